"""``hookviz trust`` against what a user would otherwise run for the same candidates: ``evaluate --metric
all`` and ``sanity``, each on its own, on the same 16 photos (issue #62's row: goal at most half the time).

``python bench/trust_bench.py [--rounds 3] [--photos 16] [--before DIR]``: TinyCNN (the tests' shapes CNN,
trained here for 200 steps), 16 shapes photos at 48 px, the methods gradcam, saliency and guidedbackprop at
``features``. Each command runs as its own process (``python -m hookviz``: imports and the model load
included, as a user pays them), interleaved round after round into fresh folders; medians, and the median of
each round's ratio (on a shared machine the seconds move with the load: the ratios of one round, measured
minutes apart, are what count). ``--before DIR``: a source tree of an earlier hookviz (``git archive main
hookviz | tar -x -C DIR``) whose ``trust`` is timed in the same rounds, its verdicts compared with this one's.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--photos", type=int, default=16)
    parser.add_argument("--before", type=Path, default=None, help="an earlier hookviz source tree")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trust-bench-"))
    torch.manual_seed(0)
    weights = work / "shapes.pt"
    torch.save(train_on_shapes(TinyCNN(), steps=200).state_dict(), weights)
    x, _, _ = shapes_batch(args.photos, np.random.default_rng(5))
    photos = work / "photos"
    photos.mkdir()
    for i, image in enumerate(x):
        write_image(
            photos / f"s{i:02d}.png", (image.numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8)
        )
    model = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--input-size", "48",
             "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1", "--method", METHODS]  # fmt: skip
    trust = ["trust", str(photos), *model, "-l", "features", "--max-photos", str(args.photos), "-q"]
    commands = {
        "trust": (trust, ROOT),
        **({"trust (before)": (trust, args.before.resolve())} if args.before else {}),
        "evaluate --metric all": (["evaluate", str(photos), *model, "-l", "features", "--metric", "all",
                                   "-q"], ROOT),
        "sanity": (["sanity", str(photos), *model, "-l", "features", "-q"], ROOT),
    }  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in commands}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for name, (words, tree) in commands.items():
            out = work / f"{name.split()[0]}{'-before' if 'before' in name else ''}{r}"
            env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}"}
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "hookviz", *words, "--out", str(out)], env=env,
                                  capture_output=True, text=True)  # fmt: skip
            times[name].append(time.perf_counter() - start)
            loads.append(os.getloadavg()[0])
            if done.returncode != 0:
                raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr[-2000:]}")
            print(f"round {r + 1} {name}: {times[name][-1]:.1f} s (load {loads[-1]:.1f})", file=sys.stderr,
                  flush=True)  # fmt: skip
    if args.before:
        print(f"same verdicts as before: {_verdicts(work / 'trust0') == _verdicts(work / 'trust-before0')}")
    report(times, loads, args)


def _verdicts(out: Path) -> list[tuple[str, str, str]]:
    data = json.loads((out / "trust.json").read_text())
    return [(c["method"], c["layer"], c["verdict"]) for c in data["candidates"]]


def report(times: dict[str, list[float]], loads: list[float], args: argparse.Namespace) -> None:
    """The table: each command's median seconds and the median over the rounds of its ratio to evaluate +
    sanity in the same round."""
    both = [e + s for e, s in zip(times["evaluate --metric all"], times["sanity"], strict=True)]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}; {args.rounds} "
          f"interleaved rounds, medians; load average (1 min) {min(loads):.1f} to {max(loads):.1f}, median "
          f"{statistics.median(loads):.1f}")  # fmt: skip
    print(f"| command ({args.photos} photos, 3 methods at features) | seconds | ratio to evaluate + sanity "
          "(median of the rounds') |")  # fmt: skip
    print("|---|---|---|")
    for name, seconds in times.items():
        ratios = [t / b for t, b in zip(seconds, both, strict=True)]
        print(f"| {name} | {statistics.median(seconds):.1f} | {statistics.median(ratios):.2f}x |")
    print(f"| evaluate --metric all + sanity | {statistics.median(both):.1f} | 1.00x |")
    print(f"all rounds: {times}")


if __name__ == "__main__":
    main()
