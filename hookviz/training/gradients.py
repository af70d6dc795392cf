"""Training-time gradient hooks: per-layer gradient statistics, intermediate gradients, clipping.

* Intermediate tensors have no ``.grad`` (it is ``None`` for non-leaf tensors); a hook on the layer's
  output TENSOR receives it during backward. :func:`gradient_flow` reads those and the parameters'
  gradients, computed with ``torch.autograd.grad`` so that no ``.grad`` of the model is touched.
* :func:`clip_grad_values` clips each gradient element as it flows (a tensor hook per parameter:
  each hook sees one tensor, which is all value clipping needs).
* :class:`GlobalNormClipper` clips by the global norm. No per-tensor hook can do that (the global norm
  is known only once every gradient exists), so each parameter gets a post-accumulate-grad hook, the
  first of which queues one callback that runs when the whole backward pass has finished; the
  callback computes the global norm over every ``.grad`` and scales them all, exactly like
  ``torch.nn.utils.clip_grad_norm_`` called after ``backward()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.hooks import HookGroup, autograd_enabled, capture, preserved, unwrap_compiled
from hookviz.core.layers import resolve_layers
from hookviz.errors import UsageError


@dataclass(frozen=True)
class GradStat:
    """Statistics of one gradient tensor."""

    name: str
    kind: str  # "output" (d loss / d layer output) or "param"
    shape: list[int]
    norm: float
    mean_abs: float
    max_abs: float

    @staticmethod
    def of(name: str, kind: str, g: Tensor) -> GradStat:
        g = g.detach().float()
        return GradStat(
            name,
            kind,
            list(g.shape),
            float(g.norm()),
            float(g.abs().mean()) if g.numel() else 0.0,
            float(g.abs().max()) if g.numel() else 0.0,
        )


@dataclass(frozen=True)
class GradientFlow:
    """Gradient statistics of one backward pass, layers in network order."""

    loss: float
    outputs: list[GradStat]  # per layer: gradient w.r.t. its output
    params: list[GradStat]  # per parameter: gradient w.r.t. it

    def to_dict(self) -> dict[str, Any]:
        return {
            "loss": self.loss,
            "outputs": [asdict(s) for s in self.outputs],
            "params": [asdict(s) for s in self.params],
        }


def default_grad_layers(model: nn.Module) -> list[str]:
    """Modules that own parameters directly (convs, norms, linears), in network order."""
    return [n for n, m in model.named_modules() if n and any(True for _ in m.parameters(recurse=False))]


def gradient_flow(
    model: nn.Module,
    x: Tensor,
    loss_fn: Callable[[Tensor], Tensor],
    layers: Sequence[str] | None = None,
    *,
    train_mode: bool = False,
) -> GradientFlow:
    """One forward and one backward of ``loss_fn(model(x))``; gradient statistics per layer and parameter.

    Args:
        loss_fn: maps the logits to a scalar (a class score, a cross-entropy).
        layers: names or globs whose output gradients are recorded (default: modules with parameters).
        train_mode: run in training mode (dropout, batch statistics) instead of eval mode.

    Gradients are taken w.r.t. every chosen layer's output and every trainable parameter, so frozen
    layers are measured too (a module run several times is reported per call, ``relu#2``). The model
    is left as found: nothing is accumulated into ``.grad``; mode, hooks and buffers (BatchNorm's
    running statistics, which a training-mode forward updates) restored.

    Examples:
        >>> flow = gradient_flow(model, x, lambda logits: F.cross_entropy(logits, y))
        >>> [(s.name, s.norm) for s in flow.params][:3]
    """
    model = unwrap_compiled(model)
    names = resolve_layers(model, layers) if layers else default_grad_layers(model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    with preserved(model, buffers=True), autograd_enabled(x) as x:
        model.train(train_mode)
        with capture(model, grad_layers=names, reuse=True) as cap:
            loss = loss_fn(model(x))
            if loss.dim() != 0:
                raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
            taps = [(n, i, t) for n in names for i, t in enumerate(cap.captured.taps.get(n, []))]
            inputs = [t for *_, t in taps] + [p for _, p in params]
            if not inputs:
                raise UsageError("none of the chosen layers ran, and no parameter requires a gradient")
            # Gradients w.r.t. the layer outputs too, so frozen layers are measured like trainable ones.
            grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    calls = {n: sum(1 for m, *_ in taps if m == n) for n in names}
    outputs = [
        GradStat.of(n if calls[n] == 1 else f"{n}#{i + 1}", "output", g)
        for (n, i, _), g in zip(taps, grads[: len(taps)], strict=True)
        if g is not None
    ]
    param_stats = [
        GradStat.of(n, "param", g)
        for (n, _), g in zip(params, grads[len(taps) :], strict=True)
        if g is not None
    ]
    return GradientFlow(float(loss.detach()), outputs, param_stats)


def _params(target: nn.Module | Iterable[Tensor]) -> list[Tensor]:
    ps = list(target.parameters()) if isinstance(target, nn.Module) else list(target)
    return [p for p in ps if p.requires_grad]


def clip_grad_values(target: nn.Module | Iterable[Tensor], clip: float) -> HookGroup:
    """Clamp every gradient element to ``[-clip, clip]`` as it flows into each parameter.

    Because the hook runs before accumulation, with gradient accumulation each micro-batch's
    contribution is clipped (``.grad`` can then exceed ``clip`` by summing; clip after the last
    backward with ``torch.nn.utils.clip_grad_value_`` if you need the bound on the sum).
    """
    if clip <= 0:
        raise ValueError(f"clip must be positive, got {clip}")
    return HookGroup([p.register_hook(lambda g: g.clamp(-clip, clip)) for p in _params(target)])


class GlobalNormClipper(HookGroup):
    """Scale all gradients so their global L2 norm is at most ``max_norm``, after every backward.

    Under mixed precision, pass the ``torch.amp.GradScaler``: gradients are then still multiplied by
    the scale when backward ends, so the clipper compares their norm *divided by the scale* with
    ``max_norm`` and scales them in place; after ``scaler.unscale_(optimizer)`` they equal what
    ``clip_grad_norm_`` after ``unscale_`` would give. A backward whose gradients overflowed (inf/NaN)
    is left alone: the scaler skips that step anyway. ``last_norm`` is always the unscaled norm.

    A backward that raises half-way leaves no state behind: the next one clips as usual.

    Examples:
        >>> with GlobalNormClipper(model, max_norm=1.0) as clipper:
        ...     loss.backward()          # clipped when backward ends
        ...     clipper.last_norm        # the norm before clipping
        >>> clipper = GlobalNormClipper(model, 1.0, scaler=scaler)   # AMP
        >>> scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    """

    def __init__(
        self, target: nn.Module | Iterable[Tensor], max_norm: float, *, scaler: Any | None = None
    ) -> None:
        if max_norm <= 0:
            raise ValueError(f"max_norm must be positive, got {max_norm}")
        self.max_norm = float(max_norm)
        self.scaler = scaler
        self.params = _params(target)
        self.last_norm: float | None = None
        # The backward pass (autograd graph task) the callback is queued for: a new backward gets a new
        # id, so a backward that raised before the callback ran cannot leave the clipper stuck.
        self._queued_for: int | None = None
        super().__init__([p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params])

    def _on_grad(self, param: Tensor) -> None:
        task = int(torch._C._current_graph_task_id())
        if self._queued_for != task:
            self._queued_for = task
            torch.autograd.Variable._execution_engine.queue_callback(self._clip)

    def _clip(self) -> None:
        self._queued_for = None
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        norm = float(
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
        )
        scale = 1.0
        if self.scaler is not None and self.scaler.is_enabled():
            scale = float(self.scaler.get_scale())
        if not math.isfinite(norm):
            return  # an overflowed step: GradScaler will skip it
        self.last_norm = norm / scale
        if self.last_norm > self.max_norm:
            factor = self.max_norm / (self.last_norm + 1e-6)
            for g in grads:
                g.mul_(factor)
