"""`hookviz trust`: Adebayo et al.'s table reproduced on a trained model (guided backprop insensitive to the
classifier, Grad-CAM not; the edge control fails), a network whose weights mean nothing gets "no map here can
be trusted", the same seed gives the same report, a method from outside the package is tested like the
built-in ones, and the command writes its files and refuses in one line."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import hookviz
from hookviz import methods
from hookviz.engine.explain import explain
from hookviz.errors import UsageError
from hookviz.evaluation import trust as trust_battery
from hookviz.evaluation import trust_clock
from hookviz.evaluation.faithfulness import probabilities, upsample
from hookviz.evaluation.localisation import pointing_game
from hookviz.evaluation.stats import mean_ci
from hookviz.evaluation.trust import VERDICTS, edge_maps, explainer, trust
from hookviz.evaluation.trust_clock import Clock, Spent
from hookviz.evaluation.trust_read import read_trust
from hookviz.io.annotation import load as load_annotations
from hookviz.io.images import DEFAULT_MAX_PIXELS
from hookviz.io.shapes import shapes_batch, shapes_scene
from hookviz.methods.compute import LayerPass
from hookviz.run.trust import grid, read_photos
from hookviz.tasks import load_model
from tests.conftest import ROOT, TinyCNN, invoke, records, write_image
from tests.shapes_net import make_segmenter


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
    # The default layer and the last two others --layer auto would try; saliency (the same map at every
    # layer) at the first only.
    assert [(c["method"], c["layer"], c["verdict"] in VERDICTS) for c in data["candidates"]] == [
        ("gradcam", "features", True), ("saliency", "features", True), ("gradcam", "features.1", True),
        ("gradcam", "features.5", True), ("edges", "-", True),
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
    assert "hookviz: trust: photos" not in r.stderr  # refused before computing anything
    # Not a classifier of photos: one line, exit 2.
    r = invoke("trust", str(photos), *model, "--method", "nosuchmethod", "--out", str(tmp_path / "o2"))
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1


# -- the library's function, localisation, the cost ------------------------------------------------------


def _folder(path: Path, x: torch.Tensor) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(x):
        write_image(path / f"s{i:02d}.png", (image.numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8))
    return path


def test_a_model_whose_weights_were_never_loaded_gets_no_map_naming_the_check(tmp_path: Path) -> None:
    """EfficientNet-Lite0's shape with weights=None, on the sample photos, through ``hookviz.trust``: its
    1000 probabilities are near uniform, so no map is recommended, whatever their figures."""

    loaded = load_model("efficientnet_lite0", "none", input_size=96)  # small: the verdict is the model's
    report = hookviz.trust(loaded, str(ROOT / "sample_images"), methods=["gradcam"], max_photos=3)
    assert isinstance(report, hookviz.TrustReport) and len(report.photos) == 3
    assert report.model_check.at_chance and report.model_check.entropy > 0.9
    assert report.answer.startswith("no map here can be trusted: the model's predictions are at chance")
    assert "near uniform" in report.answer
    assert report.recommended() is None
    assert all(c.verdict == "fails" for c in report.candidates if not c.control)
    assert json.loads(json.dumps(report.as_dict(), default=str))["candidates"][0]["method"] == "gradcam"


@pytest.mark.slow
def test_recommended_maps_point_at_the_shape_and_failed_ones_do_not(trained: Any) -> None:
    """Ground truth: the verdicts (with the true masks, so localisation is among the tests) from 16 scenes;
    then on 64 held-out scenes each map's peak on the shape (the pointing game), against a random pixel's
    chance (the shape's share of the photo)."""

    x, _, masks = shapes_batch(16, np.random.default_rng(5))
    named = ["gradcam", "layercam", "guidedbackprop", "saliency"]
    report = trust(trained.model, x, ["features"], named, masks=torch.from_numpy(masks))
    assert all("localisation" in c.tests for c in report.candidates)
    held, _, held_masks = shapes_batch(64, np.random.default_rng(77))
    ex = explain(trained.model, held, ["features"], named, None)
    chance = float(held_masks.reshape(64, -1).mean(1).mean())
    margin = {}
    for m in named:
        up = upsample(ex.maps[(m, "features")][:, 0], (48, 48))
        margin[m] = float(pointing_game(up, torch.from_numpy(held_masks), tolerance=0).mean()) - chance
    found = {c.method: c for c in report.candidates}
    verdicts = {m: c.verdict for m, c in found.items()}
    good = [m for m in named if verdicts[m] == "recommended"]
    bad = [m for m in named if verdicts[m] == "fails"]
    assert good and bad, verdicts
    worst_good = min(margin[g] for g in good)
    for m in good:
        assert margin[m] + chance >= 0.9, (m, margin)
    # No failed map points at the shape better than a recommended one, and one does far worse (guided
    # backprop). A map may fail and still point as well: on a scene of one shape a map of the activations
    # alone finds it. LayerCAM at this last layer is near that (the ReLU of the gradient keeps each class's
    # positively weighted channels): its maps differ from Grad-CAM's, yet hit the shape on the same share of
    # these 64 scenes, and barely change with the classifier re-initialised. Such a map fails randomisation,
    # which the pointing game cannot see.
    for m in bad:
        assert margin[m] <= worst_good, (m, margin)
        if margin[m] > worst_good - 0.1:
            assert found[m].tests["randomisation"].outcome == "fail", (m, found[m].reason)
    assert min(margin[m] for m in bad) < worst_good - 0.3, margin


@pytest.mark.slow
def test_a_candidate_that_fails_clearly_on_the_first_photos_is_dropped(
    trained: Any, scenes: torch.Tensor
) -> None:
    report = trust(trained.model, scenes, ["features"], ["gradcam", "layercam", "guidedbackprop"])
    found = {c.method: c for c in report.candidates}

    def first_half(method: str) -> tuple[float, float]:  # randomisation's 95 % interval on the first 8
        mean, ci = mean_ci(found[method].tests["randomisation"].per_photo[:8])
        return mean - ci, mean + ci

    # LayerCAM's randomisation interval lies wholly above 0.5 on the first 8 (as the edge control's): it
    # stops there.
    for m in ("layercam", "edges"):
        assert found[m].photos == 8 and found[m].verdict == "fails", found[m]
        assert "first 8 of 16 photos" in (found[m].dropped or "") and first_half(m)[0] > 0.5
    # Guided backprop's reaches below 0.5 there (one photo's map changes with the classifier): not a clear
    # failure, so it sees all 16, and fails over them.
    assert first_half("guidedbackprop")[0] < 0.5 < first_half("guidedbackprop")[1]
    assert found["guidedbackprop"].photos == 16 and found["guidedbackprop"].dropped is None
    assert found["guidedbackprop"].verdict == "fails"
    assert found["gradcam"].photos == 16 and found["gradcam"].dropped is None
    assert len(found["gradcam"].tests["class"].per_photo) == 16


class _Slow:
    """Each batch of perturbed photos through the model takes ``seconds`` more (a slow model): on the clock
    of ``fake`` (advanced, no wait) or the real one (slept). Records the (start, end) of each batch and of
    each explanation (the work between two readings of the budget's clock)."""

    def __init__(self, seconds: float, fake: bool = False) -> None:
        self.seconds, self.fake, self.now = seconds, fake, 0.0
        self.batches: list[tuple[float, float]] = []
        self.explained: list[tuple[float, float]] = []

    def monotonic(self) -> float:
        return self.now if self.fake else time.monotonic()

    def probabilities(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        begun = self.monotonic()
        if self.fake:
            self.now += self.seconds
        else:
            time.sleep(self.seconds)
        got = probabilities(*args, **kwargs)
        self.batches.append((begun, self.monotonic()))
        return got

    def explain(self, *args: Any, **kwargs: Any) -> Any:
        begun = self.monotonic()
        got = explain(*args, **kwargs)
        self.explained.append((begun, self.monotonic()))
        return got


def test_a_budget_far_below_one_step_ends_within_one_batch_of_it(
    scenes: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step (three methods at a layer on the first 4 photos) needs 11 batches of perturbed photos, 0.3 s
    each or more here: 3.3 s. A budget of 1.2 s stops inside it, at most one batch (or explanation) past the
    budget; the run that read the clock between steps only ran the whole step."""
    torch.manual_seed(2)
    model = TinyCNN().eval()
    model(scenes[:6])  # the first call's set-up out of the budget
    slow = _Slow(0.3)
    monkeypatch.setattr(trust_battery, "probabilities", slow.probabilities)
    monkeypatch.setattr(trust_battery, "explain", slow.explain)
    cams = ["gradcam", "layercam", "xgradcam"]
    began = time.monotonic()
    report = trust(model, scenes[:6], ["features"], cams, budget=1.2, started=began)
    took = time.monotonic() - began
    longest = max((end - start for start, end in slow.batches + slow.explained), default=0.0)
    assert took <= 1.2 + longest + 0.5, (took, slow.batches, slow.explained)  # 0.5 s: the bookkeeping
    assert len(slow.batches) < 11  # the step was cut
    said = "not tested (the budget of 1.2 s was spent)"
    assert report.left_out == [*(f"{m} at features: {said}" for m in cams), f"edges at -: {said}"]
    assert report.candidates == [] and report.partial and report.as_dict()["partial"] is True
    assert report.answer.endswith("(partial: 4 candidate(s) not tested and 0 tested on part of the photos "
                                  "within the budget)")  # fmt: skip
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())


def test_a_candidate_the_budget_cuts_keeps_the_figures_of_the_photos_it_finished(
    scenes: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a clock that moves only with the model's batches (0.5 s each: the same cut whatever the load):
    the first batch of 4 photos runs 5 batches for what every candidate shares, 2 for Grad-CAM at each
    layer; a budget of 3.8 s ends inside Grad-CAM at features.4, one batch past the budget."""
    torch.manual_seed(2)
    model = TinyCNN().eval()
    whole = trust(model, scenes[:6], ["features", "features.4"], ["gradcam"])
    slow = _Slow(0.5, fake=True)
    monkeypatch.setattr(trust_battery, "probabilities", slow.probabilities)
    monkeypatch.setattr(trust_clock, "time", slow)
    lines: list[str] = []
    report = trust(model, scenes[:6], ["features", "features.4"], ["gradcam"], budget=3.8, started=0.0,
                   progress=lines.append)  # fmt: skip
    assert slow.now == pytest.approx(4.0) and len(slow.batches) == 8  # 3.8 s + one batch
    assert lines == ["photos 1-4 of 6: gradcam at features", "photos 1-4 of 6: gradcam at features.4"]
    said = "the budget of 3.8 s was spent"
    assert report.left_out == [
        f"gradcam at features.4: not tested ({said})",
        f"edges at -: not tested ({said})",
    ]
    (cam,) = report.candidates
    assert (cam.method, cam.layer, cam.photos) == ("gradcam", "features", 4)
    assert cam.dropped == f"budget: its figures are over the first 4 of 6 photos only ({said})"
    assert report.answer.endswith("(partial: 2 candidate(s) not tested and 1 tested on part of the photos "
                                  "within the budget)")  # fmt: skip
    full = next(c for c in whole.candidates if (c.method, c.layer) == ("gradcam", "features"))
    for name, test in cam.tests.items():  # its figures: the whole run's on those photos, the interval theirs
        assert test.per_photo == pytest.approx(full.tests[name].per_photo[:4], abs=1e-6), name
        mean, ci = mean_ci(test.per_photo)
        assert (test.value, test.ci) == (pytest.approx(mean, abs=1e-5), pytest.approx(ci, abs=1e-5))
    assert cam.tests["class"].ci > 0 and not whole.partial


def test_a_generous_budget_gives_the_figures_of_no_budget(scenes: torch.Tensor) -> None:
    torch.manual_seed(2)
    model = TinyCNN().eval()
    lines: list[str] = []
    free = trust(model, scenes[:10], ["features"], ["gradcam", "saliency"], progress=lines.append)
    timed = trust(model, scenes[:10], ["features"], ["gradcam", "saliency"], budget=3600)
    assert not timed.partial and not timed.left_out and "partial" not in timed.answer
    _close(timed.as_dict(), free.as_dict())
    # Two rounds (5 photos, then 5), 4 photos at a time: each candidate saw all 10 or was dropped by halving.
    assert [line.split(":")[0] for line in lines[:3]] == [
        "photos 1-4 of 10",
        "photos 1-4 of 10",
        "photo 5 of 10",
    ]
    assert all(
        c.photos == 10 or "failed clearly on the first 5" in (c.dropped or "") for c in free.candidates
    )


def test_the_clock_stops_a_method_inside_its_own_passes_and_leaves_the_model_as_found(
    scenes: torch.Tensor,
) -> None:
    """Integrated Gradients runs 50 points a photo, 64 rows a pass: the clock is read after each pass, and
    the budget spent after the first stops it there, with no hook left and the grad mode restored."""
    model = TinyCNN().eval()
    clock = Clock(1.0)
    reads = iter([False, True])
    clock.out = lambda: next(reads)  # type: ignore[method-assign]
    maps_of = explainer("features", ["integratedgradients"], clock)
    with pytest.raises(Spent, match="the budget of 1 s was spent"):
        maps_of(model, scenes[:4], torch.zeros(4, dtype=torch.long))
    assert next(reads, "read twice") == "read twice"  # after the first and the second of 4 passes
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())
    assert torch.is_grad_enabled() and not model.training
    assert not any(p.grad is not None for p in model.parameters())


def test_the_command_localises_against_boxes_and_the_same_seed_gives_the_same_json(tmp_path: Path) -> None:
    torch.manual_seed(3)
    weights = tmp_path / "tiny.pt"
    torch.save(TinyCNN().state_dict(), weights)
    x, _, masks = shapes_batch(4, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    rows = ["file,class,x0,y0,x1,y1"]
    boxes = np.zeros_like(masks, dtype=bool)
    for i, m in enumerate(masks):
        ys, xs = np.nonzero(m)
        rows.append(f"s{i:02d}.png,0,{xs.min()},{ys.min()},{xs.max() + 1},{ys.max() + 1}")
        boxes[i, ys.min() : ys.max() + 1, xs.min() : xs.max() + 1] = True
    (tmp_path / "boxes.csv").write_text("\n".join(rows) + "\n")
    model = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--input-size", "48",
             "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1", "--method", "gradcam",
             "-l", "features"]  # fmt: skip
    runs = []
    for k in range(2):
        out = tmp_path / f"out{k}"
        r = invoke("trust", str(photos), *model, "--boxes", str(tmp_path / "boxes.csv"), "--out", str(out))
        assert r.exit_code == 0, r.stderr
        assert "hookviz: trust: photos 1-4 of 4: gradcam at features" in r.stderr  # progress
        runs.append(json.loads((out / "trust.json").read_text()))
    a, b = ({k: v for k, v in run.items() if k != "command"} for run in runs)
    _close(a, b)
    cam = a["candidates"][0]
    assert a["tests"] == ["randomisation", "class", "faithfulness", "stability", "localisation"]
    loc = cam["tests"]["localisation"]
    assert loc["outcome"] in ("pass", "care", "fail") and len(loc["per_photo"]) == 4
    # The centre map's hits on these four boxes (not the shapes inside them), computed by hand: a 48-pixel
    # side has no middle pixel, so its peak is the four tied pixels of rows and columns 23-24, and any of
    # them in the box is a hit (pointing_game's rule). The figure is the map's hits less these.
    centre = [bool(b[23:25, 23:25].any()) for b in boxes]
    assert centre == [False, True, True, True]  # the third holds a middle pixel, not (24, 24)
    assert loc["extra"]["centre_pointing"] == pytest.approx(np.mean(centre))
    assert loc["value"] == pytest.approx(loc["extra"]["pointing"] - np.mean(centre))
    assert "localisation" in (tmp_path / "out0" / "trust.md").read_text()


@pytest.mark.parametrize(
    ("flag", "said"),
    [(["--budget", "soon"], "--budget soon: a time above zero"), (["--budget", "0"], "a time above zero"),
     (["--boxes", "nosuch.csv"], "nosuch.csv"), (["--boxes", "no\nsuch.csv"], "no\\nsuch.csv")],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, flag: list[str], said: str) -> None:
    x, _, _ = shapes_batch(2, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    r = invoke("trust", str(photos), "--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size",
               "48", *flag, "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o").exists()


# -- a ViT, a segmenter, a detector ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_trained_vit_is_tested_at_its_blocks(tmp_path: Path) -> None:
    """The shapes ViT (tests/fixtures): its encoder blocks are the candidate layers; Grad-CAM at them is
    judged like a CNN's, the edge control fails."""

    loaded = load_model(f"{ROOT / 'examples' / 'shapes_vit.py'}:make_vit",
                        str(ROOT / "tests" / "fixtures" / "shapes_vit.safetensors"), input_size=64,
                        resize="squash", mean=(0, 0, 0), std=(1, 1, 1))  # fmt: skip
    x, _, _ = shapes_batch(8, np.random.default_rng(5), 64)
    report = hookviz.trust(loaded, str(_folder(tmp_path / "p", x)), methods=["gradcam"])
    layers = [c.layer for c in report.candidates if not c.control]
    assert len(layers) == 3 and all(la.startswith("encoder.layers.encoder_layer_") for la in layers), layers
    assert not report.model_check.at_chance
    for c in report.candidates:
        assert {"randomisation", "class", "faithfulness", "stability"} <= c.tests.keys()
        assert c.verdict in ("recommended", "care", "fails") and c.photos in (4, 8)
    edges = report.candidates[-1]
    assert edges.control and edges.verdict == "fails"


@pytest.mark.slow
def test_a_detector_is_tested_on_its_own_boxes_and_says_what_does_not_apply(tmp_path: Path) -> None:
    """The shapes detector (tests/fixtures): each kept box's map against the box; the tests that need the
    same box found again, or another class's map of it, are n/a with the reason."""

    loaded = load_model(f"{ROOT / 'examples' / 'shapes_detector.py'}:make_detector",
                        str(ROOT / "tests" / "fixtures" / "shapes_detector.safetensors"),
                        labels=["__background__", "square", "disc", "cross"])  # fmt: skip
    rng = np.random.default_rng(21)
    folder = tmp_path / "p"
    folder.mkdir()
    for i in range(4):
        img = shapes_scene(rng, 120, 160, 2, (9, 18))[0]
        write_image(folder / f"d{i}.png", (img * 255).round().astype(np.uint8))
    report = hookviz.trust(loaded, str(folder), methods=["hirescam", "gradcam"])
    assert report.task == "detection" and not report.model_check.at_chance
    found = {c.method: c for c in report.candidates}
    assert set(found) == {"hirescam", "gradcam", "edges"}
    for c in found.values():
        assert c.tests["randomisation"].outcome == "n/a" and "other boxes" in c.tests["randomisation"].rule
        assert c.tests["class"].outcome == "n/a" and c.tests["faithfulness"].outcome == "n/a"
    hires = found["hirescam"].tests["localisation"]
    # HiResCAM's peak lies in the box it explains (tests/test_dense.py: 35 of 37 boxes), the centre's rarely.
    assert hires.extra["pointing"] >= 0.8 and hires.value > 0.3
    assert found["hirescam"].verdict in ("recommended", "care")


@pytest.mark.slow
def test_a_segmenter_goes_through_the_battery(tmp_path: Path) -> None:
    """The FCN of tests/shapes_net.py trained briefly on scenes: every test applies (a class's score sums
    its pixels), the figures are finite, the edge control fails."""

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make_segmenter()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(120):
        batch = [shapes_scene(rng, 64, 80, 2, (7, 12)) for _ in range(16)]
        xb = torch.from_numpy(np.stack([b[0].transpose(2, 0, 1) for b in batch]))
        loss = torch.nn.functional.cross_entropy(
            model(xb)["out"], torch.from_numpy(np.stack([b[3] for b in batch]))
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    x = torch.from_numpy(
        np.stack([shapes_scene(rng, 64, 80, 2, (7, 12))[0].transpose(2, 0, 1) for _ in range(8)])
    )
    report = trust(model, x, ["backbone.1"], ["gradcam", "hirescam"], task="segmentation")
    assert not report.model_check.at_chance, report.model_check
    for c in report.candidates:
        for t in ("randomisation", "class", "faithfulness", "stability"):
            assert math.isfinite(c.tests[t].value), (c.method, t)
    assert report.candidates[-1].control and report.candidates[-1].verdict == "fails"


class _Fickle(torch.nn.Module):
    """Confident on every photo, its top class a hash of the exact pixels: small noise flips it at random."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.cos(1e5 * x.flatten(1).sum(1))
        return torch.stack([40 * s, -40 * s], 1)


def test_a_few_flips_on_a_few_photos_do_not_make_a_confident_model_at_chance() -> None:
    """On 3 photos one flip is a third of the figure: said, never called chance (the trained
    EfficientNet-Lite0 was, on 3 sample photos); on 16 the same model's flips are."""
    from hookviz.evaluation.trust import check_model

    few = check_model(_Fickle(), torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0)), seed=0)
    assert few.flips > 0.5 and few.entropy < 0.1 and not few.at_chance
    assert "of only 3 photos" in few.reason and "confident" in few.reason
    many = check_model(_Fickle(), torch.rand(16, 3, 8, 8, generator=torch.Generator().manual_seed(1)), seed=0)
    assert many.flips > 0.5 and many.at_chance and "flips under small noise" in many.reason


@pytest.mark.parametrize(("seed", "flips"), [(14, 0.0), (1, 0.25), (11, 0.5)])
def test_the_model_check_calls_a_model_stable_only_at_its_threshold(seed: int, flips: float) -> None:
    """4 photos (seeded so that small noise flips none, one, two of them): "stable" only at or below
    STABLE_FLIPS (10 %, as docs/trust.md says); above it the check says how many flip, and on 4 photos
    never calls the model at chance (EfficientNet-Lite0 on 4 photos read "confident and stable" beside
    "flipped on 50 % of the photos")."""
    from hookviz.evaluation.trust import STABLE_FLIPS, check_model

    got = check_model(
        _Fickle(), torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(seed)), seed=0
    )
    assert got.flips == flips and not got.at_chance and STABLE_FLIPS == 0.1
    assert ("stable" in got.reason and "not stable" not in got.reason) == (flips <= STABLE_FLIPS), got.reason
    if flips > STABLE_FLIPS:
        assert got.reason == (
            "its predictions are confident, not stable: its top class flips under small noise on "
            f"{flips:.0%} of the photos"
        )
    assert "at most 10 %" in (ROOT / "docs" / "trust.md").read_text()


def test_the_python_report_holds_the_key_trust_json_holds(tmp_path: Path) -> None:
    """``hookviz.trust(...).as_dict()`` is what ``trust.json`` holds, its ``key`` (how ``--method auto`` finds
    a run) included, and reads back the same."""
    from hookviz.evaluation.trust_read import report_from_dict

    loaded = load_model("efficientnet_lite0", "none", input_size=64)
    report = hookviz.trust(loaded, str(ROOT / "sample_images"), methods=["gradcam"], max_photos=2, budget=1)
    assert report.as_dict()["key"] == {"model": "efficientnet_lite0", "weights": "none"}
    assert report_from_dict(json.loads(json.dumps(report.as_dict(), default=str))).key == report.key


# -- what is refused or left out before the battery runs -------------------------------------------------


def _boxes(path: Path, names: list[str]) -> Path:
    path.write_text("file,class,x0,y0,x1,y1\n" + "".join(f"{n},0,4,4,20,20\n" for n in names))
    return path


def test_photos_the_annotations_do_not_name_are_left_out_not_failed(tmp_path: Path) -> None:
    x, _, _ = shapes_batch(3, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    loaded = load_model("tests.conftest:TinyCNN", "none", input_size=48)
    found = load_annotations(_boxes(tmp_path / "boxes.csv", ["s00.png", "s01.png"]), None)
    got = read_photos(loaded, [str(photos)], 16, DEFAULT_MAX_PIXELS, found)
    assert got.failed == {} and [Path(n).name for n in got.unannotated] == ["s02.png"]
    assert [Path(n).name for n in got.names] == ["s00.png", "s01.png"] and got.masks is not None
    assert len(got.batch) == 2 and all(m.shape == (48, 48) and m[8:16, 8:16].all() for m in got.masks)


def test_boxes_that_name_none_of_the_photos_say_so_with_an_example_of_each(tmp_path: Path) -> None:
    x, _, _ = shapes_batch(3, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    boxes = _boxes(tmp_path / "boxes.csv", ["elsewhere/cat.png", "dog.png"])
    r = invoke("trust", str(photos), "--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size",
               "48", "--boxes", str(boxes), "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "readable" not in r.stderr
    assert r.stderr.startswith(f"hookviz: error: the annotations (--boxes {boxes}) name none of the photos")
    assert "'dog.png' and 1 more" in r.stderr and "s00.png" in r.stderr
    assert not (tmp_path / "o").exists()


TINY = ("--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48")


def test_unknown_annotated_classes_are_refused_before_any_photo_as_evaluate_does(tmp_path: Path) -> None:
    """An index out of the model's range and a name that is none of its classes: one line listing both,
    exit 2, no output folder left behind; ``evaluate`` says the same line of the same file."""
    x, _, _ = shapes_batch(3, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    boxes = tmp_path / "b.csv"
    boxes.write_text("file,class,x0,y0,x1,y1\ns00.png,99999,4,4,20,20\ns01.png,notaclass,4,4,20,20\n"
                     "s02.png,0,4,4,20,20\n")  # fmt: skip
    r = invoke("trust", str(photos), *TINY, "--boxes", str(boxes), "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "2 annotated class(es) are not the model's classes 0..2" in r.stderr
    assert "99999 (in s00.png)" in r.stderr and "'notaclass' (in s01.png)" in r.stderr
    assert not (tmp_path / "o").exists()
    e = invoke("evaluate", str(photos), *TINY, "--boxes", str(boxes), "--out", str(tmp_path / "e"))
    assert e.exit_code == 2 and e.stderr == r.stderr, e.stderr


def test_photos_whose_boxes_lie_outside_what_the_model_saw_are_left_out_each_named(tmp_path: Path) -> None:
    """A box beyond the photo's edge, one before it (left out as it is read, with the one warning of its
    file) and one in the border the centre crop cuts off: those photos are readable, left out and named
    (not failed); the others are tested, exit 0. With only such photos: one line, exit 2, nothing written."""
    x, _, _ = shapes_batch(5, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    boxes = tmp_path / "b.csv"
    boxes.write_text("file,class,x0,y0,x1,y1\ns00.png,0,5000,5000,6000,6000\ns01.png,0,-100,-100,-50,-50\n"
                     "s02.png,0,0,0,2,2\ns03.png,0,4,4,30,30\ns04.png,1,10,10,40,40\n")  # fmt: skip
    r = invoke(
        "trust",
        str(photos),
        *TINY,
        "--method",
        "gradcam",
        "--boxes",
        str(boxes),
        "--out",
        str(tmp_path / "o"),
    )
    assert r.exit_code == 0, r.stderr
    got = json.loads((tmp_path / "o" / "trust.json").read_text())
    assert [Path(p).name for p in got["photos"]] == ["s03.png", "s04.png"] and got["failed"] == {}
    assert f"--boxes {boxes}: 1 box(es) cover no pixel and are left out" in got["notes"][-2]
    (said,) = [n for n in got["notes"] if "left out, their annotations outside what the model saw" in n]
    assert said.startswith("3 photo(s) left out") and "could not be read" not in r.stderr
    assert f"{photos / 's00.png'} (no annotated object within its 48x48 pixels)" in said
    assert f"{photos / 's01.png'} (no annotated object within its 48x48 pixels)" in said
    assert f"{photos / 's02.png'} (its annotated objects lie outside the centre crop the model saw" in said
    assert f"note: {said}" in r.stderr
    only = [str(photos / f"s0{i}.png") for i in range(3)]
    r = invoke("trust", *only, *TINY, "--boxes", str(boxes), "--out", str(tmp_path / "o2"))
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(
        "hookviz: error: 3 photo(s) left out, their annotations outside what the model"
    )
    assert "readable" not in r.stderr and not (tmp_path / "o2").exists()


def test_a_mask_that_is_no_image_fails_its_photo_alone(tmp_path: Path) -> None:
    """``--masks`` with one file that is no PNG: that photo fails, named with its mask (exit 1, as an input
    that fails), the others are tested against their masks; ``evaluate`` fails the same photo alone."""
    x, _, shapes = shapes_batch(3, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    (tmp_path / "mk").mkdir()
    (tmp_path / "mk" / "s00.png").write_text("not a png")
    for i in (1, 2):
        write_image(
            tmp_path / "mk" / f"s{i:02d}.png", np.repeat(shapes[i][..., None] * 255, 3, 2).astype(np.uint8)
        )
    r = invoke("trust", str(photos), *TINY, "--method", "gradcam", "--masks", str(tmp_path / "mk"),
               "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 1, r.stderr
    got = json.loads((tmp_path / "o" / "trust.json").read_text())
    assert [Path(p).name for p in got["photos"]] == ["s01.png", "s02.png"]
    (why,) = got["failed"].values()
    assert list(got["failed"]) == [str(photos / "s00.png")]
    assert why.startswith(f"its mask {tmp_path / 'mk' / 's00.png'} cannot be read (")
    (line,) = [line for line in r.stderr.splitlines() if line.startswith("hookviz: error: ")]
    assert str(photos / "s00.png") in line and line.endswith(why)
    assert "localisation" in got["tests"]
    e = invoke("evaluate", str(photos), *TINY, "--masks", str(tmp_path / "mk"), "--out", str(tmp_path / "e"))
    assert e.exit_code == 1, e.stderr
    errors = [(Path(rec["input"]).name, rec.get("error", "")) for rec in records(tmp_path / "e")]
    assert [n for n, err in errors if err] == ["s00.png"] and "cannot be read" in dict(errors)["s00.png"]


def test_an_empty_folder_exits_1_as_the_documented_exit_codes_say(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    r = invoke("trust", str(tmp_path / "empty"), "--model", "tests.conftest:TinyCNN", "--weights", "none",
               "--input-size", "48", "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "0 readable photos" in r.stderr or "no photos found" in r.stderr
    assert not (tmp_path / "o").exists()
    docs = (ROOT / "docs" / "scripting.md").read_text()
    assert "| 1 | one or more inputs failed" in docs and "an empty folder" in docs


def test_a_photo_too_small_for_the_tests_is_refused_in_one_line(tmp_path: Path) -> None:
    x, _, _ = shapes_batch(2, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    write_image(photos / "tiny.png", np.full((1, 1, 3), 200, np.uint8))
    loaded = load_model("tests.conftest:TinyCNN", "none", input_size=48)
    with pytest.raises(UsageError, match="needs 2 photos"):  # one photo given: a usage error
        read_photos(loaded, [str(photos / "s00.png")], 16, DEFAULT_MAX_PIXELS)
    got = read_photos(loaded, [str(photos)], 16, DEFAULT_MAX_PIXELS)
    assert [Path(n).name for n in got.names] == ["s00.png", "s01.png"]
    (said,) = [why for name, why in got.failed.items() if Path(name).name == "tiny.png"]
    assert said == "1x1 pixels: too small for the tests (at least 8 on a side)"


def test_an_out_that_is_an_input_folder_is_refused_and_own_outputs_are_not_photos(tmp_path: Path) -> None:
    x, _, _ = shapes_batch(2, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    model = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48"]
    r = invoke("trust", str(photos), *model, "--out", str(photos))
    assert r.exit_code == 2 and "is also an input folder" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and sorted(p.name for p in photos.iterdir()) == [
        "s00.png", "s01.png"
    ]  # fmt: skip
    # An earlier run's grid inside the photos' folder (reached again through a link to the parent) is not a
    # photo of this run's --out; a user's photo kept there is.
    out = photos / "res"
    out.mkdir()
    write_image(out / "trust.png", np.full((64, 64, 3), 90, np.uint8))
    write_image(out / "mine.png", np.full((64, 64, 3), 90, np.uint8))
    (photos / "loop").symlink_to("..")
    loaded = load_model("tests.conftest:TinyCNN", "none", input_size=48)
    got = read_photos(loaded, [str(photos)], 16, DEFAULT_MAX_PIXELS, out=out)
    assert sorted(Path(n).name for n in got.names) == ["mine.png", "s00.png", "s01.png"]
    seen = read_photos(loaded, [str(photos)], 16, DEFAULT_MAX_PIXELS)  # without --out: every photo
    assert sorted(Path(n).name for n in seen.names) == ["mine.png", "s00.png", "s01.png", "trust.png"]


def test_the_recorded_command_gives_back_inputs_whose_names_start_with_a_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex

    import typer

    from hookviz.cli import app

    x, _, _ = shapes_batch(2, np.random.default_rng(1))
    for name, image in zip(["-rf.png", "--out.png"], x, strict=True):
        write_image(tmp_path / name, (image.numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8))
    monkeypatch.chdir(tmp_path)
    model = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48"]
    r = invoke("trust", *model, "--method", "gradcam", "-q", "--out", "-o", "--", "-rf.png", "--out.png")
    assert r.exit_code == 0, r.stderr
    data = json.loads((tmp_path / "-o" / "trust.json").read_text())
    words = shlex.split(data["command"])
    assert words[:2] == ["hookviz", "trust"] and data["command"] in (tmp_path / "-o" / "trust.md").read_text()
    command = typer.main.get_command(app)
    with command.make_context("hookviz", ["trust", "--help"], resilient_parsing=True) as ctx:
        trust_command = command.get_command(ctx, "trust")  # type: ignore[attr-defined]
    params = trust_command.make_context("trust", words[2:]).params
    assert list(params["inputs"]) == ["-rf.png", "--out.png"] and params["out"] == Path("-o")
    assert params["model"] == "tests.conftest:TinyCNN" and list(params["methods"]) == ["gradcam"]


def test_a_photo_named_with_a_newline_fails_in_one_line(tmp_path: Path) -> None:
    x, _, _ = shapes_batch(2, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    (photos / "evil\nname.png").write_bytes(b"not a photo")
    r = invoke("trust", str(photos), "--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size",
               "48", "--method", "gradcam", "-q", "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 1, r.stderr
    (line,) = [la for la in r.stderr.splitlines() if la.startswith("hookviz: error:")]
    assert line.startswith(f"hookviz: error: {str(photos / 'evil')!r}"[:-1] + "\\nname.png': ")
    assert "name.png" not in r.stderr.replace(line, "")  # no other line holds a piece of the name
    assert not (tmp_path / "o" / "manifest.jsonl").exists()  # trust writes none


def test_the_help_of_out_says_what_trust_writes_there() -> None:
    """trust writes trust.json, trust.md and trust.png, no manifest.jsonl: its --out help says so (as the
    generated docs/cli/trust.md does), not the other commands' "manifest.jsonl is appended there"."""
    import typer

    from hookviz.cli import app

    command = typer.main.get_command(app)
    with command.make_context("hookviz", ["trust", "--help"], resilient_parsing=True) as ctx:
        trust_command = command.get_command(ctx, "trust")  # type: ignore[attr-defined]
    (out,) = [p for p in trust_command.params if p.name == "out"]
    said = "output folder: trust.json, trust.md and trust.png are written there (no manifest.jsonl)."
    assert out.help == said and said in (ROOT / "docs" / "cli" / "trust.md").read_text()


def test_the_python_trust_takes_a_comma_string_refuses_a_bool_budget_and_says_what_max_photos_took(
    tmp_path: Path,
) -> None:
    x, _, _ = shapes_batch(2, np.random.default_rng(1))
    photos = _folder(tmp_path / "photos", x)
    loaded = load_model("tests.conftest:TinyCNN", "none", input_size=48)
    report = hookviz.trust(loaded, photos, methods="gradcam,saliency", layers="features", budget=60)
    tested = [(c.method, c.layer) for c in report.candidates]
    assert tested == [("gradcam", "features"), ("saliency", "features"), ("edges", "-")]
    one = hookviz.trust(loaded, photos, methods="gradcam", layers=["features"], budget="60")
    assert [c.method for c in one.candidates] == ["gradcam", "edges"] and len(one.photos) == 2
    for flag in (True, False):
        with pytest.raises(UsageError, match=f"--budget {flag}: a time above zero"):
            hookviz.trust(loaded, photos, methods="gradcam", budget=flag)
    with pytest.raises(UsageError, match=r"max_photos=1 took the first 1 of the 2 photos found among "):
        hookviz.trust(loaded, photos, methods="gradcam", max_photos=1)


def _drawn_codes(image: np.ndarray, x0: int, base: int, n: int) -> str:
    """The ``n`` characters ``render.put_text`` drew at ``(x0, base)`` at scale 0.45 under
    HOOKVIZ_TEST_TEXT=codes (each a cell 7 pixels wide, its code's bits as white rows from 10 pixels above
    the baseline)."""
    white = (image == 255).all(axis=2)
    bits = [[int(white[base - 10 + b, x0 + i * 7 + 3]) for b in range(8)] for i in range(n)]
    return "".join(chr(sum(bit << b for b, bit in enumerate(code))) for code in bits)


def test_the_grid_shows_each_candidates_whole_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trust.png's first column is as wide as its longest row name: names were cut at 34 characters
    (docs/img/trust-grid.png read 'guidedbackprop @ _avg_pooling:inpu')."""
    monkeypatch.setenv("HOOKVIZ_TEST_TEXT", "codes")  # each character drawn as its code: read back below
    test = {"name": "class", "value": 0.2, "ci": 0.05, "outcome": "pass", "rule": "r", "per_photo": [0.2]}
    rows = [("gradcam", "_avg_pooling:input"), ("guidedbackprop", "_blocks.15._depthwise_conv:input")]
    (tmp_path / "trust.json").write_text(json.dumps({
        "model": "m", "photos": ["a"], "seed": 0, "default": None, "answer": "a", "notes": [],
        "tests": ["class"], "key": {"model": "m", "weights": "none"},
        "candidates": [{"method": m, "layer": layer, "verdict": "recommended", "reason": "r",
                        "control": False, "tests": {"class": test}} for m, layer in rows],
        "model_check": {"entropy": 0.1, "flips": 0.0, "same_class": False, "at_chance": False,
                        "reason": "ok"},
    }))  # fmt: skip
    report = read_trust(tmp_path).report
    image = grid(report)
    for i, (method, layer) in enumerate(rows, start=1):
        name = f"{method} @ {layer}"
        assert _drawn_codes(image, 6, 28 * i + 19, len(name)) == name
    # The first test's column starts past the longest name (7 pixels a character, a margin each side).
    assert (
        report.tests == ["class"] and image.shape[1] == 6 + 7 * len(f"{rows[1][0]} @ {rows[1][1]}") + 10 + 260
    )
