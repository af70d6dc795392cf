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

Hooks take their layers as sites (:mod:`hookviz.core.sites`: each module found once, by whoever resolved
the names); a name is resolved on entry. What keeps a model as found (the lock, :func:`preserved`,
:class:`HookGroup`, the grad mode) lives in :mod:`hookviz.core.guards` and the traced shapes in
:mod:`hookviz.core.trace`; both are imported from here as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.guards import (
    HookGroup,
    autograd_enabled,
    model_lock,
    preserved,
    serialised,
    unwrap_compiled,
)
from hookviz.core.sites import Site, bind
from hookviz.core.taps import FunctionTaps, Ref, depth_tracker
from hookviz.core.trace import (
    ModuleCall,
    Trace,
    first_tensor,
    pool_of,
    probe_input,
    trace_shapes,
    traced,
)
from hookviz.errors import LayerError

__all__ = [
    "Captured",
    "HookGroup",
    "ModuleCall",
    "Site",
    "Trace",
    "autograd_enabled",
    "capture",
    "first_tensor",
    "logits_of",
    "model_lock",
    "pool_of",
    "preserved",
    "probe_input",
    "serialised",
    "trace_shapes",
    "traced",
    "unwrap_compiled",
]


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


class capture:
    """Record layer inputs, outputs and output gradients while the context is open.

    Args:
        model: the network; nothing about it is changed once the context closes.
        layers: module names, or sites (:class:`hookviz.core.sites.Site`, taken as they are), whose input
            (forward-pre hook) and/or output (forward hook) are stored; a CAM tensor name
            (:mod:`hookviz.core.taps`: ``avgpool:input``, ``adaptive_avg_pool2d:input``) stores that tensor
            in ``outputs`` under its name. Each is hooked once, however often it is given.
        inputs: store each layer's first positional input.
        outputs: store each layer's output.
        grad_layers: module names (or CAM tensor names, or sites) whose tensor becomes a gradient *tap*: the
            gradient reaching it in a later backward (``torch.autograd.grad`` or ``.backward``) is stored in
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
        layers: Sequence[str | Site] = (),
        *,
        inputs: bool = False,
        outputs: bool = True,
        grad_layers: Sequence[str | Site] = (),
        clone: bool = True,
        reuse: bool = False,
    ) -> None:
        self.model = unwrap_compiled(model)
        self._given = (list(layers), list(grad_layers))
        self.layers = [_name(n) for n in layers]
        self.inputs = inputs
        self.outputs = outputs
        self.grad_layers = [_name(n) for n in grad_layers]
        self.clone = clone
        self.reuse = reuse
        self.captured = Captured()
        self._hooks = HookGroup()
        self._grad_mode = True
        self._mode: FunctionTaps | None = None
        self._lock: Any = None

    def __enter__(self) -> capture:
        # Sites are taken as they are; names are resolved here, all in one walk of the model.
        sites = {s.name: s for s in bind(self.model, [*self._given[0], *self._given[1]])}
        self._grad_mode = torch.is_grad_enabled()
        functional: dict[str, Ref] = {}
        owners: dict[str, nn.Module] = {}
        self._lock = model_lock(self.model)
        self._lock.acquire()
        try:
            for site in (sites[n] for n in dict.fromkeys(self.layers)):
                if site.function is not None:
                    functional[site.name], owners[site.path] = site.ref, site.module
                elif site.stage == "input":  # a NAME:input tensor is what this capture stores for it
                    self._hooks.add(
                        site.module.register_forward_pre_hook(self._store_input(site.name, "outputs"))
                    )
                else:
                    if self.inputs:
                        self._hooks.add(site.module.register_forward_pre_hook(self._store_input(site.name)))
                    if self.outputs:
                        self._hooks.add(site.module.register_forward_hook(self._store_output(site.name)))
            for site in (sites[n] for n in dict.fromkeys(self.grad_layers)):
                if site.function is not None:
                    functional[site.name], owners[site.path] = site.ref, site.module
                elif site.stage == "input":
                    self._hooks.add(site.module.register_forward_pre_hook(self._tap_input(site.name)))
                else:
                    self._hooks.add(site.module.register_forward_hook(self._tap(site.name)))
            if functional:
                self._mode = FunctionTaps(functional, depth_tracker(owners, self._hooks), self._take)
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


def _name(layer: str | Site) -> str:
    return layer.name if isinstance(layer, Site) else layer
