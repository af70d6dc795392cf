"""The hook machinery: context managers that own every handle they register.

Two rules make hooks safe to use on someone else's model:

* Every ``RemovableHandle`` is removed in ``finally``; hooks the user registered before are
  untouched and keep firing. :func:`preserved` restores each module's train/eval mode, each
  parameter's ``requires_grad`` and ``.grad`` object, whatever happens inside.
* Gradients are read from a hook on the layer's output TENSOR (``Tensor.register_hook``, attached by
  the forward hook), never from module backward hooks. ``register_full_backward_hook`` raises when the
  output is later modified in place (a ResNet ``bn2`` output before ``out += identity``), and the
  legacy ``register_backward_hook`` reports the gradient of the module's *last operation* only, which
  is silently wrong for any module made of several ops (a ResNet block, a ``Sequential``).

Gradient taps also give the fast path: if the forward pass runs under ``torch.no_grad()``, the first
tap turns autograd recording on and hands the rest of the network a fresh leaf, so only the part of
the network after the tap is recorded and no parameter gradient is ever computed.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

import torch
from torch import Tensor, nn

from hookviz.core.taps import FunctionTaps, PoolSite, PoolTracer, depth_tracker, parse
from hookviz.errors import LayerError, UsageError, close_matches

_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The one re-entrant lock of ``model``: hooks are per module, not per thread, so two threads explaining
    one model would see each other's hooks fire (a false "runs more than once"). hookviz holds it while
    its hooks are on a model and while it runs a model it explains; other threads wait."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


@contextmanager
def serialised(model: nn.Module) -> Iterator[None]:
    """Hold :func:`model_lock` for the block."""
    with model_lock(model):
        yield


@contextmanager
def preserved(model: nn.Module, *, buffers: bool = False) -> Iterator[nn.Module]:
    """Leave ``model`` exactly as found: per-module mode, ``requires_grad`` and ``.grad`` of every parameter,
    and with ``buffers`` the values of every buffer (a training-mode forward updates BatchNorm's running
    statistics and ``num_batches_tracked``).

    Examples:
        >>> with preserved(model):
        ...     model.eval()
        ...     model(x)
    """
    modes = [(m, m.training) for m in model.modules()]
    params = [(p, p.requires_grad, p.grad) for p in model.parameters()]
    saved = [(b, b.detach().clone()) for b in model.buffers()] if buffers else []
    try:
        yield model
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)
        for m, training in modes:
            m.training = training
        for p, requires_grad, grad in params:
            if p.requires_grad != requires_grad:
                p.requires_grad_(requires_grad)
            if p.grad is not grad:
                p.grad = grad


class HookGroup:
    """Owns hook handles: ``add`` keeps one, ``remove()`` takes them all off (last first); a context
    manager that removes on exit. The one way hookviz holds a ``RemovableHandle``."""

    def __init__(self, handles: list[Any] | None = None) -> None:
        self._handles: list[Any] = list(handles or [])

    def add(self, handle: Any) -> Any:
        """Keep ``handle`` (what ``register_*_hook`` returned) to remove later; returns it."""
        self._handles.append(handle)
        return handle

    def __len__(self) -> int:
        return len(self._handles)

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


@contextmanager
def autograd_enabled(x: Tensor) -> Iterator[Tensor]:
    """Gradients on inside, whatever the caller's mode (``no_grad``, ``inference_mode``); restored after.

    Users wrap inference in ``torch.no_grad()`` or ``torch.inference_mode()`` out of habit; a call that
    needs gradients turns them back on for itself. An input made under inference mode is cloned into
    an ordinary tensor (autograd cannot record inference tensors). A model whose own parameters or
    buffers were made under inference mode cannot be differentiated at all: that is a clear error.

    Raises:
        UsageError: the model's tensors are inference tensors.
    """

    try:
        with torch.inference_mode(False), torch.enable_grad():
            yield x.clone() if x.is_inference() else x
    except RuntimeError as exc:
        if "Inference tensors" not in str(exc):
            raise
        raise UsageError(
            "the model's parameters or buffers were made under torch.inference_mode(), so autograd cannot "
            "use them; create or load the model outside inference mode (torch.no_grad() is fine)"
        ) from None


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


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The original module of a ``torch.compile``d model (hooks do not run inside a compiled graph).

    Says so once, as a warning (the CLI shows it as one line); any other module is returned as is.
    """
    original = getattr(model, "_orig_mod", None)
    if isinstance(original, nn.Module) and type(model).__name__ == "OptimizedModule":
        warnings.warn(
            f"{type(original).__name__} is torch.compile'd; hookviz runs its original eager module, "
            "since Python hooks do not run inside a compiled graph",
            UserWarning,
            stacklevel=3,
        )
        return original
    return model


@dataclass
class Captured:
    """What a :class:`capture` recorded, per layer name, one entry per call of the module."""

    inputs: dict[str, list[Tensor]] = field(default_factory=dict)
    outputs: dict[str, list[Tensor]] = field(default_factory=dict)
    taps: dict[str, list[Tensor]] = field(default_factory=dict)
    grads: dict[str, list[Tensor]] = field(default_factory=dict)


def logits_of(output: Any) -> Tensor:
    """The class scores in a model's output: a tensor, a ``ModelOutput``/object with ``.logits``, a dict
    with ``logits`` (or ``out``), or the first tensor of a tuple (``(logits, aux)``).

    Raises:
        LayerError: nothing in the output looks like scores (the message says what was found).
    """
    if isinstance(output, Tensor):
        return output
    found = getattr(output, "logits", None)
    if isinstance(found, Tensor):
        return found
    if isinstance(output, dict):
        for key in ("logits", "out", "output", "pred"):
            if isinstance(output.get(key), Tensor):
                return output[key]
        raise LayerError(
            f"the model returns a dict with keys {sorted(map(str, output))}, none of them 'logits' or 'out'; "
            "wrap the model so that it returns the class scores"
        )
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    raise LayerError(
        f"the model returns {type(output).__name__}, not class scores; wrap it so that it returns a "
        "(B, num_classes) tensor"
    )


def first_tensor(value: Any) -> Tensor | None:
    """``value`` if a tensor, else the first element of a tuple or list of which it is a tensor, else None."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


class capture:
    """Record layer inputs, outputs and output gradients while the context is open.

    Args:
        model: the network; nothing about it is changed once the context closes.
        layers: module names whose input (forward-pre hook) and/or output (forward hook) are stored; a
            CAM tensor name (:mod:`hookviz.core.taps`: ``avgpool:input``, ``adaptive_avg_pool2d:input``)
            stores that tensor in ``outputs`` under its name.
        inputs: store each layer's first positional input.
        outputs: store each layer's output.
        grad_layers: module names (or CAM tensor names) whose tensor becomes a gradient *tap*: the gradient
            reaching it in a later backward (``torch.autograd.grad`` or ``.backward``) is stored in
            ``captured.grads``. The first tap to fire turns autograd recording on, so running the
            forward under ``torch.no_grad()`` records only the network after it (the fast path).
        clone: store clones, so a later in-place op (``ReLU(inplace=True)``, ``out += identity``)
            cannot change what was captured.
        reuse: allow a tap on a module that runs several times (one tap per call); by default that
            is an error, since a CAM's gradient would be ambiguous.

    A module called several times in one forward (a shared ``ReLU``) is recorded once per call;
    a tap on such a module is an error, because its gradient would be ambiguous.

    Examples:
        >>> with capture(model, ["layer4"], grad_layers=["layer4"]) as cap, torch.no_grad():
        ...     logits = model(x)
        >>> torch.autograd.grad(logits[:, 3].sum(), cap.captured.taps["layer4"][0])
        >>> cap.captured.grads["layer4"][0].shape
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[str] = (),
        *,
        inputs: bool = False,
        outputs: bool = True,
        grad_layers: Sequence[str] = (),
        clone: bool = True,
        reuse: bool = False,
    ) -> None:
        self.model = unwrap_compiled(model)
        self.layers = list(layers)
        self.inputs = inputs
        self.outputs = outputs
        self.grad_layers = list(grad_layers)
        self.clone = clone
        self.reuse = reuse
        self.captured = Captured()
        self._hooks = HookGroup()
        self._grad_mode = True
        self._mode: FunctionTaps | None = None
        self._lock: Any = None

    def __enter__(self) -> capture:
        modules = dict(self.model.named_modules())
        refs = {n: parse(n, modules) for n in [*self.layers, *self.grad_layers]}
        missing = [n for n, ref in refs.items() if ref is None]
        if missing:
            raise LayerError(f"no layer {missing[0]!r} in the model{close_matches(missing[0], modules)}")
        self._grad_mode = torch.is_grad_enabled()
        functional: dict[str, Any] = {}
        self._lock = model_lock(self.model)
        self._lock.acquire()
        try:
            for name in self.layers:
                ref = refs[name]
                assert ref is not None
                module = modules[ref.module]
                if ref.function is not None:
                    functional[name] = ref
                elif ref.stage == "input":  # a NAME:input tensor is what this capture stores for it
                    self._hooks.add(module.register_forward_pre_hook(self._store_input(name, "outputs")))
                else:
                    if self.inputs:
                        self._hooks.add(module.register_forward_pre_hook(self._store_input(name)))
                    if self.outputs:
                        self._hooks.add(module.register_forward_hook(self._store_output(name)))
            for name in self.grad_layers:
                ref = refs[name]
                assert ref is not None
                if ref.function is not None:
                    functional[name] = ref
                elif ref.stage == "input":
                    self._hooks.add(modules[ref.module].register_forward_pre_hook(self._tap_input(name)))
                else:
                    self._hooks.add(modules[ref.module].register_forward_hook(self._tap(name)))
            if functional:
                running = depth_tracker(self.model, [r.module for r in functional.values()], self._hooks)
                self._mode = FunctionTaps(functional, running, self._take)
                self._mode.__enter__()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove every hook this object registered and restore the grad mode."""
        try:
            if self._mode is not None:
                mode, self._mode = self._mode, None
                mode.__exit__(None, None, None)
            self._hooks.remove()
            torch.set_grad_enabled(self._grad_mode)
        finally:
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()

    def _keep(self, t: Tensor) -> Tensor:
        t = t.detach()
        return t.clone() if self.clone else t

    def _store_input(self, name: str, into: str = "inputs") -> Any:
        store: dict[str, list[Tensor]] = getattr(self.captured, into)

        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            t = first_tensor(args)
            if t is not None:
                store.setdefault(name, []).append(self._keep(t))

        return hook

    def _store_output(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            t = first_tensor(output)
            if t is not None:
                self.captured.outputs.setdefault(name, []).append(self._keep(t))

        return hook

    def _make_tap(self, name: str, t: Tensor, *, view: bool) -> Tensor:
        """Turn ``t`` into a gradient tap for ``name``; returns what the network continues with."""
        taps = self.captured.taps.setdefault(name, [])
        if taps and not self.reuse:
            raise LayerError(
                f"layer {name!r} runs more than once per forward pass, so its gradient is ambiguous; "
                "pick a layer that runs once (e.g. its parent block)"
            )
        # Outside a recorded graph (fast path) the tensor becomes a fresh leaf and recording starts here;
        # inside one, gradients flow through it (an input's tap is a view, so that only the gradient through
        # this consumer is read, not that of every other use of the same tensor).
        tap = (t.view_as(t) if view else t) if t.requires_grad else t.detach().requires_grad_()
        torch.set_grad_enabled(True)
        tap.register_hook(lambda g: self.captured.grads.setdefault(name, []).append(g))
        taps.append(tap)
        # The network continues on a copy, so in-place ops downstream cannot alter the tap.
        return tap.clone()

    def _take(self, name: str, t: Tensor) -> Tensor:
        """A functional pooling's input: a gradient tap, or stored as this capture's tensor for ``name``."""
        if name in self.grad_layers:
            return self._make_tap(name, t, view=True)
        self.captured.outputs.setdefault(name, []).append(self._keep(t))
        return t

    def _tap(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if not isinstance(output, Tensor):
                raise LayerError(
                    f"layer {name!r} returns {type(output).__name__}, not a tensor; "
                    "pick a layer with a tensor output"
                )
            return self._make_tap(name, output, view=False)

        return hook

    def _tap_input(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> Any:
            if not args or not isinstance(args[0], Tensor):
                raise LayerError(f"{name!r}: the module's first input is not a tensor; pick another layer")
            return (self._make_tap(name, args[0], view=True), *args[1:])

        return hook


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
    """What :func:`trace_shapes` saw: every module's :class:`ModuleCall` (a list), and ``pool``, where the
    head's global pooling takes its input (:class:`hookviz.core.taps.PoolSite`), None without one."""

    pool: PoolSite | None = None


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
