"""A two-input net for the tests of several inputs and the README's RGB-D picture: a photo with two shapes of
different kinds, and a depth map in which only one of them stands out; the label is the kind of the one that
stands out, so neither input alone tells it.
``--model tests/rgbd_net.py:make --input rgb=... --input depth=...``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hookviz.io.shapes import shape_mask

SIDE = 64


class RGBD(nn.Module):
    """Two branches (three conv layers on the photo, two on the depth), fused by a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.rgb = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        )  # fmt: skip
        self.depth = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ReLU(),
        )
        self.fuse = nn.Conv2d(40, 32, 3, padding=1)
        self.head = nn.Linear(32, 3)

    def forward(self, rgb: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        f = F.relu(self.fuse(torch.cat([self.rgb(rgb), self.depth(depth)], dim=1)))
        return self.head(F.adaptive_avg_pool2d(f, 1).flatten(1))


def make() -> RGBD:
    torch.manual_seed(0)
    return RGBD()


def scene(rng: np.random.Generator, side: int = SIDE) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """``(photo (H, W, 3) in [0, 1], depth (H, W) in [0, 1], label, mask of the shape that stands out)``."""
    photo = rng.normal(0.5, 0.15, (side, side, 3)).clip(0, 1).astype(np.float32)
    depth = rng.normal(0.3, 0.05, (side, side)).clip(0, 1).astype(np.float32)
    kinds = rng.permutation(3)[:2]
    left = rng.random() < 0.5
    masks = []
    for n, kind in enumerate(kinds):
        r = int(rng.integers(7, 10))
        half = (n == 0) == left
        cx = int(rng.integers(r + 1, side // 2 - r)) + (0 if half else side // 2)
        cy = int(rng.integers(r + 1, side - r - 1))
        mask = shape_mask(int(kind), cy, cx, r, side, side)
        photo[mask] = rng.uniform(0.8, 1.0, 3) if rng.random() < 0.5 else rng.uniform(0.0, 0.2, 3)
        masks.append(mask)
    depth[masks[0]] = rng.uniform(0.7, 0.9)  # the first shape stands out of the depth map
    return photo, depth, int(kinds[0]), masks[0]


def batch(n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
    made = [scene(rng) for _ in range(n)]
    rgb = torch.from_numpy(np.stack([p.transpose(2, 0, 1) for p, _, _, _ in made]))
    depth = torch.from_numpy(np.stack([d[None] for _, d, _, _ in made]))
    return rgb, depth, torch.tensor([y for _, _, y, _ in made]), np.stack([m for _, _, _, m in made])


def train(steps: int = 600, seed: int = 0) -> RGBD:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = make()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        rgb, depth, y, _ = batch(32, rng)
        loss = F.cross_entropy(model(rgb, depth), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p in model.parameters():
        p.grad = None
    return model.eval()
