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
import torch

from hookviz.errors import InputError, UsageError
from hookviz.io.images import Box

#: A transformers model (or one of its parts): hookviz reads its config and submodules by their names, which
#: ``nn.Module``'s static type does not know (its ``__getattr__`` says ``Tensor | Module``).
HF = Any


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
    #: Tokens after each row that have no place on the photo (LLaVA-NeXT's row-end token).
    row_extra: int = 0

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


@dataclass(frozen=True)
class Placement:
    """Where each view's image tokens lie on a photo ``(H, W)``; a map is one score per image token, the
    views' tokens one after another (each view row-major)."""

    views: tuple[Geometry, ...]
    photo: tuple[int, int]

    @property
    def grids(self) -> list[tuple[int, int]]:
        return [v.grid for v in self.views]

    @property
    def tokens(self) -> int:
        return sum(r * (c + v.row_extra) for v, (r, c) in zip(self.views, self.grids, strict=True))

    def split(self, scores: np.ndarray) -> list[np.ndarray]:
        """A flat map's scores as each view's ``(rows, cols)`` grid (row-end tokens left out)."""
        out, start = [], 0
        for view, (r, c) in zip(self.views, self.grids, strict=True):
            width = c + view.row_extra
            out.append(np.asarray(scores[start : start + r * width]).reshape(r, width)[:, :c])
            start += r * width
        return out

    def per_view(self, scores: np.ndarray, change: Any) -> np.ndarray:
        """``scores`` with each view's grid replaced by ``change(grid)`` (row-end tokens left as they are)."""
        out = np.array(scores, dtype=np.float64)
        start = 0
        for view, (r, c) in zip(self.views, self.grids, strict=True):
            width = c + view.row_extra
            block = out[start : start + r * width].reshape(r, width)
            if r * c:  # (a grid of row-end tokens alone has nothing to change)
                block[:, :c] = change(block[:, :c])
            start += r * width
        return out

    def placed(self) -> np.ndarray:
        """Which image tokens have a place on the photo (not a row-end token), ``(N,)`` booleans."""
        return np.concatenate([np.ones(r * c, bool) if v.row_extra == 0 else
                               np.tile(np.r_[np.ones(c, bool), np.zeros(v.row_extra, bool)], r)
                               for v, (r, c) in zip(self.views, self.grids, strict=True)])  # fmt: skip

    def raw(self, scores: np.ndarray) -> np.ndarray:
        """What ``--save-raw`` writes: one view's grid ``(rows, cols)``, or the flat scores of several."""
        return self.split(scores)[0] if len(self.views) == 1 else np.asarray(scores)[self.placed()]

    def box(self) -> Box:
        """The part of the photo some view saw."""
        boxes = [v.box() for v in self.views if v.grid[0] * v.grid[1]]
        return Box(min(b.x0 for b in boxes), min(b.y0 for b in boxes), max(b.x1 for b in boxes),
                   max(b.y1 for b in boxes))  # fmt: skip

    def picture(self, scores: np.ndarray) -> np.ndarray:
        """The map over the photo ``(H, W)`` for drawing: each view's grid interpolated bilinearly at its
        place (a token's score at its cell's centre; beyond the outer centres the edge tokens' scores), the
        views' mean where several cover a pixel (NaN where none does). A grid that reaches past the photo's
        edge (LLaVA-NeXT's unpadded tiles keep part of a row of padding) is cut there, not squeezed in."""
        total = np.zeros(self.photo, np.float64)
        count = np.zeros(self.photo, np.float64)
        for view, grid in zip(self.views, self.split(scores), strict=True):
            if grid.size == 0:
                continue
            wy, iy = _bilinear(view.y, self.photo[0], grid.shape[0])
            wx, ix = _bilinear(view.x, self.photo[1], grid.shape[1])
            inside = iy[:, None] & ix[None, :]
            total[inside] += (wy @ grid.astype(np.float64) @ wx.T)[inside]
            count[inside] += 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1), np.nan).astype(np.float32)

    def token_pixels(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The photo rows and columns image token ``index`` covers (its view's cell; none for a row end)."""
        for view, (r, c) in zip(self.views, self.grids, strict=True):
            width = c + view.row_extra
            if index < r * width:
                row, col = divmod(index, width)
                if col >= c:
                    return np.zeros(0, int), np.zeros(0, int)
                rows, cols = view.cells()
                return (_covered(rows, row, view.y, r, self.photo[0]),
                        _covered(cols, col, view.x, c, self.photo[1]))  # fmt: skip
            index -= r * width
        raise IndexError(index)

    def peak(self, scores: np.ndarray) -> list[int]:
        """The photo pixel ``[x, y]`` at the centre of the highest placed token's cell."""
        ys, xs = self.token_pixels(int(np.argmax(np.where(self.placed(), scores, -np.inf))))
        return [int(xs.mean()), int(ys.mean())] if len(xs) and len(ys) else [-1, -1]


class Family:
    """A family of vision-language models (see the module's docstring)."""

    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()

    def claims(self, model: HF) -> bool:
        return getattr(model.config, "model_type", "") in self.model_types

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


class Llava(Family):
    """LLaVA 1.5 (a CLIP tower, a shortest-side resize and centre crop, one token per patch)."""

    name = "llava"
    model_types = ("llava",)

    def tower(self, model: HF) -> HF | None:
        return model.model.vision_tower

    def grid(self, model: HF, encoded: dict[str, Any]) -> tuple[int, int]:
        if getattr(model.config, "vision_feature_select_strategy", "default") == "full":
            raise UsageError("a LLaVA that keeps the CLS token among its image tokens is not supported")
        return super().grid(model, encoded)


class PaliGemma(Family):
    """PaliGemma (a SigLIP tower, a squash to a square, one token per patch)."""

    name = "paligemma"
    model_types = ("paligemma",)

    def tower(self, model: HF) -> HF | None:
        return model.model.vision_tower


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
        ramp = _ramp(photo)
        got = processed(processor.image_processor, images=ramp, do_rescale=False, do_normalize=False,
                        return_tensors="pt")  # fmt: skip
        views = self.views(dict(got))
        base = Geometry(_axis(views[0][0], 1, views[0][2] > 0.5, photo[1]),
                        _axis(views[0][1], 0, views[0][2] > 0.5, photo[0]),
                        (side // patch, side // patch), photo)  # fmt: skip
        canvas = np.concatenate(
            [np.concatenate(views[1 + i * tiles_w : 1 + (i + 1) * tiles_w], axis=2) for i in range(tiles_h)],
            axis=1,
        )
        mask = canvas[2] > 0.5
        x, y = _axis(canvas[0], 1, mask, photo[1]), _axis(canvas[1], 0, mask, photo[0])
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


FAMILIES: list[Family] = [Llava(), LlavaNext(), PaliGemma(), Qwen2VL(), Idefics3(), InternVL()]


def family_of(model: HF) -> Family:
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
    processor: Any, family: Family, photo: tuple[int, int], grids: list[tuple[int, int]]
) -> Placement:
    """Where each view's image tokens lie on a photo of ``photo`` ``(H, W)`` pixels, measured through
    ``processor``'s image processor with a ramp picture (see the module's docstring); ``grids``: each view's
    image tokens' rows and columns."""
    ramp = _ramp(photo)
    images = [[ramp]] if isinstance(family, Idefics3) else ramp
    got = processed(processor.image_processor, images=images, do_rescale=False, do_normalize=False,
                    return_tensors="pt")  # fmt: skip
    views = family.views(dict(got))
    if len(views) != len(grids):
        raise InputError(f"the processor made {len(views)} views of the ramp and {len(grids)} of the photo")
    placed = tuple(
        Geometry(_axis(v[0], 1, v[2] > 0.5, photo[1]), _axis(v[1], 0, v[2] > 0.5, photo[0]), grid, photo)
        for v, grid in zip(views, grids, strict=True)
    )
    return Placement(placed, photo)


def processed(processor: Any, **kwargs: Any) -> Any:
    """``processor(**kwargs)`` on pictures ``(H, W, C)`` (said outright: left to guess, the processor takes
    a photo 4 or fewer pixels high for ``(C, H, W)``, a 4 x 4 photo for four channels of 4 x 3), its
    library's deprecation notices silenced (they are its own, not the user's: some transformers releases warn
    inside their image processors under NumPy 2)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return processor(**kwargs, input_data_format="channels_last")


def _covered(cells: np.ndarray, cell: int, axis: Axis, tokens: int, n: int) -> np.ndarray:
    """The photo pixels along one axis whose centres lie in token ``cell``; where none does (a photo
    enlarged: a cell narrower than a pixel), the pixel holding the cell's centre (none: off the photo)."""
    found = np.nonzero(cells == cell)[0]
    if len(found):
        return found
    centre = axis.origin + axis.step * ((cell + 0.5) * axis.size / tokens - 0.5)
    return np.array([int(np.floor(centre))] if 0 <= centre < n else [], int)


def _bilinear(axis: Axis, n: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Along one axis, each of the photo's ``n`` pixels as a bilinear mix of the ``tokens`` cells' centres
    ``(n, tokens)`` (clamped at the outer ones, as ``cv2.resize`` is), and which pixels the view covers."""
    u = ((np.arange(n) + 0.5) - axis.origin) / axis.step  # processed pixel, continuous (centres at integers)
    at = np.clip((u + 0.5) * tokens / axis.size - 0.5, 0, tokens - 1)  # token, continuous
    low = np.minimum(np.floor(at).astype(int), tokens - 1)
    high = np.minimum(low + 1, tokens - 1)
    weights = np.zeros((n, tokens))
    rows = np.arange(n)
    np.add.at(weights, (rows, low), 1 - (at - low))
    np.add.at(weights, (rows, high), at - low)
    return weights, (u >= -0.5) & (u < axis.size - 0.5)


def _ramp(photo: tuple[int, int]) -> np.ndarray:
    """A picture of ``photo``'s size whose pixels hold their own coordinates: ``x + 0.5``, ``y + 0.5``, and 1
    (what marks the photo's pixels: padding is 0)."""
    h, w = photo
    ramp = np.zeros((h, w, 3), np.float32)
    ramp[..., 0] = np.arange(w, dtype=np.float32)[None, :] + 0.5
    ramp[..., 1] = np.arange(h, dtype=np.float32)[:, None] + 0.5
    ramp[..., 2] = 1.0
    return ramp


def _axis(plane: np.ndarray, along: int, photo: np.ndarray, length: int) -> Axis:
    """The line ``origin + step * u`` the ramp's values follow along one axis of the processed image (a photo
    of ``length`` pixels along it).

    Fitted inside the photo's pixels: from their middle half outwards, as far as the values stay on the line.
    Only near the photo's own borders may they leave it (resampling clamps there: a kernel reaching past
    the border reads the border pixel again), which on a photo a few pixels wide is most of it. A photo one
    pixel wide along the axis (a constant ramp) is spread evenly over the processed pixels it covers.

    Raises:
        InputError: the values leave the line away from the photo's borders (not a resize hookviz knows).
    """
    line = np.nonzero(photo.any(axis=1 - along))[0]  # where the photo lies along this axis
    middle: tuple[int | slice, ...]
    if along == 1:
        rows = np.nonzero(photo.any(axis=1))[0]
        middle = (int(rows[len(rows) // 2]) if len(rows) else plane.shape[0] // 2, slice(None))
    else:
        cols = np.nonzero(photo.any(axis=0))[0]
        middle = (slice(None), int(cols[len(cols) // 2]) if len(cols) else plane.shape[1] // 2)
    values = plane[middle].astype(np.float64)
    n = len(values)
    first, last = (int(line[0]), int(line[-1]) + 1) if len(line) else (0, n)
    inside = np.arange(first, last)
    seen = values[inside]
    if len(inside) < 2 or np.ptp(seen) <= 1e-6 * max(1, length):  # within one photo pixel: nothing to fit
        step = 1.0 / max(len(inside), 1)
        pixel = float(np.clip(np.floor(seen.mean() if len(seen) else 0.0), 0, max(length - 1, 0)))
        return Axis(pixel + step * (0.5 - first), step, n)
    quarter = len(inside) // 4 if len(inside) >= 4 else 0
    lo, hi = quarter, len(inside) - quarter  # the run of values on the line, [lo, hi) of ``inside``
    centre = len(inside) // 2
    for _ in range(4):
        step, origin = np.polyfit(inside[lo:hi].astype(np.float64), seen[lo:hi], 1)
        # Within half a processed pixel (two resamplings, as Idefics3's tiles, wobble by less than that).
        on = np.abs(origin + step * inside - seen) <= 0.5 * abs(step) + 1e-9 * max(1, length)
        if not on[centre]:
            break
        off = np.nonzero(~on)[0]
        grown = int(off[off < centre].max() + 1) if (off < centre).any() else 0
        upto = int(off[off > centre].min()) if (off > centre).any() else len(inside)
        if (grown, upto) == (lo, hi) or upto - grown < 2:
            break
        lo, hi = grown, upto
    # Off the line only where a resampling kernel (Lanczos' three pixels, widened by a downscale) reaches
    # past the photo's border: on a photo a few pixels wide, everywhere (the middle half's line is kept).
    reach = 2 + 3 * max(1.0, abs(step))
    off = np.abs(origin + step * inside - seen) > 0.5 * abs(step) + 1e-9 * max(1, length)
    border = np.minimum(seen, length - seen) <= reach
    if (off & ~border).any() or abs(step) < 1e-12:
        raise InputError("the processor does not resize the photo linearly; hookviz cannot place its tokens")
    return Axis(float(origin), float(step), n)
