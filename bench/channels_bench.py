"""``hookviz channels`` over a folder (issue #36) against its floor: one inference pass over the same photos
(decode, resize and crop, resnet18 in batches of 8; nothing written). hookviz's run includes everything: its
start, the per-photo scores and peaks, gathering each channel's best 8 and a sheet for each of the 512
channels of the default layer. Whole processes, interleaved, medians. Goal: at most 1.1x the floor at 1,000
photos. A second row times the floor with its batch channels-last, the layout hookviz's pass uses on the CPU,
so that what the layout gains and what the rest costs can be told apart. Each row gives the ratio of the
medians and the median of the rounds' own ratios (runs side by side: this machine drifts by several percent
over minutes).
Run with ``python bench/channels_bench.py [--photos 1000] [--rounds 2]``."""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench import HOOKVIZ, make_images, run_timed

FLOOR = r"""
import sys, glob, os, numpy as np, torch, torchvision
from PIL import Image
src, bs, last = sys.argv[1], 8, len(sys.argv) > 2  # last: the batch in channels-last layout
model = torchvision.models.resnet18(weights=None).eval()
mean = np.array([0.485, 0.456, 0.406], np.float32); std = np.array([0.229, 0.224, 0.225], np.float32)
paths = sorted(glob.glob(os.path.join(src, "*.jpg")))
for i in range(0, len(paths), bs):
    xs = []
    for p in paths[i:i + bs]:
        rgb = Image.open(p).convert("RGB")
        w, h = rgb.size
        nh, nw = (256, int(256 * w / h)) if h <= w else (int(256 * h / w), 256)
        small = np.asarray(rgb.resize((nw, nh), Image.BILINEAR))
        y0, x0 = int(round((nh - 224) / 2.0)), int(round((nw - 224) / 2.0))
        crop = small[y0:y0 + 224, x0:x0 + 224].astype(np.float32) / 255
        xs.append(((crop - mean) / std).transpose(2, 0, 1))
    x = torch.from_numpy(np.stack(xs))
    with torch.inference_mode():
        model(x.contiguous(memory_format=torch.channels_last) if last else x)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--photos", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    # hookviz's bytecode compiled first, as pip does for an installed package: this machine sets
    # PYTHONDONTWRITEBYTECODE=1, so an editable checkout would compile its sources in every process
    # (torch and torchvision, the floor's imports, come compiled with their wheels).
    package = Path(__file__).resolve().parent.parent / "hookviz"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        imgs = tmp / "imgs"
        make_images(imgs, args.photos)
        floor = tmp / "floor.py"
        floor.write_text(FLOOR)
        runs = {
            "floor": lambda o: [sys.executable, str(floor), str(imgs)],
            "floor_last": lambda o: [sys.executable, str(floor), str(imgs), "channels-last"],
            "channels": lambda o: [
                HOOKVIZ,
                "channels",
                str(imgs),
                "--weights",
                "none",
                "--device",
                "cpu",
                "-q",
                "--out",
                str(o),
            ],
        }
        times: dict[str, list[float]] = {k: [] for k in runs}
        order = list(runs)
        for r in range(args.rounds):
            random.Random(r).shuffle(order)
            for name in order:
                out = tmp / f"{name}{r}"
                times[name].append(run_timed(runs[name](out))[0])
                shutil.rmtree(out, ignore_errors=True)
    t = {k: statistics.median(v) for k, v in times.items()}
    # This machine drifts by several percent over minutes: each round's ratio is taken between runs made
    # side by side, and the median of those is the headline (the ratio of the medians is shown too).
    paired = {k: statistics.median(a / f for a, f in zip(times[k], times["floor"], strict=True)) for k in t}
    print(
        f"resnet18 (random weights), {args.photos} photos, CPU, {args.rounds} interleaved rounds: medians of "
        "the times, and the median of each round's ratio"
    )
    for r in range(args.rounds):
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v[r]:.1f} s" for k, v in times.items())
              + f"; channels/floor {times['channels'][r] / times['floor'][r]:.3f}")  # fmt: skip
    print(f"| floor: one inference pass (decode, crop, batch 8) | {t['floor']:.1f} s | 1.00x | 1.00x |")
    last = f"{t['floor_last'] / t['floor']:.2f}x | {paired['floor_last']:.2f}x"
    print(f"| the same pass, its batch channels-last (the layout hookviz uses on the CPU) | "
          f"{t['floor_last']:.1f} s | {last} |")  # fmt: skip
    print(f"| hookviz channels (scores, top 8, 512 sheets) | {t['channels']:.1f} s | "
          f"{t['channels'] / t['floor']:.2f}x | {paired['channels']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
