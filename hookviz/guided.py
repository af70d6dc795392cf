"""Guided Backpropagation (Springenberg et al., ICLR workshop 2015), the seed use of backward hooks.

Guided backpropagation differentiates the target score w.r.t. the input, but at every ReLU lets only positive
gradients through (where the ReLU's input was positive, as usual, *and* the gradient arriving from above is
positive). Here every ReLU output gets a backward hook (``Tensor.register_hook``) that clamps the gradient
reaching it to ``>= 0``; the ReLU's own backward then masks it by its input's sign. Module ReLUs and the
functional ones architectures call (``F.relu``, ``torch.relu``, ``Tensor.relu``, their in-place forms) are
all found by one ``TorchFunctionMode`` active during the forward pass. Guided Grad-CAM (Selvaraju et al.,
ICCV 2017) is the product of this saliency and the upsampled Grad-CAM map.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from hookviz.hooks import logits_of, preserved

_RELUS = {F.relu, F.relu_, torch.relu, torch.relu_, Tensor.relu, Tensor.relu_}


class _GuidedRelus(TorchFunctionMode):
    """Puts a gradient-clamping backward hook on the output of every ReLU call that autograd records."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _RELUS and isinstance(out, Tensor) and out.requires_grad:
            out.register_hook(lambda g: g.clamp(min=0))
            self.count += 1
        return out


@contextmanager
def guided_relus() -> Iterator[_GuidedRelus]:
    """While open, ReLUs in recorded forward passes let only positive gradients back (``.count`` of them)."""
    with _GuidedRelus() as mode:
        yield mode


def guided_backprop(
    model: nn.Module, x: Tensor, targets: Tensor, scores: Callable[[Any], Tensor] | None = None
) -> Tensor:
    """Guided-backpropagation saliency ``(B, T, H, W)`` at the input's resolution: per pixel, the largest
    absolute input gradient over the colour channels (Simonyan et al.'s reduction), one map per target.

    ``scores(output)`` turns the model's output into ``(B, C)`` class scores (default: its logits).
    The model is left as found (mode, ``.grad``); no parameter gradient is computed.
    """
    rows = torch.arange(x.shape[0], device=x.device)
    maps = []
    with preserved(model), torch.enable_grad():
        model.eval()
        xi = x.detach().clone().requires_grad_()
        with guided_relus():
            output = model(xi)
            logits = scores(output) if scores is not None else logits_of(output)
        for j in range(targets.shape[1]):
            (g,) = torch.autograd.grad(
                logits[rows, targets[:, j]].sum(), xi, retain_graph=j < targets.shape[1] - 1
            )
            maps.append(g.detach().abs().amax(dim=1))
    return torch.stack(maps, dim=1)
