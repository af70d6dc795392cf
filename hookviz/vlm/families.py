"""The generative vision-language models hookviz knows, and where their image tokens lie on the photo.

A family says how its processor lays the photo out (the processed image, from the processor's own output),
how many image tokens that makes (rows x columns, in the order the language model reads them), which token
id marks them, and where its language model is. Where the tokens lie on the photo is measured through the
processor itself, not restated: the processor is handed a picture whose pixels hold their own photo
coordinates (a linear ramp: resizing, cropping and padding keep a ramp linear inside the image), so the
processed image's pixel ``u`` sits at ``origin + step * u`` on the photo, exactly, whatever the processor
does (shortest-side resizes and centre crops, squashes, dynamic resolutions).

Example:
    >>> family = family_of(model)
    >>> geometry = measure(processor, family, photo.shape[:2])
    >>> geometry.paint(scores.reshape(geometry.grid))  # a map over the photo, NaN where the model saw nothing
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from torch import nn

from hookviz.errors import UsageError
from hookviz.io.images import Box


@dataclass(frozen=True)
class Axis:
    """One axis of the processed image on the photo: pixel ``u``'s centre lies at ``origin + step * u``
    (photo pixels, ``x + 0.5`` for pixel ``x``'s centre); ``size`` processed pixels."""

    origin: float
    step: float
    size: int

    def span(self) -> tuple[float, float]:
        """The processed image's extent on the photo (its first pixel's left edge, its last's right)."""
        return self.origin - self.step / 2, self.origin + self.step * (self.size - 0.5)


@dataclass(frozen=True)
class Geometry:
    """Where the processed image lies on a photo ``(H, W)``, and the image tokens' grid ``(rows, cols)``
    over it (each token an equal block of the processed image)."""

    x: Axis
    y: Axis
    grid: tuple[int, int]
    photo: tuple[int, int]

    def box(self) -> Box:
        """The part of the photo the model saw, in whole pixels (for drawing)."""
        (x0, x1), (y0, y1) = self.x.span(), self.y.span()
        h, w = self.photo
        return Box(max(0, round(x0)), max(0, round(y0)), min(w, round(x1)), min(h, round(y1)))

    def cells(self) -> tuple[np.ndarray, np.ndarray]:
        """For each photo row and column, the token row and column it falls in (-1: outside)."""

        def along(axis: Axis, n: int, tokens: int) -> np.ndarray:
            u = ((np.arange(n) + 0.5) - axis.origin) / axis.step + 0.5  # processed pixel, continuous
            cell = np.floor(u * tokens / axis.size).astype(int)
            return np.where((u >= 0) & (u < axis.size), cell, -1)

        h, w = self.photo
        return along(self.y, h, self.grid[0]), along(self.x, w, self.grid[1])

    def paint(self, scores: np.ndarray) -> np.ndarray:
        """``scores`` ``(rows, cols)`` over the photo: each pixel takes its token's score (NaN outside)."""
        rows, cols = self.cells()
        out = np.full(self.photo, np.nan, np.float32)
        inside = (rows[:, None] >= 0) & (cols[None, :] >= 0)
        picked = scores[np.clip(rows, 0, None)[:, None], np.clip(cols, 0, None)[None, :]]
        out[inside] = picked[inside]
        return out


class Family:
    """A family of vision-language models (see the module's docstring)."""

    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()

    def claims(self, model: nn.Module) -> bool:
        return getattr(model.config, "model_type", "") in self.model_types

    def processed(self, encoded: dict[str, Any]) -> np.ndarray:
        """The first image as the processor made it, ``(C, H', W')``."""
        return np.asarray(encoded["pixel_values"][0].float())

    def patch(self, model: nn.Module) -> int:
        return int(model.config.vision_config.patch_size)

    def grid(self, model: nn.Module, encoded: dict[str, Any]) -> tuple[int, int]:
        """The image tokens' ``(rows, cols)`` over the processed image, in the language model's order."""
        _, h, w = self.processed(encoded).shape
        p = self.patch(model)
        return h // p, w // p

    def image_token(self, model: nn.Module) -> int:
        config = model.config
        found = getattr(config, "image_token_id", None)
        return int(found if found is not None else config.image_token_index)

    def language_model(self, model: nn.Module) -> nn.Module:
        """The decoder that reads the image tokens (its ``layers`` are the decoder layers)."""
        return model.model.language_model  # type: ignore[no-any-return]


class Llava(Family):
    """LLaVA 1.5 (a CLIP tower, a shortest-side resize and centre crop, one token per patch)."""

    name = "llava"
    model_types = ("llava",)

    def grid(self, model: nn.Module, encoded: dict[str, Any]) -> tuple[int, int]:
        if getattr(model.config, "vision_feature_select_strategy", "default") == "full":
            raise UsageError("a LLaVA that keeps the CLS token among its image tokens is not supported")
        return super().grid(model, encoded)


class PaliGemma(Family):
    """PaliGemma (a SigLIP tower, a squash to a square, one token per patch)."""

    name = "paligemma"
    model_types = ("paligemma",)


class Qwen2VL(Family):
    """Qwen2-VL and Qwen2.5-VL: dynamic resolution (the photo resized to multiples of patch x merge), and
    each 2 x 2 block of patches merged into one token."""

    name = "qwen2-vl"
    model_types = ("qwen2_vl", "qwen2_5_vl")

    def processed(self, encoded: dict[str, Any]) -> np.ndarray:
        """The flat patches ``(t * h * w, C * tp * p * p)`` back into the first image ``(C, H', W')`` (the
        processor orders them by merged block, then the block's 2 x 2 patches)."""
        t, h, w = (int(v) for v in encoded["image_grid_thw"][0])
        flat = np.asarray(encoded["pixel_values"].float())[: t * h * w]
        patch = self._patch(flat.shape[1])
        m = self._merge
        c, tp = 3, flat.shape[1] // (3 * patch * patch)
        blocks = flat.reshape(t, h // m, w // m, m, m, c, tp, patch, patch)[0, ..., 0, :, :]
        return blocks.transpose(4, 0, 2, 5, 1, 3, 6).reshape(c, h * patch, w * patch)

    _merge = 2

    def _patch(self, features: int) -> int:
        for p in (14, 16, 8, 28, 32):
            if features % (3 * p * p) == 0 and features // (3 * p * p) in (1, 2):
                return p
        raise UsageError(f"Qwen2-VL patches of {features} values: not a layout hookviz knows")

    def grid(self, model: nn.Module, encoded: dict[str, Any]) -> tuple[int, int]:
        _, h, w = (int(v) for v in encoded["image_grid_thw"][0])
        m = int(model.config.vision_config.spatial_merge_size)
        return h // m, w // m


FAMILIES: list[Family] = [Llava(), PaliGemma(), Qwen2VL()]


def family_of(model: nn.Module) -> Family:
    """The family of ``model``.

    Raises:
        UsageError: not a vision-language model hookviz knows (one line naming those it does).
    """
    for family in FAMILIES:
        if family.claims(model):
            return family
    kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    known = ", ".join(f.name for f in FAMILIES)
    raise UsageError(f"{kind} is not a vision-language model hookviz vlm knows (it knows {known})")


def measure(
    processor: Any, family: Family, photo: tuple[int, int], grid: tuple[int, int], **kwargs: Any
) -> Geometry:
    """Where the processed image lies on a photo of ``photo`` ``(H, W)`` pixels, measured through
    ``processor``'s image processor with a ramp picture (see the module's docstring); ``grid``: the image
    tokens' rows and columns; ``kwargs``: what the real call passes the image processor."""
    h, w = photo
    ramp = np.zeros((h, w, 3), np.float32)
    ramp[..., 0] = np.arange(w, dtype=np.float32)[None, :] + 0.5
    ramp[..., 1] = np.arange(h, dtype=np.float32)[:, None] + 0.5
    got = processor.image_processor(
        images=ramp, do_rescale=False, do_normalize=False, return_tensors="pt", **kwargs
    )
    image = family.processed(dict(got))
    return Geometry(_axis(image[0], 1), _axis(image[1], 0), grid, photo)


def _axis(plane: np.ndarray, along: int) -> Axis:
    """The line ``origin + step * u`` the ramp's values follow along one axis of the processed image (fitted
    away from its borders, where resampling clamps)."""
    values = plane[plane.shape[0] // 2] if along == 1 else plane[:, plane.shape[1] // 2]
    n = len(values)
    inner = np.arange(min(3, n // 4), max(n - min(3, n // 4), min(3, n // 4) + 2))
    step, origin = np.polyfit(inner.astype(np.float64), values[inner].astype(np.float64), 1)
    if not np.allclose(origin + step * inner, values[inner], atol=0.05 * abs(step) + 1e-3):
        raise UsageError("the processor does not resize the photo linearly; hookviz cannot place its tokens")
    return Axis(float(origin), float(step), n)
