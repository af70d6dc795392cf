"""Plug-and-play DropBlock and Dropout2d, attached to any layer of an existing model by forward hooks.

DropBlock (Ghiasi et al., NeurIPS 2018) drops contiguous ``block_size`` x ``block_size`` squares of a
feature map. Published implementations miss the requested rate (blocks overlap, and seeds near the
border make blocks that fall off the map); here:

* seeds are drawn only where a whole block fits, so every dropped region is a full square;
* the seed rate ``gamma`` is solved numerically so that the *expected dropped fraction* equals
  ``drop_prob`` exactly, overlaps included: position ``(i, j)`` covered by ``n_ij`` possible blocks is
  kept with probability ``(1 - gamma) ** n_ij``;
* kept activations are divided by that same per-position keep probability, so ``E[out] = x`` at every
  position and the expected sum is preserved for any input (not just on average over positions).

Hooks act only in training mode (eval is an exact no-op), return a new tensor (never in place) and
leave nothing on the model once removed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.hooks import HookGroup, probe_input, trace_shapes
from hookviz.core.layers import is_pattern, output_layers, resolve_layers


@functools.lru_cache(maxsize=256)
def _coverage(height: int, width: int, block: int) -> Tensor:
    """``n_ij``: how many whole-block seed positions cover each position of an ``height`` x ``width`` map."""
    seeds = torch.ones(1, 1, height - block + 1, width - block + 1, dtype=torch.float64)
    return F.conv2d(F.pad(seeds, (block - 1,) * 4), torch.ones(1, 1, block, block, dtype=torch.float64))[0, 0]


@functools.lru_cache(maxsize=256)
def seed_rate(drop_prob: float, height: int, width: int, block: int) -> float:
    """The Bernoulli seed rate ``gamma`` whose expected dropped fraction is exactly ``drop_prob``."""
    if drop_prob <= 0:
        return 0.0
    n = _coverage(height, width, block)

    def dropped(gamma: float) -> float:
        return float(1.0 - torch.pow(1.0 - gamma, n).mean())

    if drop_prob >= dropped(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if dropped(mid) < drop_prob:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def drop_block(
    x: Tensor,
    drop_prob: float,
    block_size: int,
    *,
    shared: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Apply DropBlock to ``x`` ``(N, C, H, W)``; return ``(output, keep_mask)``.

    Args:
        drop_prob: expected fraction of dropped activations (exact, overlaps included).
        block_size: side of the dropped squares; clamped to the map's smaller side.
        shared: one mask for all channels of a sample (default: one mask per channel).
        generator: for reproducible masks.
    """
    if x.dim() != 4:
        raise ValueError(f"DropBlock needs a (N, C, H, W) tensor, got shape {tuple(x.shape)}")
    if not 0.0 <= drop_prob < 1.0:
        raise ValueError(f"drop_prob must be in [0, 1), got {drop_prob}")
    n, c, h, w = x.shape
    block = max(1, min(int(block_size), h, w))
    gamma = seed_rate(float(drop_prob), h, w, block)
    shape = (n, 1 if shared else c, h - block + 1, w - block + 1)
    seeds = (torch.rand(shape, generator=generator, device="cpu") < gamma).to(device=x.device, dtype=x.dtype)
    dropped = F.max_pool2d(F.pad(seeds, (block - 1,) * 4), kernel_size=block, stride=1)
    keep = 1.0 - dropped
    keep_prob = torch.pow(1.0 - gamma, _coverage(h, w, block)).to(device=x.device, dtype=x.dtype)
    return x * keep / keep_prob, keep.expand_as(x)


class RegularizerHandle(HookGroup):
    """What ``attach_*`` returns: ``remove()`` takes every hook off; ``step`` drives the schedule."""

    def __init__(self, drop_prob: float, schedule_steps: int = 0) -> None:
        super().__init__()
        self.layers: list[str] = []
        self.drop_prob = drop_prob
        self.schedule_steps = schedule_steps
        self.step = 0

    def current_drop_prob(self) -> float:
        """``drop_prob`` ramped linearly from 0 over ``schedule_steps`` training forwards (Ghiasi et al.)."""
        if self.schedule_steps <= 0:
            return self.drop_prob
        return self.drop_prob * min(1.0, self.step / self.schedule_steps)


def _attach(
    model: nn.Module,
    layers: Sequence[str],
    handle: RegularizerHandle,
    fn: Any,
    example: Tensor | None,
) -> RegularizerHandle:
    modules = dict(model.named_modules())
    names = resolve_layers(model, layers)
    if any(is_pattern(spec) for spec in layers) or example is not None:
        # A glob must not reach modules without a feature map, nor blocks inside blocks (whose outputs
        # would be dropped twice): decide from the shapes one forward pass of ``example`` gives.
        if example is None:
            example = probe_input(model, (1, 3, 224, 224))
        names = output_layers(model, layers, trace_shapes(model, example))
    handle.layers = names
    last = names[-1]

    def make(name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if not module.training or not isinstance(output, Tensor):
                return None
            p = handle.current_drop_prob()
            if name == last:
                handle.step += 1
            return fn(output, p) if p > 0 else None

        return hook

    try:
        for name in names:
            handle.add(modules[name].register_forward_hook(make(name)))
    except BaseException:
        handle.remove()
        raise
    return handle


def attach_dropblock(
    model: nn.Module,
    layers: Sequence[str],
    drop_prob: float = 0.1,
    block_size: int = 7,
    *,
    shared: bool = False,
    schedule_steps: int = 0,
    generator: torch.Generator | None = None,
    example: Tensor | None = None,
) -> RegularizerHandle:
    """Attach DropBlock to the outputs of ``layers`` (names or globs); active in training mode only.

    With a glob (or an ``example`` input), the layers are checked at attach time from the shapes of
    one forward pass of ``example`` (default: one 224x224 RGB image of zeros): only modules with 4-D
    outputs are kept, and a module nested inside another chosen one is left out (``layer*`` gives the
    four stages, not their 61 submodules too).

    Raises:
        LayerError: a name without a 4-D output, or a glob matching none.

    Examples:
        >>> with attach_dropblock(model, ["layer3", "layer4"], 0.1, 7, schedule_steps=5000):
        ...     train(model)
    """
    if not 0.0 <= drop_prob < 1.0:
        raise ValueError(f"drop_prob must be in [0, 1), got {drop_prob}")
    handle = RegularizerHandle(drop_prob, schedule_steps)
    return _attach(
        model,
        layers,
        handle,
        lambda x, p: drop_block(x, p, block_size, shared=shared, generator=generator)[0],
        example,
    )


def attach_dropout2d(
    model: nn.Module,
    layers: Sequence[str],
    drop_prob: float = 0.1,
    *,
    schedule_steps: int = 0,
    example: Tensor | None = None,
) -> RegularizerHandle:
    """Attach channel dropout (``F.dropout2d``) to the outputs of ``layers``; training mode only.

    Layers are chosen as in :func:`attach_dropblock`.
    """
    if not 0.0 <= drop_prob < 1.0:
        raise ValueError(f"drop_prob must be in [0, 1), got {drop_prob}")
    handle = RegularizerHandle(drop_prob, schedule_steps)
    return _attach(model, layers, handle, lambda x, p: F.dropout2d(x, p, training=True), example)
