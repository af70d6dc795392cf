"""``hookviz sae train`` (issue #63): activation vectors per second when a dictionary trains from live hooks
(photos decoded, preprocessed, run through the model up to the layer, the block-shuffle buffer, the training
steps) against the chosen library's own loop (overcomplete's ``train_sae``) over the same number of vectors
held in memory, same SAE, batch and steps. resnet18 (random weights), ``layer3`` (256-wide vectors, 14 x 14
positions a photo), TopK width 2x, k 32, batch 1024; in one process, best of ``--rounds``; the library's
loop gets the vectors for free (gathered before its clock starts).
Run with ``python bench/sae_bench.py [--photos 64] [--vectors 50000] [--rounds 2]``."""

from __future__ import annotations

import argparse
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


def _library_loop(x: torch.Tensor, shape: Shape, settings: training.TrainSettings) -> float:
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

    start = time.perf_counter()
    train_sae(sae, loader, criterion, opt, nb_epochs=1, monitoring=0)
    return time.perf_counter() - start


def _ticker(ticks: list[float]) -> Any:
    return lambda progress: ticks.append(time.perf_counter())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--photos", type=int, default=64)
    parser.add_argument("--vectors", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    loaded = load_model("resnet18", "none")
    settings = training.TrainSettings(width="2x", k=32, vectors=args.vectors, batch=1024, buffer=8192,
                                      checkpoint_every=10**9)  # fmt: skip
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
        shape = Shape("topk", 256, 512, 32)
        hooks, library = [], []
        for r in range(args.rounds):
            ticks: list[float] = []
            start = time.perf_counter()
            done = train_sae(loaded, items, "layer3", Path(d) / f"run{r}", settings, tick=_ticker(ticks))
            hooks.append(ticks[-1] - start)
            library.append(_library_loop(held, shape, settings))
        vectors = done.metrics["training_vectors"]
    print(f"vectors trained on: {vectors} ({args.photos} photos, 196 vectors each, passes repeated)")
    print(
        "from hooks (hookviz sae train: decode, forward to layer3, buffer, steps; not the quality after): "
        f"{vectors / min(hooks):,.0f} vectors/s"
    )
    rate = settings.steps() * settings.batch / min(library)
    print(f"overcomplete's train_sae over the vectors in memory: {rate:,.0f} vectors/s")


if __name__ == "__main__":
    main()
