"""What each feature of a dictionary is: its top patches over a data set (the position where it fires most in
each of its best inputs, with the patch's receptive field in the photo's pixels), its activation histogram,
and the classes it pushes, measured by ablation (the feature zeroed in the reconstruction, the logits that
drop); and, per photo, where its features fire and what a feature does to the class probabilities."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.concepts.examples import receptive_field
from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import logits_of, preserved
from hookviz.io.images import Box
from hookviz.sae import dictionary, quality
from hookviz.sae.store import Trained
from hookviz.sae.vectors import layer_output, to_vectors

#: The histogram's bin edges, in the normalised units of the codes (log-spaced; 0 is "did not fire").
EDGES = np.concatenate([[0.0], np.logspace(-2, 2, 25)])


def code_maps(found: Trained, model: nn.Module, x: Tensor) -> Tensor:
    """The codes of ``x``'s positions as maps ``(B, width, h, w)``."""
    out = layer_output(model, found.layer, x)
    v = to_vectors(out, found.layout).float()
    with torch.no_grad():
        z = dictionary.encode(found.sae, found.norm.apply(v))
    b = x.shape[0]
    positions = v.shape[0] // b
    h = _grid(found, out, positions)
    return z.reshape(b, h, positions // h, -1).permute(0, 3, 1, 2)


def _grid(found: Trained, out: Tensor, positions: int) -> int:
    if found.layout.kind == "nchw":
        return int(out.shape[2])
    if found.layout.kind == "nhwc":
        return int(out.shape[1])
    return found.layout.grid[0] if found.layout.grid else round(positions**0.5)


@dataclass
class Patch:
    """One of a feature's top patches: the input, the activation, its cell in the map and its box in the
    photo's pixels (``x0, y0, x1, y1``)."""

    input: str
    score: float
    cell: tuple[int, int]
    box: tuple[int, int, int, int]
    peak: tuple[float, float]


@dataclass
class Gathered:
    """Per feature its top patches, firing count and histogram, over ``inputs`` inputs; ``rf``: the receptive
    field of a cell, in input pixels."""

    top: list[list[Patch]]
    hist: np.ndarray
    fired: np.ndarray
    positions: int = 0
    inputs: int = 0
    rf: tuple[int, int] = (0, 0)


def photo_box(cell: tuple[int, int], grid: tuple[int, int], size: tuple[int, int], seen: Box,
              rf: tuple[int, int]) -> tuple[tuple[int, int, int, int], tuple[float, float]]:  # fmt: skip
    """A map cell's receptive field as a box in the photo's pixels, and its centre ``(y, x)`` there."""
    sy, sx = seen.height / size[0], seen.width / size[1]
    cy = seen.y0 + (cell[0] + 0.5) * size[0] / grid[0] * sy
    cx = seen.x0 + (cell[1] + 0.5) * size[1] / grid[1] * sx
    hh, hw = rf[0] * sy / 2, rf[1] * sx / 2
    box = (max(seen.x0, round(cx - hw)), max(seen.y0, round(cy - hh)),
           min(seen.x1, round(cx + hw)), min(seen.y1, round(cy + hh)))  # fmt: skip
    return box, (cy, cx)


def cell_field(found: Trained, model: nn.Module, x: Tensor, grid: tuple[int, int]) -> tuple[int, int]:
    """The box a map cell stands for, in input pixels: a convolution's receptive field; a token's patch (its
    attention sees the whole photo: the patch is where it sits), the input over the patch grid."""
    if found.layout.kind == "tokens":
        return (round(x.shape[-2] / grid[0]), round(x.shape[-1] / grid[1]))
    return receptive_field(model, x[:1], found.layer)


def gather(
    found: Trained,
    model: nn.Module,
    batches: Sequence[tuple[list[str], Tensor, list[Box]]] | Any,
    top: int,
    device: torch.device,
) -> Gathered:
    """Every feature's ``top`` best inputs (each at the position it fires most), its histogram and how often
    it fired, over ``batches`` of (names, model inputs, boxes the model saw in each photo)."""
    width = found.shape.width
    out = Gathered(
        [[] for _ in range(width)], np.zeros((width, len(EDGES)), np.int64), np.zeros(width, np.int64)
    )
    with preserved(model):
        model.eval()
        for names, x, boxes in batches:
            x = x.to(device)
            maps = code_maps(found, model, x)
            b, _, h, w = maps.shape
            if out.inputs == 0:
                out.rf = cell_field(found, model, x, (h, w))
            flat = to_numpy(maps.reshape(b, width, h * w).float())
            out.fired += (flat > 0).sum((0, 2))
            out.positions += b * h * w
            idx = np.searchsorted(EDGES, flat, side="right") - 1
            idx[flat <= 0] = 0
            np.add.at(out.hist, (np.broadcast_to(np.arange(width)[None, :, None], idx.shape), idx), 1)
            best, where = flat.max(2), flat.argmax(2)
            for i in range(b):
                for f in np.nonzero(best[i] > 0)[0]:
                    cell = (int(where[i, f]) // w, int(where[i, f]) % w)
                    box, peak = photo_box(cell, (h, w), tuple(x.shape[-2:]), boxes[i], out.rf)
                    _keep(out.top[f], Patch(names[i], float(best[i, f]), cell, box, peak), top)
            out.inputs += b
    return out


def _keep(kept: list[Patch], patch: Patch, top: int) -> None:
    if len(kept) < top or patch.score > kept[-1].score:
        kept.append(patch)
        kept.sort(key=lambda p: -p.score)
        del kept[top:]


def ablation(
    found: Trained, model: nn.Module, x: Tensor, features: Sequence[int], scale: float = 0.0
) -> Tensor:
    """The mean change of each logit ``(len(features), classes)`` over ``x`` when a feature's code is scaled
    by ``scale`` (0: ablated) in the reconstruction that replaces the layer's output, against the
    reconstruction left as it is."""
    return torch.stack([edited(found, model, x, scaled(f, scale)) for f in features])


def scaled(f: int | Sequence[int], scale: float) -> Callable[[Tensor], Tensor]:
    """A codes edit: feature(s) ``f`` multiplied by ``scale``."""

    def edit(z: Tensor) -> Tensor:
        z = z.clone()
        z[:, f] = z[:, f] * scale
        return z

    return edit


def edited(found: Trained, model: nn.Module, x: Tensor, edit: Callable[[Tensor], Tensor]) -> Tensor:
    """The mean change of the logits over ``x`` when the codes are edited, against the reconstruction."""
    with preserved(model), torch.no_grad():
        model.eval()
        with quality.replaced(model, found):
            base = logits_of(model(x)).float()
        with quality.replaced(model, found, edit):
            return (logits_of(model(x)).float() - base).mean(0)
