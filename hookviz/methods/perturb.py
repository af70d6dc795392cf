# ruff: noqa: RUF002
"""Perturbation methods: the network run again on changed tensors, many at a time and across images.

Ablation-CAM changes the layer's tensor (only the network after the layer runs again); SS-CAM and IS-CAM
mask the input with the layer's channels; Occlusion and RISE mask the input with windows and random grids.
Every forward pass takes ``--batch`` rows drawn across the images of the batch, so small layers and small
batches still fill it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hookviz.core.hooks import capture, logits_of
from hookviz.errors import UsageError
from hookviz.methods._utils import baseline, in_fast_layout
from hookviz.methods.catalogue import NOISE, SAMPLES
from hookviz.methods.compute import LayerPass, rectify


class _Substitute(capture):
    """While open, the layer's tensor is replaced by ``fn(tensor)`` (the capture's tap machinery: module
    outputs, ``NAME:input`` tensors and functional poolings alike)."""

    def __init__(self, p: LayerPass, fn: Callable[[Tensor], Tensor]) -> None:
        super().__init__(p.model, grad_layers=[p.layer])
        self.fn = fn

    def _make_tap(self, name: str, t: Tensor, *, view: bool) -> Tensor:
        return self.fn(t)


def _base_scores(p: LayerPass) -> Tensor:
    """``(B, C)`` the pass's class scores of the unchanged batch."""
    return p.once("scores", lambda: p.score_of(p.model(p.x)).detach())


def _chunks(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def _replay(p: LayerPass, i: int, replacement: Tensor) -> Tensor:
    """Class scores ``(n, C)`` of image ``i`` with its layer tensor replaced by each of the ``n`` rows of
    ``replacement``. The network before the layer runs once, for the one image (tensors from before the layer
    broadcast over the ``n`` rows); a network that cannot broadcast them (a concatenation with an earlier
    tensor) runs the ``n`` copies of the image instead."""
    n = replacement.shape[0]
    with torch.no_grad():
        try:
            with _Substitute(p, lambda t: replacement):
                out = p.score_of(p.model(p.x[i : i + 1]))
            if out.shape[0] == n:
                return out
        except RuntimeError:
            pass
        with _Substitute(p, lambda t: replacement):
            return p.score_of(p.model(p.x[i : i + 1].expand(n, *p.x.shape[1:])))


def ablationcam(p: LayerPass) -> Tensor:
    """Ablation-CAM: ``w_k = (y − y_k) / y`` with ``y_k`` the target score when channel ``k`` of the layer is
    ablated (set to 0, or for a signed tensor to its minimum − 1e7 as the reference does), then
    ``ReLU(Σ_k w_k A^k)``."""
    if p.layout.kind != "nchw":
        raise UsageError(
            f"--method ablationcam needs a convolutional (B, C, H, W) tensor; {p.layer} is not one"
        )
    base = _base_scores(p)
    a = p.activations
    b, k = a.shape[:2]
    weights = torch.empty(b, p.targets.shape[1], k, device=a.device)
    eye = torch.eye(k, dtype=torch.bool, device=a.device)
    for i in range(b):
        low = a[i].min()
        value = torch.zeros((), dtype=a.dtype) if float(low) == 0 else low - 1e7
        for part in _chunks(k, p.options.batch):
            rows = eye[part][:, :, None, None]
            ablated = torch.where(rows, value.to(a.dtype), a[i : i + 1].expand(rows.shape[0], -1, -1, -1))
            scores = _replay(p, i, ablated)
            weights[i, :, part] = scores[:, p.targets[i]].T
            p.advance(rows.shape[0])
    y = base.gather(1, p.targets)[:, :, None]
    w = (y - weights) / y
    return torch.stack(
        [rectify((w[:, j, :, None, None] * a).sum(1), p.relu) for j in range(w.shape[1])], dim=1
    )


def _normalised_masks(p: LayerPass) -> Tensor:
    """The layer's channels min-max normalised then upsampled to the input, as torchcam does:
    ``(B, K, H, W)``."""
    a = p.activations.float()
    lo = a.amin(dim=(2, 3), keepdim=True)
    norm = a - lo
    norm = norm / (norm.amax(dim=(2, 3), keepdim=True) + 1e-8)
    return F.interpolate(norm, size=p.size, mode="bilinear", align_corners=False)


def _masked_scores(
    p: LayerPass, masks: Callable[[Tensor, Tensor], Tensor], rows_total: int, per: int
) -> Tensor:
    """Target scores ``(B, T, per)``: row ``r`` of image ``r // per`` is scored on ``masks(images, rows)``
    (the masked inputs), ``--batch`` rows a forward pass, across images."""
    b, t = p.x.shape[0], p.targets.shape[1]
    out = torch.empty(b * per, t, device=p.x.device)
    with torch.inference_mode():
        for part in _chunks(rows_total, p.options.batch):
            rows = torch.arange(part.start, part.stop, device=p.x.device)
            images = rows // per
            scores = p.score_of(in_fast_layout(p.model, masks(images, rows), p.model))
            out[rows] = scores.gather(1, p.targets[images]).float()
            p.advance(int(rows.numel()))
    return out.reshape(b, per, t).transpose(1, 2)


def _score_weighted(p: LayerPass, total: Tensor) -> Tensor:
    """``ReLU(Σ_k softmax_k(total) A^k)`` per target, ``total`` ``(B, T, K)``."""
    w = torch.softmax(total, dim=2).to(p.activations.dtype)
    return torch.stack(
        [rectify((w[:, j, :, None, None] * p.activations).sum(1), p.relu) for j in range(w.shape[1])], dim=1
    )


def sscam(p: LayerPass) -> Tensor:
    """SS-CAM (torchcam's): Score-CAM's masks plus Gaussian noise (σ ``--noise``, 2 by default) drawn at the
    input's resolution, ``--samples`` of them (35); each channel's weight is the softmax of its mean score
    gain over the copies."""

    n = p.options.samples or SAMPLES["sscam"]
    sigma = p.options.noise if p.options.noise is not None else NOISE["sscam"]
    up = _normalised_masks(p)
    b, k = up.shape[:2]
    base = _base_scores(p).gather(1, p.targets)[:, :, None]
    total = torch.zeros(b, p.targets.shape[1], k, device=p.x.device)
    gens = [torch.Generator().manual_seed(p.options.seed) for _ in range(b)]
    for _ in range(n):
        noisy = torch.stack(
            [up[i] + torch.normal(0.0, sigma, up.shape[1:], generator=gens[i]) for i in range(b)]
        )

        def masks(images: Tensor, rows: Tensor, noisy: Tensor = noisy) -> Tensor:
            return noisy.flatten(0, 1)[rows][:, None].to(p.x.dtype) * p.x[images]

        total += _masked_scores(p, masks, b * k, k) - base
    return _score_weighted(p, total / n)


def iscam(p: LayerPass) -> Tensor:
    """IS-CAM (torchcam's): Score-CAM's masks scaled by ``c_i = Σ_{j≤i} j/N`` for ``i = 1..N`` (``--samples``,
    10), each channel's weight the softmax of its mean score gain over the steps."""

    n = p.options.samples or SAMPLES["iscam"]
    up = _normalised_masks(p)
    b, k = up.shape[:2]
    base = _base_scores(p).gather(1, p.targets)[:, :, None]
    total = torch.zeros(b, p.targets.shape[1], k, device=p.x.device)
    coeff = 0.0
    for i in range(n):
        coeff += (i + 1) / n

        def masks(images: Tensor, rows: Tensor, c: float = coeff) -> Tensor:
            return c * (up.flatten(0, 1)[rows][:, None].to(p.x.dtype) * p.x[images])

        total += _masked_scores(p, masks, b * k, k) - base
    return _score_weighted(p, total / n)


def _fill(p: LayerPass) -> Tensor:
    """``(B, C, H, W)`` what a removed pixel becomes: ``--baseline`` black, the data mean (0 after
    normalisation) or the image blurred."""

    return p.once("baseline", lambda: baseline(p))


def occlusion(p: LayerPass) -> Tensor:
    """Occlusion: every ``--window`` square (a cube for a volume) at every ``--stride`` filled with the
    baseline (windows that pass the edge are cut, as captum's are); a pixel's (voxel's) map is the mean score
    drop over the windows covering it."""

    def compute() -> Tensor:
        dims = tuple(int(v) for v in p.x.shape[2:])
        win = min(p.options.window, *dims)
        s = p.options.stride
        starts = [[i * s for i in range(math.ceil((n - win) / s) + 1)] for n in dims]
        boxes = [tuple(slice(a, a + win) for a in corner) for corner in itertools.product(*starts)]
        fill = _fill(p)

        def masks(images: Tensor, rows: Tensor) -> Tensor:
            out = p.x[images].clone()
            for r, (i, row) in enumerate(zip(images.tolist(), (rows % len(boxes)).tolist(), strict=True)):
                where = (slice(None), *boxes[row])
                out[r][where] = fill[i][where]
            return out

        scores = _masked_scores(p, masks, p.x.shape[0] * len(boxes), len(boxes))
        drop = _base_scores(p).gather(1, p.targets)[:, :, None] - scores  # (B, T, windows)
        total = torch.zeros(*drop.shape[:2], *dims, device=p.x.device)
        count = torch.zeros(dims, device=p.x.device)
        for n, box in enumerate(boxes):
            region: tuple[Any, ...] = (slice(None), slice(None), *box)
            total[region] += drop[:, :, n].reshape(*drop.shape[:2], *([1] * len(dims)))
            count[box] += 1
        return total / count

    m = p.once("occlusion", compute)
    return m.clamp_min(0) if p.relu else m  # the drops: evidence for the class (all of them with --no-relu)


def random_masks(n: int, cells: int, size: tuple[int, ...], seed: int) -> Tensor:
    """RISE's ``n`` random masks ``(n, *size)`` from ``seed``: ``cells``² grids (``cells``³ for a volume) of
    cells kept with probability 0.5, upsampled (bilinear, trilinear) to ``cells + 1`` cell sizes and cropped
    at a random shift (made on the CPU, so a seed gives the same masks on any device)."""
    gen = torch.Generator().manual_seed(seed)
    cell = [math.ceil(d / cells) for d in size]
    grid = (torch.rand(n, 1, *([cells] * len(size)), generator=gen) < 0.5).float()
    mode = "bilinear" if len(size) == 2 else "trilinear"
    up = F.interpolate(grid, size=tuple((cells + 1) * c for c in cell), mode=mode, align_corners=False)
    shifts = [torch.randint(0, c, (n,), generator=gen) for c in cell]
    crops = []
    for i in range(n):
        at: tuple[Any, ...] = (
            i,
            0,
            *(slice(int(d[i]), int(d[i]) + s) for d, s in zip(shifts, size, strict=True)),
        )
        crops.append(up[at])
    return torch.stack(crops)


def rise(p: LayerPass) -> Tensor:
    """RISE: ``Σ_i p(c | x ⊙ M_i) M_i / (N · 0.5)`` over the random masks (probabilities, as the paper)."""

    def compute() -> Tensor:
        masks_ = random_masks(p.options.masks, p.options.cells, tuple(p.x.shape[2:]), p.options.seed).to(
            p.x.device
        )
        n = masks_.shape[0]
        b, t = p.x.shape[0], p.targets.shape[1]
        probs = torch.empty(b, t, n, device=p.x.device)
        with torch.no_grad():
            for part in _chunks(b * n, p.options.batch):
                rows = torch.arange(part.start, part.stop, device=p.x.device)
                images = rows // n
                masked = p.x[images] * masks_[rows % n][:, None].to(p.x.dtype)
                out = logits_of(in_fast_layout(p.model, masked, p.model))
                prob = p.scorer(out, images)
                for j in range(t):
                    probs[images, j, rows % n] = prob.gather(1, p.targets[images, j, None])[:, 0].float()
                p.advance(int(rows.numel()))
        return torch.einsum("btn,n...->bt...", probs, masks_) / (n * 0.5)

    return p.once("rise", compute)
