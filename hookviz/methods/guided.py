"""Guided Backpropagation (Springenberg et al., ICLR workshop 2015), the seed use of backward hooks.

Guided backpropagation differentiates the target score w.r.t. the input, but at every rectifier (ReLU, ReLU6,
``hardtanh(x, 0, t)``, ``clamp(x, min=0)``, and LeakyReLU as its variant) lets only positive gradients through
(where the rectifier's input was positive, as usual, *and* the gradient arriving from above is positive). Here
every rectifier's output gets a backward hook (``Tensor.register_hook``) that clamps the gradient reaching it
to ``>= 0``; the rectifier's own backward then masks it by its input's sign. Module rectifiers and the
functional ones architectures call (``F.relu``, ``torch.relu``, ``Tensor.relu``, ``F.relu6``, in-place
forms) are all found by one ``TorchFunctionMode`` active during the forward pass. Guided Grad-CAM
(Selvaraju et al., ICCV 2017) is the product of this saliency and the upsampled Grad-CAM map.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from hookviz.core.hooks import logits_of, preserved

_RELUS = {F.relu, F.relu_, torch.relu, torch.relu_, Tensor.relu, Tensor.relu_}
_LEAKY = {F.leaky_relu, F.leaky_relu_}
_HARDTANH = {F.hardtanh, F.hardtanh_}
_CLAMPS = {torch.clamp, Tensor.clamp, Tensor.clamp_, torch.clamp_min, Tensor.clamp_min, Tensor.clamp_min_}


def _arg(args: Any, kwargs: dict[str, Any], index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def rectifier(func: Any, args: Any, kwargs: dict[str, Any]) -> str | None:
    """The kind of rectifier this call is (``relu``, ``relu6``, ``hardtanh``, ``leaky_relu``, ``clamp``),
    or None: a function whose gradient is zero (or a fixed slope, LeakyReLU) below 0 and 1 above it.

    ``hardtanh(x, 0, t)`` (``nn.ReLU6`` calls it with t = 6) and ``clamp(x, min=0)`` count; Hardswish, SiLU
    and GELU do not: they are smooth, and guiding them is not in the paper."""
    if func in _RELUS:
        return "relu"
    if func is F.relu6:
        return "relu6"
    if func in _LEAKY:
        return "leaky_relu"
    if func in _HARDTANH:
        low, high = _arg(args, kwargs, 1, "min_val", -1.0), _arg(args, kwargs, 2, "max_val", 1.0)
        if low == 0:
            return "relu6" if high == 6 else "hardtanh"
        return None
    if func in _CLAMPS:
        low = _arg(args, kwargs, 1, "min", None)
        high = _arg(args, kwargs, 2, "max", None)
        if isinstance(low, (int, float)) and low == 0 and (high is None or high > 0):
            return "clamp"
    return None


class _GuidedRelus(TorchFunctionMode):
    """Puts a gradient-clamping backward hook on the output of every rectifier call that autograd records."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.kinds: dict[str, int] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if isinstance(out, Tensor) and out.requires_grad:
            kind = rectifier(func, args, kwargs)
            if kind is not None:
                out.register_hook(lambda g: g.clamp(min=0))
                self.count += 1
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
        return out


@contextmanager
def guided_relus() -> Iterator[_GuidedRelus]:
    """While open, rectifiers in recorded forward passes let only positive gradients back (``.count`` of
    them, ``.kinds`` by kind)."""
    with _GuidedRelus() as mode:
        yield mode


def guided_backprop_counted(
    model: nn.Module, x: Tensor, targets: Tensor, scores: Callable[[Any], Tensor] | None = None
) -> tuple[Tensor, dict[str, int]]:
    """:func:`guided_backprop` and how many rectifiers of each kind it guided in one forward pass (empty: the
    network has none, and the saliency is the plain input gradient)."""
    rows = torch.arange(x.shape[0], device=x.device)
    maps = []
    with preserved(model), torch.enable_grad():
        model.eval()
        xi = x.detach().clone().requires_grad_()
        with guided_relus() as mode:
            output = model(xi)
            logits = scores(output) if scores is not None else logits_of(output)
        for j in range(targets.shape[1]):
            (g,) = torch.autograd.grad(
                logits[rows, targets[:, j]].sum(), xi, retain_graph=j < targets.shape[1] - 1
            )
            maps.append(g.detach().abs().amax(dim=1))
    return torch.stack(maps, dim=1), dict(mode.kinds)


def guided_backprop(
    model: nn.Module, x: Tensor, targets: Tensor, scores: Callable[[Any], Tensor] | None = None
) -> Tensor:
    """Guided-backpropagation saliency ``(B, T, H, W)`` at the input's resolution: per pixel, the largest
    absolute input gradient over the colour channels (Simonyan et al.'s reduction), one map per target.

    Every rectifier is guided: ReLU, ReLU6 and ``hardtanh(x, 0, t)``, ``clamp(x, min=0)``, module or
    functional; LeakyReLU as its variant (the gradient from above clamped to >= 0, then its own slope).
    ``scores(output)`` turns the model's output into ``(B, C)`` class scores (default: its logits).
    The model is left as found (mode, ``.grad``); no parameter gradient is computed.
    """
    return guided_backprop_counted(model, x, targets, scores)[0]
