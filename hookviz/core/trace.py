"""Shapes seen in one forward pass: every module's input and output shape, how often and in which order it
ran, and where the head's global pooling takes its input (:func:`trace_shapes`, remembered per model and input
shape by :func:`traced`). Layer rules (:mod:`hookviz.core.layers`), layouts (:mod:`hookviz.core.layout`) and
sites (:mod:`hookviz.core.sites`) are decided from these shapes.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.guards import HookGroup, preserved, serialised, unwrap_compiled
from hookviz.core.taps import PoolSite, PoolTracer


def first_tensor(value: Any) -> Tensor | None:
    """``value`` if a tensor, else the first element of a tuple or list of which it is a tensor, else None."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


def probe_input(
    model: nn.Module, shape: Sequence[int], *, device: Any = None, dtype: torch.dtype | None = None
) -> Tensor:
    """Zeros of ``shape`` in the model's dtype and on its device (its first floating-point tensor's),
    unless given: a bfloat16 or CUDA model rejects a float32 CPU probe."""
    first = next((t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()), None)
    if device is None:
        device = first.device if first is not None else "cpu"
    if dtype is None:
        dtype = first.dtype if first is not None else torch.float32
    return torch.zeros(*shape, device=device, dtype=dtype)


@dataclass(frozen=True)
class ModuleCall:
    """Shapes seen at one module during a forward pass."""

    name: str
    type: str
    output_shape: tuple[int, ...] | None
    calls: int
    #: When the module's first call finished, counting from 0 (forward hooks fire in post-order, so a
    #: block finishes after its children); -1 for a module that did not run.
    order: int = -1
    #: The shape of its first positional input (a ``NAME:input`` CAM tensor), if a tensor.
    input_shape: tuple[int, ...] | None = None


class Trace(list[ModuleCall]):
    """What :func:`trace_shapes` saw: every module's :class:`ModuleCall` (a list), ``pool``, where the head's
    global pooling takes its input (:class:`hookviz.core.taps.PoolSite`), None without one, and the input's
    shape it ran on."""

    pool: PoolSite | None = None
    #: The input's shape, less its batch axis (None: not a traced pass).
    input_shape: tuple[int, ...] | None = None


def pool_of(calls: Sequence[ModuleCall]) -> PoolSite | None:
    """Where the head's global pooling takes its input, when ``calls`` is a :class:`Trace` that found one."""
    return calls.pool if isinstance(calls, Trace) else None


def trace_shapes(model: nn.Module, x: Tensor) -> Trace:
    """Run ``x`` through ``model`` (eval mode, no grad) and report every module's input and output shape, in
    call order, and where the head's global pooling takes its input (``.pool``, see :mod:`hookviz.core.taps`).

    Modules that never run are listed last with ``calls == 0``.
    """
    model = unwrap_compiled(model)
    seen: dict[str, list[Any]] = {}
    order: list[str] = []
    tracer = PoolTracer()

    def make_pre(name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            tracer.pre(name, first_tensor(args))

        return hook

    def make(name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            t = first_tensor(output)
            tracer.post(name, t)
            if name not in seen:
                order.append(name)
                first = tracer.inputs.get(name)
                seen[name] = [
                    type(module).__name__,
                    tuple(t.shape) if t is not None else None,
                    0,
                    tuple(first[0].shape) if first is not None else None,
                ]
            seen[name][2] += 1

        return hook

    with serialised(model), preserved(model), HookGroup() as hooks:
        for name, module in model.named_modules():
            if name:
                hooks.add(module.register_forward_pre_hook(make_pre(name)))
                hooks.add(module.register_forward_hook(make(name)))
        model.eval()
        with torch.no_grad(), tracer.mode:
            model(x)
    calls = [ModuleCall(n, seen[n][0], seen[n][1], seen[n][2], i, seen[n][3]) for i, n in enumerate(order)]
    # Forward hooks fire on exit, so call order is post-order; network order is named_modules order.
    rank = {n: i for i, (n, _) in enumerate(model.named_modules())}
    calls.sort(key=lambda c: rank[c.name])
    unused = [
        ModuleCall(n, type(m).__name__, None, 0) for n, m in model.named_modules() if n and n not in seen
    ]
    trace = Trace(calls + unused)
    trace.pool = tracer.site({n: v[2] for n, v in seen.items()}, {n: v[0] for n, v in seen.items()})
    trace.input_shape = tuple(int(s) for s in x.shape[1:])
    return trace


_TRACES: weakref.WeakKeyDictionary[nn.Module, dict[Any, Trace]] = weakref.WeakKeyDictionary()


def traced(model: nn.Module, input_shape: tuple[int, ...], device: Any) -> Trace:
    """:func:`trace_shapes` for one input of ``input_shape``, remembered per model while it lives (a
    transformer's token layout needs its patch grid, and a batch run asks for it every batch; the layers a
    command chooses were traced on the same input: one forward pass serves both)."""
    per_model = _TRACES.setdefault(model, {})
    key = (tuple(int(s) for s in input_shape), str(torch.device(device)))
    if key not in per_model:
        per_model[key] = trace_shapes(model, probe_input(model, (1, *input_shape), device=device))
    return per_model[key]
