"""How much a batch holds, and how many images a batch may take under a memory budget (``--max-memory``).

An estimate, made before a batch runs, from the model's traced shapes (one pass of one input, cached): what
the explain pass holds per image (the activations autograd records and their gradients, each target layer's
gradients per class, input gradients, the maps of every method x layer x class at feature and input
resolution) and what does not grow with the batch (the masked and perturbed passes run ``--masked-batch``
rows at a time). The pipeline splits a batch whose estimate passes the budget; it never grows one."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The share of the memory available when the run starts that a batch may hold by default: the rest is
#: for the decoded photos, the renders overlapping the next batch, and everything else on the machine.
DEFAULT_SHARE = 0.5
_FLOAT = 4
_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 2**10,
    "m": 2**20,
    "mb": 2**20,
    "g": 2**30,
    "gb": 2**30,
    "t": 2**40,
}


def parse_size(text: str) -> int:
    """``"4G"``, ``"512MB"``, ``"1.5 GiB"``, ``"2000000"`` (bytes) as bytes.

    Raises:
        ValueError: not a size.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"{text!r}: not a size (4G, 512M, 1.5GB)")
    unit = m.group(2) + ("b" if m.group(3) else "")
    value = float(m.group(1)) * _UNITS.get(unit, _UNITS[m.group(2)])
    if value < 1:
        raise ValueError(f"{text!r}: not a size (4G, 512M, 1.5GB)")
    return int(value)


def human(n: float) -> str:
    """Bytes as ``14.2 GB`` / ``512 MB``."""
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def available(device: Any = "cpu") -> int:
    """Bytes free now: the GPU's free memory for a CUDA device, else the system's available memory
    (``MemAvailable``; the physical memory where that cannot be read)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def default_budget(device: Any = "cpu") -> int:
    """The default ``--max-memory``: :data:`DEFAULT_SHARE` of what is available now."""
    return int(available(device) * DEFAULT_SHARE)


@dataclass(frozen=True)
class Estimate:
    """Bytes a batch holds: ``per_image`` times its images, plus ``fixed`` (passes run in rows of their
    own, whatever the batch)."""

    per_image: int
    fixed: int = 0

    def total(self, images: int) -> int:
        return self.fixed + self.per_image * images

    def fitting(self, budget: int, wanted: int) -> int:
        """How many of ``wanted`` images a batch may take under ``budget`` (at least one)."""
        room = budget - self.fixed
        return max(1, min(wanted, room // max(1, self.per_image)))


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
    """What :func:`hookviz.attribution.explain` holds for ``methods`` at ``layers`` with ``targets`` classes
    an image, on inputs of ``input_shape`` (one image's, without the batch axis); ``options`` are the
    methods' settings (:class:`hookviz.methods.MethodOptions`: the rows of their own passes)."""
    from hookviz import methods as registry
    from hookviz.hooks import traced

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
