"""Every metric of ``hookviz evaluate`` against Quantus 0.6 (a test-only dependency) on the same model,
input, map and settings; where Quantus has none, against a hand-made case computed here.

The model is a small random CNN on 12 x 12 inputs (fast in Quantus's per-sample loops); the maps are random
(no ties, so the order of the pixels is the same in both) at the input's resolution.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import quantus
import torch
from torch import nn

from hookviz.engine.explain import explain
from hookviz.evaluation import localisation as loc
from hookviz.evaluation import perturbation as pert
from hookviz.evaluation import random_logit, randomised_models, spearman
from hookviz.evaluation import robustness as rob_module
from hookviz.evaluation.robustness import robustness

B, H = 6, 12


def _net(channels: int = 3, classes: int = 4) -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(32, classes),
    ).eval()


@pytest.fixture(scope="module")
def case() -> dict[str, Any]:
    model = _net()
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(B, 3, H, H)).astype(np.float32))
    y = model(x).argmax(1)
    a = torch.from_numpy(np.random.default_rng(1).random((B, H, H)).astype(np.float32))
    return {"model": model, "x": x, "y": y, "a": a}


def _q(metric: Any, c: dict[str, Any], **kwargs: Any) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = metric(
            model=c["model"],
            x_batch=c["x"].numpy(),
            y_batch=c["y"].numpy(),
            a_batch=c["a"][:, None].numpy(),
            device="cpu",
            **kwargs,
        )
    return np.asarray(out, dtype=np.float64)


def test_pixel_flipping_equals_quantus(case: dict[str, Any]) -> None:
    ours = pert.pixel_flipping(case["model"], case["x"], case["a"], case["y"], pixels_per_step=4)
    theirs = _q(
        quantus.PixelFlipping(features_in_step=3 * 4, perturb_baseline=0.0, disable_warnings=True), case
    )
    assert ours.curve.shape == theirs.shape == (B, H * H // 4)
    np.testing.assert_allclose(ours.curve.numpy(), theirs, atol=1e-6)
    assert ours.forward_passes == B * H * H // 4


def test_region_perturbation_equals_quantus(case: dict[str, Any]) -> None:
    ours = pert.region_perturbation(case["model"], case["x"], case["a"], case["y"], patch_size=4, regions=9)
    theirs = _q(
        quantus.RegionPerturbation(
            patch_size=4, regions_evaluation=9, perturb_baseline=0.0, disable_warnings=True
        ),
        case,
    )
    np.testing.assert_allclose(ours.curve.numpy(), theirs, atol=1e-6)
    np.testing.assert_allclose(ours.summary.numpy(), theirs.mean(axis=1), atol=1e-6)


def test_noisy_linear_imputation_equals_quantus() -> None:
    from quantus.functions.perturb_func import noisy_linear_imputation

    x = torch.from_numpy(np.random.default_rng(2).normal(size=(3, 9, 11)))
    removed = torch.from_numpy(np.random.default_rng(3).random(99) < 0.6)
    ours = pert.noisy_linear_imputation(x, removed, noise=0.0)
    theirs = noisy_linear_imputation(x.numpy(), np.flatnonzero(removed.numpy()), noise=0.0)
    np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-10)
    assert torch.equal(ours.flatten(1)[:, ~removed], x.flatten(1)[:, ~removed])  # the rest untouched
    # The solution is the weighted mean of the 8 neighbours at every removed pixel away from the border.
    i = next(int(k) for k in torch.nonzero(removed)[:, 0] if 0 < k // 11 < 8 and 0 < k % 11 < 10)
    r, col = divmod(i, 11)
    patch = ours[:, r - 1 : r + 2, col - 1 : col + 2]
    weights = torch.tensor([[1, 2, 1], [2, 0, 2], [1, 2, 1]], dtype=ours.dtype) / 12
    torch.testing.assert_close((patch * weights).sum(dim=(1, 2)), ours[:, r, col])


def test_road_equals_quantus_on_a_grey_image_model() -> None:
    """Quantus's ROAD indexes the maps' pixels across colour channels (an IndexError on RGB input with one
    map per pixel), so the comparison is on a one-channel model; noise 0 makes it deterministic."""
    # The class is the brightest quadrant: removing pixels can change the model's mind.
    model = nn.Sequential(nn.Conv2d(1, 1, 1), nn.AdaptiveAvgPool2d(2), nn.Flatten()).eval()
    x = torch.from_numpy(np.random.default_rng(4).normal(size=(B, 1, H, H)).astype(np.float32))
    c = {
        "model": model,
        "x": x,
        "y": model(x).argmax(1),
        "a": torch.rand(B, H, H, generator=torch.Generator().manual_seed(5)),
    }
    percentages = [10, 30, 50, 70, 90]
    ours = pert.road(model, x, c["a"], c["y"], percentages=percentages, noise=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = quantus.ROAD(percentages=percentages, noise=0.0, disable_warnings=True)(
            model=model,
            x_batch=x.numpy(),
            y_batch=c["y"].numpy(),
            a_batch=c["a"][:, None].numpy(),
            device="cpu",
        )
    np.testing.assert_allclose(ours.morf_correct.mean(dim=0).numpy(), [theirs[p] for p in percentages])
    assert ours.morf.shape == ours.lerf.shape == (B, 5) and ours.forward_passes == 2 * 5 * B
    assert 0.0 < float(ours.morf_correct.mean()) < 1.0  # the comparison is not all-or-nothing


def _masks() -> torch.Tensor:
    masks = torch.zeros(B, H, H, dtype=torch.bool)
    for i, (y0, x0, h, w) in enumerate(
        [(0, 0, 4, 4), (2, 3, 6, 5), (5, 5, 7, 7), (1, 8, 3, 4), (0, 0, 12, 12), (6, 0, 2, 12)]
    ):
        masks[i, y0 : y0 + h, x0 : x0 + w] = True
    return masks


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (
            lambda a, s: loc.pointing_game(a, s, tolerance=0),
            lambda: quantus.PointingGame(disable_warnings=True),
        ),
        (loc.relevance_mass, lambda: quantus.RelevanceMassAccuracy(disable_warnings=True)),
        (loc.relevance_rank, lambda: quantus.RelevanceRankAccuracy(disable_warnings=True)),
        (
            lambda a, s: loc.top_k_intersection(a, s, k=20),
            lambda: quantus.TopKIntersection(k=20, disable_warnings=True),
        ),
    ],
    ids=["pointing", "mass", "rank", "topk"],
)
def test_localisation_equals_quantus(case: dict[str, Any], ours: Callable, theirs: Callable) -> None:
    s = _masks()
    a = case["a"].clone()
    a[0, 1, 1] = 2.0  # image 0's maximum on its object, image 2's off it
    a[2, 0, 0] = 2.0
    values = ours(a, s).numpy()
    np.testing.assert_allclose(values, _q(theirs(), {**case, "a": a}, s_batch=s[:, None].numpy()), atol=1e-6)
    assert len(set(np.round(values, 6))) > 1  # not one value for all six


def test_pointing_game_tolerance_and_the_energy_game_by_hand() -> None:
    mask = torch.zeros(1, 40, 40, dtype=torch.bool)
    mask[0, 10:20, 10:20] = True
    cam = torch.zeros(1, 40, 40)
    cam[0, 19 + 15, 15] = 1.0  # 15 pixels below the object: a hit at the paper's tolerance, not at 14
    assert float(loc.pointing_game(cam, mask)) == 1.0 and float(loc.pointing_game(cam, mask, 14)) == 0.0
    cam[0, 12, 12] = 0.5  # energy: min-max scaled, 0.5 of 1.5 inside
    assert float(loc.energy_pointing_game(cam, mask)) == pytest.approx(0.5 / 1.5)
    assert np.isnan(float(loc.pointing_game(cam, torch.zeros_like(mask))))  # nothing to point at


def test_complexity_equals_quantus(case: dict[str, Any]) -> None:
    a = case["a"] - 0.3  # signed: both take |map|
    for ours, theirs in ((loc.sparseness, quantus.Sparseness), (loc.complexity, quantus.Complexity)):
        np.testing.assert_allclose(
            ours(a).numpy(), _q(theirs(disable_warnings=True), {**case, "a": a}), rtol=1e-5
        )
    flat, peak = torch.ones(1, H, H), torch.zeros(1, H, H)
    peak[0, 3, 3] = 1.0
    assert float(loc.sparseness(flat)) == pytest.approx(0.0, abs=1e-6) and float(loc.sparseness(peak)) > 0.99
    assert float(loc.complexity(flat)) == pytest.approx(np.log(H * H)) and float(loc.complexity(peak)) < 1e-4


def _gradcam(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    ex = explain(model, x, ["2"], ["gradcam"], [int(v) for v in y], relu=False)
    return torch.nn.functional.interpolate(ex.maps[("gradcam", "2")][:, :1], size=x.shape[2:])[:, 0]


def test_robustness_equals_quantus(case: dict[str, Any]) -> None:
    """The same four perturbed inputs for both (a replayed draw): sensitivity, RIS and ROS agree."""
    model, x, y = case["model"], case["x"], case["y"]
    gen = torch.Generator().manual_seed(7)
    draws = [rob_module.uniform_noise(x, 0.01, gen) for _ in range(4)]
    maps = _gradcam(model, x, y)
    ours = robustness(
        model, lambda xp, _k: _gradcam(model, xp, y), x, maps, samples=4, perturb=lambda _x, k: draws[k]
    )
    assert not torch.isnan(ours.relative_input_stability).any()  # no draw changed a prediction

    def quantus_explain(model: nn.Module, inputs: np.ndarray, targets: np.ndarray, **_: Any) -> np.ndarray:
        return _gradcam(model, torch.from_numpy(inputs), torch.from_numpy(targets))[:, None].detach().numpy()

    def replay() -> Callable[..., np.ndarray]:
        k = [0]

        def perturb(arr: np.ndarray, **_: Any) -> np.ndarray:
            k[0] += 1
            return draws[k[0] - 1].reshape(arr.shape).numpy()

        return perturb

    c = {**case, "a": maps}
    common = {"nr_samples": 4, "disable_warnings": True}
    for got, metric in (
        (ours.max_sensitivity, quantus.MaxSensitivity(perturb_func=replay(), **common)),
        (ours.avg_sensitivity, quantus.AvgSensitivity(perturb_func=replay(), **common)),
        (ours.relative_input_stability, quantus.RelativeInputStability(perturb_func=replay(), **common)),
        (ours.relative_output_stability, quantus.RelativeOutputStability(perturb_func=replay(), **common)),
    ):
        np.testing.assert_allclose(
            got.numpy(), _q(metric, c, explain_func=quantus_explain, softmax=False), rtol=1e-4
        )


@pytest.mark.parametrize("order", ["top_down", "independent"])
def test_parameter_randomisation_equals_quantus_layer_by_layer(case: dict[str, Any], order: str) -> None:
    model, x, y = case["model"], case["x"], case["y"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    original = _gradcam(model, x, y).abs()
    ours = {
        step: [spearman(original[i], _gradcam(m, x, y).abs()[i]) for i in range(B)]
        for step, m in randomised_models(
            model, order="cascading" if order == "top_down" else "independent", granularity="layer", seed=42
        )
    }

    def quantus_explain(model: nn.Module, inputs: np.ndarray, targets: np.ndarray, **_: Any) -> np.ndarray:
        return _gradcam(model, torch.from_numpy(inputs), torch.from_numpy(targets))[:, None].detach().numpy()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = quantus.MPRT(layer_order=order, seed=42, disable_warnings=True)(
            model=model, x_batch=x.numpy(), y_batch=y.numpy(), a_batch=None, device="cpu",
            explain_func=quantus_explain,
        )  # fmt: skip
    theirs.pop("original")
    # Both from the head down; Quantus lists the independent steps from the input up (order is moot there).
    assert list(ours) == ["6", "2", "0"] and sorted(theirs) == ["0", "2", "6"]
    for step in ours:
        np.testing.assert_allclose(ours[step], theirs[step], atol=1e-6)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_random_logit_draws_the_classes_quantus_draws(case: dict[str, Any]) -> None:
    model, x, y = case["model"], case["x"], case["y"]

    def sim(a: torch.Tensor, b: torch.Tensor) -> float:
        return spearman(a, b)

    ours = random_logit(lambda t: _gradcam(model, x, t), y, 4, seed=42, similarity=sim)
    assert not (ours["classes"] == y).any()

    def quantus_explain(model: nn.Module, inputs: np.ndarray, targets: np.ndarray, **_: Any) -> np.ndarray:
        return _gradcam(model, torch.from_numpy(inputs), torch.from_numpy(targets))[:, None].detach().numpy()

    def quantus_sim(a: np.ndarray, b: np.ndarray, batched: bool = True) -> list[float]:
        return [sim(torch.from_numpy(p), torch.from_numpy(q)) for p, q in zip(a, b, strict=True)]

    theirs = _q(
        quantus.RandomLogit(num_classes=4, seed=42, similarity_func=quantus_sim, disable_warnings=True),
        {**case, "a": _gradcam(model, x, y)},
        explain_func=quantus_explain,
    )
    np.testing.assert_allclose(ours["similarity"].numpy(), theirs, atol=1e-6)
