"""What the explain pass holds for a batch, estimated before it runs from the model's traced shapes (one pass
of one input, cached): the activations autograd records and their gradients, each target layer's gradients per
class, input gradients, the maps of every method x layer x class at feature and input resolution; and what
does not grow with the batch (the masked and perturbed passes run ``--masked-batch`` rows at a time). The
pipeline splits a batch whose estimate passes ``--max-memory`` (:mod:`hookviz.core.memory`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hookviz.core.hooks import traced
from hookviz.core.memory import Estimate
from hookviz.methods import registry

_FLOAT = 4


def _numel(shape: Sequence[int] | None) -> int:
    return math.prod(int(s) for s in shape[1:]) if shape else 0  # one image: the batch axis left out


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
    parents = {c.name.rsplit(".", 1)[0] for c in calls if "." in c.name} | {""}
    leaves = [c for c in calls if c.name not in parents and c.output_shape is not None]
    activations = sum(_numel(c.output_shape) for c in leaves) * _FLOAT
    specs = [registry.get(m) for m in dict.fromkeys(methods)]
    needs = set().union(*(s.needs for s in specs)) if specs else set()
    by_name = {c.name: c for c in calls}
    shapes = [by_name[la].output_shape if la in by_name else None for la in layers]
    layer_sizes = [_numel(s) * _FLOAT for s in shapes]
    channels = max([int(s[1]) for s in shapes if s and len(s) > 1] or [1])
    hw = (int(input_shape[-2]), int(input_shape[-1]))
    pixels = hw[0] * hw[1] * math.prod(int(s) for s in input_shape[1:-2])
    image = _numel((1, *input_shape)) * _FLOAT
    # Before the earliest target layer the pass runs without a graph: only a few tensors live at a time.
    # From there autograd records every output (and the backward pass their gradients); an input gradient
    # records the whole network.
    start = min([by_name[la].order for la in layers if la in by_name] or [-1])
    whole = "input_gradients" in needs
    recorded = sum(_numel(c.output_shape) for c in leaves if whole or c.order > start) * _FLOAT
    largest = max([_numel(c.output_shape) for c in leaves] or [0]) * _FLOAT
    per = 3 * largest + recorded
    if needs & {"layer_gradients", "input_gradients"}:
        # Their gradients, in the backward pass: freed as it goes, half of them alive at once (measured on
        # ResNet-50 and EfficientNet-B0 at 448 px: the estimate stays 1.3x to 2.4x over the peak).
        per += recorded // 2
    if "layer_gradients" in needs:
        per += targets * sum(layer_sizes)  # each target layer's gradient, kept per class
    if "input_gradients" in needs or any(s.resolution == "input" for s in specs):
        per += 2 * targets * image  # input gradients and their products
    # Every map: at the layer's resolution, and at the input's for the pixel methods and the overlays.
    per += len(specs) * max(1, len(layers)) * targets * (pixels + max(layer_sizes or [0]) // _FLOAT) * _FLOAT
    fixed = 0
    for spec in specs:  # a method's own passes: one pass of the batch, or copies in rows of --masked-batch
        forward = registry.passes(spec.name, channels, targets, options, hw)[0]
        if forward and forward <= targets:
            per = max(per, activations * 3 // 2 + per // 2)  # its own recorded pass of the batch
        elif forward:
            fixed = max(fixed, min(options.batch, forward) * (2 * activations + image))
    return Estimate(per_image=int(per * 1.25), fixed=int(fixed))  # a quarter for the allocator's slack
