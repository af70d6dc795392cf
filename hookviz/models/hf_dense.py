"""Hugging Face detectors and semantic segmenters, explained as torchvision's are (``--model hf:DIR``).

Each is a facade over the ``transformers`` model (module names stay its own: ``model.backbone.model.layer4``)
that takes photos ``(B, 3, H, W)`` in [0, 1], prepares them with the model's own image processor (from the
same folder) and reads the outputs as the processor's post-processing does:

- :class:`HfDetector` (DETR, Conditional DETR, Deformable DETR, RT-DETR, YOLOS): the boxes, classes and scores
  of ``post_process_object_detection``; a box's score is its query's class probability, a tensor of the
  forward pass, so its gradient is that query's.
- :class:`HfSegmenter` (SegFormer, UperNet, DPT, MaskFormer, Mask2Former): the per-pixel class scores of
  ``post_process_semantic_segmentation`` (logits upsampled to the input; for the mask classifiers, the
  classes' probabilities times the masks' sigmoid, summed over queries), whose argmax is its map.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.detections import Found
from hookviz.models.facade import Facade, photos_uint8


class _Processed(Facade):
    def __init__(self, model: nn.Module, processor: Any) -> None:
        super().__init__(model)
        self._processor = (processor,)  # not a module
        self.size: dict[str, int] | None = None  # --input-size, else the processor's own
        self.num_classes = int(getattr(model.config, "num_labels", 0)) or None

    @property
    def processor(self) -> Any:
        return self._processor[0]

    def inputs(self, images: Tensor | Sequence[Tensor]) -> dict[str, Tensor]:
        """What the processor makes of the photos, on the model's device and in its dtype."""
        first = next(self.parameters())
        size = {"size": self.size} if self.size else {}
        batch = self.processor(images=photos_uint8(images), return_tensors="pt", **size)
        return {
            k: v.to(first.device, first.dtype if v.is_floating_point() else v.dtype)
            for k, v in batch.items()
            if k in ("pixel_values", "pixel_mask")
        }


class HfDetector(_Processed):
    """A ``transformers`` object detector: ``forward`` returns the class logits ``(B, queries, classes)``;
    :meth:`detect` each photo's post-processed boxes."""

    def __init__(self, model: nn.Module, processor: Any) -> None:
        super().__init__(model, processor)
        blocks = [
            n for n, _ in model.named_modules() if n.startswith("vit.encoder.layer.") and n.count(".") == 3
        ]
        if (
            blocks
        ):  # YOLOS: the last block's input (its output reaches the heads through the detection tokens only)
            self.default_layers: tuple[str, ...] = (f"{blocks[-1]}.layernorm_before",)
            self.layers_note = "the patch tokens entering its last encoder block"
        else:  # the DETR family: found from the traced shapes (the backbone's last stage)
            self.default_layers, self.layers_note = (), ""

    def set_input_size(self, size: int) -> None:
        """``--input-size``: the processor resizes to ``size`` (the shorter side, the longer capped at the
        1333/800 ratio of DETR's default; RT-DETR's fixed square: ``size`` x ``size``)."""
        own = getattr(self.processor, "size", None) or {}
        fixed = ("height" in own) if isinstance(own, dict) else getattr(own, "height", None) is not None
        self.size = (
            {"height": size, "width": size}
            if fixed
            else {"shortest_edge": size, "longest_edge": round(size * 1333 / 800)}
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.wrapped(**self.inputs(x)).logits

    def detect(self, images: Sequence[Tensor], threshold: float) -> list[Found]:
        found = []
        for image in images:
            inputs = self.inputs([image])
            out = self.wrapped(**inputs)
            size = (int(image.shape[-2]), int(image.shape[-1]))
            post = self.processor.post_process_object_detection(
                out, threshold=threshold, target_sizes=[size]
            )[0]
            pixels = inputs["pixel_values"]
            canvas = (int(pixels.shape[-2]), int(pixels.shape[-1]))
            mask = inputs.get("pixel_mask")
            if mask is not None:  # the photo's part of a padded canvas
                rows, cols = int(mask[0].any(dim=1).sum()), int(mask[0].any(dim=0).sum())
            else:
                rows, cols = canvas
            boxes = post["boxes"].detach().float()
            found.append(Found(boxes, post["labels"], post["scores"], canvas, (0, 0, rows, cols)))
        return found

    def to_map(self, t: Tensor, canvas: tuple[int, int]) -> Tensor | None:
        """Tokens ``(B, N, C)`` as a map ``(B, C, h, w)``: DETR's encoder tokens (the backbone's stride-32
        grid) or YOLOS's patch tokens (after its class token, before its detection tokens); else None."""
        if t.dim() != 3:
            return None
        b, n, c = t.shape
        extra = int(getattr(self.wrapped.config, "num_detection_tokens", 0) or 0)
        patch = int(getattr(self.wrapped.config, "patch_size", 0) or 0)
        for stride in (patch, 32) if patch else (32,):
            for h, w in {
                (canvas[0] // stride, canvas[1] // stride),
                (-(-canvas[0] // stride), -(-canvas[1] // stride)),
            }:
                for lead, tail in ((0, 0), (1, extra)):
                    if h * w and n == lead + h * w + tail:
                        return t[:, lead : lead + h * w].reshape(b, h, w, c).permute(0, 3, 1, 2)
        return None


#: Where a segmenter's decode head fuses its features, before BatchNorm, ReLU and the 1x1 classifier.
_FUSED_FEATURES = {
    "segformer": "decode_head.linear_fuse",
    "upernet": "decode_head.fpn_bottleneck.conv",
    "dpt": "head.head.0",
}


class HfSegmenter(_Processed):
    """A ``transformers`` semantic segmenter: ``forward`` returns class scores ``(B, classes, H, W)`` at the
    input's size: the processor's ``post_process_semantic_segmentation`` scores (its map is their argmax).

    The input is the photo as hookviz's preprocessing made it (the processor's size, mean and std, read from
    its config), so the model runs on ``x`` itself and pixel gradients stay available.
    """

    def __init__(self, model: nn.Module, processor: Any) -> None:
        super().__init__(model, processor)
        modules = dict(model.named_modules())
        own = _FUSED_FEATURES.get(str(getattr(model.config, "model_type", "")))
        heads = [
            n for n, m in modules.items() if isinstance(m, nn.Conv2d) and m.out_channels == self.num_classes
        ]
        if own is not None and own in modules:
            # The decode head's fused features before its last ReLU: after it the head is linear, so a CAM
            # there is the class's logit map, which ReLU blanks where a class wins by being less negative.
            self.default_layers: tuple[str, ...] = (own,)
            self.layers_note = "its decode head's fused features, before the last ReLU"
        elif (mask := "model.pixel_level_module.decoder.mask_projection") in modules:  # Mask(2)Former
            self.default_layers, self.layers_note = (mask,), "the pixel decoder's mask features"
        elif heads:
            self.default_layers = (f"{heads[-1]}:input",)
            self.layers_note = f"the features its classifier {heads[-1]} reads"
        else:
            self.default_layers, self.layers_note = (), ""

    def forward(self, x: Tensor) -> Tensor:
        out = self.wrapped(pixel_values=x)
        size = (int(x.shape[-2]), int(x.shape[-1]))
        post = getattr(self.processor, "post_process_semantic_segmentation", None)
        if post is not None:
            try:
                got = post(out, target_sizes=[size] * len(x), return_segmentation_scores=True)
                return torch.stack([g["segmentation_scores"] for g in got])
            except TypeError:  # transformers before 5.x: no scores returned; the same computation below
                pass
        classes = getattr(out, "class_queries_logits", None)
        if classes is None:  # SegFormer, UperNet, DPT: logits at a fraction of the input
            return F.interpolate(out.logits, size=size, mode="bilinear", align_corners=False)
        # MaskFormer, Mask2Former: P(class | query) without the null class, times each query's mask
        probs = classes.softmax(dim=-1)[..., :-1]
        masks = F.interpolate(out.masks_queries_logits, size=size, mode="bilinear", align_corners=False)
        return torch.einsum("bqc,bqhw->bchw", probs, masks.sigmoid())
