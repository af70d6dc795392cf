"""The README's RGB-D picture: the trained two-input net (tests/fixtures/rgbd_net.safetensors) on one held-out
scene, LayerCAM at the photo branch, the depth branch and after they meet, each drawn over the input its layer
sees, side by side.

    python scripts/rgbd_picture.py [--out docs/img/rgbd-pair.png]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import rgbd_net  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "rgbd-pair.png")
    args = parser.parse_args()
    photo, depth, _, _ = rgbd_net.scene(np.random.default_rng(77))
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        # Shown at 4x (nearest); the model sees them at its 64 px (--input-size 64 --resize squash).
        big = np.kron(photo, np.ones((4, 4, 1), np.float32))
        Image.fromarray((big * 255).round().astype(np.uint8)).save(t / "photo.png")
        Image.fromarray((np.kron(depth, np.ones((4, 4), np.float32)) * 65535).round().astype(np.uint16)).save(
            t / "depth.png"
        )
        (t / "labels.txt").write_text("square\ndisc\ncross\n")
        subprocess.run(
            [sys.executable, "-m", "hookviz", "gradcam", "--input", f"rgb={t / 'photo.png'}", "--input",
             f"depth={t / 'depth.png'}", "--model", "tests/rgbd_net.py:make", "--weights",
             "tests/fixtures/rgbd_net.safetensors", "--mean", "rgb=0,0,0", "--std",
             "rgb=1,1,1", "--input-size", "64", "--resize", "squash", "--labels", str(t / "labels.txt"),
             "--method", "layercam", "--layer", "rgb.6", "--layer", "depth.4", "--layer", "fuse",
             "--no-sheet", "-o", str(t / "out"), "-q"],
            check=True,
            cwd=ROOT,
        )  # fmt: skip
        pictures = [
            cv2.imread(str(next((t / "out").glob(f"*.layercam.{n}.png"))))
            for n in ("rgb.6", "depth.4", "fuse")
        ]
    h = max(p.shape[0] for p in pictures)
    gap = np.full((h, 8, 3), 255, np.uint8)
    row = [np.pad(p, ((0, h - p.shape[0]), (0, 0), (0, 0)), constant_values=255) for p in pictures]
    cv2.imwrite(str(args.out), np.concatenate([row[0], gap, row[1], gap, row[2]], axis=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
