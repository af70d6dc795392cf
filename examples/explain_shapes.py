"""Where do the CAM methods look on a model that really learned something? A 10-second check on a CPU.

    python examples/explain_shapes.py --out shapes.png

Trains the small CNN of ``train_with_hooks.py`` to tell squares, discs and crosses apart, then draws every
CAM method for a few held-out images in one sheet, with the fraction of 200 held-out images whose map
peaks inside the shape.
"""

from __future__ import annotations

import argparse

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from train_with_hooks import make_batch, make_model

from hookviz import render
from hookviz.engine.explain import explain
from hookviz.io.images import Box, encode_png

#: The CAMs compared, in the order the sheet shows them (any registered method name works).
METHODS = (
    "gradcam",
    "gradcampp",
    "xgradcam",
    "layercam",
    "hirescam",
    "eigencam",
    "scorecam",
    "guidedbackprop",
    "guidedgradcam",
)

NAMES = ("square", "disc", "cross")


def train(steps: int) -> torch.nn.Module:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=steps)
    model.train()
    for _ in range(steps):
        x, y = make_batch(32, rng)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


def shape_mask(img: np.ndarray) -> np.ndarray:
    """The shape's pixels: the ones far from the noisy grey background."""
    return np.abs(img.mean(axis=0) - 0.5) > 0.28


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="shapes.png")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval", type=int, default=200, help="held-out images scored")
    args = parser.parse_args()
    model = train(args.steps)
    layer = "8"  # the last convolution

    x, y = make_batch(max(4, args.eval), np.random.default_rng(7))
    ex = explain(model, x, [layer], METHODS, y[:, None], scorecam_batch=64)
    rates = {}
    for m in METHODS:
        maps = ex.maps[(m, layer)][:, 0].numpy()
        hits = []
        for cam, img in zip(maps, x.numpy(), strict=True):
            up = cv2.resize(cam, (48, 48), interpolation=cv2.INTER_LINEAR)
            hits.append(shape_mask(img)[np.unravel_index(np.argmax(up), up.shape)])
        rates[m] = float(np.mean(hits))
    print("map peak inside the shape:", ", ".join(f"{m} {r:.0%}" for m, r in rates.items()))

    rows = []
    for i in range(4):
        rgb = (x[i].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        rgb = cv2.resize(rgb, (144, 144), interpolation=cv2.INTER_NEAREST)
        cells = [
            render.overlay(rgb, ex.maps[(m, layer)][i, 0].numpy(), Box(0, 0, 144, 144), alpha=0.45)
            for m in METHODS
        ]
        label = f"{NAMES[int(y[i])]}: p={float(ex.target_scores[i, 0]):.2f}"
        rows.append((label, [rgb, *cells]))
    titles = ["input", *(f"{m} {rates[m]:.0%}" for m in METHODS)]
    title = f"CNN trained on shapes | % = map peak inside the shape ({len(x)} held-out images)"
    sheet = render.sheet(rows, titles, title=title, cell=144)
    with open(args.out, "wb") as f:
        f.write(encode_png(sheet))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
