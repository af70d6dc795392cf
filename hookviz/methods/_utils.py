"""Helpers the method modules share: the batch layout the CPU runs fastest, and the ``--baseline`` image."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor, nn

from hookviz.errors import UsageError
from hookviz.methods.compute import LayerPass

T = TypeVar("T")


def channels_last(x: Tensor) -> Tensor:
    """A batch of changed inputs in the layout the CPU's convolutions run fastest on (channels last: 1.1-1.3x
    for resnet18 on this project's machine; the values are the same)."""
    return x.contiguous(memory_format=torch.channels_last) if x.device.type == "cpu" and x.dim() == 4 else x


def in_fast_layout(model: nn.Module, x: Tensor, run: Callable[[Tensor], T]) -> T:
    """``run(x)`` with ``x`` in :func:`channels_last`'s layout; a model whose forward refuses it (a ``.view``
    over a map, as much older code writes, raises on a channels-last map) is run on ``x`` as it is, from
    then on (remembered per model)."""
    fast = channels_last(x)
    if fast is x or model in PLAIN:
        return run(x)
    try:
        return run(fast)
    except RuntimeError:
        PLAIN.add(model)
        return run(x)


#: Models whose forward refused a channels-last batch: they get the plain layout.
PLAIN: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def baseline(p: LayerPass) -> Tensor:
    """The ``--baseline`` image ``(B, C, H, W)``: ``black`` (the input tensor of a black pixel, from the
    model's normalisation), ``mean`` (the data mean: zeros after normalisation) or ``blur`` (the image under
    a Gaussian blur of sigma = 1/20 of its longer side)."""
    kind = p.options.baseline
    if kind == "mean":
        return torch.zeros_like(p.x)
    if kind == "blur":
        if p.x.dim() != 4:
            raise UsageError("--baseline blur is for photos; use black or mean for a volume")
        from torchvision.transforms.functional import gaussian_blur

        sigma = max(p.size) / 20
        k = 2 * math.ceil(3 * sigma) + 1
        k = min(k, 2 * (min(p.size) // 2) - 1)
        return gaussian_blur(p.x, [k, k], [sigma, sigma])
    floor = p.options.input_floor
    if floor is None:
        return torch.zeros_like(p.x)
    spread = (None, slice(None), *([None] * (p.x.dim() - 2)))
    return torch.as_tensor(floor, dtype=p.x.dtype, device=p.x.device)[spread].expand_as(p.x)
