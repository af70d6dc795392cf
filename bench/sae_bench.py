"""``hookviz sae train`` (issue #63): activation vectors per second when a dictionary trains from live hooks
(photos decoded, preprocessed, run through the model up to the layer, the block-shuffle buffer, the training
steps) against the chosen library's own loop (overcomplete's ``train_sae``) over the same number of vectors
held in memory, same SAE, batch and steps; and hookviz's own steps over those vectors in memory
(``train_vectors``: the same loss as from hooks, so the gap to it is the data path alone). resnet18 (random
weights), ``layer3`` (256-wide vectors, 14 x 14 positions a photo), TopK, k 32, batch 1024; in one process,
the three interleaved round after round, medians of ``--rounds``; the in-memory loops get the vectors for free
(gathered before their clocks start).

``--memory``: the peak resident memory of ``hookviz sae train`` (its own process) over 1,000 and 10,000
photos of 32 pixels (the tests' shapes model, its last map: 64 vectors of 64 a photo), one pass over the
10,000.

Run with ``python bench/sae_bench.py [--photos 32] [--vectors 20000] [--width 2x] [--rounds 3]``, or
``--memory``."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hookviz.io.inputs import expand_inputs
from hookviz.sae import dictionary, training
from hookviz.sae.api import train_sae
from hookviz.sae.dictionary import Norm, Shape
from hookviz.sae.vectors import layer_output, read_batch, site_layout, to_vectors
from hookviz.tasks import load_model


def _photos(folder: Path, n: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (256, 320, 3), dtype=np.uint8)).save(folder / f"p{i:04d}.jpg")


def _library_loop(x: torch.Tensor, shape: Shape, settings: training.TrainSettings) -> tuple[float, float]:
    """overcomplete's own training loop over vectors in memory: seconds for ``settings.steps()`` steps."""
    lib = dictionary.library()
    from torch.utils.data import DataLoader, TensorDataset

    train_sae = dictionary.library_module("train").train_sae
    sae = lib.TopKSAE(shape.d, shape.width, top_k=shape.k)
    xn = Norm.fit(x).apply(x)[: settings.steps() * settings.batch]
    loader = DataLoader(TensorDataset(xn), batch_size=settings.batch, shuffle=True)
    opt = torch.optim.Adam(sae.parameters(), lr=settings.lr)

    def criterion(x: torch.Tensor, x_hat: torch.Tensor, *rest: object) -> torch.Tensor:
        return (x - x_hat).square().mean()

    start = _clocks()
    train_sae(sae, loader, criterion, opt, nb_epochs=1, monitoring=0)
    return _since(start)


def _clocks() -> tuple[float, float]:
    """Wall-clock seconds and this process's CPU seconds (every thread's): on a loaded machine the second
    is the work done, the first also the waiting for a core."""
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    now = _clocks()
    return now[0] - start[0], now[1] - start[1]


def _ticker(ticks: list[tuple[float, float]]) -> Any:
    return lambda progress: ticks.append(_clocks())


def _own_loop(x: torch.Tensor, shape: Shape, settings: training.TrainSettings) -> tuple[float, float]:
    """hookviz's steps (its loss, TopK's auxiliary loss for dead features included) over vectors in memory."""
    start = _clocks()
    training.train_vectors(x, shape, settings)
    return _since(start)


def speed(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    loaded = load_model("resnet18", "none")
    settings = training.TrainSettings(width=args.width, k=32, vectors=args.vectors, batch=1024, buffer=8192,
                                      checkpoint_every=10**9)  # fmt: skip
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "photos"
        folder.mkdir()
        _photos(folder, args.photos)
        items = expand_inputs([str(folder)])
        x = torch.cat(
            [read_batch(items[i : i + 16], loaded.preprocess, 10**8, []) for i in range(0, len(items), 16)]
        )  # type: ignore[misc]
        layout = site_layout(loaded.model, "layer3", x[:1])
        with torch.no_grad():
            held = torch.cat(
                [
                    to_vectors(layer_output(loaded.model, "layer3", x[i : i + 16]), layout)
                    for i in range(0, len(x), 16)
                ]
            )
        while held.shape[0] < args.vectors:
            held = torch.cat([held, held])
        shape = Shape("topk", 256, dictionary.parse_width(args.width, 256), 32)
        hooks, own, library, seen = [], [], [], []
        for r in range(args.rounds):
            ticks: list[tuple[float, float]] = []
            start = _clocks()
            done = train_sae(loaded, items, "layer3", Path(d) / f"run{r}", settings, tick=_ticker(ticks))
            hooks.append((ticks[-1][0] - start[0], ticks[-1][1] - start[1]))
            seen.append(done.metrics["training_vectors"])
            own.append(_own_loop(held, shape, settings))
            library.append(_library_loop(held, shape, settings))
            load.append(os.getloadavg()[0])
    vectors = settings.steps() * settings.batch
    print(f"{args.photos} photos, 196 vectors each; {settings.steps()} steps of 1024; width {shape.width}; "
          f"load average (1 min) {min(load):.1f}-{max(load):.1f}; rounds {args.rounds}")  # fmt: skip
    for clock, c in (("wall-clock", 0), ("CPU time", 1)):
        rates = {
            "from hooks (hookviz sae train: decode, forward to layer3, buffer, steps)": [
                n / t[c] for n, t in zip(seen, hooks, strict=True)
            ],
            "hookviz's own steps over the vectors in memory (train_vectors)": [vectors / t[c] for t in own],
            "overcomplete's train_sae over the vectors in memory": [vectors / t[c] for t in library],
        }
        medians = [statistics.median(v) for v in rates.values()]
        for (name, values), median in zip(rates.items(), medians, strict=True):
            each = ", ".join(f"{v:,.0f}" for v in values)
            print(f"{clock}: {name}: median {median:,.0f} vectors/s ({each})")
        print(f"{clock}: from hooks / overcomplete {medians[0] / medians[2]:.2f}x; from hooks / hookviz in "
              f"memory {medians[0] / medians[1]:.2f}x")  # fmt: skip


def memory(args: argparse.Namespace) -> None:
    """Peak RSS of ``hookviz sae train`` over 1,000 and 10,000 photos (each run its own process)."""
    from PIL import Image

    root = Path(__file__).resolve().parent.parent
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        for n in (1000, 10_000):
            folder = Path(d) / f"p{n}"
            folder.mkdir()
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                    folder / f"p{i:05d}.png"
                )
        for n in (1000, 10_000):
            peak, seconds = peak_rss(root, Path(d) / f"p{n}", Path(d) / f"run{n}", Path(d) / f"rss{n}")
            print(f"{n:,} photos: peak RSS {peak / 2**20:,.0f} MiB ({seconds:.1f} s)")


def peak_rss(root: Path, photos: Path, out: Path, report: Path) -> tuple[int, float]:
    """``hookviz sae train`` in a process of its own, the peak resident memory it reports at its exit."""
    args = ["sae", "train", str(photos), "--model", "tests.conftest:TinyCNN", "--weights", "none",
            "--input-size", "32", "--resize", "squash", "--layer", "features.10", "--width", "2x", "--k", "8",
            "--vectors", "640000", "--batch", "4096", "--buffer", "8192", "--device", "cpu", "--quiet",
            "--out", str(out)]  # fmt: skip
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", PEAK, str(report), *args], cwd=root, check=True)
    return int(report.read_text()), time.perf_counter() - start


#: Runs ``python -m hookviz ARGS`` and writes its peak RSS (bytes) to the file named first.
PEAK = """import resource, runpy, sys
report, sys.argv = sys.argv[1], ["hookviz", *sys.argv[2:]]
try:
    runpy.run_module("hookviz", run_name="__main__", alter_sys=True)
finally:
    open(report, "w").write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--photos", type=int, default=32)
    parser.add_argument("--vectors", type=int, default=20_000)
    parser.add_argument("--width", default="2x")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", action="store_true")
    args = parser.parse_args()
    memory(args) if args.memory else speed(args)


if __name__ == "__main__":
    main()
