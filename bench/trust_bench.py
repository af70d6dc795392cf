"""``hookviz trust`` against what a user would otherwise run for the same candidates: ``evaluate --metric
all`` and ``sanity``, each on its own, on the same 16 photos (issue #62's row: goal at most half the time).

``python bench/trust_bench.py [--rounds 3]``: TinyCNN (the tests' shapes CNN, trained here for 200 steps), 16
shapes photos at 48 px, the methods gradcam, saliency and guidedbackprop at ``features``. Each command runs as
its own process (``python -m hookviz``: imports and the model load included, as a user pays them), the three
interleaved round after round into fresh folders; medians. On a shared machine the figures move with the load:
only the ratio of one run means anything.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from hookviz.io.shapes import shapes_batch  # noqa: E402
from tests.conftest import TinyCNN, train_on_shapes, write_image  # noqa: E402

METHODS = "gradcam,saliency,guidedbackprop"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trust-bench-"))
    torch.manual_seed(0)
    weights = work / "shapes.pt"
    torch.save(train_on_shapes(TinyCNN(), steps=200).state_dict(), weights)
    x, _, _ = shapes_batch(16, np.random.default_rng(5))
    photos = work / "photos"
    photos.mkdir()
    for i, image in enumerate(x):
        write_image(
            photos / f"s{i:02d}.png", (image.numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8)
        )
    model = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--input-size", "48",
             "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1", "--method", METHODS]  # fmt: skip
    commands = {
        "trust": ["trust", str(photos), *model, "-l", "features", "-q"],
        "evaluate --metric all": ["evaluate", str(photos), *model, "-l", "features", "--metric", "all", "-q"],
        "sanity": ["sanity", str(photos), *model, "-l", "features", "-q"],
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    times: dict[str, list[float]] = {k: [] for k in commands}
    for r in range(args.rounds):
        for name, words in commands.items():
            out = work / f"{name.split()[0]}{r}"
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "hookviz", *words, "--out", str(out)], env=env,
                                  capture_output=True, text=True)  # fmt: skip
            times[name].append(time.perf_counter() - start)
            if done.returncode != 0:
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr[-2000:]}")
            print(f"round {r + 1} {name}: {times[name][-1]:.1f} s", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    both = med["evaluate --metric all"] + med["sanity"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}; "
          f"{args.rounds} interleaved rounds, medians")  # fmt: skip
    print("| command (16 photos, 3 methods at features) | seconds | ratio to evaluate + sanity |")
    print("|---|---|---|")
    for name, seconds in med.items():
        print(f"| {name} | {seconds:.1f} | {seconds / both:.2f}x |")
    print(f"| evaluate --metric all + sanity | {both:.1f} | 1.00x |")
    print(f"all rounds: {times}")


if __name__ == "__main__":
    main()
