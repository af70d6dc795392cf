"""A volume's map as pictures: three orthogonal slices through the map's peak, a mosaic of slices, and the
frames of a sweep through the slices (a WebM).

Slices of a NIfTI or DICOM volume (RAS) are shown as radiology viewers in neurological convention show them
(superior or anterior up, the patient's right on the right of the picture: ``flipud`` of the transposed
slice); an ``.npy`` array's slices as its axes lie (first axis down). Voxels of unequal size are stretched
to their true proportions. Intensities are windowed between the volume's 1st and 99th percentiles.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hookviz.io.volume import Volume
from hookviz.render import caption, colormap_lut, label

#: Slices on a mosaic.
MOSAIC_SLICES = 16
#: Shortest side of a slice as drawn (smaller volumes are enlarged).
MIN_SIDE = 160


def sweep_axis(volume: Volume) -> int:
    """The axis slices are swept along: the third (axial, Z) of a NIfTI or DICOM volume, the first of an
    array."""
    return 0 if volume.kind == "npy" else 2


def _slice(values: np.ndarray, axis: int, index: int, volume: Volume) -> np.ndarray:
    plane = np.take(values, index, axis=axis)
    return plane if volume.kind == "npy" else np.flipud(plane.T)


def _proportions(image: np.ndarray, axis: int, volume: Volume) -> np.ndarray:
    """``image`` stretched so its pixels have the voxels' proportions, and enlarged to ``MIN_SIDE``."""
    import cv2

    rest = [a for a in range(3) if a != axis]
    sp = volume.spacing
    # Rows run along the second remaining axis for RAS (transposed), the first for an array.
    row_axis, col_axis = (rest[0], rest[1]) if volume.kind == "npy" else (rest[1], rest[0])
    h, w = image.shape[:2]
    unit = min(sp[row_axis], sp[col_axis]) or 1.0
    height, width = h * sp[row_axis] / unit, w * sp[col_axis] / unit
    scale = max(1.0, MIN_SIDE / max(1.0, min(height, width)))
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_LINEAR if image.ndim == 3 else cv2.INTER_NEAREST)


def overlay_slice(
    grey: np.ndarray, unit: np.ndarray, axis: int, index: int, volume: Volume, *, alpha: float, colormap: str
) -> np.ndarray:
    """One slice of the volume with the map (``unit``: in [0, 1], the volume's grid) blended over it."""
    import cv2

    g = _slice(grey, axis, index, volume)
    u = np.clip(np.nan_to_num(_slice(unit, axis, index, volume)), 0, 1)
    rgb = cv2.merge([g, g, g])
    index8 = cv2.convertScaleAbs(np.ascontiguousarray(u, dtype=np.float32), alpha=255.0)
    heat = cv2.LUT(cv2.merge([index8, index8, index8]), colormap_lut(colormap).reshape(1, 256, 3))
    return _proportions(
        cv2.addWeighted(np.ascontiguousarray(rgb), 1.0 - alpha, heat, alpha, 0.0), axis, volume
    )


def orthogonal(
    volume: Volume,
    unit: np.ndarray,
    peak: Sequence[int],
    lines: Sequence[str],
    *,
    alpha: float,
    colormap: str,
) -> np.ndarray:
    """Three slices through ``peak``, side by side (the axis and index named under each), captioned."""
    grey = volume.grey()
    tiles = []
    for axis in range(3):
        tile = overlay_slice(grey, unit, axis, int(peak[axis]), volume, alpha=alpha, colormap=colormap)
        tiles.append(_label_below(tile, f"{'XYZ'[axis] if volume.kind != 'npy' else 'axis ' + str(axis)}"
                                        f" = {int(peak[axis])}"))  # fmt: skip
    return caption(_row(tiles), list(lines))


def mosaic(
    volume: Volume, unit: np.ndarray, lines: Sequence[str], *, alpha: float, colormap: str
) -> np.ndarray:
    """``MOSAIC_SLICES`` evenly spaced slices along the sweep axis, four a row, each with its index."""
    grey = volume.grey()
    axis = sweep_axis(volume)
    n = volume.shape[axis]
    picks = sorted({round(v) for v in np.linspace(0, n - 1, min(MOSAIC_SLICES, n))})
    tiles = [
        _label_below(overlay_slice(grey, unit, axis, k, volume, alpha=alpha, colormap=colormap), f"slice {k}")
        for k in picks
    ]
    rows = [_row(tiles[i : i + 4]) for i in range(0, len(tiles), 4)]
    width = max(r.shape[1] for r in rows)
    rows = [np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows]
    return caption(np.concatenate(rows, axis=0), list(lines))


def sweep(
    volume: Volume, unit: np.ndarray, lines: Sequence[str], *, alpha: float, colormap: str
) -> list[np.ndarray]:
    """Every slice along the sweep axis, captioned with its index: a WebM's frames (even sizes)."""
    grey = volume.grey()
    axis = sweep_axis(volume)
    frames = []
    for k in range(volume.shape[axis]):
        tile = overlay_slice(grey, unit, axis, k, volume, alpha=alpha, colormap=colormap)
        frames.append(caption(tile, [*lines, f"slice {k + 1}/{volume.shape[axis]}"]))
    h, w = frames[0].shape[:2]
    return [f[: h - h % 2, : w - w % 2] for f in frames]


def _label_below(tile: np.ndarray, text: str) -> np.ndarray:
    band = np.full((18, tile.shape[1], 3), 255, np.uint8)
    label(band, text, 3, 2)
    return np.concatenate([tile, band], axis=0)


def _row(tiles: Sequence[np.ndarray], gap: int = 4) -> np.ndarray:
    h = max(t.shape[0] for t in tiles)
    parts = []
    for t in tiles:
        parts += [np.pad(t, ((0, h - t.shape[0]), (0, 0), (0, 0)), constant_values=255),
                  np.full((h, gap, 3), 255, np.uint8)]  # fmt: skip
    return np.concatenate(parts[:-1], axis=1)
