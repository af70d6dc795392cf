"""Synthetic shapes: a tiny labelled image set made on the fly (no download), for examples and tests.

Each image is noisy grey with one square, disc or cross, clearly brighter or darker than the
background; the mask of the shape comes with it, so a map's localisation can be measured.
"""

from __future__ import annotations

import numpy as np
import torch

SHAPES = ("square", "disc", "cross")


def shape_mask(kind: int, cy: int, cx: int, r: int, height: int, width: int) -> np.ndarray:
    """The pixels of a square (0), disc (1) or cross (2) of half-size ``r`` centred at ``(cy, cx)``."""
    yy, xx = np.mgrid[:height, :width]
    if kind == 0:
        return (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
    if kind == 1:
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    return ((abs(yy - cy) <= r) & (abs(xx - cx) <= r // 3)) | ((abs(xx - cx) <= r) & (abs(yy - cy) <= r // 3))


def draw_shape(
    kind: int, size: int, rng: np.random.Generator, height: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A noisy ``height`` x ``size`` RGB float image with one shape; returns (image, mask of the shape)."""
    h, w = height or size, size
    img = rng.normal(0.5, 0.15, (h, w, 3)).clip(0, 1).astype(np.float32)
    r = int(rng.integers(6, 10))
    cy, cx = int(rng.integers(r + 1, h - r - 1)), int(rng.integers(r + 1, w - r - 1))
    mask = shape_mask(kind, cy, cx, r, h, w)
    # Clearly brighter or darker than the background, so every shape is visible.
    colour = (rng.uniform(0.8, 1.0, 3) if rng.random() < 0.5 else rng.uniform(0.0, 0.2, 3)).astype(np.float32)
    img[mask] = colour
    return img, mask


def shapes_batch(
    n: int, rng: np.random.Generator, size: int = 48
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """``n`` images ``(n, 3, size, size)`` in [0, 1], their labels (0 square, 1 disc, 2 cross) and masks."""
    xs, ys, masks = [], [], []
    for _ in range(n):
        k = int(rng.integers(0, 3))
        img, mask = draw_shape(k, size, rng)
        xs.append(img.transpose(2, 0, 1))
        ys.append(k)
        masks.append(mask)
    return torch.from_numpy(np.stack(xs)), torch.tensor(ys), np.stack(masks)


def shapes_scene(
    rng: np.random.Generator,
    height: int = 120,
    width: int = 160,
    count: int = 3,
    sizes: tuple[int, int] = (9, 18),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A noisy ``height`` x ``width`` RGB float image with 1..``count`` shapes that do not touch.

    Returns (image, boxes ``(n, 4)`` as ``x0, y0, x1, y1`` with exclusive ends, labels ``(n,)``
    0 square, 1 disc, 2 cross, and the class map ``(H, W)``: 0 background, 1 + label on a shape).
    """
    img = rng.normal(0.5, 0.15, (height, width, 3)).clip(0, 1).astype(np.float32)
    classes = np.zeros((height, width), dtype=np.int64)
    boxes: list[tuple[int, int, int, int]] = []
    labels: list[int] = []
    for _ in range(int(rng.integers(1, count + 1))):
        for _attempt in range(20):
            r = int(rng.integers(sizes[0], sizes[1] + 1))
            cy, cx = int(rng.integers(r + 1, height - r - 1)), int(rng.integers(r + 1, width - r - 1))
            box = (cx - r, cy - r, cx + r + 1, cy + r + 1)
            if all(
                box[0] > b[2] + 2 or box[2] < b[0] - 2 or box[1] > b[3] + 2 or box[3] < b[1] - 2
                for b in boxes
            ):
                break
        else:
            continue
        kind = int(rng.integers(0, 3))
        mask = shape_mask(kind, cy, cx, r, height, width)
        colour = rng.uniform(0.8, 1.0, 3) if rng.random() < 0.5 else rng.uniform(0.0, 0.2, 3)
        img[mask] = colour.astype(np.float32)
        classes[mask] = kind + 1
        boxes.append(box)
        labels.append(kind)
    return (
        img,
        np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        np.asarray(labels, dtype=np.int64),
        classes,
    )
