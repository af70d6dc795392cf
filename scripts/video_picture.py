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
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hookviz.video import KINETICS_MEAN, KINETICS_STD  # noqa: E402
from tests.video_net import CLASSES, ShapesVideoNet, moving_shape  # noqa: E402


def normalised(video: np.ndarray) -> np.ndarray:
    x = (video.astype(np.float32) / 255 - np.asarray(KINETICS_MEAN, np.float32)) / np.asarray(
        KINETICS_STD, np.float32
    )
    return x.transpose(3, 0, 1, 2)


def main() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for i in range(600):
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
    for _ in range(80):
        idx = torch.randint(0, len(x), (32,), generator=gen)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
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
