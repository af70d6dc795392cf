"""How a layer's output holds its map (channels first or last, tokens, time), decided from shapes, and the
map as ``(B, C, H, W)`` for any architecture. :mod:`hookviz.core.layers` builds its rules on these."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from hookviz.core import taps
from hookviz.core.trace import ModuleCall
from hookviz.errors import LayerError


@dataclass(frozen=True)
class Layout:
    """How a layer's output holds its map: ``nchw``, ``nhwc`` (Swin, channels-last blocks) or ``tokens``
    ``(B, N, D)``: ``prefix`` tokens (class, distillation, register) then a ``grid`` of patch tokens.

    A video model's map has ``time`` steps: ``ncthw`` ``(B, C, T, H, W)`` (3D CNNs), ``nthwc`` (Swin3D), or
    tokens over a ``T x H x W`` grid (MViT). :func:`to_spatial` folds time into the height,
    ``(B, C, T * H, W)``, so every CAM formula (which pools or works position by position) applies as it
    is; :func:`unfold_time` gives a map its time axis back."""

    kind: str
    prefix: int = 0
    grid: tuple[int, int] | None = None
    #: Time steps of a video model's map (0 for an image model's).
    time: int = 0


#: A convolutional layer's layout, ``(B, C, H, W)``: the default.
NCHW = Layout("nchw")

#: The layouts whose channels come right after the batch axis (2-D and 3-D convolutions' maps); the others
#: (channels-last blocks, tokens) hold their channels last.
CHANNELS_FIRST = frozenset({"nchw", "ncthw"})


def channel_axis(layout: Layout | str) -> int:
    """The axis of a tensor in ``layout`` that holds its channels (tokens: the embedding width)."""
    kind = layout if isinstance(layout, str) else layout.kind
    return 1 if kind in CHANNELS_FIRST else -1


def to_spatial(t: Tensor, layout: Layout | str) -> Tensor:
    """``(B, C, H, W)`` from a layer output in ``layout``."""
    kind = layout if isinstance(layout, str) else layout.kind
    if kind == "nchw":
        return t
    if kind == "nhwc":
        return t.permute(0, 3, 1, 2)
    if kind == "ncthw":
        b, c, nt, h, w = t.shape
        return t.reshape(b, c, nt * h, w)
    if kind == "nthwc":
        b, nt, h, w, c = t.shape
        return t.permute(0, 4, 1, 2, 3).reshape(b, c, nt * h, w)
    b, n, d = t.shape
    if isinstance(layout, Layout) and layout.grid is not None:
        gh, gw = layout.grid
        return t[:, layout.prefix :].reshape(b, gh, gw, d).permute(0, 3, 1, 2)
    side = math.isqrt(n)
    if side * side != n:
        side = math.isqrt(n - 1)
        t = t[:, 1:]
    return t.reshape(b, side, side, d).permute(0, 3, 1, 2)


def unfold_time(maps: Tensor, time: int) -> Tensor:
    """``(..., T, H, W)`` from maps ``(..., T * H, W)`` folded by :func:`to_spatial` (``time`` = T)."""
    *lead, th, w = maps.shape
    return maps.reshape(*lead, time, th // time, w)


#: At most this many tokens before the patch grid (class + distillation + register tokens).
MAX_PREFIX_TOKENS = 16


def patch_grid(calls: Sequence[ModuleCall], tokens: int, dim: int) -> tuple[int, int] | None:
    """The patch grid behind ``tokens`` tokens of width ``dim``: the earliest 4-D output ``(B, dim, gh, gw)``
    (the patch embedding's convolution) with ``gh * gw`` patches and at most 16 more tokens."""
    for c in sorted((c for c in calls if c.calls and c.output_shape), key=lambda c: c.order):
        shape = c.output_shape or ()
        if len(shape) == 4 and shape[1] == dim:
            gh, gw = int(shape[2]), int(shape[3])
            if gh * gw <= tokens <= gh * gw + MAX_PREFIX_TOKENS:
                return gh, gw
    return None


def _video_tokens(calls: Sequence[ModuleCall], tokens: int) -> Layout | None:
    """Tokens over a ``T x H x W`` grid (MViT): T from the patch embedding's 5-D output (the first one),
    a square ``H x W`` (stages pool space, not time), after at most 16 prefix tokens."""
    first = min(
        (c for c in calls if c.calls and c.output_shape and len(c.output_shape) == 5),
        key=lambda c: c.order,
        default=None,
    )
    if first is None or first.output_shape is None:
        return None
    t = int(first.output_shape[2])
    for prefix in range(MAX_PREFIX_TOKENS + 1):
        if (tokens - prefix) % t:
            continue
        side = math.isqrt((tokens - prefix) // t)
        if side > 1 and t * side * side == tokens - prefix:
            return Layout("tokens", prefix, (t * side, side), t)
    return None


def _kind_4d(module: nn.Module | None, shape: Sequence[int]) -> str:
    # Inputs are square, so a channels-first map has H == W and a channels-last one has shape[1] == shape[2].
    if isinstance(module, nn.Conv2d) or shape[2] == shape[3] or shape[1] != shape[2]:
        return "nchw"
    return "nhwc"


def layout_of(
    model: nn.Module, layer: str, shape: Sequence[int], calls: Sequence[ModuleCall] | None = None
) -> Layout:
    """How a layer's output is laid out, so maps come out as ``(B, C, H, W)`` for any architecture.

    Decided from shapes: 4-D outputs are channels-first or channels-last (Swin); 3-D outputs are tokens,
    whose patch grid (and so the number of prefix tokens, and non-square grids) comes from the patch
    embedding seen in ``calls``; without ``calls``, a square number of tokens after 0 or 1 prefix token.

    Raises:
        LayerError: the output has no spatial structure (a classifier head, a pooled vector, 1x1).
    """
    return layout_for(
        None if taps.is_input(layer) else dict(model.named_modules())[layer], layer, shape, calls
    )


def layout_for(
    module: nn.Module | None, layer: str, shape: Sequence[int], calls: Sequence[ModuleCall] | None = None
) -> Layout:
    """:func:`layout_of` for the module already found (None for a ``NAME:input`` tensor): a site
    (:mod:`hookviz.core.sites`) computes its layout once with it, and looks nothing up."""
    kind_name = type(module).__name__ if module is not None else "input"
    what = f"layer {layer!r} ({kind_name}) outputs shape {tuple(shape)}"
    if len(shape) == 4:
        kind = _kind_4d(module, shape)
        pixels = shape[2] * shape[3] if kind == "nchw" else shape[1] * shape[2]
        if pixels == 1:
            raise LayerError(f"{what}: a 1x1 map has no spatial extent left to show; pick an earlier layer")
        return Layout(kind)
    if len(shape) == 5:
        channels_first = isinstance(module, nn.Conv3d) or shape[3] == shape[4] or shape[2] != shape[3]
        pixels = shape[3] * shape[4] if channels_first else shape[2] * shape[3]
        if pixels == 1:
            raise LayerError(f"{what}: a 1x1 map has no spatial extent left to show; pick an earlier layer")
        return Layout("ncthw", time=int(shape[2])) if channels_first else Layout("nthwc", time=int(shape[1]))
    if len(shape) == 3 and shape[1] > 1 and calls and any(len(c.output_shape or ()) == 5 for c in calls):
        video = _video_tokens(calls, int(shape[1]))
        if video is not None:
            return video
    if len(shape) == 3 and shape[1] > 1:
        n, d = int(shape[1]), int(shape[2])
        grid = patch_grid(calls, n, d) if calls else None
        if grid is not None:
            return Layout("tokens", n - grid[0] * grid[1], grid)
        for prefix in (0, 1):
            side = math.isqrt(n - prefix)
            if side > 1 and side * side == n - prefix:
                return Layout("tokens", prefix, (side, side))
    raise LayerError(
        f"{what}, not a (B, C, H, W) feature map or a grid of tokens, so it has no spatial map to show; "
        "pick a convolutional layer or an encoder block"
    )
