"""Train a tiny ultralytics YOLO (v8 layout, a quarter of v8n's width) on synthetic shape scenes and save the
test fixture.

    python scripts/train_shapes_yolo.py [--epochs 50] [--out tests/fixtures/shapes_yolo.pt]

Needs ``pip install 'hookviz[ultralytics]'`` (AGPL-3.0, not bundled with hookviz). CPU only, seeded; a few
minutes on two cores. The scenes are written as an ultralytics dataset in a temporary folder; the checkpoint
is ultralytics' own ``best.pt`` (stripped of its optimiser state by ultralytics), copied to ``--out``. Prints
ultralytics' validation mAP50 on held-out scenes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hookviz.io.shapes import SHAPES, shapes_scene  # noqa: E402

#: YOLOv8's layout at depth 0.33 and width 0.0625 (v8n's is 0.25): about 0.2 M parameters.
MODEL_YAML = """\
nc: 3
scales:
  t: [0.33, 0.0625, 1024]
backbone:
  - [-1, 1, Conv, [64, 3, 2]]
  - [-1, 1, Conv, [128, 3, 2]]
  - [-1, 3, C2f, [128, True]]
  - [-1, 1, Conv, [256, 3, 2]]
  - [-1, 6, C2f, [256, True]]
  - [-1, 1, Conv, [512, 3, 2]]
  - [-1, 6, C2f, [512, True]]
  - [-1, 1, Conv, [1024, 3, 2]]
  - [-1, 3, C2f, [1024, True]]
  - [-1, 1, SPPF, [1024, 5]]
head:
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [[-1, 6], 1, Concat, [1]]
  - [-1, 3, C2f, [512]]
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [[-1, 4], 1, Concat, [1]]
  - [-1, 3, C2f, [256]]
  - [-1, 1, Conv, [256, 3, 2]]
  - [[-1, 12], 1, Concat, [1]]
  - [-1, 3, C2f, [512]]
  - [-1, 1, Conv, [512, 3, 2]]
  - [[-1, 9], 1, Concat, [1]]
  - [-1, 3, C2f, [1024]]
  - [[15, 18, 21], 1, Detect, [nc]]
"""

SIZE = (120, 160)  # scene height, width; trained and predicted at imgsz 160


def write_split(folder: Path, n: int, seed: int) -> None:
    """``n`` scenes as PNGs with YOLO label files (class cx cy w h, normalised)."""
    import cv2

    (folder / "images").mkdir(parents=True)
    (folder / "labels").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    h, w = SIZE
    for i in range(n):
        img, boxes, labels, _ = shapes_scene(rng, h, w)
        rgb = (img * 255).round().clip(0, 255).astype(np.uint8)
        cv2.imwrite(str(folder / "images" / f"{i:04d}.png"), rgb[..., ::-1])
        lines = [
            f"{k} {(x0 + x1) / 2 / w:.6f} {(y0 + y1) / 2 / h:.6f} {(x1 - x0) / w:.6f} {(y1 - y0) / h:.6f}"
            for (x0, y0, x1, y1), k in zip(boxes.tolist(), labels.tolist(), strict=True)
        ]
        (folder / "labels" / f"{i:04d}.txt").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--train", type=int, default=500, help="training scenes")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "shapes_yolo.pt")
    args = parser.parse_args()
    from ultralytics import YOLO

    with tempfile.TemporaryDirectory(prefix="shapes-yolo-") as tmp:
        root = Path(tmp)
        write_split(root / "train", args.train, seed=0)
        write_split(root / "val", 100, seed=1234)
        names = "\n".join(f"  {i}: {n}" for i, n in enumerate(SHAPES))
        (root / "data.yaml").write_text(
            f"path: {root}\ntrain: train/images\nval: val/images\nnames:\n{names}\n"
        )
        (root / "shapes-yolo.yaml").write_text(MODEL_YAML)
        model = YOLO(str(root / "shapes-yolo.yaml"))
        model.train(
            data=str(root / "data.yaml"), epochs=args.epochs, imgsz=SIZE[1], batch=16, device="cpu",
            workers=0, seed=0, deterministic=True, project=str(root / "runs"), name="train", plots=False,
            amp=False, mosaic=0.0, fliplr=0.5, hsv_h=0.0, hsv_s=0.0, hsv_v=0.2, scale=0.3, translate=0.1,
            verbose=False, val=True,
        )  # fmt: skip
        best = root / "runs" / "train" / "weights" / "best.pt"
        metrics = YOLO(str(best)).val(data=str(root / "data.yaml"), imgsz=SIZE[1], device="cpu", plots=False,
                                      verbose=False, project=str(root / "runs"), name="val")  # fmt: skip
        print(f"held-out mAP50 {metrics.box.map50:.3f}, mAP50-95 {metrics.box.map:.3f}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(best, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
