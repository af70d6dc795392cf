"""A small 3-D CNN for the volume tests, and the synthetic volumes it learns: an object in noise, a solid cube
(class 0) or a rod (3 x 3 x 14) along one axis (class 1), at a random place.
``--model tests/volume_net.py:make``."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

SIDE = 24


class VolumeNet(nn.Module):
    def __init__(self, channels: int = 1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv3d(channels, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool3d(2),
            nn.Conv3d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv3d(16, 16, 3, padding=1),
            nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)).flatten(1))


def make() -> VolumeNet:
    torch.manual_seed(0)
    return VolumeNet()


def volume(rng: np.random.Generator, label: int, side: int = SIDE) -> tuple[np.ndarray, tuple[slice, ...]]:
    """``(side, side, side)`` float32 noise with a cube (0) or a rod (1) of +2.5 in it; and where it is."""
    v = rng.normal(0.0, 1.0, (side, side, side)).astype(np.float32)
    size = [6, 6, 6] if label == 0 else [3, 3, 3]
    if label == 1:
        size[int(rng.integers(3))] = 14
    start = [int(rng.integers(1, side - s - 1)) for s in size]
    where = tuple(slice(a, a + s) for a, s in zip(start, size, strict=True))
    v[where] += 2.5
    return v, where


def batch(n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, list[tuple[slice, ...]]]:
    labels = rng.integers(0, 2, n)
    made = [volume(rng, int(y)) for y in labels]
    x = torch.from_numpy(np.stack([v for v, _ in made]))[:, None]
    return x, torch.from_numpy(labels).long(), [w for _, w in made]


def train(steps: int = 150, seed: int = 0) -> VolumeNet:
    """The net trained on fresh volumes (batches of 16, Adam); eval mode after."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = make()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        x, y, _ = batch(16, rng)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p in model.parameters():
        p.grad = None
    return model.eval()
