"""A small 3D CNN and the synthetic videos it learns from: a square or a cross moving across noise.

``hookviz ... --model tests/video_net.py:ShapesVideoNet`` builds it (a model of the user's own code);
``moving_shape`` draws one video with the shape's box in every frame, for the tests' ground truth.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hookviz.io.video import KINETICS_MEAN, KINETICS_STD

CLASSES = ("square", "cross", "nothing")
SIDE = 32
FRAMES = 8


class ShapesVideoNet(nn.Module):
    """Clips ``(B, 3, 8, 32, 32)`` -> 2 classes; the CAM tensor ``features`` is ``(B, 16, 8, 16, 16)``."""

    def __init__(self, classes: int = len(CLASSES)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.ReLU())
        self.block = nn.Sequential(
            nn.Conv3d(8, 16, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)), nn.ReLU()
        )
        self.features = nn.Sequential(nn.Conv3d(16, 16, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.features(self.block(self.stem(x)))).flatten(1))


def moving_shape(
    rng: np.random.Generator,
    label: int,
    frames: int = FRAMES,
    side: int = SIDE,
    visible: range | None = None,
) -> tuple[np.ndarray, list[tuple[int, int, int, int] | None]]:
    """``(frames, side, side, 3)`` uint8: noise, and shape ``label`` (0 square, 1 cross, 2 none) moving in a
    straight line (shown in the frames of ``visible`` only, default all); and its box ``(x0, y0, x1, y1)``
    per frame (None: hidden)."""
    import cv2

    r = 6
    video = rng.integers(40, 120, size=(frames, side, side, 3), dtype=np.uint8)
    speed = rng.integers(1, 3, size=2) * rng.choice([-1, 1], size=2)
    start = rng.integers(r + 1, side - r - 1, size=2)  # it stops at the border it reaches
    colour = tuple(int(c) for c in rng.integers(200, 256, size=3))
    boxes: list[tuple[int, int, int, int] | None] = []
    for k in range(frames):
        cx, cy = (int(v) for v in np.clip(start + speed * k, r + 1, side - r - 2))
        if label == 2 or (visible is not None and k not in visible):
            boxes.append(None)
            continue
        frame = np.ascontiguousarray(video[k])
        if label == 0:
            cv2.rectangle(frame, (cx - r, cy - r), (cx + r, cy + r), colour, -1)
        else:
            cv2.rectangle(frame, (cx - r, cy - 1), (cx + r, cy + 1), colour, -1)
            cv2.rectangle(frame, (cx - 1, cy - r), (cx + 1, cy + r), colour, -1)
        video[k] = frame
        boxes.append((cx - r, cy - r, cx + r + 1, cy + r + 1))
    return video, boxes


def normalised(video: np.ndarray) -> np.ndarray:
    """What :class:`hookviz.io.video.VideoPreprocess` makes of frames already at the input size:
    ``(3, T, H, W)`` float32 with Kinetics' mean and std."""
    mean, std = np.asarray(KINETICS_MEAN, np.float32), np.asarray(KINETICS_STD, np.float32)
    return ((video.astype(np.float32) / 255 - mean) / std).transpose(3, 0, 1, 2)


def trained(steps: int = 80, clips: int = 600) -> ShapesVideoNet:
    """The net trained on ``clips`` seeded clips (square, cross, nothing; a third of them with the shape in a
    few frames only): 80 steps of 32, about 10-15 s on one core, 95-100 % on fresh clips."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for i in range(clips):
        visible = None
        if rng.random() < 0.3:
            first = int(rng.integers(0, 5))
            visible = range(first, first + int(rng.integers(2, 5)))
        xs.append(normalised(moving_shape(rng, i % 3, visible=visible)[0]))
        ys.append(i % 3)
    x, y = torch.from_numpy(np.stack(xs)), torch.tensor(ys)
    model = ShapesVideoNet()
    opt = torch.optim.Adam(model.parameters(), 5e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (32,), generator=gen)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()
