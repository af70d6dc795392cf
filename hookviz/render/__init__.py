"""Numpy arrays to pictures: feature-map mosaics, CAM overlays, captions, boxes (plots.py: plots). No torch.

Everything is RGB ``uint8``; text is drawn with OpenCV so that a grid of hundreds of channels
renders in milliseconds (no matplotlib subplot per channel).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hookviz.io.images import Box
from hookviz.options import Colormap

# The plots live in render/plots.py; their names stay importable from here.
from hookviz.render.plots import figure_to_rgb as figure_to_rgb
from hookviz.render.plots import grad_flow_plot as grad_flow_plot
from hookviz.render.plots import summary_plot as summary_plot

#: Colormap names accepted by ``--colormap`` (OpenCV's built-in maps).
COLORMAPS = tuple(c.value for c in Colormap)


def colormap_lut(name: str) -> np.ndarray:
    """A ``(256, 3)`` RGB lookup table for a colormap name."""
    import cv2

    if name not in COLORMAPS:
        raise ValueError(f"unknown colormap {name!r}; choose one of {', '.join(COLORMAPS)}")
    ramp = np.arange(256, dtype=np.uint8)[:, None]
    if name == "gray":
        return np.repeat(ramp, 3, axis=1)
    bgr = cv2.applyColorMap(ramp, getattr(cv2, f"COLORMAP_{name.upper()}"))[:, 0, :]
    return np.ascontiguousarray(bgr[:, ::-1])


def normalize(values: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Min-max scale to ``[0, 1]`` (NaN/Inf become 0; a constant map becomes all zeros)."""
    v = np.nan_to_num(np.asarray(values, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    lo = float(v.min()) if lo is None else lo
    hi = float(v.max()) if hi is None else hi
    if not np.isfinite(hi - lo) or hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return np.zeros_like(v)
    return np.clip((v - lo) / (hi - lo), 0.0, 1.0)


def overlay(
    rgb: np.ndarray,
    cam: np.ndarray,
    box: Box,
    *,
    alpha: float = 0.5,
    colormap: str = "jet",
    scaled: bool = False,
) -> np.ndarray:
    """Blend a CAM over the original photo, placed on the region the model saw.

    Args:
        rgb: the original photo ``(H, W, 3)``.
        cam: the map ``(h, w)``; upsampled bilinearly to ``box``.
        box: the region of ``rgb`` the model input came from (see ``Preprocess.box``); the rest of
            the photo is dimmed, since the model never saw it.
        alpha: weight of the heatmap (0 = photo only, 1 = heatmap only).
        scaled: ``cam`` is already in ``[0, 1]`` (otherwise it is min-max normalised).
    """
    import cv2

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    unit = np.clip(np.nan_to_num(cam.astype(np.float32)), 0, 1) if scaled else normalize(cam)
    up = cv2.resize(unit, (box.width, box.height), interpolation=cv2.INTER_LINEAR)
    index = cv2.convertScaleAbs(up, alpha=255.0)  # rounds and saturates to uint8
    heat = cv2.LUT(cv2.merge([index, index, index]), colormap_lut(colormap).reshape(1, 256, 3))
    # uint8 arithmetic in OpenCV (saturating, rounded): several times faster than float numpy here.
    full = (box.width, box.height) == (rgb.shape[1], rgb.shape[0])
    out = rgb.copy() if full else cv2.convertScaleAbs(rgb, alpha=0.45)
    region = np.ascontiguousarray(rgb[box.y0 : box.y1, box.x0 : box.x1])
    out[box.y0 : box.y1, box.x0 : box.x1] = cv2.addWeighted(region, 1.0 - alpha, heat, alpha, 0.0)
    return out


def overlay_row(
    rgb: np.ndarray,
    box: Box,
    maps: np.ndarray,
    labels: Sequence[str],
    title: str,
    alpha: float,
    colormap: str,
) -> np.ndarray:
    """Maps ``(k, h, w)`` over the photo side by side, one colour scale for all (zero to the largest), each
    captioned, a title above."""
    top = float(np.nan_to_num(maps).max()) or 1.0
    tiles = [
        caption(
            enlarge_small(overlay(rgb, m / top, box, alpha=alpha, colormap=colormap, scaled=True)), [text]
        )
        for m, text in zip(maps, labels, strict=True)
    ]
    return caption(np.concatenate(tiles, axis=1), [title], top=True)


def upsample(cam: np.ndarray, box: Box) -> np.ndarray:
    """The map at the photo's resolution inside ``box`` (bilinear), as float32."""
    import cv2

    return cv2.resize(cam.astype(np.float32), (box.width, box.height), interpolation=cv2.INTER_LINEAR)


#: Pictures narrower than this are enlarged (nearest neighbour, whole factor) so a caption fits beside them.
MIN_CAPTION_WIDTH = 128


def enlarge_small(image: np.ndarray, min_width: int = MIN_CAPTION_WIDTH) -> np.ndarray:
    """``image`` repeated ``k`` times along both axes, the least ``k`` that makes it ``min_width`` wide."""
    k = -(-min_width // max(1, image.shape[1]))
    if k <= 1:
        return image
    return np.repeat(np.repeat(image, k, axis=0), k, axis=1)


#: ``HOOKVIZ_TEST_TEXT=codes`` draws each character of a caption or label as its code, in bits, in a cell
#: of a fixed width: pictures whose text can be compared across OpenCV versions (whose Hershey fonts and
#: text widths differ: 5.1 draws and wraps otherwise than 5.0). For tests; never set for a user.
TEST_TEXT = "HOOKVIZ_TEST_TEXT"


def _codes() -> bool:
    import os

    return os.environ.get(TEST_TEXT) == "codes"


def text_size(text: str, scale: float) -> tuple[int, int]:
    """``(width, height)`` in pixels of ``text`` drawn at ``scale`` (OpenCV's Hershey simplex)."""
    if _codes():
        return len(text) * max(2, round(16 * scale)), max(8, round(22 * scale))
    import cv2

    (w, h), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
    return int(w), int(h)


def put_text(image: np.ndarray, text: str, origin: tuple[int, int], scale: float) -> None:
    """``text`` in white at ``origin`` (its baseline's left end), antialiased, into ``image``."""
    if _codes():
        cw, h = text_size("x", scale)
        x0, base = origin
        for i, ch in enumerate(text):
            bits = [(ord(ch) >> b) & 1 for b in range(8)]
            for b, on in enumerate(bits):
                y = base - h + b * (h // 8)
                if on and y >= 0:
                    image[y : y + max(1, h // 8 - 1), x0 + i * cw : x0 + (i + 1) * cw - 1] = 255
        return
    import cv2

    cv2.putText(image, text, origin, cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), 1, cv2.LINE_AA)


def _text_scale(width: int) -> float:
    return max(0.4, min(1.0, width / 900))


def caption(image: np.ndarray, lines: Sequence[str], *, top: bool = False) -> np.ndarray:
    """Add a dark band with white text below (or above) ``image``; long lines wrap at spaces."""
    w = image.shape[1]
    scale = _text_scale(w)
    wrapped = [part for line in lines for part in _wrap(line, w - 12, scale)]
    line_h = int(28 * scale) + 6
    band = np.full((line_h * len(wrapped) + 8, w, 3), 24, dtype=np.uint8)
    for i, text in enumerate(wrapped):
        put_text(band, text, (6, 4 + line_h * (i + 1) - 8), scale)
    return np.concatenate([band, image] if top else [image, band], axis=0)


def _wrap(text: str, max_w: int, scale: float) -> list[str]:
    def width(t: str) -> int:
        return text_size(t, scale)[0]

    # Hershey fonts are ASCII only: anything else would come out as '?' boxes.
    words = text.encode("ascii", "replace").decode("ascii").split(" ")
    lines: list[str] = []
    current = ""
    for word in words:
        trial = f"{current} {word}" if current else word
        if width(trial) <= max_w or not current:
            current = trial
        else:
            lines.append(current)
            current = word
    lines.append(current)
    out = []
    for line in lines:
        while len(line) > 1 and width(line) > max_w:
            line = line[:-2] + "~"
        out.append(line)
    return out


def feature_grid(
    fmap: np.ndarray,
    channels: Sequence[int],
    *,
    title: str,
    colormap: str = "viridis",
    min_tile: int = 64,
    gap: int = 2,
    value_range: tuple[float, float] | None = None,
) -> np.ndarray:
    """Tile the chosen channels of one ``(C, H, W)`` map into a labelled mosaic.

    Each channel is min-max normalised on its own, enlarged with nearest-neighbour to at least
    ``min_tile`` pixels (so a 7x7 map is still readable), coloured with ``colormap`` and labelled
    with its channel index (``value_range`` fixes one scale for all tiles instead, e.g. a 0/1 mask).
    The mosaic is built with numpy, in one array.
    """
    import cv2

    _, h, w = fmap.shape
    n = len(channels)
    if n == 0:
        raise ValueError("no channels to draw")
    places = tile_positions(n, h, w, min_tile=min_tile, gap=gap)
    th, tw = places[0][2], places[0][3]
    zoom = th // h
    cols = int(np.ceil(np.sqrt(n)))
    rows = -(-n // cols)
    # All tiles at once (normalize and apply_lut per channel, vectorised: the same pixels, several
    # times faster on the hundreds of grids a default run over every conv layer of a big model draws).
    picked = np.nan_to_num(
        np.asarray(fmap[list(channels)], dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0
    )
    if value_range is None:
        lo = picked.min(axis=(1, 2), keepdims=True)
        hi = picked.max(axis=(1, 2), keepdims=True)
    else:
        lo = np.full((n, 1, 1), value_range[0], dtype=np.float32)
        hi = np.full((n, 1, 1), value_range[1], dtype=np.float32)
    span = hi.astype(np.float64) - lo
    flat = ~np.isfinite(span) | (span <= 1e-12 * np.maximum(1.0, np.abs(hi.astype(np.float64))))
    unit = np.clip((picked - lo) / np.where(flat, 1.0, span).astype(np.float32), 0.0, 1.0)
    unit[np.broadcast_to(flat, unit.shape)] = 0.0
    tiles = colormap_lut(colormap)[np.clip(np.rint(unit * 255.0), 0, 255).astype(np.uint8)]
    cells = np.full((rows * cols, th + gap, tw + gap, 3), 255, dtype=np.uint8)
    if zoom > 1:  # the tiles stacked in one column, enlarged at once (exact pixel copies)
        column = cv2.resize(tiles.reshape(n * h, w, 3), (tw, n * th), interpolation=cv2.INTER_NEAREST_EXACT)
        tiles = column.reshape(n, th, tw, 3)
    cells[:n, :th, :tw] = tiles
    body = cells.reshape(rows, cols, th + gap, tw + gap, 3).transpose(0, 2, 1, 3, 4)
    width = gap + cols * (tw + gap) if rows > 1 else gap + n * (tw + gap)
    grid = np.full((gap + rows * (th + gap), width, 3), 255, dtype=np.uint8)
    grid[gap:, gap:] = body.reshape(rows * (th + gap), cols * (tw + gap), 3)[:, : width - gap]
    label_scale = 0.32 if tw < 90 else 0.4
    for (y, x, _, _), ch in zip(places, channels, strict=True):
        label(grid, str(ch), x, y, label_scale)
    if grid.shape[1] < 480:  # room for the title
        pad = np.full((grid.shape[0], 480 - grid.shape[1], 3), 255, dtype=np.uint8)
        grid = np.concatenate([grid, pad], axis=1)
    return caption(grid, [title], top=True)


def tile_positions(
    n: int, h: int, w: int, *, min_tile: int = 64, gap: int = 2
) -> list[tuple[int, int, int, int]]:
    """Where :func:`feature_grid` puts tile ``i`` in the mosaic body: ``(y, x, tile_h, tile_w)``."""
    zoom = max(1, int(np.ceil(min_tile / max(h, w))))
    th, tw = h * zoom, w * zoom
    cols = int(np.ceil(np.sqrt(n)))
    return [(gap + (i // cols) * (th + gap), gap + (i % cols) * (tw + gap), th, tw) for i in range(n)]


def sheet(
    rows: Sequence[tuple[str, Sequence[np.ndarray]]],
    columns: Sequence[str],
    *,
    title: str,
    cell: int = 200,
    per_line: int = 8,
) -> np.ndarray:
    """A labelled comparison grid: one row per (layer, target), one column per method; more than
    ``per_line`` methods wrap onto further lines of the same row (so 30 methods stay readable).

    Args:
        rows: ``(label, images)`` with one RGB image per column (resized to ``cell`` pixels high).
        columns: column headers.
        title: a line above everything.
    """
    import cv2

    if not rows:
        raise ValueError("a sheet needs at least one row")
    h0, w0 = rows[0][1][0].shape[:2]
    cw = max(1, round(cell * w0 / h0))
    gap = 4
    width = min(len(columns), per_line) * (cw + gap) + gap
    body = []
    for name, images in rows:
        for start in range(0, len(columns), per_line):
            line = np.full((cell + 2 * gap, width, 3), 255, np.uint8)
            for c in range(start, min(start + per_line, len(columns))):
                x = gap + (c - start) * (cw + gap)
                line[gap : gap + cell, x : x + cw] = cv2.resize(
                    images[c], (cw, cell), interpolation=cv2.INTER_AREA
                )
                label(line, columns[c], x + 3, gap + 3)
            body.append(caption(line, [name], top=True) if start == 0 else line)
    grid = np.concatenate(body, axis=0)
    return caption(grid, [title], top=True)


def label(image: np.ndarray, text: str, x: int, y: int, scale: float = 0.45) -> None:
    """White text on a black box at ``(x, y)`` (top-left), drawn into ``image``."""
    tw, th = text_size(text, scale)
    image[y : y + th + 6, x : x + tw + 6] = 0
    put_text(image, text, (x + 3, y + th + 2), scale)


def _line_width(image: np.ndarray) -> int:
    return max(2, round(min(image.shape[:2]) / 250))


def outline(image: np.ndarray, mask: np.ndarray, box: Box) -> None:
    """Draw the border of ``mask`` (a region at any resolution, covering ``box``) into ``image``: white
    over a dark edge, visible on any heatmap colour."""
    import cv2

    if not mask.any():
        return
    up = cv2.resize(mask.astype(np.uint8), (box.width, box.height), interpolation=cv2.INTER_NEAREST)
    contours, _ = cv2.findContours(up, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    width = _line_width(image)
    view = image[box.y0 : box.y1, box.x0 : box.x1]
    cv2.drawContours(view, contours, -1, (0, 0, 0), width + 2, cv2.LINE_AA)
    cv2.drawContours(view, contours, -1, (255, 255, 255), width, cv2.LINE_AA)


def draw_box(image: np.ndarray, box: Sequence[float], text: str, *, strong: bool = True) -> None:
    """A detection's box (``x0, y0, x1, y1`` in ``image``'s pixels) with its label above it (inside it at
    the top edge); ``strong=False`` draws it thin and grey (the other detections)."""
    import cv2

    x0, y0, x1, y1 = (round(float(v)) for v in box)
    width = _line_width(image) if strong else max(1, _line_width(image) // 2)
    colour = (255, 255, 255) if strong else (170, 170, 170)
    if strong:
        cv2.rectangle(image, (x0, y0), (x1, y1), (0, 0, 0), width + 2)
    cv2.rectangle(image, (x0, y0), (x1, y1), colour, width)
    if text:
        scale = 0.45 * max(1.0, min(image.shape[:2]) / 400)
        _, th = text_size(text, scale)
        ty = y0 - th - 8 if y0 - th - 8 >= 0 else y0 + width
        label(image, text, max(0, min(x0, image.shape[1] - 1)), max(0, ty), scale)
