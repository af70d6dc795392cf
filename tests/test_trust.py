"""`hookviz trust`: Adebayo et al.'s table reproduced on a trained model (guided backprop insensitive to the
classifier, Grad-CAM not; the edge control fails), a network whose weights mean nothing gets "no map here can
be trusted", the same seed gives the same report, a method from outside the package is tested like the
built-in ones, and the command writes its files and refuses in one line."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz import methods
from hookviz.evaluation.trust import edge_maps, trust
from hookviz.io.shapes import shapes_batch
from hookviz.methods.compute import LayerPass
from tests.conftest import TinyCNN, invoke, write_image


@pytest.fixture(scope="module")
def scenes() -> torch.Tensor:
    x, _, _ = shapes_batch(16, np.random.default_rng(5))
    return x


def _close(a: Any, b: Any) -> None:
    """Two reports' data equal: the same keys and words, floats within a tolerance."""
    if isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-9)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            _close(u, v)
    else:
        assert a == b


@pytest.mark.slow
def test_the_papers_table_on_a_trained_model(trained: Any, scenes: torch.Tensor) -> None:
    model = trained.model
    report = trust(
        model, scenes, ["features"], ["gradcam", "guidedbackprop"], default=("gradcam", "features")
    )
    found = {c.method: c for c in report.candidates}
    assert not report.model_check.at_chance
    # Guided backprop keeps its map when the classifier is re-initialised (it explains the photo):
    guided = found["guidedbackprop"]
    assert guided.tests["randomisation"].value > 0.5 and guided.tests["randomisation"].outcome == "fail"
    assert guided.verdict == "fails" and "randomisation" in guided.reason
    # Grad-CAM changes with it, and its map depends on the class.
    cam = found["gradcam"]
    assert cam.tests["randomisation"].value < 0.5 and cam.tests["randomisation"].outcome == "pass"
    assert cam.tests["class"].outcome == "pass"
    assert cam.tests["faithfulness"].value > 0
    # The edge detector, the control, fails both: it is the same whatever the model and the class.
    edges = found["edges"]
    assert edges.control and edges.verdict == "fails"
    assert edges.tests["randomisation"].value == pytest.approx(1.0) and edges.tests["class"].value > 0.95
    assert report.answer.startswith("recommended: gradcam at features") or cam.verdict == "care"
    # The same seed gives the same report.
    _close(report.as_dict(), trust(model, scenes, ["features"], ["gradcam", "guidedbackprop"],
                                   default=("gradcam", "features")).as_dict())  # fmt: skip


def test_a_network_whose_weights_mean_nothing_gets_no_recommendation(scenes: torch.Tensor) -> None:
    torch.manual_seed(1)
    report = trust(TinyCNN().eval(), scenes[:8], ["features"], ["gradcam"], default=("gradcam", "features"))
    assert report.model_check.at_chance and "near uniform" in report.model_check.reason
    assert report.answer.startswith("no map here can be trusted: the model's predictions are at chance")
    assert all(c.verdict == "fails" for c in report.candidates)
    assert report.recommended() is None
    assert "the default (gradcam at features) fails" in report.answer


def test_the_edge_control_is_the_photos_own_gradient() -> None:
    x = torch.zeros(1, 3, 8, 8)
    x[:, :, :, 4:] = 1.0  # a vertical edge between columns 3 and 4
    e = edge_maps(x)[0]
    assert e.shape == (8, 8)
    assert float(e[4, 3]) == pytest.approx(4.0) and float(e[4, 4]) == pytest.approx(4.0)  # Sobel: 1+2+1
    assert float(e[4, 0]) == 0.0 and float(e[4, 7]) == 0.0


@pytest.fixture
def outsider() -> Iterator[str]:
    """A map that ignores the model: the activations' mean over channels (no gradient, no class)."""

    @methods.register_method(
        "meanact", title="Mean activation toy", family="activation-only", needs={"activations"},
        cost="one forward pass", paper="a test", formula="mean_k A^k", class_specific=False,
    )  # fmt: skip
    def meanact(p: LayerPass) -> torch.Tensor:
        return p.activations.mean(dim=1, keepdim=True)

    yield "meanact"
    methods.unregister("meanact")


@pytest.mark.slow
def test_a_method_from_outside_the_package_is_tested_like_the_built_in_ones(
    trained: Any, scenes: torch.Tensor, outsider: str
) -> None:
    report = trust(trained.model, scenes, ["features"], [outsider])
    (mine,) = [c for c in report.candidates if c.method == outsider]
    # Its map is the same for every class: the class test fails it, whatever its other figures.
    assert mine.tests["class"].value > 0.95 and mine.tests["class"].outcome == "fail"
    assert mine.verdict == "fails" and "class" in mine.reason


def test_the_command_writes_its_files_and_refuses_in_one_line(tmp_path: Path) -> None:
    torch.manual_seed(3)
    weights = tmp_path / "tiny.pt"
    torch.save(TinyCNN().state_dict(), weights)
    photos = tmp_path / "photos"
    photos.mkdir()
    x, _, _ = shapes_batch(6, np.random.default_rng(1))
    for i, image in enumerate(x):
        write_image(photos / f"s{i}.png", (image.numpy().transpose(1, 2, 0) * 255).astype(np.uint8))
    out = tmp_path / "out"
    model = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--input-size", "48"]
    (photos / "broken.png").write_bytes(b"not a photo")
    r = invoke("trust", str(photos), *model, "--method", "gradcam,saliency", "--out", str(out))
    # The broken photo is named, the verdicts are over the six others, and the run says some input failed.
    assert r.exit_code == 1, r.stderr
    assert "broken.png" in r.stderr and "1 input(s) could not be read" in r.stderr
    data = json.loads((out / "trust.json").read_text())
    assert [Path(name).name for name in data["failed"]] == ["broken.png"]
    assert [(c["method"], c["verdict"] in ("recommended", "care", "fails")) for c in data["candidates"]] == [
        ("gradcam", True), ("saliency", True), ("edges", True)
    ]  # fmt: skip
    assert len(data["photos"]) == 6 and data["seed"] == 0 and data["versions"]["torch"] == torch.__version__
    assert "hookviz trust" in (out / "trust.md").read_text() and (out / "trust.png").stat().st_size > 1000
    assert "verdict" in r.stderr  # the table
    # One photo gives no interval: refused in one line.
    one = tmp_path / "one"
    one.mkdir()
    (one / "s0.png").write_bytes((photos / "s0.png").read_bytes())
    r = invoke("trust", str(one), *model, "--out", str(tmp_path / "o1"))
    assert r.exit_code == 2 and "needs 2 photos or more" in r.stderr and not (tmp_path / "o1").exists()
    (photos / "broken.png").unlink()
    # Again without --overwrite: the first run's files are kept, one line, exit 3.
    before = (out / "trust.json").read_bytes()
    r = invoke("trust", str(photos), *model, "--method", "gradcam", "--out", str(out))
    assert r.exit_code == 3 and "--overwrite" in r.stderr and (out / "trust.json").read_bytes() == before
    # Not a classifier of photos: one line, exit 2.
    r = invoke("trust", str(photos), *model, "--method", "nosuchmethod", "--out", str(tmp_path / "o2"))
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
