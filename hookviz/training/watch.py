"""The first module to turn non-finite, found at almost no cost per training step.

Every step only the model's own output is checked (a few logits) and, once per backward, its parameters'
gradients (a sum of each): no module's output or passed-back gradient is read. When either turns non-finite,
the step is *replayed* at once, before the optimiser has used it: the forward pass again on the same inputs
with the random state it began with (the same dropout masks), BatchNorm's running statistics left alone,
and, for a gradient, the backward pass again from the gradient that reached the model's output (taken with
``torch.autograd.grad``: no ``.grad`` is touched); in the replay every module's output and passed-back
gradient is summed (a sum is NaN or inf when a value is), and the first non-finite one names the module.

A value made non-finite inside a module's own code (a composite's softmax, the model's ``forward``) names
that module and the children it ran between, not the next module it reaches: the module blamed is the
innermost whose output is non-finite while its inputs were finite.

A gradient that turns non-finite before any parameter sees it (in a module ahead of every parameter) changes
no weight and is not reported; neither is ``-inf`` inside the model that leaves its output finite (a masked
softmax). With several outputs, the gradient is replayed through the first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from hookviz.core.hooks import preserved

#: Modules that cannot make a finite value non-finite, forward or backward: the replay skips them.
PASS_THROUGH = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Identity, nn.Flatten,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
)  # fmt: skip


class Watch:
    """Owned hooks that name the first module whose output or passed-back gradient turns non-finite."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self.found: tuple[str, str] | None = None
        self.on = True
        self._replaying = False
        self._call: tuple[tuple[Any, ...], dict[str, Any], list[Tensor]] | None = None
        self._out_grad: Tensor | None = None
        #: This backward's parameter gradients so far, summed, by parameter name (in the order they came).
        self._sums: list[tuple[str, Tensor]] = []
        self.handles: list[RemovableHandle] = [
            model.register_forward_pre_hook(self._start, with_kwargs=True),
            model.register_forward_hook(self._end, with_kwargs=True),
        ]
        # A tensor hook per parameter (not autograd's multi-grad hook, which breaks a user's own
        # torch.autograd.grad over the parameters while it is registered).
        self.handles += [p.register_hook(self._param_grad(n)) for n, p in named]

    # -- every step: the output and the parameters' gradients ---------------------------------------------
    def _start(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.on and not self._replaying and self.found is None:
            self._call = (args, kwargs, _rng_states(args))
            self._out_grad, self._sums = None, []

    def _end(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not self.on or self._replaying or self.found is not None:
            return
        if not _finite(output):
            self.found = self._replay(backward=False) or ("(output)", "output")
            return
        first = _first_tensor(output)
        if first is not None and first.requires_grad:
            first.register_hook(self._keep)

    def _keep(self, grad: Tensor) -> None:
        self._out_grad = grad

    def _param_grad(self, name: str) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            if not self.on or self._replaying or self.found is not None:
                return
            self._sums.append((name, grad.detach().sum(dtype=torch.float32)))
            if len(self._sums) == len(self.params):  # the backward's last parameter gradient
                self._check_gradients()

        return hook

    def _check_gradients(self) -> None:
        """Every parameter has its gradient of this backward: replayed if one is not finite."""
        sums, self._sums = self._sums, []
        if bool(torch.stack([s for _, s in sums]).isfinite().all()):
            return
        if self._out_grad is not None and not bool(self._out_grad.isfinite().all()):
            self.found = ("(loss)", "gradient")  # it reached the model non-finite
            return
        self.remove_hooks()  # the replay's own backward must not run them
        self.found = self._replay(backward=True) or (_module_of(sums), "gradient")

    # -- on a bad step: the replay ------------------------------------------------------------------------
    def _replay(self, backward: bool) -> tuple[str, str] | None:
        """The step's forward again (and its backward from the output's gradient), every module summed."""
        if self._call is None:
            return None
        args, kwargs, states = self._call
        calls: list[_Call] = []  # every module's call, in the order they finished
        grads: list[tuple[str, Tensor]] = []
        handles: list[RemovableHandle] = []
        for name, module in self.model.named_modules():
            leaf = not list(module.children())
            if leaf and isinstance(module, PASS_THROUGH):
                continue
            started: list[tuple[bool, int]] = []
            handles.append(module.register_forward_pre_hook(_entering(started, calls), with_kwargs=True))
            leaving = _leaving(name, started, calls, grads if backward and leaf and name else None)
            handles.append(module.register_forward_hook(leaving, with_kwargs=True))
        self._replaying = True
        try:
            with (
                preserved(self.model),
                _stats_kept(self.model),
                torch.random.fork_rng(devices=_devices(args)),
            ):
                _set_rng_states(states, args)
                with torch.enable_grad() if backward else torch.no_grad():
                    out = self.model(*args, **kwargs)
                found = _first_made(calls)
                first = _first_tensor(out)
                if found is None and backward and first is not None and self._out_grad is not None:
                    torch.autograd.grad(first, self.params, self._out_grad, allow_unused=True)
                    found = next(((n, "gradient") for n, s in grads if not bool(s.isfinite())), None)
        finally:
            self._replaying = False
            for h in handles:
                h.remove()
        return found

    # -- the monitor's side -------------------------------------------------------------------------------
    def take(self) -> tuple[str, str] | None:
        """The first non-finite (module, ``output`` or ``gradient``) since the watch began, if any; the step's
        inputs are let go. A backward that left parameters without a gradient is checked here, without a
        replay (the optimiser has used it): the module of the first parameter whose gradient is not finite."""
        sums, self._sums = self._sums, []
        if self.found is None and sums and not bool(torch.stack([s for _, s in sums]).isfinite().all()):
            self.found = (_module_of(sums), "gradient")
        self._call, self._out_grad = None, None
        return self.found

    def paused(self) -> Any:
        watch = self

        class _Paused:
            def __enter__(self) -> None:
                watch.on = False

            def __exit__(self, *exc: object) -> None:
                watch.on = True

        return _Paused()

    def remove_hooks(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def remove(self) -> None:
        self.remove_hooks()
        self._call, self._out_grad = None, None


@contextmanager
def _stats_kept(model: nn.Module) -> Iterator[None]:
    """BatchNorm in training mode normalises by the batch (as in the step) without updating its running
    statistics: those buffers may be saved for the step's own backward, so they are not even restored."""
    changed = [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats
    ]
    for m in changed:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in changed:
            m.track_running_stats = True


def _module_of(sums: list[tuple[str, Tensor]]) -> str:
    """The module of the first parameter (in the order the gradients came) whose gradient is not finite."""
    name = next((n for n, s in sums if not bool(s.isfinite())), sums[0][0])
    return name.rpartition(".")[0] or name


@dataclass
class _Call:
    """One module's call in the replay: whether its inputs and its output were finite, and the calls
    that finished inside it (its children's among them)."""

    name: str
    inputs_finite: bool
    output_finite: bool
    inside: list[_Call]


def _entering(started: list[tuple[bool, int]], calls: list[_Call]) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
        started.append((_finite(args) and _finite(kwargs), len(calls)))

    return hook


def _leaving(
    name: str, started: list[tuple[bool, int]], calls: list[_Call], grads: list[tuple[str, Tensor]] | None
) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        finite_in, begun = started.pop() if started else (True, len(calls))
        calls.append(_Call(name, finite_in, _finite(output), calls[begun:]))
        first = args[0] if args and isinstance(args[0], Tensor) else None
        if grads is not None and first is not None and first.requires_grad:
            first.register_hook(lambda g: grads.append((name, g.sum(dtype=torch.float32))))

    return hook


def _first_made(calls: list[_Call]) -> tuple[str, str] | None:
    """The innermost module whose output turned non-finite from finite inputs (the first such call to
    finish): a leaf, or a composite module or the model whose own code made it, named with the children it
    happened between (``attn (its own code, between attn.qkv and attn.proj)``)."""
    call = next((c for c in calls if c.inputs_finite and not c.output_finite), None)
    if call is None:
        return None
    depth = call.name.count(".") + 1 if call.name else 0
    prefix = f"{call.name}." if call.name else ""
    children = [c for c in call.inside if c.name.startswith(prefix) and c.name.count(".") == depth and c.name]
    if not children and call.name:
        return call.name, "output"
    before = [c.name for c in children if c.output_finite and c.inputs_finite]
    after = next((c.name for c in children if not c.inputs_finite), None)
    where = (
        f"between {before[-1]} and {after}" if before and after else
        f"after {before[-1]}" if before else f"before {after}" if after else "before any module ran"
    )  # fmt: skip
    own = f"{call.name}'s own code" if call.name else "the model's forward"
    return f"{call.name or '(forward)'} ({own}, {where})", "output"


def _finite(value: Any) -> bool:
    """Whether every floating-point tensor in ``value`` (a tensor, or a dict, list or tuple of them) is
    finite."""
    if isinstance(value, Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value.detach()).all())
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def _first_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value if value.is_floating_point() else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return next((t for v in items if (t := _first_tensor(v)) is not None), None)


def _devices(args: Any) -> list[int]:
    """The CUDA devices whose random state the step's inputs could draw from."""
    t = _first_tensor(args)
    return [t.device.index or 0] if t is not None and t.device.type == "cuda" else []


def _rng_states(args: Any) -> list[Tensor]:
    return [torch.get_rng_state()] + [torch.cuda.get_rng_state(d) for d in _devices(args)]


def _set_rng_states(states: list[Tensor], args: Any) -> None:
    torch.set_rng_state(states[0])
    for d, s in zip(_devices(args), states[1:], strict=False):
        torch.cuda.set_rng_state(s, d)
