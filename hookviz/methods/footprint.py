"""What the explain pass holds for a batch, estimated before it runs from the model's traced shapes (one pass
of one input, cached); the pipeline splits a batch whose estimate passes ``--max-memory``
(:mod:`hookviz.core.memory`).

The estimate is of the tensors the batch's pass allocates at its peak (torch's allocator: the process's own
baseline, torch, the model's weights and the decoded photos are not the batch's). Per image:

* the largest of the passes the methods run in turn: a pass without a graph (an output, the one before it
  and the input a residual block holds, at once), or a pass recorded from the earliest target layer (from the
  input for input gradients): every module output from there, and the tensors a block makes itself (a
  squeeze-excitation's product), but a rectifier's in place (SiLU and Hardswish in place keep a copy);
* beside it, what outlives the passes: the captured activations, each target layer's gradient per class,
  input gradients per class, and every method x layer x class map (at the input's resolution for the
  pixel methods).

Whatever the batch: the largest convolution's weights, reordered for its pass (the peak of a small batch;
added to a pass recorded from the input, whose backward reorders them while it is all kept), the masked and
perturbed copies (``--batch`` rows a pass, drawn across the images, each with a pass without a graph), and
RISE's masks. Measured against torch's allocator on resnet18, mobilenet_v3_small and efficientnet_b0 at
112-448 px (``python bench/memory_bench.py --only estimate``; bench/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules.conv import _ConvNd

from hookviz.core.hooks import ModuleCall, traced
from hookviz.core.memory import Estimate
from hookviz.methods import registry

_FLOAT = 4
# What the process grows by beside the tensors, measured (bench/memory_bench.py --only estimate; the figures
# in bench/RESULTS.md): the resident memory's growth over a whole `hookviz gradcam` batch, from the photos
# decoded to its files written, on resnet18, mobilenet_v3_small and efficientnet_b0 at 112-448 px, 1-8
# photos; the constants fitted to those runs (the largest error made least) and rounded. Two phases, one
# after the other:
# * the pass: its tensors, and _SLACK beside them (the allocator's arenas and the workspace the first pass
#   sets up); RISE's passes, its masked copies --batch at a time, leave the heap fragmented by about _CHURN
#   bytes per mask, per image;
# * the pictures, drawn once the pass's tensors are freed: _SET_UP once a batch (colour maps, the caption's
#   font, PNG encoding), each method's workspace (a method at the input's resolution, its lazily imported
#   pieces and its map brought to the input: _INPUT_WORKSPACE; a layer's: _LAYER_WORKSPACE); for each
#   image, _PER_MAP bytes per input pixel for each picture (the map at the input's resolution, scaled, and
#   its numpy copies) and _PHOTO bytes per pixel of its photo (the pictures are drawn on the photo: its
#   copies, the overlay, its PNG; the pool threads' allocator arenas keep what they freed).
# The pictures reuse what the pass freed, up to _REUSED (the arenas' share; the pass's larger blocks go back
# to the system): the two phases added, less the smaller of them and _REUSED. Over the 28 runs measured:
# 0.80x to 1.25x the growth (the allocator's reuse moves it by 10-20 MB either way), never under the
# tensors' peak; pictures that do not compress (noise: each PNG as large as the photo) take more.
_SLACK = int(13.5 * 2**20)
_CHURN = 28 * 2**10
_SET_UP = 14 * 2**20
_INPUT_WORKSPACE = 9 * 2**20
_LAYER_WORKSPACE = int(0.33 * 2**20)
_PER_MAP = 4.2
_PHOTO = 8.5
_REUSED = 24 * 2**20
_RECTIFIERS = ("ReLU", "ReLU6", "LeakyReLU", "Hardtanh", "ELU")


def _numel(shape: Sequence[int] | None) -> int:
    return math.prod(int(s) for s in shape[1:]) if shape else 0  # one image: the batch axis left out


@dataclass(frozen=True)
class _Net:
    """One image's pass through the model, in bytes: the peak of a pass without a graph, and every tensor a
    recorded pass keeps, by when it is made (``(order, bytes)``)."""

    forward: int
    kept: tuple[tuple[int, int], ...]

    def recorded(self, start: int) -> int:
        """What a pass recorded after module ``start`` (its order; -1: from the input) holds."""
        return sum(size for order, size in self.kept if order > start)


def _inplace(module: Any) -> bool:
    return bool(getattr(module, "inplace", False))


def _net(model: Any, calls: Sequence[ModuleCall]) -> _Net:
    ran = sorted((c for c in calls if c.output_shape is not None and c.order >= 0), key=lambda c: c.order)
    children: dict[str, list[ModuleCall]] = {}
    for c in ran:
        if c.name:
            children.setdefault(c.name.rsplit(".", 1)[0] if "." in c.name else "", []).append(c)
    modules = dict(model.named_modules())
    leaves = [c for c in ran if c.name not in children]
    # A block whose output is not its last child's made it itself (a squeeze-excitation's product).
    own = [c for c in ran if c.name in children and children[c.name][-1].output_shape != c.output_shape]
    # A rectifier in place keeps no tensor of its own (its backward reads its output); SiLU and Hardswish in
    # place do (theirs reads the input: autograd keeps a copy).
    free = {c.name for c in leaves if c.type in _RECTIFIERS and _inplace(modules.get(c.name))}
    kept = tuple((c.order, _numel(c.output_shape) * _FLOAT) for c in [*leaves, *own] if c.name not in free)
    # Without a graph: an output, the one before it (its input) and the input of the block around it (a
    # residual's), unless it works in place.
    inputs = {c.name: _numel(c.input_shape) * _FLOAT for c in ran if c.input_shape is not None}
    peak, before = 0, 0
    for c in leaves:
        out = 0 if _inplace(modules.get(c.name)) else _numel(c.output_shape) * _FLOAT
        parts = c.name.split(".")
        held = max([inputs.get(".".join(parts[:k]), 0) for k in range(1, len(parts))] or [0])
        peak, before = max(peak, out + before + held), out or before
    return _Net(peak, kept)


def explain_estimate(
    model: Any,
    input_shape: tuple[int, ...],
    device: Any,
    layers: Sequence[str],
    methods: Sequence[str],
    targets: int,
    options: Any = None,
) -> Estimate:
    """What :func:`hookviz.engine.explain.explain` holds for ``methods`` at ``layers`` with ``targets``
    classes an image, on inputs of ``input_shape`` (one image's, without the batch axis); ``options`` are the
    methods' settings (:class:`hookviz.methods.MethodOptions`: the rows of their own passes)."""
    options = options or registry.MethodOptions()
    calls = traced(model, tuple(input_shape), device)
    net = _net(model, calls)
    specs = [registry.get(m) for m in dict.fromkeys(methods)]
    specs += [registry.get(u) for s in specs for u in s.uses if u not in methods]
    needs = set().union(*(s.needs for s in specs)) if specs else set()
    by_name = {c.name: c for c in calls}
    shapes = [by_name[la].output_shape if la in by_name else None for la in layers]
    layer_sizes = [_numel(s) * _FLOAT for s in shapes]
    channels = max([int(s[1]) for s in shapes if s and len(s) > 1] or [1])
    hw = (int(input_shape[-2]), int(input_shape[-1]))
    pixels = hw[0] * hw[1] * math.prod(int(s) for s in input_shape[1:-2])
    image = _numel((1, *input_shape)) * _FLOAT
    start = min([by_name[la].order for la in layers if la in by_name] or [-1])
    whole = bool(needs & {"input_gradients", "bias_gradients"})
    passes = [net.forward]
    if whole or "layer_gradients" in needs:
        passes.append(net.recorded(-1 if whole else start))
    kept = sum(layer_sizes)  # the captured activations
    if "layer_gradients" in needs:
        kept += targets * sum(layer_sizes)  # each target layer's gradient, per class
    if whole:
        kept += targets * image  # the input gradients, per class
    n_layers = max(1, len(layers))
    for s in specs:  # every map: at the layer's grid, and at the input's for the pixel methods
        grid = max(layer_sizes or [0]) // max(1, channels) if s.resolution == "layer" else pixels * _FLOAT
        kept += n_layers * targets * grid
    fixed, rows, row = 0, 0, 0
    for spec in specs:  # a method's own passes: one recorded pass of the batch, or rows of --batch copies
        forward, backward = registry.passes(spec.name, channels, targets, options, hw)
        if forward and forward <= targets:
            passes.append(image + net.recorded(-1 if spec.resolution == "input" else start) * backward)
        elif forward:
            size = image + (net.recorded(-1) if backward else net.forward)
            masks = options.masks * pixels * _FLOAT if spec.name in ("rise", "drise") else 0
            # RISE's masks while they are made: grids upsampled past the photo, and the masks cut from them.
            made = masks * (1 + ((options.cells + 1) / options.cells) ** 2)
            if min(options.batch, forward) * size >= min(options.batch, rows) * row:
                rows, row = forward, size
            fixed = max(fixed, masks, int(made - min(options.batch, forward) * size))
    # A convolution's weights, reordered for the pass (oneDNN on the CPU): the peak of a small batch.
    weights = max([_numel((0, *m.weight.shape)) for m in model.modules() if isinstance(m, _ConvNd)] or [0])
    if whole:  # its backward reorders them while the whole pass is kept
        fixed += weights * _FLOAT
    tensors = Estimate(int(max(passes) + kept), int(fixed), rows, int(row), options.batch, weights * _FLOAT)
    if (
        torch.device(device).type == "cuda"
    ):  # the budget is the GPU's: what is beside the tensors is the host's
        return tensors
    return _beside(tensors, list(dict.fromkeys(methods)), len(specs), n_layers * targets, pixels, options)


def _beside(
    tensors: Estimate, methods: list[str], ran: int, maps: int, pixels: int, options: registry.MethodOptions
) -> Estimate:
    """``tensors`` with what the process grows by beside them (the constants above): ``ran`` methods run
    (those used by others too), ``maps`` maps a method and image, inputs of ``pixels`` pixels."""
    at_input = sum(registry.get(m).resolution == "input" for m in methods)
    masks = sum(options.masks for m in methods if m in ("rise", "drise"))
    return dataclasses.replace(
        tensors,
        slack=_SLACK,
        churn=_CHURN * masks,
        beside=_SET_UP + at_input * _INPUT_WORKSPACE + (ran - at_input) * _LAYER_WORKSPACE,
        drawn=int(_PER_MAP * maps * len(methods) * pixels),
        per_pixel=_PHOTO,
        pixels=pixels,
        reused=_REUSED,
    )
