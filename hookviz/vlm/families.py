"""The generative vision-language models hookviz knows (a registry: :func:`register_family`), and where
their image tokens lie on the photo.

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

from typing import Any, ClassVar

import numpy as np
import torch

from hookviz.errors import InputError, UsageError
from hookviz.vlm.placement import Axis, Geometry, Placement, axis_of, processed, ramp

__all__ = [
    "FAMILIES", "HF", "Axis", "Family", "Geometry", "Placement", "family_of", "measure", "not_a_vlm",
    "processed", "register_family", "unregister_family",
]  # fmt: skip

#: A transformers model (or one of its parts): hookviz reads its config and submodules by their names, which
#: ``nn.Module``'s static type does not know (its ``__getattr__`` says ``Tensor | Module``).
HF = Any


class Family:
    """A family of vision-language models (see the module's docstring)."""

    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    #: Photos of one batch make prompts of one length (a fixed number of image tokens per photo): their
    #: answers are generated together, with no padding. A family whose token count follows the photo's size
    #: (dynamic resolutions, tiles) generates one photo at a time.
    batches: ClassVar[bool] = False

    def claims(self, model: HF) -> bool:
        return getattr(model.config, "model_type", "") in self.model_types

    def images(self, photos: list[np.ndarray]) -> Any:
        """``photos`` ``(H, W, C)`` as the processor takes them, one per prompt (a list; a single photo as
        itself)."""
        return photos[0] if len(photos) == 1 else photos

    def stacked(self, encoded: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Photos' processor inputs as one batch's (each photo's tensors one row of it), where the family
        batches and the prompts have one length; None where they cannot be stacked."""
        keys = encoded[0].keys()
        if not self.batches or any(e.keys() != keys for e in encoded):
            return None
        out: dict[str, Any] = {}
        for key in keys:
            values = [e[key] for e in encoded]
            if not all(isinstance(v, torch.Tensor) and v.shape == values[0].shape for v in values):
                return None
            out[key] = torch.cat(values, dim=0)
        return out

    def processed(self, encoded: dict[str, Any]) -> np.ndarray:
        """The first image as the processor made it, ``(C, H', W')``."""
        return np.asarray(encoded["pixel_values"][0].float())

    def views(self, encoded: dict[str, Any]) -> list[np.ndarray]:
        """The first photo's views as the processor made them, each ``(C, H', W')``, in the order the
        language model reads their tokens (one view, unless the family cuts the photo into tiles)."""
        return [self.processed(encoded)]

    def grids(self, model: HF, encoded: dict[str, Any]) -> list[tuple[int, int]]:
        """Each view's image tokens ``(rows, cols)``."""
        return [self.grid(model, encoded)]

    def patch(self, model: HF) -> int:
        return int(model.config.vision_config.patch_size)

    def grid(self, model: HF, encoded: dict[str, Any]) -> tuple[int, int]:
        """The image tokens' ``(rows, cols)`` over the processed image, in the language model's order."""
        _, h, w = self.processed(encoded).shape
        p = self.patch(model)
        return h // p, w // p

    def placement(
        self, model: HF, processor: Any, encoded: dict[str, Any], photo: tuple[int, int]
    ) -> Placement:
        """Where the first photo's image tokens lie on it (see :func:`measure`)."""
        return measure(processor, self, photo, self.grids(model, encoded))

    def tower(self, model: HF) -> HF | None:
        """The vision tower, where its tokens are the image tokens one for one (after a CLS token, if any):
        relevancy is carried on through it; None where tokens are merged or tiled."""
        return None

    def image_token(self, model: HF) -> int:
        config = model.config
        found = getattr(config, "image_token_id", None)
        return int(found if found is not None else config.image_token_index)

    def language_model(self, model: HF) -> HF:
        """The decoder that reads the image tokens (its ``layers`` are the decoder layers)."""
        return model.model.language_model


class PatchTower(Family):
    """A family whose vision tower makes one image token per patch (relevancy is carried on through it) and
    whose prompts have one length whatever the photo (a batch's answers come from one ``generate``)."""

    batches = True

    def tower(self, model: HF) -> HF | None:
        return model.model.vision_tower


class Llava(PatchTower):
    """LLaVA 1.5 (a CLIP tower, a shortest-side resize and centre crop, one token per patch)."""

    name = "llava"
    model_types = ("llava",)

    def grid(self, model: HF, encoded: dict[str, Any]) -> tuple[int, int]:
        if getattr(model.config, "vision_feature_select_strategy", "default") == "full":
            raise UsageError("a LLaVA that keeps the CLS token among its image tokens is not supported")
        return super().grid(model, encoded)


class PaliGemma(PatchTower):
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

    def grid(self, model: HF, encoded: dict[str, Any]) -> tuple[int, int]:
        _, h, w = (int(v) for v in encoded["image_grid_thw"][0])
        m = int(model.config.vision_config.spatial_merge_size)
        return h // m, w // m


class Idefics3(Family):
    """Idefics3 and SmolVLM: the photo cut into tiles (rows x columns of the largest side the tower takes)
    and a global view of it, each view's patches pixel-shuffled into one token per ``scale x scale`` patches;
    the tiles' tokens first, row by row, then the global view's."""

    name = "idefics3"
    model_types = ("idefics3", "smolvlm")

    def images(self, photos: list[np.ndarray]) -> Any:
        """A list of photos per prompt (the processor reads a flat list as one prompt's photos)."""
        return [[p] for p in photos]

    def views(self, encoded: dict[str, Any]) -> list[np.ndarray]:
        pixels = np.asarray(encoded["pixel_values"][0].float())
        mask = encoded.get("pixel_attention_mask")
        real = [v for v in range(len(pixels)) if mask is None or bool(mask[0, v].any())]  # batches pad
        return [pixels[v] for v in real]

    def grids(self, model: HF, encoded: dict[str, Any]) -> list[tuple[int, int]]:
        step = self.patch(model) * int(model.config.scale_factor)
        return [(v.shape[1] // step, v.shape[2] // step) for v in self.views(encoded)]

    def language_model(self, model: HF) -> HF:
        return model.model.text_model


class LlavaNext(Family):
    """LLaVA-NeXT: a base view of the photo, then the photo resized and padded onto the best of a few tile
    grids, the tiles' tokens joined into one grid, the padding's rows or columns taken off again (by the
    model's own ``unpad_image``), and a row-end token after each row."""

    name = "llava-next"
    model_types = ("llava_next",)

    def views(self, encoded: dict[str, Any]) -> list[np.ndarray]:
        return list(np.asarray(encoded["pixel_values"][0].float()))

    def placement(
        self, model: HF, processor: Any, encoded: dict[str, Any], photo: tuple[int, int]
    ) -> Placement:
        from transformers.models.llava_next.modeling_llava_next import (
            get_anyres_image_grid_shape,
            unpad_image,
        )

        side, patch = int(model.config.vision_config.image_size), self.patch(model)
        tiles_h, tiles_w = get_anyres_image_grid_shape(list(photo), model.config.image_grid_pinpoints, side)
        got = processed(processor.image_processor, images=ramp(photo), do_rescale=False, do_normalize=False,
                        return_tensors="pt")  # fmt: skip
        views = self.views(dict(got))
        base = Geometry(axis_of(views[0][0], 1, views[0][2] > 0.5, photo[1]),
                        axis_of(views[0][1], 0, views[0][2] > 0.5, photo[0]),
                        (side // patch, side // patch), photo)  # fmt: skip
        canvas = np.concatenate(
            [np.concatenate(views[1 + i * tiles_w : 1 + (i + 1) * tiles_w], axis=2) for i in range(tiles_h)],
            axis=1,
        )
        mask = canvas[2] > 0.5
        x, y = axis_of(canvas[0], 1, mask, photo[1]), axis_of(canvas[1], 0, mask, photo[0])
        rows, cols = tiles_h * side // patch, tiles_w * side // patch
        index = torch.arange(rows * cols).reshape(1, rows, cols)
        kept = unpad_image(index, torch.tensor(list(photo)))[0]
        kr, kc = kept.shape
        extra = 1 if getattr(model.model, "image_newline", None) is not None else 0
        if kept.numel() == 0:  # a photo so thin that its tiles' rows or columns round to none
            if kr == 0 or not extra:  # no tokens at all: the base view alone
                return Placement((base,), photo)
            # No column left: each row is its row-end token alone, with no place on the photo.
            ends = Axis(y.origin, y.step, kr * patch)
            return Placement((base, Geometry(Axis(x.origin, x.step, 0), ends, (kr, 0), photo, extra)), photo)
        r0, c0 = divmod(int(kept[0, 0]), cols)
        grid_view = Geometry(
            Axis(x.origin + x.step * c0 * patch, x.step, kc * patch),
            Axis(y.origin + y.step * r0 * patch, y.step, kr * patch), (kr, kc), photo, row_extra=extra,
        )  # fmt: skip
        return Placement((base, grid_view), photo)


class InternVL(Family):
    """InternVL: the photo cut into tiles of the tower's size (the grid closest to its shape) and a thumbnail
    of it, each tile's patches pixel-shuffled into one token per ``1 / downsample_ratio`` squared patches."""

    name = "internvl"
    model_types = ("internvl",)

    def views(self, encoded: dict[str, Any]) -> list[np.ndarray]:
        return list(np.asarray(encoded["pixel_values"].float()))  # one photo: every tile is its

    def patch(self, model: HF) -> int:
        size = model.config.vision_config.patch_size
        return int(size[0] if isinstance(size, (list, tuple)) else size)

    def grids(self, model: HF, encoded: dict[str, Any]) -> list[tuple[int, int]]:
        step = round(self.patch(model) / float(model.config.downsample_ratio))
        return [(v.shape[1] // step, v.shape[2] // step) for v in self.views(encoded)]


#: The registered families, the first that claims a model taking it (:func:`register_family`).
FAMILIES: list[Family] = [Llava(), LlavaNext(), PaliGemma(), Qwen2VL(), Idefics3(), InternVL()]


def register_family(family: Family, *, replace: bool = False) -> Family:
    """Make ``hookviz vlm`` (and the explorer) take the models ``family`` claims; registered families are
    asked first, so one may claim a model type a built-in family also names.

    Examples:
        >>> class Tiny(Family):
        ...     name, model_types = "tiny", ("tiny_vlm",)
        >>> register_family(Tiny())

    Raises:
        ValueError: the name is taken (``replace`` swaps it) or empty.
    """
    taken = [f for f in FAMILIES if f.name == family.name]
    if not family.name or (taken and not replace):
        raise ValueError(f"family {family.name!r}: give a new name, or replace=True")
    for old in taken:
        FAMILIES.remove(old)
    FAMILIES.insert(0, family)
    return family


def unregister_family(name: str) -> None:
    """Remove family ``name`` (tests that register one clean up with this)."""
    FAMILIES[:] = [f for f in FAMILIES if f.name != name]


def family_of(model: HF) -> Family:
    """The family of ``model``.

    Raises:
        UsageError: not a vision-language model hookviz knows (one line naming those it does).
    """
    for family in FAMILIES:
        if family.claims(model):
            return family
    kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    raise UsageError(not_a_vlm(str(kind)))


def not_a_vlm(kind: str) -> str:
    """What ``hookviz vlm`` says of a model of type ``kind`` that no family claims: the families it knows."""
    known = ", ".join(f.name for f in FAMILIES)
    return f"{kind} is not a vision-language model hookviz vlm knows (it knows {known})"


def measure(
    processor: Any, family: Family, photo: tuple[int, int], grids: list[tuple[int, int]]
) -> Placement:
    """Where each view's image tokens lie on a photo of ``photo`` ``(H, W)`` pixels, measured through
    ``processor``'s image processor with a ramp picture (see the module's docstring); ``grids``: each view's
    image tokens' rows and columns."""
    got = processed(processor.image_processor, images=family.images([ramp(photo)]), do_rescale=False,
                    do_normalize=False, return_tensors="pt")  # fmt: skip
    views = family.views(dict(got))
    if len(views) != len(grids):
        raise InputError(f"the processor made {len(views)} views of the ramp and {len(grids)} of the photo")
    placed = tuple(
        Geometry(axis_of(v[0], 1, v[2] > 0.5, photo[1]), axis_of(v[1], 0, v[2] > 0.5, photo[0]), grid, photo)
        for v, grid in zip(views, grids, strict=True)
    )
    return Placement(placed, photo)
