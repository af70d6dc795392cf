"""Running a model to explain it: every CAM method, layer and target of a batch from one forward pass."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz import methods as registry
from hookviz.core import conventions
from hookviz.core.hooks import (
    autograd_enabled,
    logits_of,
    preserved,
    serialised,
    traced,
    unwrap_compiled,
)
from hookviz.core.layout import to_spatial, unfold_time
from hookviz.core.readout import Readout, Scorer, ranking, read
from hookviz.core.sites import Site, bind
from hookviz.core.taps import negative_mass
from hookviz.engine.forward import Forward, Targets, forward
from hookviz.errors import UsageError
from hookviz.methods import MethodOptions
from hookviz.methods._utils import in_fast_layout
from hookviz.methods.compute import LayerPass
from hookviz.methods.guided import guided_backprop_counted
from hookviz.render.notebook import CamDisplay, ExplanationDisplay

__all__ = ["CamResult", "Explanation", "Targets", "explain", "grad_cam", "ranking", "traced"]


@dataclass(frozen=True)
class Explanation(ExplanationDisplay):
    """Maps for a batch and the predictions behind them (all tensors on the CPU).

    Attributes:
        layers, methods: what was computed, in order.
        maps: ``(method, layer) -> (B, T, h, w)`` raw maps at the layer's resolution (a video model's:
            ``(B, T, t, h, w)``, ``t`` the layer's time steps).
        targets: ``(B, T)`` classes explained, ``T`` per image; ``target_scores``: their probabilities.
        probs: ``(B, num_classes)`` softmax; ``predicted``/``predicted_score``: top-1 class and probability.
        grads_computed: number of backward passes run (one per target, each reusing the single graph).
        labels: for a segmentation model, ``(B, H, W)`` the predicted class of each pixel (its
            ``probs`` are then pixel shares, see :mod:`hookviz.core.readout`); ``region`` what a score sums.
        negative_mass: per layer, ``(B,)`` the share of each image's CAM-tensor mass (sum of absolute
            values) that is below zero: ~0.5 for a BatchNorm's output, 0 after a ReLU, a few % after SiLU
            (formulas that assume none say why in ``hookviz.methods.registry.Method.assumes_nonnegative``).
        guided: with Guided Backprop, how many activations of each kind were guided (``{"relu": 17}``).
        channels: per layer, the CAM tensor's channels.
        score_kind: ``softmax`` (``probs`` are a softmax) or ``identity`` (they are the scores themselves: a
            similarity, see :mod:`hookviz.models.scores`).
    """

    layers: tuple[str, ...]
    methods: tuple[str, ...]
    maps: dict[tuple[str, str], Tensor]
    targets: Tensor
    target_scores: Tensor
    probs: Tensor
    predicted: Tensor
    predicted_score: Tensor
    grads_computed: int
    labels: Tensor | None = None
    region: str | None = None
    negative_mass: dict[str, Tensor] = field(default_factory=dict)
    guided: dict[str, int] | None = None
    channels: dict[str, int] = field(default_factory=dict)
    score_kind: str = "softmax"


@dataclass(frozen=True)
class CamResult(CamDisplay):
    """One method, one layer, one target per image (what :func:`grad_cam` returns)."""

    layer: str
    maps: Tensor
    probs: Tensor
    predicted: Tensor
    predicted_score: Tensor
    target: Tensor
    target_score: Tensor


def score_kind(model: nn.Module) -> str:
    """How a model's scores become what records report: ``softmax``, or ``identity`` for a similarity
    (:class:`hookviz.models.scores.Similarity` says so)."""
    return conventions.score_kind(model)


def explain(
    model: nn.Module,
    x: Tensor,
    layers: Sequence[str | Site],
    methods: Sequence[str] = ("gradcam",),
    targets: Targets = None,
    *,
    relu: bool = True,
    scorecam_batch: int = 64,
    progress: Callable[[int, int], None] | None = None,
    eigen_smooth: bool = False,
    aug_smooth: bool = False,
    region: str = "class",
    background: int | None = 0,
    options: MethodOptions | None = None,
) -> Explanation:
    """Every requested CAM ``method`` at every ``layer`` for every target, from one forward pass.

    The forward pass runs under ``torch.no_grad()`` until the earliest target layer; from there
    autograd records only the rest of the network. Each target then costs one backward pass over
    that recorded part, reusing the graph, with gradients taken w.r.t. the layer outputs alone (no
    parameter gradient is computed); all gradient methods share those gradients. Eigen-CAM needs no
    gradient; Score-CAM runs its own masked forward passes, ``scorecam_batch`` inputs at a time.

    Args:
        model: a classifier returning logits ``(B, num_classes)``, or a segmentation model returning
            ``(B, num_classes, H, W)`` (a dict's ``out``, as torchvision's): a class's score is then its
            logit summed over its predicted pixels (``region="class"``) or all pixels (``"all"``), and
            the predicted class the most frequent one other than ``background``.
        x: the preprocessed batch on the model's device.
        layers: module names (conv layers or blocks; ViT/Swin encoder blocks work too), or their sites.
        methods: registered method names (:mod:`hookviz.methods`); the pass gives them what they need.
        targets: a :data:`hookviz.core.targets.Target` (``Top(5)``, ``Classes((281,))``, ``Positive()``),
            ``None``/``"top1"`` (the predicted class), ``"topK"``, a class index for every image, a list of
            class indices shared by all images, or a ``(B, T)`` tensor.
        relu: ``False`` keeps signed maps.
        progress: called as ``progress(done, total)`` after each Score-CAM forward pass, counting the
            masked inputs of this call (Score-CAM is the slow method: one input per channel).
        eigen_smooth: gradient methods give the first principal component of their weighted activations
            instead of the sum (as pytorch-grad-cam's ``eigen_smooth``).
        aug_smooth: average the maps over test-time augmentations: horizontal flip x brightness 0.9,
            1.0, 1.1 (as pytorch-grad-cam's ``aug_smooth``); six passes, the targets of the plain one.
        options: the settings of the methods that take any (``seed``, ``samples``, ``steps``, ...; see
            :class:`hookviz.methods.MethodOptions`); ``progress`` counts every extra pass they run.

    Raises:
        UsageError: an unknown method. LayerError: a layer that does not run, runs twice, or has no
        spatial output. TargetError: targets out of range.

    Examples:
        >>> ex = explain(model, x, ["layer3", "layer4"], ["gradcam", "layercam"], "top5")
        >>> ex.maps[("gradcam", "layer4")].shape  # (B, 5, 7, 7)
    """
    model = unwrap_compiled(model)

    kind = score_kind(model)

    def readout(output: Any) -> Readout:
        return read(logits_of(output), region, background, kind)

    if options is None:
        options = MethodOptions(batch=scorecam_batch)
    with serialised(model), autograd_enabled(x) as x:
        plain = _explain(model, x, layers, methods, targets, relu, options, progress, eigen_smooth, readout)
        if not aug_smooth:
            return plain
        sums = {key: value.clone() for key, value in plain.maps.items()}
        for flip, gain in ((False, 0.9), (False, 1.1), (True, 1.0), (True, 0.9), (True, 1.1)):
            xa = (x.flip(-1) if flip else x) * gain
            ex = _explain(
                model,
                xa,
                layers,
                methods,
                plain.targets.to(x.device),
                relu,
                options,
                None,
                eigen_smooth,
                readout,
            )
            for key, value in ex.maps.items():
                sums[key] += value.flip(-1) if flip else value
        return dataclasses.replace(plain, maps={key: value / 6 for key, value in sums.items()})


def _explain(
    model: nn.Module,
    x: Tensor,
    given: Sequence[str | Site],
    methods: Sequence[str],
    targets: Targets,
    relu: bool,
    options: MethodOptions,
    progress: Callable[[int, int], None] | None,
    eigen_smooth: bool,
    readout: Callable[[Any], Readout],
) -> Explanation:
    sites = bind(model, given)
    layers, methods = tuple(s.name for s in sites), tuple(dict.fromkeys(methods))
    plan = _plan(methods)
    needs = frozenset().union(*(spec.needs for spec in plan))
    f = forward(model, x, sites, targets, needs, readout)
    shared: dict[str, Any] = {"scores": f.scores.scores.detach()}
    if f.input_grads is not None:
        shared["input_gradient"] = f.input_grads
    if f.bias is not None:
        shared["fullgrad_bias"] = f.bias.parts
    advance, total = _progress(plan, layers, f, options, x, progress)
    maps, negative = _layer_maps(
        model, x, plan, layers, f, shared, relu, eigen_smooth, options, advance, readout
    )
    if progress is not None and total:  # methods sharing their passes counted them once: the bar ends
        progress(total, total)
    for spec in plan:  # a method over all the layers: its map after the last one, for each
        if spec.across_layers:
            for layer in layers:
                maps[(spec.name, layer)] = maps[(spec.name, layers[-1])]
    ordered = {(m, layer): maps[(m, layer)].float().cpu() for m in methods for layer in layers}
    for (m, layer), value in ordered.items():  # a video model's maps get their time axis back
        if f.layouts[layer].time and value.dim() == 4:  # (a map at the input's voxels is 3-D already)
            ordered[(m, layer)] = unfold_time(value, f.layouts[layer].time)
    probs, t = f.scores.probs, f.targets
    top = f.scores.order[:, 0]
    return Explanation(
        layers=layers,
        methods=methods,
        maps=ordered,
        targets=t.cpu(),
        target_scores=probs.gather(1, t).cpu(),
        probs=probs.cpu(),
        predicted=top.cpu(),
        predicted_score=probs.gather(1, top[:, None])[:, 0].cpu(),
        grads_computed=f.backward_passes,
        labels=None if f.scores.labels is None else f.scores.labels.to(torch.int16).cpu(),
        region=f.scores.region,
        negative_mass=negative,
        guided=shared["guided"][1] if "guided" in shared else None,
        channels={la: int(to_spatial(f.raw[la], f.layouts[la]).shape[1]) for la in layers},
        score_kind=f.scores.kind,
    )


def _plan(methods: Sequence[str]) -> list[Any]:
    """The requested methods and those they use (first), each once."""
    plan = [registry.get(m) for m in methods]
    for spec in list(plan):
        plan[:0] = [registry.get(u) for u in spec.uses if u not in methods]
    return list({spec.name: spec for spec in plan}.values())


def _progress(
    plan: list[Any],
    layers: Sequence[str],
    f: Forward,
    options: MethodOptions,
    x: Tensor,
    progress: Callable[[int, int], None] | None,
) -> tuple[Callable[[int], None], int]:
    """``advance(n)`` for the methods' extra passes, and their total: per layer for a layer's method, once
    for a pixel map."""
    size = tuple(int(v) for v in x.shape[2:])
    total = 0
    for spec in plan:
        for la in layers if spec.resolution == "layer" else layers[:1]:
            k = to_spatial(f.raw[la], f.layouts[la]).shape[1]
            total += registry.passes(spec.name, k, f.targets.shape[1], options, size)[0] * x.shape[0]
    done = [0]

    def advance(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(min(done[0], total), total)

    return advance, total


def _layer_maps(
    model: nn.Module,
    x: Tensor,
    plan: list[Any],
    layers: Sequence[str],
    f: Forward,
    shared: dict[str, Any],
    relu: bool,
    eigen_smooth: bool,
    options: MethodOptions,
    advance: Callable[[int], None],
    readout: Callable[[Any], Readout],
) -> tuple[dict[tuple[str, str], Tensor], dict[str, Tensor]]:
    """Every method's maps at every layer, and each layer's negative mass."""
    t, scorer = f.targets, f.scores.scorer()
    # Score-CAM weighs a classifier's channels by the target logit (as pytorch-grad-cam and torchcam do); a
    # segmentation model's by the class's probability over the pixels it first predicted.
    channel_scorer: Scorer = scorer if f.scores.labels is not None else (lambda output, rows: output.float())

    def input_saliency() -> Tensor:  # once per pass, for every layer
        if "guided" not in shared:
            shared["guided"] = guided_backprop_counted(model, x, t, lambda output: readout(output).scores)
        return shared["guided"][0]  # (B, T, H, W) at the input's resolution

    maps: dict[tuple[str, str], Tensor] = {}
    negative: dict[str, Tensor] = {}
    with torch.no_grad():
        for layer in layers:
            a = to_spatial(f.raw[layer].detach(), f.layouts[layer])
            negative[layer] = negative_mass(a).cpu()

            def masked_scores(a: Tensor = a) -> Tensor:
                return _score_cam_scores(model, x, a, t, options.batch, advance, channel_scorer)

            grads = [to_spatial(g, f.layouts[layer]) for g in f.grads[layer]] if f.grads is not None else None
            p = LayerPass(
                model, x, layer, a, grads, t, relu, eigen_smooth, masked_scores, input_saliency,
                options=options, layout=f.layouts[layer], score_of=lambda output: readout(output).scores,
                scorer=scorer, advance=advance, shared=shared, methods=frozenset(spec.name for spec in plan),
            )  # fmt: skip
            with preserved(model):
                model.eval()
                for spec in plan:
                    p.maps[spec.name] = spec.compute(p)
                    maps[(spec.name, layer)] = p.maps[spec.name]
    return maps, negative


def _score_cam_scores(
    model: nn.Module,
    x: Tensor,
    a: Tensor,
    t: Tensor,
    chunk: int,
    advance: Callable[[int], None],
    scorer: Scorer,
) -> Tensor:
    """Target scores ``(B, T, K)`` (``scorer``'s) for the input masked by each upsampled, normalised channel.

    The ``B x K`` masked inputs are run ``chunk`` at a time across images (not image by image), so a
    batch of small-channel layers still fills every forward pass. A channel that is constant over the
    map (a dead ReLU channel: common in late layers) masks the whole input to zeros; that input is the
    same for every such channel and image, so it is run once.
    """
    if chunk < 1:
        raise UsageError(f"--scorecam-batch {chunk}: must be at least 1")
    b, k = a.shape[:2]
    size = x.shape[2:]
    out = torch.empty(b, t.shape[1], k, device=x.device)
    flat = a.reshape(b * k, *a.shape[2:]).float()
    constant = flat.flatten(1).amax(dim=1) <= flat.flatten(1).amin(dim=1)
    if bool(constant.any()):
        zero_out = logits_of(model(torch.zeros_like(x[:1])))
        idx = constant.nonzero()[:, 0]
        images = (idx // k).unique()
        zero = scorer(zero_out.expand(len(images), *zero_out.shape[1:]), images)
        per_image = torch.zeros(b, zero.shape[1], device=x.device)
        per_image[images] = zero.to(per_image.device)
        out[idx // k, :, idx % k] = per_image[idx // k].gather(1, t[idx // k])
        advance(int(idx.numel()))
    live = (~constant).nonzero()[:, 0]
    with torch.inference_mode():  # no autograd bookkeeping at all for the masked passes
        for start in range(0, int(live.numel()), chunk):
            rows = live[start : start + chunk]
            images, channels = rows // k, rows % k
            # Corner-aligned, as pytorch-grad-cam does: the maps agree to 1e-6 (bench/scorecam_bench.py).
            up = F.interpolate(flat[rows][:, None], size=size, mode="bilinear", align_corners=True)[:, 0]
            lo = up.amin(dim=(1, 2), keepdim=True)
            hi = up.amax(dim=(1, 2), keepdim=True)
            mask = torch.where(hi > lo, (up - lo) / (hi - lo).clamp_min(1e-12), torch.zeros_like(up))
            probs = scorer(
                logits_of(in_fast_layout(model, x[images] * mask[:, None].to(x.dtype), model)), images
            )
            out[images, :, channels] = probs.gather(1, t[images])
            advance(int(rows.numel()))
    return out


def grad_cam(
    model: nn.Module,
    x: Tensor,
    layer: str,
    target: int | Sequence[int] | Tensor | None = None,
    *,
    relu: bool = True,
) -> CamResult:
    """Grad-CAM of ``model`` at ``layer`` for the batch ``x``: one map per image.

    The forward pass runs under ``torch.no_grad()`` up to ``layer``; from there autograd records
    only the head, and the gradient of the target logits is taken w.r.t. the layer's output alone
    (read by a hook on that tensor), so no parameter gradient is computed. In eval mode the images of
    a batch are independent, so the gradient of the *sum* of per-image target logits gives every
    image its own gradient in one call. The model is left as found (mode, ``requires_grad``, ``.grad``,
    hooks).

    Args:
        model: a classifier returning logits ``(B, num_classes)``, or a segmentation model returning
            ``(B, num_classes, H, W)`` (a dict's ``out``, as torchvision's): a class's score is then its
            logit summed over its predicted pixels (``region="class"``) or all pixels (``"all"``), and
            the predicted class the most frequent one other than ``background``.
        x: the preprocessed batch ``(B, 3, H, W)`` on the model's device.
        layer: the module name (``layer4``, ``features.28``).
        target: ``None`` for each image's predicted class, one class index for all, or one per image.
        relu: ``False`` keeps negative evidence (signed map).

    Examples:
        >>> res = grad_cam(model, x, "layer4")
        >>> res.maps.shape  # (B, 7, 7) for a 224x224 resnet input
    """
    spec: Targets = target
    if target is not None and not isinstance(target, (int, Tensor)):
        spec = torch.as_tensor(list(target))
    ex = explain(model, x, [layer], ["gradcam"], spec, relu=relu)
    return CamResult(
        layer=layer,
        maps=ex.maps[("gradcam", layer)][:, 0],
        probs=ex.probs,
        predicted=ex.predicted,
        predicted_score=ex.predicted_score,
        target=ex.targets[:, 0],
        target_score=ex.target_scores[:, 0],
    )
