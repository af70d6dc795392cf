"""The method catalogue beyond the references: where the maps land on a trained model, the properties a
method must have whatever its reference (completeness, the network-after-the-layer shortcut), the cost and
settings in every record, D-RISE on the detector, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from hookviz import methods as registry
from hookviz.engine.explain import explain
from hookviz.methods import MethodOptions
from tests.conftest import (
    TinyCNN,
    Trained,
    evaluation_file,
    hook_counts,
    invoke,
    records,
    shapes_batch,
    write_image,
)
from tests.test_localisation import _peak_hits

FAST = MethodOptions(samples=4, steps=16, masks=400, window=8, stride=4)


@pytest.fixture(scope="module")
def held_out() -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    return shapes_batch(60, np.random.default_rng(123))


LAYER_METHODS = [
    m.name for m in registry.REGISTRY.values()
    if m.class_specific and m.resolution == "layer" and m.name not in ("sscam", "iscam", "drise")
    and m.family != "attention"  # a CNN has none: tests/test_attention.py localises them on a ViT
]  # fmt: skip


def test_every_class_specific_cam_peaks_on_the_explained_shape(
    trained: Trained, held_out: tuple[torch.Tensor, torch.Tensor, np.ndarray]
) -> None:
    """60 held-out images (shapes cover 8.5 % of them): each CAM's peak lies in the shape on >= 95 %."""
    x, y, masks = held_out
    ex = explain(trained.model, x, ["features"], LAYER_METHODS, y, options=FAST)
    rates = {
        m: float(_peak_hits(ex.maps[(m, "features")][:, 0].numpy(), masks).mean()) for m in LAYER_METHODS
    }
    print(rates)
    assert min(rates.values()) >= 0.95, rates


@pytest.mark.slow  # 15 s: make test runs it
def test_perturbation_cams_and_pixel_maps_find_the_shape_far_above_chance(
    trained: Trained, held_out: tuple[torch.Tensor, torch.Tensor, np.ndarray]
) -> None:
    """SS-CAM and IS-CAM (20 images) and the pixel maps: their peak in the shape at least 3x as often as a
    random point's 8.5 % (FullGrad is left out: its bias terms light every edge; it equals its reference)."""
    x, y, masks = held_out
    slow = explain(trained.model, x[:20], ["features"], ["sscam", "iscam"], y[:20], options=FAST)
    pixel = [
        "saliency",
        "inputxgradient",
        "smoothgrad",
        "vargrad",
        "integratedgradients",
        "occlusion",
        "rise",
    ]
    ex = explain(trained.model, x, ["features"], pixel, y, options=FAST)
    rates = {
        m: float(_peak_hits(slow.maps[(m, "features")][:, 0].numpy(), masks[:20]).mean())
        for m in slow.methods
    }
    rates |= {m: float(_peak_hits(ex.maps[(m, "features")][:, 0].numpy(), masks).mean()) for m in pixel}
    print(rates)
    assert rates["sscam"] >= 0.7 and rates["iscam"] >= 0.9, rates
    assert min(rates[m] for m in pixel) >= 3 * float(masks.mean()), rates


def test_randomcam_ranks_with_the_random_baseline_not_with_the_cams(
    trained: Trained, held_out: tuple[torch.Tensor, torch.Tensor, np.ndarray]
) -> None:
    """Random weights over real activations: its insertion - deletion AUC lies nearer evaluate's random
    baseline than Grad-CAM's (not at it: the activations it weighs still fire on the object)."""
    from hookviz import evaluation

    x, y, _ = held_out
    x, y = x[:24], y[:24]
    ex = explain(trained.model, x, ["features"], ["gradcam", "randomcam"], y)
    score = {}
    for m in ("gradcam", "randomcam"):
        f = evaluation.faithfulness(trained.model, x, ex.maps[(m, "features")][:, 0], y)
        score[m] = float((f.insertion_auc - f.deletion_auc).mean())
    f = evaluation.faithfulness(trained.model, x, evaluation.random_maps(24, 12, 12, x=x), y)
    score["random"] = float((f.insertion_auc - f.deletion_auc).mean())
    print(score)
    assert score["gradcam"] > score["randomcam"] > score["random"] - 0.05
    assert score["randomcam"] - score["random"] < score["gradcam"] - score["randomcam"], score


def test_integrated_gradients_is_complete(trained: Trained) -> None:
    """The axiom: the attributions sum to f(x) - f(baseline), within 1 % of the largest gap with 128
    Gauss-Legendre points (a ReLU network's path integrand has kinks, so the rule is not exact)."""
    x, y, _ = shapes_batch(3, np.random.default_rng(3))
    for baseline, base in (("mean", torch.zeros_like(x)), ("black", torch.full_like(x, -0.5))):
        opts = MethodOptions(steps=128, baseline=baseline, input_floor=(-0.5, -0.5, -0.5))
        ex = explain(trained.model, x, ["features"], ["integratedgradients"], y, relu=False, options=opts)
        total = ex.maps[("integratedgradients", "features")][:, 0].sum(dim=(1, 2))
        with torch.no_grad():
            gap = (
                trained.model(x).gather(1, y[:, None])[:, 0] - trained.model(base).gather(1, y[:, None])[:, 0]
            )
        assert torch.allclose(total, gap, rtol=0, atol=0.01 * float(gap.abs().max())), (baseline, total, gap)


class Concat(nn.Module):
    """A DenseNet-style block: the layer's output is concatenated with an earlier tensor (so the network after
    the layer cannot broadcast one image's earlier tensors over many ablated copies)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layer = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.stem(x))
        return self.head(torch.cat([s, self.layer(s)], dim=1).mean(dim=(2, 3)))


@pytest.mark.slow  # 13 s each: make test runs it
@pytest.mark.parametrize("kind", ["broadcast", "concat"])
def test_ablationcam_equals_ablating_each_channel_by_hand(kind: str) -> None:
    """Only the network after the layer runs per channel (earlier tensors broadcast over the copies), or
    the copies of the image when it cannot: either way the weights are those of ablating each channel in
    a full forward pass, by hand."""
    torch.manual_seed(0)
    if kind == "broadcast":
        import torchvision

        model, layer = torchvision.models.resnet18(weights=None, num_classes=3).eval(), "layer3.0"
        module = model.layer3[0]
    else:
        model, layer = Concat().eval(), "layer"
        module = model.layer
    x = torch.rand(2, 3, 64, 64)
    ex = explain(model, x, [layer], ["ablationcam"], [1], options=MethodOptions(batch=40))
    kept: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda m, i, o: kept.append(o))
    with torch.no_grad():
        y = model(x)[:, 1]
    handle.remove()
    a = kept[0]
    want = []
    for i in range(2):
        value = 0.0 if float(a[i].min()) == 0 else float(a[i].min()) - 1e7
        w = []
        for k in range(a.shape[1]):
            ablated = a[i : i + 1].clone()
            ablated[:, k] = value
            handle = module.register_forward_hook(lambda m, inp, o, ab=ablated: ab)
            with torch.no_grad():
                w.append(float((y[i] - model(x[i : i + 1])[0, 1]) / y[i]))
            handle.remove()
        want.append(torch.relu((torch.tensor(w)[:, None, None] * a[i]).sum(0)))
    got = ex.maps[("ablationcam", layer)][:, 0]
    assert torch.allclose(got, torch.stack(want), rtol=1e-4, atol=1e-5 * float(got.abs().max()))


def test_rise_is_its_formula_over_its_masks(trained: Trained) -> None:
    from hookviz.methods.perturb import random_masks

    x, y, _ = shapes_batch(2, np.random.default_rng(8))
    opts = MethodOptions(masks=50, cells=5, seed=9, batch=16)
    got = explain(trained.model, x, ["features"], ["rise"], y, options=opts).maps[("rise", "features")][:, 0]
    m = random_masks(50, 5, (48, 48), 9)
    assert m.shape == (50, 48, 48) and 0.3 < float(m.mean()) < 0.7
    with torch.no_grad():
        p = torch.stack([torch.softmax(trained.model(x * mk), 1).gather(1, y[:, None])[:, 0] for mk in m])
    want = torch.einsum("nb,nhw->bhw", p, m) / (50 * 0.5)
    assert torch.allclose(got, want, atol=1e-5)
    other = explain(
        trained.model, x, ["features"], ["rise"], y, options=MethodOptions(masks=50, cells=5, seed=10)
    )
    assert not torch.allclose(other.maps[("rise", "features")][:, 0], got)


@pytest.mark.parametrize(
    "method", ["finercam", "shapleycam", "smoothgradcampp", "ablationcam", "fullgrad", "sscam", "cam"]
)
def test_methods_with_their_own_passes_leave_the_model_as_found(method: str) -> None:
    model = TinyCNN().eval()
    model.features[0].weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = hook_counts(model)
    x = torch.rand(2, 3, 32, 32)
    opts = MethodOptions(samples=2, batch=16)
    try:  # Grad-CAM's layer for CAM: refused (the gradient varies), after its pass ran
        explain(model, x, ["features.6" if method == "cam" else "features"], [method], options=opts)
    except Exception as e:
        assert method == "cam", e
    assert not model.training and hook_counts(model) == hooks
    assert all(p.grad is None for p in model.parameters())
    assert not model.features[0].weight.requires_grad and model.features[4].weight.requires_grad
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_family_selectors_settings_costs_and_refusals_on_the_command_line(tmp_path: Path) -> None:
    pixel = [
        m.name
        for m in registry.REGISTRY.values()
        if m.family in ("input-gradient", "pixel-perturbation") and not m.detection_only
    ]
    assert registry.parse(["pixel"]) == pixel
    assert set(registry.parse(["perturbation"])) >= {
        "scorecam",
        "ablationcam",
        "sscam",
        "iscam",
        "occlusion",
        "rise",
    }
    assert registry.parse(["saliency, occlusion"]) == ["saliency", "occlusion"]
    photo = write_image(tmp_path / "p.png", np.random.default_rng(0).integers(0, 256, (40, 50, 3), np.uint8))
    out = tmp_path / "out"
    r = invoke("gradcam", str(photo), "--weights", "none", "--input-size", "48", "--method", "rise,saliency",
               "--method", "ablationcam", "--masks", "40", "--seed", "5", "--out", str(out))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "RISE runs 40 forward passes per image (one forward pass per random mask)" in r.stderr
    assert "Saliency runs" not in r.stderr  # one pass per target: under the threshold, no note
    assert "Ablation-CAM runs 512 forward passes per image at layer4" in r.stderr
    (rec,) = records(out)
    by = {m["method"]: m for m in rec["maps"]}
    assert by["rise"]["passes"] == {"forward": 40, "backward": 0}
    assert "passes" not in by["saliency"]  # the shared pass's own backward, taken to the input
    assert by["ablationcam"]["passes"] == {"forward": 512, "backward": 0}
    assert rec["options"] == {"seed": 5, "masks": 40, "cells": 7, "batch": 64}
    r = invoke("gradcam", str(photo), "--weights", "none", "--input-size", "48", "--method", "drise",
               "--out", str(tmp_path / "o2"))  # fmt: skip
    assert (
        r.exit_code != 0 and r.stderr.count("\n") == 1 and "for a classification model use rise" in r.stderr
    )
    r = invoke("gradcam", str(photo), "--weights", "none", "--baseline", "grey",
               "--method", "integratedgradients", "--out", str(tmp_path / "o3"))  # fmt: skip
    assert r.exit_code == 2 and "--baseline grey: one of black, mean, blur" in r.stderr


def test_drise_peaks_in_each_detected_box_and_runs_from_the_cli(tmp_path: Path) -> None:
    """D-RISE on the shapes detector: every box's map peaks inside that box (4 scenes, 200 masks); from the
    CLI a class-agnostic method (FEM) gives one map per photo next to D-RISE's one per box."""
    import cv2

    from hookviz.engine.detection import explain_detections
    from hookviz.tasks import load_model
    from tests.test_dense import DETECTOR, FIXTURE, NAMES, photo, scenes

    det = load_model(DETECTOR, str(FIXTURE), labels=NAMES)
    hits = total = 0
    for img, _boxes, _labels, _ in scenes(4, seed=21, height=120, width=160, sizes=(9, 18)):
        x = torch.from_numpy(photo(img).transpose(2, 0, 1).copy()).float() / 255
        opts = MethodOptions(masks=200, cells=8, batch=16)
        [ex] = explain_detections(det.model, [x], ["backbone.2"], ["drise"], options=opts)
        for cam, b in zip(ex.maps[("drise", "backbone.2")], ex.boxes, strict=True):
            up = cv2.resize(cam.numpy(), (160, 120))
            py, px = np.unravel_index(int(up.argmax()), up.shape)
            x0, y0, x1, y1 = b.tolist()
            hits += x0 - 2 <= px <= x1 + 2 and y0 - 2 <= py <= y1 + 2
            total += 1
    assert total >= 6 and hits == total, (hits, total)
    img = scenes(1, seed=21, height=120, width=160, sizes=(9, 18))[0][0]
    src = write_image(tmp_path / "scene.png", photo(img))
    out = tmp_path / "out"
    names = tmp_path / "labels.txt"
    names.write_text("\n".join(NAMES) + "\n")
    r = invoke("gradcam", str(src), "--model", DETECTOR, "--weights", str(FIXTURE), "--labels", str(names),
               "--method", "drise,fem", "--masks", "24", "--out", str(out))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "D-RISE runs 24 detector passes per photo" in r.stderr
    (rec,) = records(out)
    boxes = len(rec["detections"])
    assert [m["box"] for m in rec["maps"] if m["method"] == "drise"] == list(range(1, boxes + 1))
    assert [m["box"] for m in rec["maps"] if m["method"] == "fem"] == [None]
    assert rec["options"]["masks"] == 24


def test_evaluate_sanity_metrics_and_report_take_the_new_methods(tmp_path: Path) -> None:
    """Pixel, perturbation and control methods through evaluate (a row each), sanity (a strip each), gradcam
    --metrics and the report, with their settings recorded."""
    import csv
    import json

    rng = np.random.default_rng(1)
    photos = tmp_path / "in"
    photos.mkdir()
    for i in range(2):
        write_image(photos / f"p{i}.png", rng.integers(0, 256, (40, 50, 3), np.uint8))
    model = ["--weights", "none", "--input-size", "48"]
    chosen = "saliency,occlusion,randomcam"
    settings = ["--window", "24", "--stride", "24", "--seed", "4"]
    r = invoke("evaluate", str(photos), *model, "--method", chosen, *settings, "--out", str(tmp_path / "e"))
    assert r.exit_code == 0, r.stderr
    rows = list(csv.DictReader(evaluation_file(tmp_path / "e", ext="csv").read_text().splitlines()))
    assert [row["method"] for row in rows] == ["saliency", "occlusion", "randomcam", "random", "center"]
    r = invoke(
        "sanity", str(photos / "p0.png"), *model, "--method", chosen, *settings, "--out", str(tmp_path / "s")
    )
    assert r.exit_code == 0, r.stderr
    steps = json.loads((tmp_path / "s" / "sanity.json").read_text())["steps"]
    assert {s["method"] for s in steps} == {"saliency", "occlusion", "randomcam", "edges"}
    out = tmp_path / "g"
    r = invoke("gradcam", str(photos), *model, "--method", chosen, *settings, "--metrics", "--report",
               "--out", str(out), "-q")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    recs = records(out)
    assert all(rec["options"] == {"seed": 4, "window": 24, "stride": 24, "baseline": "black", "batch": 64}
               for rec in recs)  # fmt: skip
    assert all("metrics" in m for rec in recs for m in rec["maps"])
    page = (out / "index.html").read_text()
    assert '"occlusion"' in page and '"randomcam"' in page
