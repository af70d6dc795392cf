"""Explaining a detector: one map per detected box, each from the gradient of that box's own score.

torchvision's detectors (Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS, SSD) take photos of any size in
[0, 1], resize and normalise them inside their own ``transform``, pad the batch, and return boxes in the
photo's pixels. One forward pass records the network from the target layer on; the score of each kept
detection is a tensor of that very pass (the box is the same box, not a re-matched one), so each box
costs one backward pass over the recorded graph. Eigen-CAM needs no gradient: one map per photo.

The default method is HiResCAM (gradient x activation, summed over channels): a box's score reads the
features inside its proposal only, so its gradient is local, and element-wise methods (HiResCAM,
LayerCAM) keep it local. Grad-CAM averages that gradient over the whole map into one weight per channel,
so its map lights up every object with those channels, not the box: on the shapes detector, HiResCAM's
peak lies in the explained box for 35 of 37 boxes, LayerCAM's 36, Grad-CAM's 16 (tests/test_dense.py).

The layer's map covers the padded canvas; it is upsampled to that canvas and cut to the resized photo,
so maps and boxes land on the original photo exactly (tested with off-centre objects in non-square
photos).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.detections import Detects, Found
from hookviz.core.hooks import HookGroup, autograd_enabled, capture, preserved, unwrap_compiled
from hookviz.core.layers import single_call
from hookviz.errors import LayerError, UsageError
from hookviz.methods import REGISTRY, MethodOptions
from hookviz.methods.compute import LayerPass
from hookviz.methods.perturb import random_masks


#: What a detector's maps can be made with: the gradient methods and Eigen-CAM.
def detection_methods() -> list[str]:
    """The registered methods that work per detected box (``detection=True``: gradient-weighted ones from the
    box's score gradient, and Eigen-CAM once per photo)."""

    return [m.name for m in REGISTRY.values() if m.detection]


#: The built-in ones (:func:`detection_methods` has any registered later too).


@dataclass(frozen=True)
class DetectionExplanation:
    """One photo's detections and their maps (tensors on the CPU).

    Attributes:
        boxes: ``(N, 4)`` kept detections ``x0, y0, x1, y1`` in the photo's pixels, best first;
            ``labels`` ``(N,)`` their classes, ``scores`` ``(N,)`` their scores.
        maps: ``(method, layer) -> (N, h, w)`` one map per box for the gradient methods, ``(1, h, w)``
            for Eigen-CAM, at the resolution the model resized the photo to (padding removed).
        found: detections the model returned before ``score_threshold`` and ``classes`` (kept or not).
        image_size, resized: the photo's ``(H, W)`` and the model's resized ``(h, w)``.
    """

    boxes: Tensor
    labels: Tensor
    scores: Tensor
    layers: tuple[str, ...]
    methods: tuple[str, ...]
    maps: dict[tuple[str, str], Tensor]
    found: int
    image_size: tuple[int, int]
    resized: tuple[int, int]
    grads_computed: int
    #: An instance segmenter's classes among the kept boxes, first seen first (``(R,)``), each class's
    #: region (the union of its instances' masks, ``(R, h, w)``, at ``resized``), its score (the sum of its
    #: instances' scores) and its maps ``(method, layer) -> (R, h, w)``; empty for other detectors.
    region_labels: Tensor = dataclasses.field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    region_masks: Tensor = dataclasses.field(default_factory=lambda: torch.zeros(0, 0, 0, dtype=torch.bool))
    region_scores: Tensor = dataclasses.field(default_factory=lambda: torch.zeros(0))
    region_maps: dict[tuple[str, str], Tensor] = dataclasses.field(default_factory=dict)


@contextmanager
def _score_floor(model: nn.Module, threshold: float) -> Iterator[None]:
    """While open, the detector's own score cut-off is at most ``threshold`` (restored after), so a low
    ``--score-threshold`` shows boxes it would drop (with random weights, every box)."""
    holders: list[Any] = [m for m in (model, getattr(model, "roi_heads", None)) if hasattr(m, "score_thresh")]
    saved = [m.score_thresh for m in holders]
    try:
        for m in holders:
            m.score_thresh = min(float(m.score_thresh), threshold)
        yield
    finally:
        for m, value in zip(holders, saved, strict=True):
            m.score_thresh = value


class _Torchvision:
    """torchvision's detectors: they take a list of photos, resize and pad them in their ``transform``, and
    return ``boxes``, ``labels`` and ``scores`` in the photos' pixels."""

    def __init__(self, model: nn.Module) -> None:
        if getattr(model, "transform", None) is None:
            raise UsageError("the detector has no `transform` module (torchvision's detectors have one)")
        self.model = model

    def detect(self, images: Sequence[Tensor], threshold: float) -> list[Found]:
        sizes: list[tuple[int, int]] = []
        padded: list[tuple[int, int]] = []

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            batch = output[0]
            sizes.extend((int(h), int(w)) for h, w in batch.image_sizes)
            padded.append((int(batch.tensors.shape[-2]), int(batch.tensors.shape[-1])))

        group = HookGroup()
        transform: Any = self.model.transform
        group.add(transform.register_forward_hook(hook))
        with group, _score_floor(self.model, threshold):
            outs = self.model(list(images))
        if len(sizes) != len(outs):
            raise UsageError("the detector's transform did not report the resized image size")
        return [
            Found(out["boxes"], out["labels"], out["scores"], padded[0], (0, 0, *size))
            for out, size in zip(outs, sizes, strict=True)
        ]


def detector_of(model: nn.Module) -> Detects:
    """How to run ``model`` as a detector: itself where it implements :class:`Detects`, else torchvision's."""
    return model if isinstance(model, Detects) else _Torchvision(model)


def explain_detections(
    model: nn.Module,
    images: Tensor | np.ndarray | Sequence[Tensor | np.ndarray],
    layers: Sequence[str],
    methods: Sequence[str] = ("hirescam",),
    *,
    score_threshold: float = 0.5,
    max_boxes: int = 10,
    classes: Sequence[int] | None = None,
    relu: bool = True,
    eigen_smooth: bool = False,
    options: MethodOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[DetectionExplanation]:
    """Detections of each photo above ``score_threshold`` (at most ``max_boxes``, best first), each with
    a map per gradient method and layer; Eigen-CAM gives one map per photo.

    Args:
        model: a torchvision detector (or one built from its classes).
        images: ``(B, 3, H, W)`` or a list of ``(3, H, W)`` photos in [0, 1], each at its own size, or
            ``(H, W, 3)`` ``uint8`` photos as :func:`hookviz.load_rgb` reads them (moved to the model's
            device).
        layers: module names (default in the CLI: the backbone's last stage, ``backbone.body.layer4``).
        classes: keep only detections of these classes.
        options: the methods' settings (D-RISE: ``masks``, ``cells``, ``seed``, ``batch``); ``progress`` is
            called as ``progress(done, total)`` over D-RISE's masked passes.

    Raises:
        UsageError: a method that needs more than a gradient (Score-CAM, guided), bad limits, or an image
            that is not a photo.
        LayerError: a layer that does not run once with a ``(1, C, h, w)`` output.

    Examples:
        >>> import torchvision
        >>> from hookviz import load_rgb
        >>> model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None)
        >>> photo = load_rgb("sample_images/cat.jpg")  # or a (3, H, W) tensor in [0, 1]
        >>> [ex] = explain_detections(model, [photo], ["backbone.body.layer4"], max_boxes=3)
        >>> ex.boxes, ex.maps[("hirescam", "backbone.body.layer4")].shape  # (N, 4), (N, h, w)
    """
    unknown = [m for m in methods if m not in detection_methods()]
    if unknown:
        raise UsageError(
            f"method {unknown[0]!r} is not available for detectors; use {', '.join(detection_methods())}"
        )
    if not 0.0 <= score_threshold <= 1.0:
        raise UsageError(f"--score-threshold {score_threshold}: must be between 0 and 1")
    if max_boxes < 1:
        raise UsageError(f"--max-boxes {max_boxes}: must be at least 1")
    model = unwrap_compiled(model)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    photos = [_photo(image, device) for image in images]
    layers, methods = tuple(dict.fromkeys(layers)), tuple(dict.fromkeys(methods))
    options = options or MethodOptions()
    found = [
        _explain_one(model, image, layers, methods, score_threshold, max_boxes, classes, relu, eigen_smooth)
        for image in photos
    ]
    if "drise" not in methods:
        return found
    total = len(found) * options.masks
    done = [0]

    def advance(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0], total)

    out = []
    for image, ex in zip(photos, found, strict=True):
        m = drise(model, image, ex.boxes, ex.labels, options, advance)
        small = F.interpolate(m[:, None], size=ex.resized, mode="bilinear", align_corners=False)[:, 0]
        maps = dict(ex.maps)
        for layer in layers:
            maps[("drise", layer)] = small
        out.append(dataclasses.replace(ex, maps={(k, la): maps[(k, la)] for k in methods for la in layers}))
    return out


def _photo(image: Any, device: torch.device) -> Tensor:
    """One photo as a detector takes it: a ``(3, H, W)`` tensor in [0, 1] as given, or an ``(H, W, 3)`` RGB
    array (``uint8`` as :func:`hookviz.load_rgb` reads it, or floats in [0, 1]) turned into one on ``device``.

    Raises:
        UsageError: anything else (named with its type and shape).
    """
    if isinstance(image, Tensor) and image.dim() == 3 and image.shape[0] == 3:
        return image
    if isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[-1] == 3:
        scale = 255.0 if image.dtype == np.uint8 else 1.0
        return (torch.from_numpy(np.array(image, np.float32)).permute(2, 0, 1) / scale).to(device)
    shape = tuple(getattr(image, "shape", ()))
    raise UsageError(
        f"explain_detections: an image is a (3, H, W) tensor in [0, 1] or an (H, W, 3) RGB array "
        f"(load_rgb's), not a {type(image).__name__} of shape {shape}"
    )


def drise(
    model: nn.Module,
    image: Tensor,
    boxes: Tensor,
    labels: Tensor,
    options: MethodOptions,
    advance: Callable[[int], None] = lambda n: None,
) -> Tensor:
    """D-RISE (Petsiuk et al., CVPR 2021) for the given detections of one photo: ``(N, H, W)`` in the photo's
    pixels, ``Σ_i w_i M_i / (masks · 0.5)`` over RISE's random masks, where ``w_i`` is the best match among
    the detections of the photo masked by ``M_i``: IoU with the box times the detection's score, among those
    of the box's class (torchvision's detectors give a class and a score, not the paper's class
    distribution). The detector's own score cut-off is lowered to 0 meanwhile, so weak matches count."""
    from torchvision.ops import box_iou

    h, w = int(image.shape[-2]), int(image.shape[-1])
    if not len(boxes):  # nothing to explain: no detector pass
        advance(options.masks)
        return torch.zeros(0, h, w)
    masks = random_masks(options.masks, options.cells, (h, w), options.seed).to(image.device)
    weights = torch.zeros(len(boxes), options.masks)
    target_boxes = boxes.to(image.device)
    detector = detector_of(model)
    with torch.no_grad(), preserved(model):
        model.eval()
        for start in range(0, options.masks, options.batch):
            chunk = masks[start : start + options.batch]
            outs = detector.detect([image * mk[None] for mk in chunk], 0.0)
            for k, out in enumerate(outs):
                if len(boxes) and len(out.boxes):
                    iou = box_iou(target_boxes, out.boxes.to(image.device))  # (targets, found)
                    same = labels.to(image.device)[:, None] == out.labels.to(image.device)[None]
                    score = iou * out.scores.to(image.device)[None] * same
                    weights[:, start + k] = score.amax(dim=1).float().cpu()
            advance(len(chunk))
    return torch.einsum("nm,mhw->nhw", weights, masks.float().cpu()) / (options.masks * 0.5)


def _kept(
    scores: Tensor, labels: Tensor, threshold: float, classes: Sequence[int] | None, max_boxes: int
) -> Tensor:
    """The boxes explained: scoring at least ``threshold``, of ``classes`` when given, best first, at most
    ``max_boxes``."""
    keep = scores.detach() >= threshold
    if classes is not None:
        keep &= torch.isin(labels, torch.as_tensor(list(classes), device=labels.device))
    kept = keep.nonzero()[:, 0]
    return kept[scores.detach()[kept].argsort(descending=True, stable=True)][:max_boxes]


def _explain_one(
    model: nn.Module,
    image: Tensor,
    layers: tuple[str, ...],
    methods: tuple[str, ...],
    threshold: float,
    max_boxes: int,
    classes: Sequence[int] | None,
    relu: bool,
    eigen_smooth: bool,
) -> DetectionExplanation:

    gradient_methods = [m for m in methods if REGISTRY[m].family == "gradient-weighted"]
    passes = 0
    detector = detector_of(model)
    with autograd_enabled(image[None]) as batch, preserved(model):
        model.eval()
        # Gradient methods read the activations at their taps; Eigen-CAM alone needs stored outputs.
        hooks = capture(
            model, () if gradient_methods else layers, grad_layers=layers if gradient_methods else ()
        )
        with hooks as cap:
            with torch.no_grad():
                out = detector.detect([batch[0]], threshold)[0]
            found = cap.captured.taps if gradient_methods else cap.captured.outputs
            acts: dict[str, Tensor] = {}
            for layer in layers:
                acts[layer] = single_call(found, layer)
                _spatial(detector, acts[layer], out.canvas, layer)  # a map, or a clear error
            scores, labels, boxes = out.scores, out.labels, out.boxes
            kept = _kept(scores, labels, threshold, classes, max_boxes)
            grads: dict[str, list[Tensor]] = {layer: [] for layer in layers}
            taps = [acts[layer] for layer in layers]
            regions = _class_regions(out, kept)
            wanted = [scores[i] for i in kept.tolist()] + [scores[idx].sum() for _, idx in regions]
            for j, target in enumerate(wanted):
                if not scores.requires_grad:
                    break
                got_grads = torch.autograd.grad(
                    target, taps, retain_graph=j < len(wanted) - 1, allow_unused=True
                )
                passes += 1
                for layer, g in zip(layers, got_grads, strict=True):
                    grads[layer].append(torch.zeros_like(acts[layer]) if g is None else g)
    region = out.region
    n = len(kept) + len(regions)
    maps = _layer_maps(model, detector, out, acts, grads, n, methods, relu, eigen_smooth)
    boxed = len(kept)
    ex = DetectionExplanation(
        boxes=boxes.detach()[kept].float().cpu(),
        labels=labels.detach()[kept].cpu(),
        scores=scores.detach()[kept].float().cpu(),
        layers=layers,
        methods=methods,
        maps={
            (m, la): v[: boxed if m in gradient_methods else None].float().cpu()
            for (m, la), v in maps.items()
        },
        found=int(scores.numel()),
        image_size=(int(image.shape[-2]), int(image.shape[-1])),
        resized=region[2:],
        grads_computed=passes,
    )
    if not regions:
        return ex
    return dataclasses.replace(
        ex,
        region_labels=torch.stack([c for c, _ in regions]).cpu(),
        region_masks=torch.stack([mask for _, mask in _union_masks(out, regions)]),
        region_scores=torch.stack([scores.detach()[idx].sum() for _, idx in regions]).float().cpu(),
        region_maps={(m, la): maps[(m, la)][boxed:].float().cpu() for m in gradient_methods for la in layers},
    )


def _layer_maps(
    model: nn.Module,
    detector: Detects,
    out: Found,
    acts: dict[str, Tensor],
    grads: dict[str, list[Tensor]],
    n: int,
    methods: tuple[str, ...],
    relu: bool,
    eigen_smooth: bool,
) -> dict[tuple[str, str], Tensor]:
    """Each method's maps at each layer, on the photo's part of the canvas: ``(n, h, w)`` for the gradient
    methods (one per target, from its gradients), ``(1, h, w)`` for the activation-only ones."""
    canvas, region = out.canvas, out.region
    maps: dict[tuple[str, str], Tensor] = {}
    with torch.no_grad():
        for layer in acts:
            a = _spatial(detector, acts[layer].detach(), canvas, layer)
            grads[layer] = [_spatial(detector, g, canvas, layer) for g in grads[layer]]
            for m in methods:
                if REGISTRY[m].family == "activation-only":  # one map per photo
                    targets = torch.zeros(1, 1, dtype=torch.long)
                    p = LayerPass(model, a, layer, a, None, targets, relu, eigen_smooth)
                    maps[(m, layer)] = _on_photo(REGISTRY[m].compute(p)[:, 0], canvas, region)
                    continue
                if REGISTRY[m].family != "gradient-weighted":
                    continue
                if len(grads[layer]) < n:  # the scores do not depend on this layer: no evidence
                    grads[layer] += [torch.zeros_like(a)] * (n - len(grads[layer]))
                if n:
                    p = LayerPass(
                        model,
                        a,
                        layer,
                        a,
                        grads[layer],
                        torch.zeros(1, n, dtype=torch.long),
                        relu,
                        eigen_smooth,
                    )
                    stacked = REGISTRY[m].compute(p)[0]  # (targets, h, w)
                else:
                    stacked = a.new_zeros(0, *a.shape[2:])
                maps[(m, layer)] = _on_photo(stacked, canvas, region)
    return maps


def _class_regions(out: Found, kept: Tensor) -> list[tuple[Tensor, Tensor]]:
    """An instance segmenter's classes among the kept boxes (first seen first), each with the indices of its
    kept instances; none for a detector without masks."""
    if out.masks is None or not len(kept):
        return []
    labels = out.labels.detach()[kept]
    classes = list(dict.fromkeys(labels.tolist()))
    return [(torch.tensor(c), kept[labels == c]) for c in classes]


def _union_masks(out: Found, regions: list[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
    """Each class's region: the union of its instances' masks."""
    assert out.masks is not None
    return [(c, out.masks[idx.cpu()].any(dim=0)) for c, idx in regions]


def _spatial(detector: Detects, t: Tensor, canvas: tuple[int, int], layer: str) -> Tensor:
    """A layer's tensor as a ``(1, C, h, w)`` map: as it is, or a transformer's tokens laid out on their grid
    by the detector (``to_map``: YOLOS's patch tokens, DETR's encoder tokens).

    Raises:
        LayerError: no map can be made of it.
    """
    if t.dim() == 4:
        return t
    to_map = getattr(detector, "to_map", None)
    laid = to_map(t, canvas) if to_map is not None else None
    if laid is None:
        raise LayerError(
            f"layer {layer!r} gives shape {tuple(t.shape)}, not a (1, C, h, w) map; "
            "pick a convolutional layer of the backbone"
        )
    return laid


def _on_photo(maps: Tensor, canvas: tuple[int, int], region: tuple[int, int, int, int]) -> Tensor:
    """Maps over the network's input canvas → the photo's part of it, at its resolution there."""
    top, left, h, w = region
    if maps.shape[0] == 0:
        return maps.new_zeros(0, h, w)
    up = F.interpolate(maps[:, None].float(), size=canvas, mode="bilinear", align_corners=False)[:, 0]
    return up[:, top : top + h, left : left + w]
