"""The rooms inside, used from outside the package: an input kind, a command and a task's refusal added by a
test with no package file touched; ``--method all`` gives a map per registered method and layer; option groups
declared once reach the library whole."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar

import numpy as np
import pytest
import torch
import typer

from hookviz import methods
from hookviz.cli import app
from hookviz.cli.flags import Inputs
from hookviz.cli.options import ModelOptions, PlainModel, RunOptions, grouped
from hookviz.cli.runner import run_command
from hookviz.io.inputs import Item
from hookviz.io.shapes import SHAPES, draw_shape
from hookviz.models.loaded import LoadedModel, input_channels
from hookviz.run.kinds import InputKind, input_kind_of, register_input_kind, unregister_input_kind
from hookviz.tasks import Task, register_task, unregister_task
from tests.conftest import TinyCNN, Trained, invoke, records, tiny_loaded, write_image

SIZE = 48


def read_grid(item: Item, preprocess: Any, max_pixels: int) -> tuple[np.ndarray, np.ndarray, Any]:
    """A ``.grid`` file: rows of grey values in [0, 1], one number a pixel; drawn on as an RGB photo."""
    assert item.path is not None
    grey = np.loadtxt(item.path, dtype=np.float32, ndmin=2)
    rgb = (np.repeat(grey[..., None], 3, axis=2) * 255).round().astype(np.uint8)
    x, box = preprocess(rgb)
    return rgb, x, box


class Grids(InputKind):
    """The toy kind: a text file of grey values is a photo."""

    name = "grid"

    def claims(self, loaded: LoadedModel, specs: Any) -> bool:
        return bool(specs) and all(str(s).endswith(".grid") for s in specs)

    def find(self, loaded: LoadedModel, specs: Any, **where: Any) -> list[Item]:
        return [Item(s, Path(s)) if Path(s).is_file() else Item(s, None, f"{s}: no such file") for s in specs]

    def read(self, loaded: LoadedModel) -> Any:
        return read_grid

    def fields(self, loaded: LoadedModel) -> dict[str, Any]:
        return {"input_kind": self.name}


@pytest.fixture
def grids() -> Iterator[Grids]:
    kind = register_input_kind(Grids())
    yield kind
    unregister_input_kind("grid")


@pytest.fixture(scope="module")
def shapes_weights(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("weights") / "shapes.pt"
    torch.save(trained.model.state_dict(), path)
    return path


def _shapes_model(weights: Path, labels: Path) -> list[str]:
    labels.write_text("\n".join(SHAPES))
    return ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--labels", str(labels),
            "--input-size", str(SIZE), "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1"]  # fmt: skip


def test_an_input_kind_from_outside_runs_through_gradcam_the_manifest_and_the_report(
    grids: Grids, shapes_weights: Path, tmp_path: Path
) -> None:
    img, mask = draw_shape(1, SIZE, np.random.default_rng(3))  # a disc, in grey
    grid = tmp_path / "disc.grid"
    np.savetxt(grid, img.mean(axis=2), fmt="%.4f")
    out = tmp_path / "out"
    model = _shapes_model(shapes_weights, tmp_path / "labels.txt")
    r = invoke("gradcam", str(grid), str(tmp_path / "gone.grid"), *model, "--save-raw", "--report",
               "--out", str(out))  # fmt: skip
    assert r.exit_code == 1, r.stderr  # the missing file fails alone; the other is done
    ok, failed = sorted(records(out), key=lambda rec: rec["status"] != "ok")
    assert failed["status"] == "error" and "gone.grid: no such file" in failed["error"]
    assert ok["status"] == "ok" and ok["input_kind"] == "grid" and ok["predicted"]["name"] == "disc"
    # The map is the trained model's evidence for the disc, read through the kind's reader: it lies on it.
    full = np.load(next(p for p in map(Path, ok["outputs"]) if p.name.endswith(".full.npy")))
    inside, outside = float(np.nanmean(full[mask])), float(np.nanmean(full[~mask]))
    assert inside > 2 * outside, (inside, outside)
    page = (out / "index.html").read_text()
    assert '"predicted": "disc"' in page and f'"file": "{Path(ok["maps"][0]["file"]).name}"' in page


def test_explain_inputs_takes_a_registered_kind(grids: Grids, shapes_weights: Path, tmp_path: Path) -> None:
    import hookviz
    from hookviz.jobs.settings import CamSettings

    img, _ = draw_shape(2, SIZE, np.random.default_rng(5))  # a cross
    grid = tmp_path / "cross.grid"
    np.savetxt(grid, img.mean(axis=2), fmt="%.4f")
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(SHAPES))
    loaded = hookviz.load_model("tests.conftest:TinyCNN", str(shapes_weights), input_size=SIZE,
                                resize="squash", mean=(0.0,) * 3, std=(1.0,) * 3, labels=labels)  # fmt: skip
    assert input_kind_of(loaded, [str(grid)]).name == "grid" and input_kind_of(loaded).name == "photo"
    (rec,) = hookviz.explain_inputs(loaded, grid, tmp_path / "out", CamSettings(), kind="grid")
    assert rec["predicted"]["name"] == "cross" and rec["input_kind"] == "grid"
    with pytest.raises(hookviz.HookvizError, match="takes photos, not videos"):
        hookviz.explain_inputs(loaded, grid, tmp_path / "o2", kind="video")


def test_a_kinds_reader_failing_on_one_input_fails_that_input_alone(
    grids: Grids, shapes_weights: Path, tmp_path: Path
) -> None:
    import hookviz

    img, _ = draw_shape(1, SIZE, np.random.default_rng(3))  # a disc
    good, broken = tmp_path / "disc.grid", tmp_path / "broken.grid"
    np.savetxt(good, img.mean(axis=2), fmt="%.4f")
    broken.write_text("0.5 x 0.5\n")  # np.loadtxt raises ValueError in the kind's own reader
    out = tmp_path / "out"
    model = _shapes_model(shapes_weights, tmp_path / "labels.txt")
    r = invoke("gradcam", str(broken), str(good), *model, "--out", str(out))
    assert r.exit_code == 1, r.stderr  # the broken grid fails alone; the good one is done
    bad, ok = records(out)
    assert ok["status"] == "ok" and ok["predicted"]["name"] == "disc"
    assert bad["status"] == "error" and "cannot read: ValueError" in bad["error"]
    assert bad["error"].startswith(f"'{broken}'") and "\n" not in bad["error"]
    err = [line for line in r.stderr.splitlines() if "broken.grid" in line]
    assert len(err) == 1 and "cannot read: ValueError" in err[0]
    loaded = hookviz.load_model("tests.conftest:TinyCNN", str(shapes_weights), input_size=SIZE,
                                resize="squash", mean=(0.0,) * 3, std=(1.0,) * 3)  # fmt: skip
    recs = hookviz.explain_inputs(loaded, [str(tmp_path / "gone.grid"), str(good)], tmp_path / "o2")
    assert [rec["status"] for rec in recs] == ["error", "ok"]


def peek(
    inputs: Inputs,
    model: PlainModel = ModelOptions(),
    layer: Annotated[str | None, typer.Option("--layer", "-l", help="the layer.")] = None,
    run: RunOptions = RunOptions(),
) -> None:
    """The toy command: four channels of one layer's feature maps."""
    from hookviz.jobs.build import made_by
    from hookviz.jobs.features import featuremap_job

    run_command(
        made_by(featuremap_job, layers=[layer] if layer else None, max_channels=4), model, run, inputs
    )


class PickyNet(TinyCNN):
    """A classifier of a task that refuses the toy command."""


class Picky(Task):
    name = "picky"
    noun = "a picky classifier"
    plural = "picky classifiers"
    refuses = frozenset({"peek"})

    def claims(self, model: torch.nn.Module) -> bool:
        return isinstance(model, PickyNet)


@pytest.fixture
def peek_command() -> Iterator[None]:
    before = list(app.registered_commands)
    app.command()(grouped(peek))
    register_task(Picky())
    yield
    app.registered_commands[:] = before
    unregister_task("picky")


def test_a_command_from_outside_runs_on_a_classifier_and_a_task_may_refuse_it(
    peek_command: None, tmp_path: Path
) -> None:
    photo = write_image(tmp_path / "p.png", np.random.default_rng(0).integers(0, 256, (40, 50, 3), np.uint8))
    r = invoke("peek", "--help")
    assert (
        r.exit_code == 0
        and "--layer" in r.stdout
        and "--weights-key" in r.stdout
        and "--head" not in r.stdout
    )
    out = tmp_path / "out"
    r = invoke("peek", str(photo), "--model", "tests.conftest:TinyCNN", "--weights", "none", "--layer",
               "features.4", "--out", str(out), "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert rec["status"] == "ok" and rec["layers"] == ["features.4"] and len(rec["outputs"]) == 1
    assert all(Path(o).is_file() for o in rec["outputs"])
    r = invoke("peek", str(photo), "--model", "tests.test_rooms:PickyNet", "--weights", "none",
               "--out", str(tmp_path / "o2"))  # fmt: skip
    assert r.exit_code == 2, r.stderr
    assert "`hookviz peek` works on" in r.stderr and "PickyNet is a picky classifier" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_method_all_gives_one_map_per_registered_method_and_layer(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "p.png", np.random.default_rng(1).integers(0, 256, (40, 40, 3), np.uint8))
    layers = ["features.2", "features.6"]
    r = invoke("gradcam", str(photo), "--model", "tests.conftest:TinyCNN", "--weights", "none",
               "--input-size", "32", "--method", "all", "--layer", layers[0], "--layer", layers[1],
               "--out", str(tmp_path / "out"), "--json", "-q")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
    expected = methods.parse(["all"])
    got = {(m["method"], m["layer"]) for m in rec["maps"]}
    # Methods at photo resolution give one map whatever the layers; the others one per layer.
    at_layer = [m for m in expected if methods.get(m).resolution == "layer"]
    at_photo = [m for m in expected if methods.get(m).resolution != "layer"]
    assert {(m, la) for m in at_layer for la in layers} <= got
    assert {m for m, _ in got} == set(expected) and all(any(m == g for g, _ in got) for m in at_photo)
    assert len(rec["maps"]) == len(got)  # one map each, none twice


def test_the_option_groups_reach_the_library_whole() -> None:
    """``gradcam``'s groups become one CamSettings, the method flags one MethodOptions."""
    from hookviz.cli.options import CamLook, CamMaps, MethodFlags, cam_settings
    from hookviz.methods import MethodOptions

    flags = MethodFlags(seed=3, samples=5, baseline=" Blur ", masked_batch=16, compare="1,2")
    s = cam_settings(["a"], ["gradcam"], "top2", CamMaps(channels=4), CamLook(no_relu=True), flags)
    assert s.layers == ("a",) and s.relu is False and s.channel_terms == 4
    assert s.options == MethodOptions(seed=3, samples=5, baseline="blur", batch=16, compare=("1", "2"))


def test_a_model_source_from_outside_is_one_registration(trained: Trained, tmp_path: Path) -> None:
    """``--model shapes:NAME`` built by a source the test registers (one record): the trained model, its
    classes and its preprocessing come with it; the warm server's key reads the file its fingerprint names."""
    from hookviz.cli.loading import warm_key
    from hookviz.cli.options import ModelOptions
    from hookviz.io.images import Preprocess
    from hookviz.models.build import Source, register_source, unregister_source
    from hookviz.models.sources import Built

    card = tmp_path / "tiny.card"
    card.write_text("v1")

    def make(spec: str, weights: str, options: Any) -> Built:
        pre = Preprocess(crop_size=SIZE, resize_size=SIZE, mean=(0.0,) * 3, std=(1.0,) * 3, resize="squash")
        return Built(trained.model, spec, "the shapes fixture", True, "shapes:v1", SHAPES, pre)

    register_source(Source("shapes", make, suffixes=(".card",), fingerprint=lambda spec: (card,)))
    try:
        with pytest.raises(ValueError, match="replace=True"):
            register_source(Source("shapes", make))
        img, mask = draw_shape(0, SIZE, np.random.default_rng(4))  # a square
        photo = write_image(tmp_path / "square.png", (img * 255).round().astype(np.uint8))
        out = tmp_path / "out"
        r = invoke("gradcam", str(photo), "--model", "shapes:tiny", "--save-raw", "--out", str(out))
        assert r.exit_code == 0, r.stderr
        (rec,) = records(out)
        assert rec["model"] == "shapes:tiny" and rec["predicted"]["name"] == "square"
        full = np.load(next(p for p in map(Path, rec["outputs"]) if p.name.endswith(".full.npy")))
        assert float(np.nanmean(full[mask])) > 2 * float(np.nanmean(full[~mask]))
        r = invoke("gradcam", str(photo), "--model", str(card), "--out", str(tmp_path / "by-suffix"))
        assert r.exit_code == 0, r.stderr
        assert records(tmp_path / "by-suffix")[0]["predicted"]["name"] == "square"
        before = warm_key(ModelOptions(model="shapes:tiny"))
        card.write_text("v2")
        assert before is not None and warm_key(ModelOptions(model="shapes:tiny")) != before
    finally:
        unregister_source("shapes")
    r = invoke("gradcam", str(photo), "--model", "shapes:tiny", "--out", str(tmp_path / "gone"))
    assert r.exit_code != 0


@dataclasses.dataclass(frozen=True)
class GreyInputs:
    """What the grey kind prepares for a model: how many bands it repeats a grey plane into (the model's)."""

    bands: int
    kind: ClassVar[str] = "grey"
    sides: ClassVar[str] = "N"

    def shape(self, preprocess: Any) -> tuple[int, ...]:
        return (self.bands, preprocess.crop_size, preprocess.crop_size)

    def key(self) -> dict[str, Any]:
        return {"grey": {"bands": self.bands}}


class Greys(Grids):
    """A kind that needs the model: a ``.grey`` file of grey values, repeated into as many bands as the
    model's first convolution takes (read from the model when a run takes the kind)."""

    name = "grey"

    def claims(self, loaded: LoadedModel, specs: Any) -> bool:
        return bool(specs) and all(str(s).endswith(".grey") for s in specs)

    def prepare(self, loaded: LoadedModel) -> LoadedModel:
        return dataclasses.replace(loaded, inputs=GreyInputs(input_channels(loaded.model)))

    def preprocess(self, loaded: LoadedModel) -> Any:
        return loaded.inputs, loaded.preprocess

    def read(self, loaded: LoadedModel) -> Any:
        def read_grey(item: Item, prepared: Any, max_pixels: int) -> tuple[np.ndarray, np.ndarray, Any]:
            inputs, preprocess = prepared
            assert item.path is not None
            grey = np.loadtxt(item.path, dtype=np.float32, ndmin=2)
            planes = (np.repeat(grey[..., None], inputs.bands, axis=2) * 255).round().astype(np.uint8)
            x, box = preprocess(planes)
            return planes[..., :3], x, box

        return read_grey


def test_an_input_kind_that_needs_the_model_is_one_class_from_outside(
    shapes_weights: Path, tmp_path: Path
) -> None:
    """The kind's ``prepare`` reads the model (its bands) when a run takes the kind: what it prepares sets
    the traced shape and goes into every output's key, and its reader uses it; the trained model finds the
    disc and the map lies on it."""
    kind = register_input_kind(Greys())
    try:
        img, mask = draw_shape(1, SIZE, np.random.default_rng(3))  # a disc, in grey
        grey = tmp_path / "disc.grey"
        np.savetxt(grey, img.mean(axis=2), fmt="%.4f")
        out = tmp_path / "out"
        model = _shapes_model(shapes_weights, tmp_path / "labels.txt")
        r = invoke("gradcam", str(grey), *model, "--save-raw", "--out", str(out))
        assert r.exit_code == 0, r.stderr
        (rec,) = records(out)
        assert rec["input_kind"] == "grey" and rec["predicted"]["name"] == "disc"
        assert rec["settings"]["grey"] == {"bands": 3}
        full = np.load(next(p for p in map(Path, rec["outputs"]) if p.name.endswith(".full.npy")))
        assert float(np.nanmean(full[mask])) > 2 * float(np.nanmean(full[~mask]))
        loaded = kind.prepare(tiny_loaded(TinyCNN(), SIZE))
        assert input_kind_of(loaded, [str(grey)]) is kind and loaded.input_shape == (3, SIZE, SIZE)
    finally:
        unregister_input_kind("grey")
