"""Dataset examples: which inputs drive each channel of a layer most, and where.

One forward pass per batch gives every channel's score on every input (its map's maximum, or its mean)
and where its maximum lies; :class:`TopK` keeps the ``k`` best inputs per channel while any number of
inputs stream past (memory: ``channels x k``). With a target class the same pass (and one backward) gives
each channel's contribution to the class's logit, gradient x activation summed over the map: the channel's
term of Grad-CAM's sum before the ReLU.

A layer's receptive field comes from the traced geometry: every convolution and pooling that ran before the
layer's output adds ``(kernel - 1) x dilation`` input pixels times its stride from the input (the ratio of the
input's size to its own input's), so parallel branches count once each: an upper bound where a block has
several, exact along a chain.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.hooks import Captured, HookGroup, capture, logits_of, preserved
from hookviz.errors import LayerError, UsageError
from hookviz.methods._utils import in_fast_layout

#: How a channel's map becomes one score per input.
REDUCE = ("max", "mean")


@dataclass(frozen=True)
class ChannelScores:
    """One layer's channels on a batch.

    Attributes:
        layer: module name.
        scores: ``(B, C)`` each channel's maximum (or mean) over its map.
        peaks: ``(B, C, 2)`` where each channel's maximum lies, ``(y, x)`` in map cells.
        size: the map's ``(H, W)``.
        contributions: ``(B, C)`` gradient x activation of the target's logit, summed over the map (None
            without a target).
    """

    layer: str
    scores: Tensor
    peaks: Tensor
    size: tuple[int, int]
    contributions: Tensor | None = None


def channel_scores(
    model: nn.Module,
    x: Tensor,
    layers: Sequence[str],
    *,
    reduce: str = "max",
    target: int | Tensor | None = None,
) -> tuple[list[ChannelScores], Tensor | None]:
    """Every channel's score and peak on each input of ``x``, per layer; and the model's output (logits).

    ``target``: a class index (or one per input): each channel's contribution to its logit is added. The
    model is left as found (eval mode for the pass). On the CPU the batch goes in channels last, the layout
    the convolutions run fastest on (1.1-1.3x for resnet18; the same values within float rounding); a model
    that refuses it (a ``.view`` over a map) is given the plain layout, from then on.

    Raises:
        LayerError: a layer does not run, or its output is not a ``(B, C, H, W)`` map.
        UsageError: an unknown ``reduce``.
    """
    if reduce not in REDUCE:
        raise UsageError(f"--reduce {reduce!r}: choose one of {', '.join(REDUCE)}")
    found, logits = in_fast_layout(model, x, lambda xi: _pass(model, xi, layers, target))
    result = [_scores(found, name, reduce, target is not None) for name in layers]
    return result, logits.detach().float().cpu()


def _pass(
    model: nn.Module, x: Tensor, layers: Sequence[str], target: int | Tensor | None
) -> tuple[Captured, Tensor]:
    """One forward pass capturing ``layers`` (and, with a target, the gradient of its logit at them)."""
    grads = list(layers) if target is not None else []
    with preserved(model), capture(model, layers, grad_layers=grads) as cap:
        model.eval()
        with torch.no_grad():
            out = model(x)
        logits = logits_of(out)
        if target is not None:
            if logits.dim() != 2:
                raise UsageError(
                    "--target ranks the channels behind a classifier's class; this model's output "
                    f"is {tuple(logits.shape)}, not (batch, classes): leave --target out"
                )
            rows = torch.arange(logits.shape[0], device=logits.device)
            t = torch.as_tensor(target, device=logits.device).expand(logits.shape[0])
            taps = [cap.captured.taps[n][0] for n in layers]
            torch.autograd.grad(logits[rows, t].sum(), taps)
    return cap.captured, logits


def _scores(found: Captured, name: str, reduce: str, attributed: bool) -> ChannelScores:
    maps = found.outputs.get(name)
    if not maps:
        raise LayerError(f"layer {name!r} did not run in the forward pass")
    act = maps[0].detach().float()
    if act.dim() != 4:
        raise LayerError(
            f"layer {name!r} gives {tuple(act.shape)}, not a (B, C, H, W) feature map; pick a "
            "convolutional layer"
        )
    h, w = act.shape[-2:]
    flat = act.flatten(2)
    top, where = flat.max(dim=2)
    scores = top if reduce == "max" else flat.mean(dim=2)
    peaks = torch.stack([where // w, where % w], dim=2)
    contrib = None
    if attributed:
        g = found.grads[name][0].detach().float()
        contrib = (g * act).sum(dim=(2, 3))
    return ChannelScores(name, scores.cpu(), peaks.cpu(), (h, w), _cpu(contrib))


def _cpu(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.cpu()


@dataclass(frozen=True)
class Example:
    """One input among a channel's best: its score, the input's name and the peak (anything JSON)."""

    score: float
    input: str
    peak: tuple[float, float]


class TopK:
    """The ``k`` highest-scoring inputs of each channel over a stream, ties to the earlier name (so any order
    of the same inputs, a resumed run's or torchrun's, keeps the same ones). An input is weighed only for
    the channels whose ``k``-th best it reaches (one vector comparison), so a long stream costs little more
    than reading it."""

    def __init__(self, channels: int, k: int) -> None:
        if k < 1:
            raise UsageError(f"--top {k}: must be at least 1")
        self.k = k
        self._heaps: list[list[tuple[float, _Reversed, tuple[float, float]]]] = [[] for _ in range(channels)]
        #: Each channel's k-th best score once it has k (else -inf): what an input must reach to enter.
        self._bar = np.full(channels, -np.inf)
        #: The name of each full channel's k-th best: an input tying its score enters only before it.
        self._last = np.full(channels, "", dtype=object)
        self._full = np.zeros(channels, dtype=bool)

    def add(
        self, name: str, scores: Sequence[float] | np.ndarray, peaks: Sequence[Sequence[float]] | np.ndarray
    ) -> None:
        values = np.asarray(scores, dtype=np.float64)
        if values.shape != self._bar.shape or len(peaks) != len(values):
            raise ValueError(f"{len(values)} scores and {len(peaks)} peaks for {len(self._heaps)} channels")
        key = _Reversed(name)
        # NaN is weighed too (a NaN bar, or score, compares False), exactly as the heap would weigh it
        weigh = ~(values < self._bar)
        tied = np.flatnonzero(weigh & (values == self._bar) & self._full)
        if len(tied):  # a tie with the k-th best enters only with an earlier name (duplicates: most ties)
            weigh[tied[self._last[tied] <= name]] = False
        for c in np.flatnonzero(weigh).tolist():
            heap, p = self._heaps[c], peaks[c]
            entry = (float(values[c]), key, (float(p[0]), float(p[1])))
            if len(heap) < self.k:
                heapq.heappush(heap, entry)
            elif entry[:2] > heap[0][:2]:
                heapq.heapreplace(heap, entry)
            if len(heap) == self.k:
                self._bar[c], self._last[c], self._full[c] = heap[0][0], heap[0][1].name, True

    def best(self, channel: int) -> list[Example]:
        """The channel's examples, best first."""
        ranked = sorted(self._heaps[channel], key=lambda e: (-e[0], e[1].name))
        return [Example(s, key.name, p) for s, key, p in ranked]

    def __len__(self) -> int:
        return len(self._heaps)


class _Reversed:
    """A name that sorts backwards: in the min-heap the later name is dropped first on a tie."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __lt__(self, other: _Reversed) -> bool:
        return self.name > other.name

    def __gt__(self, other: _Reversed) -> bool:
        return self.name < other.name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and self.name == other.name

    def __hash__(self) -> int:
        return hash(self.name)


_KERNELS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MaxPool2d, nn.AvgPool2d, nn.ConvTranspose2d)


def receptive_field(model: nn.Module, x: Tensor, layer: str) -> tuple[int, int]:
    """The ``(height, width)`` in input pixels that one cell of ``layer``'s output can see, from the kernels,
    dilations and strides of every convolution and pooling that ran before it (on one input ``x``)."""
    size = x.shape[-2:]
    grows: list[tuple[float, float]] = []
    done: list[bool] = [False]
    modules = dict(model.named_modules())
    if layer not in modules:
        raise LayerError(f"no layer {layer!r} in the model")

    def leaf(module: nn.Module, args: tuple[object, ...], output: object) -> None:
        first = args[0] if args and isinstance(args[0], Tensor) else None
        if done[0] or first is None or first.dim() != 4 or not isinstance(module, _KERNELS):
            return
        k = _pair(getattr(module, "kernel_size", 1))
        d = _pair(getattr(module, "dilation", 1))
        jump = (size[0] / first.shape[-2], size[1] / first.shape[-1])
        grows.append(((k[0] - 1) * d[0] * jump[0], (k[1] - 1) * d[1] * jump[1]))

    def end(module: nn.Module, args: object, output: object) -> None:
        done[0] = True

    with preserved(model), HookGroup() as hooks, torch.no_grad():
        for m in modules.values():
            if not list(m.children()):
                hooks.add(m.register_forward_hook(leaf))
        hooks.add(modules[layer].register_forward_hook(end))
        model.eval()
        model(x)
    if not done[0]:
        raise LayerError(f"layer {layer!r} did not run in the forward pass")
    field = (1 + sum(g[0] for g in grows), 1 + sum(g[1] for g in grows))
    return (min(round(field[0]), int(size[0])), min(round(field[1]), int(size[1])))


def _pair(v: object) -> tuple[int, int]:
    if isinstance(v, tuple):
        return (int(v[0]), int(v[-1]))
    return (int(v), int(v))  # type: ignore[call-overload]


@dataclass(frozen=True)
class ChannelTerms:
    """A class's Grad-CAM at a layer split by channel: the ``k`` channels whose terms ``alpha_c A_c`` add
    most to the sum (before Grad-CAM's ReLU), per input.

    Attributes:
        channels: ``(B, k)`` channel indices, the largest contribution first.
        maps: ``(B, k, H, W)`` each channel's term, ReLU'd: where it raises the class's score.
        shares: ``(B, k)`` each channel's contribution over the sum of the positive ones.
    """

    channels: Tensor
    maps: Tensor
    shares: Tensor


def channel_terms(model: nn.Module, x: Tensor, layer: str, target: Tensor, k: int) -> ChannelTerms:
    """The map of class ``target`` (one per input) through each of the ``k`` channels of ``layer`` that add
    most to its Grad-CAM: the channel's term of Grad-CAM's sum, ``mean(gradient) x activation``.

    Raises:
        LayerError: the layer does not run, or has no ``(B, C, H, W)`` map.
    """
    with preserved(model), capture(model, [layer], grad_layers=[layer]) as cap:
        model.eval()
        with torch.no_grad():
            out = model(x)
        logits = logits_of(out)
        rows = torch.arange(logits.shape[0], device=logits.device)
        torch.autograd.grad(logits[rows, target.to(logits.device)].sum(), cap.captured.taps[layer][0])
    act, grad = cap.captured.outputs[layer][0].detach().float(), cap.captured.grads[layer][0].detach().float()
    if act.dim() != 4:
        raise LayerError(f"--channels: layer {layer!r} has no (B, C, H, W) map (shape {tuple(act.shape)})")
    terms = grad.mean(dim=(2, 3), keepdim=True) * act
    contribution = terms.sum(dim=(2, 3))
    order = contribution.argsort(dim=1, descending=True, stable=True)[:, :k]
    positive = contribution.clamp_min(0).sum(dim=1, keepdim=True)
    shares = contribution.gather(1, order) / positive.clamp_min(1e-12)
    maps = terms.gather(1, order[:, :, None, None].expand(-1, -1, *terms.shape[2:])).clamp_min(0)
    return ChannelTerms(order.cpu(), maps.cpu(), shares.cpu())
