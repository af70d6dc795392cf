"""A layer's activations as vectors, from live forward hooks: every spatial position of a convolution's map,
or every patch token of a transformer block, is one vector of the layer's width. They stream from the inputs
through a bounded, seeded block-shuffle buffer; nothing is written to disk (unless a cache asks:
:mod:`hookviz.sae.cache`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.hooks import HookGroup, first_tensor, preserved, trace_shapes
from hookviz.core.layout import Layout, layout_of, to_spatial
from hookviz.errors import LayerError, close_matches
from hookviz.io.images import Box
from hookviz.io.inputs import Item, read_input

#: The layouts whose positions are vectors: a map, channels first or last, or tokens over a patch grid.
KINDS = ("nchw", "nhwc", "tokens")


class _Stop(Exception):
    """Raised by the capturing hook: the rest of the forward pass is not needed."""


def module_of(model: nn.Module, layer: str) -> nn.Module:
    modules = dict(model.named_modules())
    if layer not in modules:
        raise LayerError(f"no layer {layer!r} in the model{close_matches(layer, modules)}")
    return modules[layer]


def layer_output(model: nn.Module, layer: str, x: Tensor) -> Tensor:
    """``layer``'s output on ``x`` (its first tensor), the forward stopped right after it, no grad."""
    kept: list[Tensor] = []

    def hook(module: nn.Module, args: object, output: object) -> None:
        t = first_tensor(output)
        if t is None:
            raise LayerError(
                f"layer {layer!r} outputs {type(output).__name__}, not a tensor; pick another layer"
            )
        kept.append(t.detach())
        raise _Stop

    with HookGroup() as hooks, torch.no_grad():
        hooks.add(module_of(model, layer).register_forward_hook(hook))
        with contextlib.suppress(_Stop):
            model(x)
    if not kept:
        raise LayerError(f"layer {layer!r} did not run in the forward pass; pick a layer the model calls")
    return kept[0]


def site_layout(model: nn.Module, layer: str, x: Tensor) -> Layout:
    """How ``layer``'s output holds its vectors, from one probe input ``x``; one line (exit 2) for a layer
    whose output is not a map or a token sequence (a pooled vector, a head, a 1x1 map, a clip)."""
    module_of(model, layer)
    with preserved(model):
        model.eval()
        calls = trace_shapes(model, x)
        shape = tuple(layer_output(model, layer, x).shape)
    layout = layout_of(model, layer, shape, calls)
    if layout.kind not in KINDS:
        raise LayerError(
            f"layer {layer!r} outputs {shape}, a clip's map: hookviz sae takes photo models' layers"
        )
    return layout


def to_vectors(t: Tensor, layout: Layout) -> Tensor:
    """``(B * positions, d)``: every position of ``t``'s map (patch tokens only, for tokens) as a row."""
    spatial = to_spatial(t, layout)
    return spatial.permute(0, 2, 3, 1).reshape(-1, spatial.shape[1])


def from_vectors(v: Tensor, like: Tensor, layout: Layout) -> Tensor:
    """``like`` with its positions replaced by the rows of ``v`` (the inverse of :func:`to_vectors`; a token
    output keeps its prefix tokens)."""
    b = like.shape[0]
    if layout.kind == "nchw":
        _, c, h, w = like.shape
        return v.reshape(b, h, w, c).permute(0, 3, 1, 2).to(like.dtype)
    if layout.kind == "nhwc":
        return v.reshape(like.shape).to(like.dtype)
    out = like.clone()
    out[:, layout.prefix :] = v.reshape(b, -1, like.shape[-1]).to(like.dtype)
    return out


@dataclass(frozen=True)
class Position:
    """Where a stream stands: the pass over the inputs (``epoch``) and the next input's place in its order."""

    epoch: int = 0
    index: int = 0


@dataclass
class Block:
    """One buffer of shuffled vectors, the stream's position before it (a stream restarted there gives it
    again) and after it, and how many inputs it drew on."""

    vectors: Tensor
    after: Position
    inputs: int
    start: Position = Position()


#: Vectors of inputs by their places in the list (``None`` for one that could not be read): the model run
#: through hooks, or a cache of what it gave (:mod:`hookviz.sae.cache`).
Source = Callable[[Sequence[int]], list[Tensor | None]]


def order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The inputs' order in pass ``epoch``: a permutation seeded by the run's seed and the pass."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def readable(
    items: Sequence[Item], preprocess: object, max_pixels: int, skipped: list[str]
) -> Iterator[tuple[Item, Tensor, Box]]:
    """Each readable input, its model tensor and the box of the photo the model saw; each unreadable input is
    named in ``skipped`` and the others go on."""
    for item in items:
        if item.error is not None:
            skipped.append(item.error)
            continue
        try:
            _, x, box = read_input(item, preprocess, max_pixels)
        except Exception as e:  # an unreadable file: named, and the stream goes on
            skipped.append(f"{item.name}: {no_option(e)}")
            continue
        yield item, torch.as_tensor(x), box


def no_option(e: Exception) -> str:
    """An input's error without the advice to raise ``--max-pixels``, an option the sae commands lack."""
    return str(e).replace("downscale it or raise --max-pixels", "downscale it")


def read_each(
    items: Sequence[Item], preprocess: object, max_pixels: int, skipped: list[str]
) -> list[Tensor | None]:
    """Each input's model tensor, or None for one that could not be read (named in ``skipped``)."""
    got = [list(readable([item], preprocess, max_pixels, skipped)) for item in items]
    return [one[0][1] if one else None for one in got]


def read_batch(
    items: Sequence[Item], preprocess: object, max_pixels: int, skipped: list[str]
) -> Tensor | None:
    """The inputs' model tensors stacked, or None where none could be read; each unreadable input is named in
    ``skipped``."""
    xs = [x for _, x, _ in readable(items, preprocess, max_pixels, skipped)]
    return torch.stack(xs) if xs else None


def from_model(
    vectors_of: Callable[[Tensor], Tensor], read: Callable[[Sequence[int]], list[Tensor | None]]
) -> Source:
    """The :data:`Source` that reads the inputs (``read``: their model tensors by place) and runs them
    through the model together, one forward pass; every input gives the same number of vectors."""

    def source(places: Sequence[int]) -> list[Tensor | None]:
        xs = read(places)
        kept = [i for i, x in enumerate(xs) if x is not None]
        out: list[Tensor | None] = [None] * len(xs)
        if kept:
            v = vectors_of(torch.stack([xs[i] for i in kept]))  # type: ignore[misc]
            for i, part in zip(kept, v.chunk(len(kept)), strict=True):
                out[i] = part
        return out

    return source


def stream(
    source: Source, n: int, *, seed: int, buffer: int, batch: int, start: Position = Position()
) -> Iterator[Block]:
    """Blocks of at least ``buffer`` vectors of ``n`` inputs (all of an input's vectors in one block; asked of
    ``source`` ``batch`` inputs at a time), each shuffled by a generator seeded from the run's seed and its
    position, so a stream restarted at a block's ``start`` gives the same blocks as one that went on;
    passes over the inputs repeat, each in a new seeded order."""
    epoch, index = start.epoch, start.index
    empty_passes = 0
    while True:
        if index >= n:
            epoch, index = epoch + 1, 0
        perm = order(n, seed, epoch)
        kept: list[Tensor] = []
        count, first = 0, index
        while index < n and count < buffer:
            for v in source([int(i) for i in perm[index : index + batch]]):
                if v is not None:
                    kept.append(v)
                    count += v.shape[0]
            index = min(index + batch, n)
        if not kept:
            empty_passes += 1
            if empty_passes > 1 or first == 0:
                raise LayerError("no input could be read: nothing to train on")
            continue
        empty_passes = 0
        block = torch.cat([v.to(kept[-1].device) for v in kept])  # the cache's on the CPU
        state = int(np.random.SeedSequence([seed, epoch, first]).generate_state(1)[0])
        g = torch.Generator().manual_seed(state)
        shuffled = block[torch.randperm(block.shape[0], generator=g)]
        yield Block(shuffled, Position(epoch, index), index - first, Position(epoch, first))
