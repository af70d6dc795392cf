"""The shared pass of :func:`hookviz.engine.explain.explain`: one forward with the layers captured, and one
backward per target where a method needs gradients; the targets a ``--target`` gives a batch."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.hooks import capture, preserved, traced
from hookviz.core.layers import single_call
from hookviz.core.layout import Layout
from hookviz.core.readout import Readout, positive_targets
from hookviz.core.sites import Site
from hookviz.core.targets import Classes, Labelled, Positive, Target, Top, parse
from hookviz.errors import TargetError
from hookviz.methods.pixel import BiasTerms

__all__ = ["Forward", "Targets", "class_targets", "forward"]

#: A parsed ``--target`` (:data:`hookviz.core.targets.Target`), its words, None, class indices or a tensor.
Targets = Target | int | Sequence[int] | Sequence[Sequence[int]] | Tensor | str | None


def class_targets(spec: Targets, logits: Tensor, order: Tensor) -> Tensor:
    """``(B, T)`` class indices: :class:`Top` (``None``: top-1) each image's top K; :class:`Classes`, an
    ``int`` or ints the same for every image; :class:`Positive` each image's labels over the threshold; a
    tensor one class per image, or ``(B, T)``; words (``"top5"``) are parsed as ``--target`` first."""
    n, num_classes = logits.shape
    if isinstance(spec, str):  # the Python API's words: parsed as --target is, by index only
        spec = parse(spec, None, num_classes)
    if isinstance(spec, Labelled):
        raise TargetError("target label: each input's own class; give the classes as a tensor")
    if isinstance(spec, Positive):
        t = positive_targets(logits, order, spec.threshold)
    elif spec is None or isinstance(spec, Top):
        k = 1 if spec is None else spec.k
        if k > num_classes:
            raise TargetError(f"target top{k}: the model has only {num_classes} classes")
        t = order[:, :k]
    elif isinstance(spec, Tensor):
        t = spec.to(logits.device)
        t = t[:, None] if t.dim() == 1 else t
    else:
        shared = (
            list(spec.ids) if isinstance(spec, Classes) else [spec] if isinstance(spec, int) else list(spec)
        )
        t = torch.as_tensor(shared, device=logits.device)
        t = t[None].expand(n, -1) if t.dim() == 1 else t
    if t.dim() != 2 or t.shape[0] != n or t.shape[1] == 0:
        raise TargetError(f"got targets of shape {tuple(t.shape)} for a batch of {n}")
    if bool(((t < 0) | (t >= num_classes)).any()):
        raise TargetError(f"target class out of range 0..{num_classes - 1}: {t.unique().tolist()}")
    return t.long()


@dataclass
class Forward:
    """What the shared forward (and backward) pass gives every method."""

    scores: Readout
    targets: Tensor  # (B, T) class indices
    raw: dict[str, Tensor]  # each layer's tensor as captured
    layouts: dict[str, Layout]
    grads: dict[str, list[Tensor]] | None  # per layer, one gradient per target (layer_gradients)
    input_grads: list[Tensor] | None  # one per target (input_gradients)
    bias: BiasTerms | None  # FullGrad's bias terms (bias_gradients)
    backward_passes: int


def forward(
    model: nn.Module,
    x: Tensor,
    sites: Sequence[Site],
    targets: Targets,
    needs: frozenset[str],
    readout: Callable[[Any], Readout],
) -> Forward:
    """One forward pass with the layers captured, and one backward pass per target when a method needs
    gradients (at the layers, at the input, FullGrad's bias terms)."""
    with_gradients = "layer_gradients" in needs
    # The plain input gradient (Saliency, Input x Gradient) comes from this pass, recorded from the input.
    with_input = "input_gradients" in needs
    backward_passes, layers = 0, [s.name for s in sites]
    input_grads: list[Tensor] = []
    grads: dict[str, list[Tensor]] = {layer: [] for layer in layers}
    with preserved(model):
        model.eval()
        # Gradient taps when a method needs layer gradients; else the tensors alone, with no graph.
        hooks = capture(model, grad_layers=sites) if with_gradients else capture(model, sites, outputs=True)
        x_in = x.detach().requires_grad_() if with_input else x
        # FullGrad's bias terms, gathered by the shared backward passes (they reach the input for it).
        bias = BiasTerms(model) if "bias_gradients" in needs else None
        with hooks as cap, bias if bias is not None else contextlib.nullcontext():
            with torch.enable_grad() if with_input else torch.no_grad():
                scores = readout(model(x_in))
            logits = scores.scores
            found = cap.captured.taps if with_gradients else cap.captured.outputs
            raw = {layer: single_call(found, layer) for layer in layers}
            t = class_targets(targets, logits.detach(), scores.order)
            if with_gradients or with_input:
                inputs = [raw[layer] for layer in layers] if with_gradients else []
                rows = torch.arange(t.shape[0], device=t.device)
                for j in range(t.shape[1]):
                    if bias is not None:
                        bias.start()
                    score = logits[rows, t[:, j]].sum()
                    got = torch.autograd.grad(score, [*inputs, *([x_in] if with_input else [])],
                                              retain_graph=j < t.shape[1] - 1)  # fmt: skip
                    backward_passes += 1
                    if with_input:
                        input_grads.append(got[-1].detach())
                    for layer in layers if with_gradients else ():
                        grads[layer].append(cap.captured.grads[layer][-1])
        # Each site's layout as traced, else from its tensor (tokens: by a pass traced on x, the hooks off).
        again = functools.partial(traced, model, tuple(x.shape[1:]), x.device)
        layouts = {s.name: s.layout_at(raw[s.name].shape, x.shape, again) for s in sites}
    kept = grads if with_gradients else None
    return Forward(scores, t, raw, layouts, kept, input_grads if with_input else None, bias, backward_passes)
