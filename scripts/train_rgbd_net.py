"""Train the two-input test net (``tests/rgbd_net.py``: a photo with two shapes, a depth map in which one
stands out; the label is that one's kind) and save the fixture.

    python scripts/train_rgbd_net.py [--steps 2000] [--out tests/fixtures/rgbd_net.safetensors]

CPU, seeded, about 5 minutes on two cores; prints the accuracy on 256 held-out scenes (chance: 1/3; either
input alone: at most 1/2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import rgbd_net  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "rgbd_net.safetensors")
    args = parser.parse_args()
    model = rgbd_net.train(args.steps)
    rgb, depth, y, _ = rgbd_net.batch(256, np.random.default_rng(12345))
    with torch.no_grad():
        accuracy = float((model(rgb, depth).argmax(1) == y).float().mean())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(args.out))
    print(f"held-out accuracy {accuracy:.3f}; wrote {args.out}")


if __name__ == "__main__":
    main()
