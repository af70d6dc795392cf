"""Nets whose first layer does not take RGB: a greyscale one (a 16-bit scan) and a 4-band one (RGB + near
infrared, or RGB + depth stacked)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BandNet(nn.Module):
    def __init__(self, bands: int, classes: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(bands, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def make_grey() -> nn.Module:
    torch.manual_seed(0)
    return BandNet(1)


def make_four() -> nn.Module:
    torch.manual_seed(0)
    return BandNet(4)
