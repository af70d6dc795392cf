"""Where a vision-language model's image tokens lie on the photo: each view's axes on the photo
(:class:`Axis`, :class:`Geometry`), the views together (:class:`Placement`), and the ramp picture that
measures them through the processor itself (see :mod:`hookviz.vlm.families`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hookviz.errors import InputError
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
            (y0, y1, fy), iy = _bilinear(view.y, self.photo[0], grid.shape[0])
            (x0, x1, fx), ix = _bilinear(view.x, self.photo[1], grid.shape[1])
            ys, xs = np.flatnonzero(iy), np.flatnonzero(ix)
            g = grid.astype(np.float64)
            across = g[:, x0[xs]] * (1 - fx[xs]) + g[:, x1[xs]] * fx[xs]  # (rows, W'): along x first
            inside = np.ix_(ys, xs)
            total[inside] += across[y0[ys]] * (1 - fy[ys])[:, None] + across[y1[ys]] * fy[ys][:, None]
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


def _bilinear(
    axis: Axis, n: int, tokens: int
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """Along one axis, each of the photo's ``n`` pixels as a bilinear mix of the ``tokens`` cells' centres
    (clamped at the outer ones, as ``cv2.resize`` is): ``(low, high, weight of high)``, each ``(n,)``, and
    which pixels the view covers. (Gathered, not a weights matrix: a product of small matrices goes through
    BLAS's threads, which on a busy machine made drawing a map cost 100 ms.)"""
    u = ((np.arange(n) + 0.5) - axis.origin) / axis.step  # processed pixel, continuous (centres at integers)
    at = np.clip((u + 0.5) * tokens / axis.size - 0.5, 0, tokens - 1)  # token, continuous
    low = np.minimum(np.floor(at).astype(int), tokens - 1)
    high = np.minimum(low + 1, tokens - 1)
    return (low, high, at - low), (u >= -0.5) & (u < axis.size - 0.5)


def ramp(photo: tuple[int, int]) -> np.ndarray:
    """A picture of ``photo``'s size whose pixels hold their own coordinates: ``x + 0.5``, ``y + 0.5``, and 1
    (what marks the photo's pixels: padding is 0)."""
    h, w = photo
    ramp = np.zeros((h, w, 3), np.float32)
    ramp[..., 0] = np.arange(w, dtype=np.float32)[None, :] + 0.5
    ramp[..., 1] = np.arange(h, dtype=np.float32)[:, None] + 0.5
    ramp[..., 2] = 1.0
    return ramp


def axis_of(plane: np.ndarray, along: int, photo: np.ndarray, length: int) -> Axis:
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
