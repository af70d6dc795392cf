"""Faithfulness by perturbation as the field defines it beside deletion / insertion.

* **ROAD** (Rong, Leemann et al., ICML 2022, "A Consistent and Efficient Evaluation Strategy for Attribution
  Methods"): a fraction of the pixels, most relevant first (MoRF) or least relevant first (LeRF), is
  replaced by *noisy linear imputation* (each removed pixel the weighted mean of its 8 neighbours, solved as
  one sparse linear system, plus a little noise), which leaves no tell-tale shape of the removed region for
  the model to read. A faithful map makes the class's probability fall fast under MoRF and stay under LeRF.
* **Pixel flipping** (Bach et al., PLOS ONE 2015): pixels are replaced by the baseline cumulatively, most
  relevant first, a fixed number a step; the curve of the class's probability and its area.
* **Region perturbation** (Samek et al., IEEE TNNLS 2017): non-overlapping patches, ordered by their summed
  relevance, are replaced cumulatively; the curve of the probability's drop and its mean, the AOPC.

Each is written to equal Quantus 0.6's ``ROAD``, ``PixelFlipping`` and ``RegionPerturbation`` on the same
model, input, map and settings (tests/test_metrics_reference.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import logits_of, preserved
from hookviz.core.readout import Scorer
from hookviz.evaluation.faithfulness import chunk_size, image_generators, probabilities, upsample

#: ROAD's fractions of pixels removed, in %: pytorch-grad-cam's ROADCombined uses these nine.
ROAD_PERCENTAGES = (10, 20, 30, 40, 50, 60, 70, 80, 90)
#: The 8-neighbourhood of the imputation and its weights (edge neighbours 1/6, diagonal ones 1/12).
_NEIGHBOURS = ((1, 1, 1 / 12), (0, 1, 1 / 6), (-1, 1, 1 / 12), (1, -1, 1 / 12), (0, -1, 1 / 6),
               (-1, -1, 1 / 12), (1, 0, 1 / 6), (-1, 0, 1 / 6))  # fmt: skip


def _refuse_video(x: Tensor, metric: str) -> None:
    if x.dim() != 4:
        raise ValueError(f"{metric} perturbs the pixels of images (B, C, H, W); a clip is not one")


def noisy_linear_imputation(
    x: Tensor, removed: Tensor, *, noise: float = 0.01, generator: torch.Generator | None = None
) -> Tensor:
    """``x`` ``(C, H, W)`` with the pixels where ``removed`` ``(H * W,)`` is true replaced by the solution of
    the 8-neighbour weighted-mean equations (Rong et al. 2022), plus Gaussian noise of std ``noise``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import spsolve

    c, h, w = x.shape
    flat = to_numpy(x.reshape(c, -1), torch.float64)
    gone = to_numpy(removed).astype(bool)
    idx = np.flatnonzero(gone)
    if idx.size == 0:
        return x.clone()
    var = np.zeros(h * w, dtype=np.int64)
    var[idx] = np.arange(idx.size)
    rows, cols, vals = [], [], []
    b = np.zeros((idx.size, c))
    total = np.zeros(idx.size)
    yy, xx = idx // w, idx % w
    for dy, dx, weight in _NEIGHBOURS:
        ny, nx = yy + dy, xx + dx
        ok = (ny >= 0) & (ny < h) & (nx >= 0) & (nx < w)
        me, nb = np.flatnonzero(ok), (ny * w + nx)[ok]
        total[me] += weight
        known = ~gone[nb]
        b[me[known]] -= weight * flat[:, nb[known]].T
        rows.append(me[~known])
        cols.append(var[nb[~known]])
        vals.append(np.full(int((~known).sum()), weight))
    rows.append(np.arange(idx.size))
    cols.append(np.arange(idx.size))
    vals.append(-total)
    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), (idx.size, idx.size))
    solved = np.asarray(spsolve(a.tocsc(), b)).reshape(idx.size, c).T
    out = torch.from_numpy(flat.copy())
    filled = torch.from_numpy(solved)
    if noise:
        filled = filled + noise * torch.randn(filled.shape, generator=generator, dtype=filled.dtype)
    out[:, torch.from_numpy(idx)] = filled
    return out.reshape(c, h, w).to(x)


@dataclass(frozen=True)
class Road:
    """ROAD per image: the class's probability and whether it is still the top-1 class, after removing each
    percentage of the pixels, most relevant first (``morf``) and least relevant first (``lerf``)."""

    percentages: tuple[float, ...]
    morf: Tensor  # (B, P) probability of the class
    lerf: Tensor
    morf_correct: Tensor  # (B, P) 1.0 where the prediction is still the class (Quantus's ROAD)
    lerf_correct: Tensor
    forward_passes: int

    @property
    def morf_mean(self) -> Tensor:
        """Mean probability over the percentages, most relevant removed first (lower is better)."""
        return self.morf.mean(dim=1)

    @property
    def lerf_mean(self) -> Tensor:
        """The same, least relevant removed first (higher is better)."""
        return self.lerf.mean(dim=1)

    @property
    def combined(self) -> Tensor:
        """LeRF minus MoRF (higher is better), as pytorch-grad-cam's ROADCombined."""
        return self.lerf_mean - self.morf_mean


def _importance(x: Tensor, maps: Tensor) -> Tensor:
    return upsample(maps.to(x.device), tuple(int(s) for s in x.shape[2:])).flatten(1)


def _classify(
    model: nn.Module,
    images: Tensor,
    targets: Tensor,
    rows: Tensor,
    chunk: int | None,
    counter: list[int],
    scorer: Scorer | None,
) -> tuple[Tensor, Tensor]:
    """The class's probability and whether the class is the top-1 (of the probabilities); ``rows``
    the image each perturbed copy comes from (a segmentation's scorer reads its region)."""
    probs, correct = [], []
    chunk = chunk_size(images, chunk)
    for i in range(0, images.shape[0], chunk):
        logits = logits_of(model(images[i : i + chunk])).float()
        t = targets[i : i + chunk]
        p = torch.softmax(logits, dim=1) if scorer is None else scorer(logits, rows[i : i + chunk])
        probs.append(p.gather(1, t[:, None])[:, 0])
        correct.append((p.argmax(dim=1) == t).float())  # a segmentation's: the class over its region
        counter[0] += len(t)
    return torch.cat(probs), torch.cat(correct)


def road(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    targets: Tensor,
    *,
    percentages: Sequence[float] = ROAD_PERCENTAGES,
    noise: float = 0.01,
    seed: int = 0,
    chunk: int | None = None,
    scorer: Scorer | None = None,
) -> Road:
    """ROAD (MoRF and LeRF) for ``maps`` ``(B, h, w)`` of images ``x`` ``(B, C, H, W)``; each percentage
    starts again from the original image, as in the paper and Quantus."""
    _refuse_video(x, "ROAD")
    b, n = x.shape[0], x.shape[2] * x.shape[3]
    importance = _importance(x, maps)
    gens = image_generators(x, seed)  # each image's noise its own: the figures do not depend on the batch
    passes = [0]
    curves: dict[str, tuple[Tensor, Tensor]] = {}
    t = targets.to(x.device)
    with torch.no_grad(), preserved(model):
        model.eval()
        for name, descending in (("morf", True), ("lerf", False)):
            order = torch.sort(importance, dim=1, descending=descending, stable=True).indices.cpu()
            images = []
            for p in percentages:
                k = int(n * p / 100)
                for i in range(b):
                    removed = torch.zeros(n, dtype=torch.bool)
                    removed[order[i, :k]] = True
                    images.append(noisy_linear_imputation(x[i], removed, noise=noise, generator=gens[i]))
            reps, rows = t.repeat(len(percentages)), torch.arange(b, device=x.device).repeat(len(percentages))
            prob, correct = _classify(
                model, torch.stack(images).to(x.device), reps, rows, chunk, passes, scorer
            )
            curves[name] = (prob.reshape(-1, b).T.cpu(), correct.reshape(-1, b).T.cpu())
    return Road(
        percentages=tuple(float(p) for p in percentages),
        morf=curves["morf"][0],
        lerf=curves["lerf"][0],
        morf_correct=curves["morf"][1],
        lerf_correct=curves["lerf"][1],
        forward_passes=passes[0],
    )


def _curve(
    model: nn.Module,
    perturbed: Callable[[int], Tensor],
    steps: int,
    targets: Tensor,
    chunk: int | None,
    passes: list[int],
    scorer: Scorer | None,
) -> Tensor:
    """The class's probability ``(B, steps)`` for ``perturbed(s)``, the batch after step ``s`` (asked for in
    order), as many steps a forward pass as fill a chunk: never all of them in memory at once."""
    b = targets.shape[0]
    per = max(1, chunk_size(targets, chunk) // b)
    out = []
    for s0 in range(0, steps, per):
        group = [perturbed(s) for s in range(s0, min(steps, s0 + per))]
        rows = torch.arange(b, device=targets.device).repeat(len(group))
        p = probabilities(model, torch.cat(group), targets.repeat(len(group)), chunk, passes, scorer, rows)
        out.append(p.reshape(len(group), b))
    return torch.cat(out).T.cpu()


@dataclass(frozen=True)
class Curve:
    """A perturbation curve per image and its summary: pixel flipping's probabilities (``auc``: area over
    the fraction flipped, lower is better) or region perturbation's drops (``aopc``: their mean, higher is
    better)."""

    curve: Tensor  # (B, steps)
    summary: Tensor  # (B,)
    forward_passes: int


def pixel_flipping(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    targets: Tensor,
    *,
    pixels_per_step: int | None = None,
    steps: int = 16,
    baseline: float = 0.0,
    chunk: int | None = None,
    scorer: Scorer | None = None,
) -> Curve:
    """Pixel flipping: ``pixels_per_step`` pixels (default ``ceil(H * W / steps)``), most relevant first,
    set to ``baseline`` cumulatively; the class's probability after each step (Quantus's ``PixelFlipping``
    with ``features_in_step`` = channels x pixels_per_step) and its area over the fraction flipped."""
    _refuse_video(x, "pixel flipping")
    b, n = x.shape[0], x.shape[2] * x.shape[3]
    k = pixels_per_step or math.ceil(n / steps)
    order = torch.sort(_importance(x, maps), dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(n, device=x.device).expand(b, n))
    passes = [0]

    def flipped(s: int) -> Tensor:
        keep = (rank >= (s + 1) * k).reshape(b, 1, *x.shape[2:]).to(x.dtype)
        return x * keep + baseline * (1 - keep)

    with torch.no_grad(), preserved(model):
        model.eval()
        curve = _curve(model, flipped, math.ceil(n / k), targets.to(x.device), chunk, passes, scorer)
    area = torch.trapezoid(curve, dx=1.0 / max(1, curve.shape[1] - 1), dim=1)
    return Curve(curve=curve, summary=area, forward_passes=passes[0])


def region_perturbation(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    targets: Tensor,
    *,
    patch_size: int = 8,
    regions: int = 100,
    baseline: float = 0.0,
    chunk: int | None = None,
    scorer: Scorer | None = None,
) -> Curve:
    """Region perturbation (most relevant first): the ``patch_size`` patches of a grid over the image
    (partial ones at the right and bottom edges), ordered by their summed relevance, set to ``baseline`` one
    more each step for ``regions`` steps; the drop of the class's probability from the original's after each,
    and the AOPC, their mean."""
    _refuse_video(x, "region perturbation")
    b, (h, w) = x.shape[0], x.shape[2:]
    importance = _importance(x, maps).reshape(b, h, w)
    gh, gw = math.ceil(h / patch_size), math.ceil(w / patch_size)
    padded = torch.zeros(b, gh * patch_size, gw * patch_size, dtype=importance.dtype, device=x.device)
    padded[:, :h, :w] = importance
    sums = padded.reshape(b, gh, patch_size, gw, patch_size).sum(dim=(2, 4)).flatten(1)
    order = torch.sort(sums, dim=1, descending=True, stable=True).indices
    steps = min(regions, gh * gw)
    cell = (
        torch.arange(h, device=x.device)[:, None] // patch_size * gw
        + torch.arange(w, device=x.device) // patch_size
    )
    keep = [torch.ones(b, 1, h, w, dtype=x.dtype, device=x.device)]
    passes = [0]

    def removed(s: int) -> Tensor:  # cumulative: asked for in order
        keep[0] = keep[0] * (cell[None, None] != order[:, s, None, None, None]).to(x.dtype)
        return x * keep[0] + baseline * (1 - keep[0])

    with torch.no_grad(), preserved(model):
        model.eval()
        t = targets.to(x.device)
        p0 = probabilities(model, x, t, chunk, passes, scorer).cpu()
        probs = _curve(model, removed, steps, t, chunk, passes, scorer)
    drops = p0[:, None] - probs
    return Curve(curve=drops, summary=drops.mean(dim=1), forward_passes=passes[0])
