"""docs/sae.md's pictures of what a layer of the packaged EfficientNet-Lite0 has learned: a small TopK
dictionary of ``_blocks.10`` (112 channels at 14 x 14 for a 224-pixel input) trained by ``hookviz sae train``
over crops of the four photos in sample_images/ (the only photos the repository holds: random crops of 15 to
100 % of a photo's area, half of them mirrored, seeded), then ``hookviz sae features`` over the same crops and
``hookviz sae explain`` on the cat. The sheets and the map go into docs/img/ as small PNGs.

    python scripts/sae_pictures.py [--crops 320] [--features 3] [--out docs/img] [--keep /tmp/sae-run]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "sample_images"
MODEL = ["--model", "efficientnet_lite0", "--device", "cpu"]
LAYER = "_blocks.10"
TRAIN = ["--width", "8x", "--k", "16", "--vectors", "300000", "--batch", "1024", "--buffer", "16384",
         "--lr", "4e-4", "--seed", "0", "--batch-size", "32"]  # fmt: skip


def crops(out: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` random crops of the sample photos (15 to 100 % of the area, aspect 3:4 to 4:3, half mirrored),
    each resized to 256 pixels on its short side, written into ``out``."""
    rng = np.random.default_rng(seed)
    photos = sorted(p for p in PHOTOS.glob("*.jpg"))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(n):
        photo = photos[i % len(photos)]
        img = cv2.imread(str(photo))
        h, w = img.shape[:2]
        area = rng.uniform(0.15, 1.0) * h * w
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch = min(h, round(np.sqrt(area / aspect)))
        cw = min(w, round(np.sqrt(area * aspect)))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = img[y : y + ch, x : x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        scale = 256 / min(ch, cw)
        crop = cv2.resize(crop, (round(cw * scale), round(ch * scale)), interpolation=cv2.INTER_AREA)
        path = out / f"{photo.stem}-{i:03d}.jpg"
        cv2.imwrite(str(path), crop, [cv2.IMWRITE_JPEG_QUALITY, 90])
        written.append(path)
    return written


def hookviz(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "hookviz", *args], check=True, cwd=ROOT)


def small_png(source: Path, target: Path, width: int) -> None:
    """``source`` scaled to ``width`` pixels (area averaging), as a PNG of at most 256 colours."""
    from PIL import Image

    img = Image.open(source).convert("RGB")
    if img.width > width:
        img = img.resize((width, round(img.height * width / img.width)), Image.Resampling.LANCZOS)
    img.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(target, optimize=True)


def pick(data: dict, n: int) -> list[dict]:
    """The ``n`` detailed features whose top patches come from the most different photos (then the most
    firing): a feature that fires on the cat's fur in eight crops says less than one found in three photos."""
    detailed = [f for f in data["features"] if "sheet" in f]

    def spread(f: dict) -> tuple[int, float]:
        return len({Path(p["input"]).name.split("-")[0] for p in f["top"]}), f["fired"]

    return sorted(detailed, key=spread, reverse=True)[:n]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crops", type=int, default=320)
    parser.add_argument("--features", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folder and crops here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = args.keep or Path(d)
        data_dir, run = work / "crops", work / "run"
        crops(data_dir, args.crops)
        hookviz("sae", "train", str(data_dir), *MODEL, "--layer", LAYER, *TRAIN, "--out", str(run))
        hookviz("sae", "features", str(run), str(data_dir), "--top", "8", "--detail", "24", "--device", "cpu")
        hookviz("sae", "explain", str(PHOTOS / "cat.jpg"), "--sae", str(run), "--strongest", "3", "--device",
                "cpu", "--out", str(work / "explain"))  # fmt: skip
        data = json.loads((run / "features" / "features.json").read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        chosen = pick(data, args.features)
        for i, f in enumerate(chosen):
            small_png(run / f["sheet"], args.out / f"sae-feature-{i + 1}.png", 900)
        small_png(work / "explain" / "cat.sae.png", args.out / "sae-explain-cat.png", 900)
        metrics = json.loads((run / "metrics.json").read_text())
        print(json.dumps({"metrics": metrics, "features": [
            {"feature": f["feature"], "fired": f["fired"], "classes": f.get("classes"),
             "inputs": [Path(p["input"]).name for p in f["top"]]} for f in chosen]}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
