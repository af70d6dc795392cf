"""The README's video picture: the 3D CNN of tests/video_net.py trained on moving shapes (as the tests train
it), a video of a cross crossing noise, and `hookviz gradcam` over it; its contact sheet is copied to
docs/img/video-shapes.png.

    .venv/bin/python scripts/video_picture.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.video_net import CLASSES, moving_shape, trained  # noqa: E402


def main() -> None:
    model = trained()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        torch.save(model.state_dict(), d / "net.pt")
        (d / "labels.txt").write_text("\n".join(CLASSES) + "\n")
        # A cross that appears in frame 4 of 16 and crosses the picture.
        video, _ = moving_shape(np.random.default_rng(7), 1, frames=16, visible=range(4, 16))
        writer = cv2.VideoWriter(str(d / "cross.mp4"), cv2.VideoWriter.fourcc(*"mp4v"), 15.0, (32, 32))
        for f in video:
            writer.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
        writer.release()
        subprocess.run(
            [str(ROOT / ".venv/bin/hookviz"), "gradcam", str(d / "cross.mp4"), "--model",
             f"{ROOT / 'tests/video_net.py'}:ShapesVideoNet", "--weights", "net.pt", "--labels", "labels.txt",
             "--input-size", "32", "--resize", "squash", "--clip-len", "8", "--clips", "2",
             "--method", "gradcam", "--method", "eigencam", "--out", str(d / "out"), "-q"],
            check=True,
            cwd=d,
        )  # fmt: skip
        sheet = sorted((d / "out").glob("*.clip01.frames.png"))[0]
        target = ROOT / "docs/img/video-shapes.png"
        shutil.copy(sheet, target)
        print(target)


if __name__ == "__main__":
    main()
