"""Train the volume tests' 3-D CNN (``tests/volume_net.py``: a cube or a rod in noise) and save the fixture.

    python scripts/train_volume_net.py [--steps 700] [--out tests/fixtures/volume_net.safetensors]

CPU, seeded, about 70 s on two cores; prints the accuracy on 256 held-out volumes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import volume_net  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "volume_net.safetensors")
    args = parser.parse_args()
    model = volume_net.train(args.steps)
    x, y, _ = volume_net.batch(256, np.random.default_rng(12345))
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(args.out))
    print(f"held-out accuracy {accuracy:.3f}; wrote {args.out}")


if __name__ == "__main__":
    main()
