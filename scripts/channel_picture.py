"""The README's channel picture: the small CNN trained on the synthetic shapes (as the tests train it), one
channel of its last block: its 6 best photos of a folder of 90 (``hookviz channels``) next to the picture
that drives it most (``hookviz visualize``).

    python scripts/channel_picture.py [--channel 2] [--out docs/img/channel-examples.png]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hookviz.io.shapes import draw_shape  # noqa: E402
from tests.conftest import TinyCNN, train_on_shapes, write_image  # noqa: E402

MODEL = ["--model", "tests.conftest:TinyCNN", "--input-size", "48", "--mean", "0,0,0", "--std", "1,1,1",
         "--device", "cpu", "-q"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--channel", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "channel-examples.png")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = train_on_shapes(TinyCNN())
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        torch.save(model.state_dict(), tmp / "shapes.pt")
        (tmp / "in").mkdir()
        rng = np.random.default_rng(11)
        for i in range(90):
            img, _ = draw_shape(i % 3, 64, rng)
            write_image(tmp / "in" / f"s{i:02d}.png", (img * 255).round().astype(np.uint8))
        weights = ["--weights", str(tmp / "shapes.pt")]
        hv = [sys.executable, "-m", "hookviz"]
        layer = ["--layer", "features.10"]
        subprocess.run([*hv, "channels", str(tmp / "in"), *MODEL, *weights, *layer, "--top", "6", "--resize",
                        "squash", "--channels", str(args.channel), "--out", str(tmp / "out")],
                       check=True, cwd=ROOT)  # fmt: skip
        subprocess.run([*hv, "visualize", *MODEL, *weights, *layer, "--channel",
                        str(args.channel), "--size", "64", "--steps", "256", "--out", str(tmp / "vis")],
                       check=True, cwd=ROOT)  # fmt: skip
        sheet = cv2.imread(str(tmp / "out" / "channels" / f"features.10.c{args.channel}.png"))
        vis = cv2.imread(str(next((tmp / "vis").glob("*.png"))))
    scale = sheet.shape[0] / vis.shape[0]
    vis = cv2.resize(vis, (round(vis.shape[1] * scale), sheet.shape[0]), interpolation=cv2.INTER_NEAREST)
    gap = np.full((sheet.shape[0], 12, 3), 255, np.uint8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(args.out), np.concatenate([sheet, gap, vis], axis=1))
    print(args.out)


if __name__ == "__main__":
    main()
