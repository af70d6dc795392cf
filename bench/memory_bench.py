"""Memory bounded (issue #32): peak RSS of a heavy request, and FullGrad's cost against Grad-CAM's.

1. The request that was killed at 14.6 GB: 4 mosaics of 448 px through an EfficientNet (the Lite family's
   layout, weights=None), 16 methods, top-5, the default batch; whole ``hookviz gradcam`` processes, peak RSS
   of each (``RUSAGE_CHILDREN``), with the default ``--max-memory`` and with ``--max-memory 1G``.
2. FullGrad and Grad-CAM on one 448 px photo, in process, medians of interleaved rounds.

Run with ``make bench`` (or ``python bench/memory_bench.py``); paste the table into bench/RESULTS.md.
"""

from __future__ import annotations

import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HOOKVIZ = shutil.which("hookviz", path=str(Path(sys.executable).parent)) or "hookviz"
METHODS = (
    "gradcam,gradcampp,xgradcam,layercam,hirescam,eigencam,guidedbackprop,guidedgradcam,gradcamelementwise,"
    "eigengradcam,segeigencam,kpcacam,fem,saliency,inputxgradient,fullgrad"
)
MODEL = ["--model", "efficientnet_b0", "--weights", "none", "--input-size", "448", "--device", "cpu"]


def mosaics(folder: Path, n: int = 4, side: int = 448) -> Path:
    """``n`` photos of ``side`` px, each four sample photos tiled 2 x 2."""
    import cv2

    photos = [cv2.imread(str(p)) for p in sorted((ROOT / "sample_images").glob("*.jpg"))]
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        tiles = [cv2.resize(photos[(i + k) % len(photos)], (side // 2, side // 2)) for k in range(4)]
        cv2.imwrite(str(folder / f"mosaic{i}.png"), np.vstack([np.hstack(tiles[:2]), np.hstack(tiles[2:])]))
    return folder


_PEAK = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)"
)


def peak_rss(cmd: list[str]) -> tuple[float, float, int]:
    """Peak RSS (MiB) and seconds of one process running ``cmd``, and its exit code."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PEAK, *cmd], capture_output=True, text=True, check=True)
    kib, code = out.stdout.split()[-2:]
    return int(kib) / 1024, time.perf_counter() - t0, int(code)


def request_rows(tmp: Path) -> list[tuple[str, float, float]]:
    photos = mosaics(tmp / "mosaics")
    rows = []
    for name, extra in (("default --max-memory", []), ("--max-memory 1G", ["--max-memory", "1G"])):
        out = tmp / name.replace(" ", "_")
        cmd = [HOOKVIZ, "gradcam", str(photos), *MODEL, "--method", METHODS, "--target", "top5", "--out",
               str(out), "-q", *extra]  # fmt: skip
        mib, secs, code = peak_rss(cmd)
        assert code == 0, f"hookviz exited {code}"
        rows.append((f"peak RSS, 4 x 448 px, efficientnet_b0, 16 methods, top-5, {name} (MiB; goal <= 4096)",
                     mib, mib / 4096))  # fmt: skip
        rows.append((f"  its time (s), {name}", secs, float("nan")))
    return rows


def fullgrad_rows(rounds: int) -> list[tuple[str, float, float]]:
    import torch
    import torchvision

    from hookviz.engine.explain import explain

    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b0(weights=None).eval()
    x = torch.randn(1, 3, 448, 448)
    fns = {
        "gradcam": lambda: explain(model, x, ["features"], ["gradcam"]),
        "fullgrad": lambda: explain(model, x, ["features"], ["fullgrad"]),
        "saliency": lambda: explain(model, x, ["features"], ["saliency"]),
    }
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    order, rng = list(fns), random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    m = {k: statistics.median(v) for k, v in times.items()}
    return [
        ("Grad-CAM, one 448 px photo, efficientnet_b0", m["gradcam"], 1.0),
        ("FullGrad, the same photo (goal <= 3x Grad-CAM)", m["fullgrad"], m["fullgrad"] / m["gradcam"]),
        ("Saliency, the same photo: FullGrad's passes (a backward to the input)", m["saliency"],
         m["saliency"] / m["gradcam"]),
        ("-> FullGrad / its passes (Saliency)", m["fullgrad"] / m["saliency"], float("nan")),
    ]  # fmt: skip


def main() -> None:
    print(f"# hookviz memory bench  {time.strftime('%Y-%m-%d')}\n")
    with tempfile.TemporaryDirectory() as d:
        rows = request_rows(Path(d)) + fullgrad_rows(rounds=5)
    print(f"| {'measurement':<92} | {'value':>9} | {'ratio':>6} |")
    print(f"|{'-' * 94}|{'-' * 11}|{'-' * 8}|")
    for name, value, ratio in rows:
        shown = f"{value:.0f}" if "MiB" in name else f"{value:.1f}" if "(s)" in name else f"{value:.3f} s"
        shown = f"{value:.2f}x" if name.startswith("->") else shown
        print(f"| {name:<92} | {shown:>9} | {'' if ratio != ratio else f'{ratio:.2f}x':>6} |")


if __name__ == "__main__":
    main()
