"""Throughput of one process vs torchrun ranks over the same images (whole processes, median of rounds).

    python bench/torchrun_bench.py --images 64 --rounds 3 --ranks 2

Each round runs both, alternating which goes first, into fresh output folders; the ratio is 1 process /
N ranks (above 1: the ranks are faster). On a CPU the ranks split the cores (torch threads = cores / N).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    res = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{res.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hookviz-torchrun-bench-"))
    try:
        (tmp / "in").mkdir()
        for i in range(args.images):
            rgb = np.random.default_rng(i).integers(0, 256, (375, 500, 3), dtype=np.uint8)
            Image.fromarray(rgb).save(tmp / "in" / f"img{i:04d}.jpg", quality=90)
        job = ["gradcam", "in", "--weights", "none", "--device", "cpu", "-q"]
        single = [sys.executable, "-m", "hookviz", *job]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        ranks = [*launcher, f"--nproc-per-node={args.ranks}", "-m", "hookviz", *job]
        times: dict[str, list[float]] = {"1 process": [], f"{args.ranks} ranks": []}
        for r in range(args.rounds):
            order = [("1 process", single), (f"{args.ranks} ranks", ranks)]
            for label, cmd in order if r % 2 == 0 else order[::-1]:
                out = tmp / f"out-{r}-{label.replace(' ', '')}"
                times[label].append(timed([*cmd, "--out", str(out)], tmp))
        one, many = (statistics.median(v) for v in times.values())
        print(f"# hookviz under torchrun: {args.images} images (500x375 JPEG), resnet18, whole processes")
        print(f"machine: {os.cpu_count()} CPUs; median of {args.rounds} alternating rounds")
        print("| run | median | images/s | speed-up |")
        print("|---|---|---|---|")
        print(f"| 1 process | {one:.2f} s | {args.images / one:.1f} | 1.00x |")
        print(
            f"| torchrun, {args.ranks} ranks | {many:.2f} s | {args.images / many:.1f} | {one / many:.2f}x |"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
