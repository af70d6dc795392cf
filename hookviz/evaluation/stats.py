"""The statistics every evaluation reports, from the field's libraries: confidence intervals (scipy.stats),
rank correlation (scipy's ranks) and SSIM (scikit-image), so that a figure here is the figure a reviewer's
own scipy or scikit-image gives."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from hookviz.core.arrays import to_numpy


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (Student's t, ``scipy.stats.t``; NaN for a
    single value: one image gives no interval). NaN values (a metric that does not apply to an image) are
    left out."""
    from scipy.stats import t

    kept = [float(v) for v in values if not math.isnan(float(v))]
    n = len(kept)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(kept) / n
    if n == 1:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in kept) / (n - 1))
    return mean, float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def wilson(successes: int, n: int) -> tuple[float, float]:
    """The Wilson score interval (95 %) of a proportion, as fractions (``scipy.stats.binomtest``): inside
    0..1 for any n and count, unlike the normal or t interval, which gives 0 +- 0 for 0 of 3 and runs past
    100 % for 3 of 3."""
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(int(successes), int(n)).proportion_ci(0.95, method="wilson")
    return max(0.0, float(ci.low)), min(1.0, float(ci.high))


def rankdata(x: Tensor) -> Tensor:
    """Ranks 1..n of a 1-D tensor, ties given their average rank: ``scipy.stats.rankdata`` (float64)."""
    from scipy.stats import rankdata as ranks

    return torch.from_numpy(ranks(to_numpy(x, torch.float64)))


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation of two maps (flattened): the Pearson correlation of their ranks, as
    ``scipy.stats.spearmanr``; 0 where either map is constant (scipy gives NaN and a warning)."""
    ra, rb = rankdata(a.flatten().double()), rankdata(b.flatten().double())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / denom if denom > 0 else 0.0


def ssim(a: Tensor, b: Tensor, size: int = 64) -> float:
    """Structural similarity (Wang et al. 2004) of two maps, each min-max scaled to [0, 1] and resized to
    ``size`` x ``size``: ``skimage.metrics.structural_similarity`` with the paper's Gaussian window
    (sigma 1.5, 11 x 11) and population statistics."""
    from skimage.metrics import structural_similarity

    def prep(m: Tensor) -> Tensor:
        m = torch.nan_to_num(m.detach().cpu().double(), nan=0.0)
        m = (m - m.min()) / (m.max() - m.min()).clamp_min(1e-12)
        return F.interpolate(m[None, None], size=(size, size), mode="bilinear", align_corners=False)[0, 0]

    return float(
        structural_similarity(
            to_numpy(prep(a)),
            to_numpy(prep(b)),
            data_range=1.0,
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
        )
    )
