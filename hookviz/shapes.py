"""Synthetic shapes: a tiny labelled image set made on the fly (no download), for examples and tests.

Each image is noisy grey with one square, disc or cross, clearly brighter or darker than the
background; the mask of the shape comes with it, so a map's localisation can be measured.
"""

from __future__ import annotations

import numpy as np
import torch

SHAPES = ("square", "disc", "cross")


def draw_shape(
    kind: int, size: int, rng: np.random.Generator, height: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A noisy ``height`` x ``size`` RGB float image with one shape; returns (image, mask of the shape)."""
    h, w = height or size, size
    img = rng.normal(0.5, 0.15, (h, w, 3)).clip(0, 1).astype(np.float32)
    r = int(rng.integers(6, 10))
    cy, cx = int(rng.integers(r + 1, h - r - 1)), int(rng.integers(r + 1, w - r - 1))
    yy, xx = np.mgrid[:h, :w]
    if kind == 0:
        mask = (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
    elif kind == 1:
        mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    else:
        mask = ((abs(yy - cy) <= r) & (abs(xx - cx) <= r // 3)) | (
            (abs(xx - cx) <= r) & (abs(yy - cy) <= r // 3)
        )
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
