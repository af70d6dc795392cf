"""Watch a small CNN learn the synthetic shapes: every 50 steps, Grad-CAM of four probe images, a feature-map
grid, per-layer activation statistics and gradient norms go to TensorBoard; a layer turning NaN would be named
with its step. Then: ``tensorboard --logdir runs/shapes``.

    python examples/monitor_shapes.py [--steps 300] [--log-dir runs/shapes]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hookviz import Monitor
from hookviz.io.shapes import SHAPES, shapes_batch


def small_cnn() -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, 16), nn.MaxPool2d(2), *block(16, 32), nn.MaxPool2d(2), *block(32, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, len(SHAPES)),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log-dir", default="runs/shapes")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = small_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    probe, labels, _ = shapes_batch(4, np.random.default_rng(9))
    rng = np.random.default_rng(0)
    with Monitor(model, probe, labels=labels, every=50, log_dir=args.log_dir, features=["4"]) as monitor:
        model.train()
        for step in range(args.steps + 1):
            x, y, _ = shapes_batch(32, rng)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.step(step)
    print(f"logged to {args.log_dir}: tensorboard --logdir {args.log_dir}")
    if monitor.first_nonfinite is not None:
        print(f"non-finite: {monitor.first_nonfinite}")


if __name__ == "__main__":
    main()
