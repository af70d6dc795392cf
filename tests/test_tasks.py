"""Tasks as a registry: a task registered from outside the package (greyscale photos, a model returning a
dict) runs through ``gradcam``, the manifest and the report with no other file touched; the built-in tasks
claim the models they should; a command a task does not take is refused in one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torchvision.models import detection, segmentation

from hookviz.io.images import Box, Preprocess, load_rgb
from hookviz.io.inputs import Item
from hookviz.io.shapes import SHAPES, draw_shape
from hookviz.models.loaded import LoadedModel
from hookviz.tasks import Task, get_task, load_model, register_task, task_for, task_names, unregister_task
from hookviz.tasks.registry import _TASKS
from tests.conftest import invoke, records, write_image

SIZE = 48


class GreyNet(nn.Module):
    """A classifier of one-channel photos that returns a dict, as other people's code often does."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
        )
        self.head = nn.Linear(32, len(SHAPES))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.head(nn.functional.relu(self.body(x)).mean((2, 3)))}


class Grey(Task):
    """The toy task: photos read as one grey channel; a line that says so."""

    name = "grey"
    noun = "a greyscale classifier"
    plural = "greyscale classifiers"
    commands = frozenset({"gradcam"})

    def claims(self, model: nn.Module) -> bool:
        return isinstance(model, GreyNet)

    def default_preprocess(self) -> Preprocess:
        return Preprocess(crop_size=SIZE, resize_size=SIZE, mean=(0.0,) * 3, std=(1.0,) * 3, resize="squash")

    def input_shape(self, loaded: LoadedModel) -> tuple[int, ...]:
        return (1, loaded.preprocess.crop_size, loaded.preprocess.crop_size)

    def read(self, item: Item, preprocess: Any, max_pixels: int) -> tuple[Any, np.ndarray, Box]:
        assert item.path is not None
        rgb = load_rgb(item.path, max_pixels=max_pixels)
        x, box = preprocess(rgb)
        return rgb, x.mean(axis=0, keepdims=True), box

    def describe(self, record: dict[str, Any]) -> list[str] | None:
        return None if record.get("status") != "ok" else ["(read in grey)"]


def _grey(x: torch.Tensor) -> torch.Tensor:
    return x.mean(1, keepdim=True)


@pytest.fixture(scope="module")
def grey_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GreyNet trained for a few seconds on grey shapes; its state_dict's file."""
    from hookviz.io.shapes import shapes_batch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = GreyNet()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    steps = 250
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=steps)
    model.train()
    for _ in range(steps):
        x, y, _ = shapes_batch(32, rng, SIZE)
        loss = nn.functional.cross_entropy(model(_grey(x))["logits"], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    x, y, _ = shapes_batch(200, np.random.default_rng(5), SIZE)
    with torch.no_grad():
        accuracy = float((model(_grey(x))["logits"].argmax(1) == y).float().mean())
    assert accuracy > 0.9, accuracy
    path = tmp_path_factory.mktemp("grey") / "grey.pt"
    torch.save(model.state_dict(), path)
    return path


@pytest.fixture
def grey_task() -> Iterator[Grey]:
    task = register_task(Grey())
    yield task
    unregister_task("grey")


def test_a_task_from_outside_runs_through_gradcam_the_manifest_and_the_report(
    grey_task: Grey, grey_weights: Path, tmp_path: Path
) -> None:
    img, mask = draw_shape(1, SIZE, np.random.default_rng(3))  # a disc
    photo = write_image(tmp_path / "disc.png", (img * 255).round().astype(np.uint8))
    out = tmp_path / "out"
    model = ["--model", "tests.test_tasks:GreyNet", "--weights", str(grey_weights), "--device", "cpu"]
    names = ",".join(SHAPES)
    labels = tmp_path / "labels.txt"
    labels.write_text(names.replace(",", "\n"))
    r = invoke(
        "gradcam", str(photo), *model, "--labels", str(labels), "--save-raw", "--report", "--out", str(out)
    )
    assert r.exit_code == 0, r.stderr
    assert "disc.png: (read in grey) wrote " in r.stdout  # the task's words on the line, not a prediction
    (rec,) = records(out)
    assert rec["status"] == "ok" and rec["task"] == "grey" and rec["predicted"]["name"] == "disc"
    # The map is the model's evidence, read through the task's one-channel input: it lies on the disc.
    full = np.load(next(p for p in map(Path, rec["outputs"]) if p.name.endswith(".full.npy")))
    inside, outside = float(np.nanmean(full[mask])), float(np.nanmean(full[~mask]))
    assert inside > 2 * outside, (inside, outside)
    page = (out / "index.html").read_text()  # the record's card, its picture named by the job
    assert (
        '"predicted": "disc"' in page
        and '"method": "gradcam"' in page
        and f'"file": "{Path(rec["maps"][0]["file"]).name}"' in page
    )
    # The Python API finds the same task.
    loaded = load_model("tests.test_tasks:GreyNet", str(grey_weights))
    assert loaded.task_name == "grey" and loaded.input_shape == (1, SIZE, SIZE)


def test_a_command_the_task_does_not_take_is_refused_in_one_line(grey_task: Grey, tmp_path: Path) -> None:
    photo = write_image(tmp_path / "p.png", np.zeros((SIZE, SIZE, 3), np.uint8))
    r = invoke(
        "featuremaps", str(photo), "--model", "tests.test_tasks:GreyNet", "--weights", "none",
        "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert r.exit_code == 2
    assert "`hookviz featuremaps` works on classifiers" in r.stderr
    assert (
        "and tests.test_tasks:GreyNet is a greyscale classifier; `hookviz gradcam` explains it "
        "(and `layers`, `summary` work on it)" in r.stderr
    )
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.png"))


def test_the_built_in_tasks_claim_their_models() -> None:
    from hookviz.models.sources import Built

    def task(model: nn.Module) -> str:
        return task_for(Built(model, "m", "none", False, "none")).name

    assert task_names()[:4] == ["classification", "detection", "segmentation", "video"]
    assert task(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))) == "classification"
    assert task(nn.Sequential(nn.Conv3d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))) == "video"
    fcn = segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=3, aux_loss=False)
    assert task(fcn) == "segmentation"
    ssd = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3)
    assert task(ssd) == "detection"


def test_registering_is_checked() -> None:
    class Nameless(Task):
        pass

    with pytest.raises(Exception, match="needs a name"):
        register_task(Nameless())
    with pytest.raises(Exception, match="registered already"):
        register_task(get_task("detection").__class__())
    with pytest.raises(Exception, match="no task 'nope'; the tasks are classification"):
        get_task("nope")
    assert "grey" not in _TASKS  # the fixture's task is gone after its test


def test_records_say_their_task_and_a_classifiers_do_not(tmp_path: Path) -> None:
    """Every task's records name it, except a classifier's (the default, as before tasks had names)."""
    assert get_task("classification").fields(None) == {}  # type: ignore[arg-type]
    assert get_task("segmentation").fields(None) == {"task": "segmentation"}  # type: ignore[arg-type]
    assert json.loads(json.dumps(get_task("video").fields(None))) == {"task": "video"}  # type: ignore[arg-type]
