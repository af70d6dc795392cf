"""Metric throughput: hookviz's evaluation metrics against Quantus 0.6's on the same model, inputs, maps and
settings, as ratios from ONE run.

``python bench/metrics_bench.py`` (``make bench`` runs it). resnet18 (weights=None), a batch of images at
``--size``, Grad-CAM maps at layer4 (upsampled to the input, as Quantus takes them), each image's top-1
class. Interleaved rounds in a shuffled order; medians. Both sides run the model on the CPU in batches.
ROAD is compared on the noisy linear imputation alone (Quantus's ROAD stops with an IndexError on RGB input
with one map per pixel).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import contextlib
import io
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import medians


def rows(rounds: int, batch: int, size: int) -> list[tuple[str, float, float]]:
    import quantus
    from quantus.functions.perturb_func import noisy_linear_imputation as q_nli

    from hookviz.engine.explain import explain
    from hookviz.evaluation import localisation as loc
    from hookviz.evaluation import perturbation as pert
    from hookviz.evaluation import random_logit, randomised_models, spearman
    from hookviz.evaluation.robustness import robustness, uniform_noise

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(batch, 3, size, size)
    with torch.no_grad():
        y = model(x).argmax(1)

    def cam(m: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        maps = explain(m, inputs, ["layer4"], ["gradcam"], targets).maps[("gradcam", "layer4")][:, 0]
        return torch.nn.functional.interpolate(maps[:, None], size=inputs.shape[2:], mode="bilinear")[:, 0]

    a = cam(model, x, y)
    masks = torch.zeros(batch, size, size, dtype=torch.bool)
    masks[:, size // 4 : size // 2, size // 3 : 2 * size // 3] = True
    xn, yn, an, sn = x.numpy(), y.numpy(), a[:, None].numpy(), masks[:, None].numpy()

    def q(metric: Any, **kw: Any) -> Callable[[], object]:
        def run() -> object:
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                return metric(
                    model=model, x_batch=xn, y_batch=yn, a_batch=an, device="cpu", batch_size=batch, **kw
                )

        return run

    def q_explain(model: torch.nn.Module, inputs: np.ndarray, targets: np.ndarray, **_: Any) -> np.ndarray:
        return cam(model, torch.from_numpy(inputs), torch.from_numpy(targets))[:, None].detach().numpy()

    # Quantus counts a map's value once per colour channel and wants its step to divide H x W, which has no
    # factor 3 at 224 or 112: its 16ths of H x W are 48 steps over the 3 channels; ours flips whole pixels
    # in as many steps.
    step = size * size // 16
    gen = torch.Generator().manual_seed(0)
    draws = [uniform_noise(x, 0.02, gen) for _ in range(4)]

    def replay() -> Callable[..., np.ndarray]:
        k = [0]

        def perturb(arr: np.ndarray, **_: Any) -> np.ndarray:
            k[0] += 1
            return draws[(k[0] - 1) % 4].reshape(arr.shape).numpy()

        return perturb

    removed = torch.zeros(size * size, dtype=torch.bool)
    removed[torch.randperm(size * size, generator=torch.Generator().manual_seed(1))[: size * size // 2]] = (
        True
    )
    idx = np.flatnonzero(removed.numpy())
    pairs: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        (
            "pixel flipping, 48 steps",
            lambda: pert.pixel_flipping(model, x, a, y, pixels_per_step=-(-size * size // 48)),
            q(quantus.PixelFlipping(features_in_step=step, perturb_baseline=0.0, disable_warnings=True)),
        ),
        (
            "region perturbation, 8 px patches, 16 regions",
            lambda: pert.region_perturbation(model, x, a, y, patch_size=8, regions=16),
            q(
                quantus.RegionPerturbation(
                    patch_size=8, regions_evaluation=16, perturb_baseline=0.0, disable_warnings=True
                )
            ),
        ),
        (
            "noisy linear imputation (ROAD), half the pixels, one image",
            lambda: pert.noisy_linear_imputation(x[0], removed, noise=0.0),
            lambda: q_nli(xn[0], idx, noise=0.0),
        ),
        (
            "pointing game + relevance mass + rank + top-k",
            lambda: [
                f(a, masks)
                for f in (loc.pointing_game, loc.relevance_mass, loc.relevance_rank, loc.top_k_intersection)
            ],
            lambda: [
                q(m, s_batch=sn)()
                for m in (
                    quantus.PointingGame(disable_warnings=True),
                    quantus.RelevanceMassAccuracy(disable_warnings=True),
                    quantus.RelevanceRankAccuracy(disable_warnings=True),
                    quantus.TopKIntersection(disable_warnings=True),
                )
            ],
        ),
        (
            "sparseness + complexity",
            lambda: (loc.sparseness(a), loc.complexity(a)),
            lambda: (
                q(quantus.Sparseness(disable_warnings=True))(),
                q(quantus.Complexity(disable_warnings=True))(),
            ),
        ),
        (
            "max + avg sensitivity, RIS, ROS; 4 noisy copies",
            lambda: robustness(
                model, lambda xp, _k: cam(model, xp, y), x, a, samples=4, perturb=lambda _x, k: draws[k]
            ),
            lambda: [
                q(m(nr_samples=4, perturb_func=replay(), disable_warnings=True), explain_func=q_explain)()
                for m in (
                    quantus.MaxSensitivity,
                    quantus.AvgSensitivity,
                    quantus.RelativeInputStability,
                    quantus.RelativeOutputStability,
                )
            ],
        ),
        (
            "random-logit",
            lambda: random_logit(lambda t: cam(model, x, t), y, 1000, seed=42, similarity=spearman, maps=a),
            q(quantus.RandomLogit(num_classes=1000, seed=42, disable_warnings=True), explain_func=q_explain),
        ),
        (
            "parameter randomisation, every layer, cascading",
            lambda: [
                [spearman(a[i], maps[i]) for i in range(batch)]
                for _, m in randomised_models(model, granularity="layer", seed=42)
                for maps in [cam(m, x, y)]
            ],
            q(quantus.MPRT(seed=42, disable_warnings=True), explain_func=q_explain),
        ),
    ]
    fns: dict[str, Callable[[], object]] = {}
    for name, ours, theirs in pairs:
        fns[f"hookviz  {name}"] = ours
        fns[f"Quantus  {name}"] = theirs
    t = medians(fns, rounds)
    out = []
    for name, _, _ in pairs:
        ours_t, theirs_t = t[f"hookviz  {name}"], t[f"Quantus  {name}"]
        out.append((name, ours_t, theirs_t))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    import quantus

    print(f"# hookviz metrics bench  {time.strftime('%Y-%m-%d')}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads), Quantus {quantus.__version__}, CPU only"
    )
    print(f"resnet18, weights=None, batch {args.batch}, {args.size}x{args.size}, Grad-CAM maps, median of "
          f"{args.rounds} interleaved rounds\n")  # fmt: skip
    print(f"| {'metric':<58} | {'hookviz':>9} | {'Quantus':>9} | {'Quantus / hookviz':>17} |")
    print(f"|{'-' * 60}|{'-' * 11}|{'-' * 11}|{'-' * 19}|")
    for name, ours, theirs in rows(args.rounds, args.batch, args.size):
        print(f"| {name:<58} | {ours:>7.3f} s | {theirs:>7.3f} s | {theirs / ours:>16.2f}x |")


if __name__ == "__main__":
    main()
