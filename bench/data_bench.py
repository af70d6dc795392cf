"""Data where it lives (issue #52): the pipeline over WebDataset shards against the same photos in a local
folder (images per second, side by side), memory over a long run (RSS after 1,000 and after 10,000 photos from
shards, with ``--records parquet`` and ``--maps zarr``), and Ray Data with two local workers against one
process.

A small CNN (3 conv stages, 64 px photos, weights seeded) so that reading, rendering and writing weigh as they
do in a large run; Grad-CAM at its last stage, a PNG and a raw map per photo. Interleaved rounds; medians. Run
with ``make bench`` or ``python bench/data_bench.py [--long 10000]``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import medians
from hookviz.io.inputs import expand_inputs
from hookviz.io.outputs import Output
from hookviz.io.shapes import draw_shape
from hookviz.io.sinks import data_sinks
from hookviz.jobs.settings import CamSettings
from hookviz.run.runner import run_job
from hookviz.tasks import load_model, make_cam_job

SIDE = 64


def make_net() -> nn.Module:
    def stage(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(stage(3, 16), stage(16, 32), stage(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 3))  # fmt: skip


def photos(folder: Path, n: int, shards: int) -> None:
    """``n`` PNG photos in ``folder/photos`` and the same in ``shards`` tar shards (WebDataset's layout)."""
    import cv2

    (folder / "photos").mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = []
    for i in range(n):
        img, _ = draw_shape(i % 3, SIDE, rng)
        path = folder / "photos" / f"p{i:05d}.png"
        cv2.imwrite(str(path), cv2.cvtColor((img * 255).round().astype(np.uint8), cv2.COLOR_RGB2BGR))
        names.append(path)
    per = -(-n // shards)
    for s in range(shards):
        with tarfile.open(folder / f"s{s:03d}.tar", "w") as tar:
            for path in names[s * per : (s + 1) * per]:
                tar.add(path, arcname=path.name)


def run(loaded: object, job: object, items: list, out: Path, sinks: bool = False) -> tuple[int, list[float]]:
    """The pipeline over ``items`` into a fresh ``out``: photos done, and RSS (MiB) after each 1,000."""
    shutil.rmtree(out, ignore_errors=True)
    output = Output(out)
    output.prepare()
    table = None
    if sinks:
        output.maps, table = data_sinks(out, "zarr", "parquet")
    rss, done = [], 0
    for record in run_job(job, loaded, items, output, batch_size=16):  # type: ignore[arg-type]
        done += record["status"] == "ok"
        if table is not None:
            table.add(record)
        if done and done % 1000 == 0:
            rss.append(psutil.Process().memory_info().rss / 2**20)
    if table is not None:
        table.close()
    return done, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--photos", type=int, default=512)
    parser.add_argument("--long", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ray", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = Path(tempfile.mkdtemp(prefix="hookviz-data-bench-"))
    spec = f"{Path(__file__).resolve()}:make_net"
    loaded = load_model(spec, "none", input_size=SIDE)
    job = make_cam_job(loaded, CamSettings(save_raw=True)).job
    print(f"# hookviz data bench: {args.photos} photos of {SIDE} px, Grad-CAM + PNG + raw map each, "
          f"{args.rounds} rounds, medians")  # fmt: skip
    photos(folder / "short", args.photos, 8)
    local = expand_inputs([str(folder / "short" / "photos")])
    shards = expand_inputs([str(folder / "short" / "s{000..007}.tar")])
    assert len(local) == len(shards) == args.photos
    t = medians({"folder": lambda: run(loaded, job, local, folder / "o1"),
                 "shards": lambda: run(loaded, job, shards, folder / "o2")}, args.rounds)  # fmt: skip
    rate = {k: args.photos / v for k, v in t.items()}
    print("| input | images/s | ratio |\n|---|---|---|")
    for k in ("folder", "shards"):
        print(f"| {k} | {rate[k]:.1f} | {rate[k] / rate['folder']:.2f}x |")
    if args.long:
        photos(folder / "long", args.long, 20)
        items = expand_inputs([str(folder / "long" / "s{000..019}.tar")])
        start = time.perf_counter()
        done, rss = run(loaded, job, items, folder / "o3", sinks=True)
        took = time.perf_counter() - start
        print(f"\nlong run: {done} photos from 20 shards with --records parquet --maps zarr in {took:.0f} s "
              f"({done / took:.1f}/s); RSS after 1,000: {rss[0]:.0f} MiB, after {len(rss) * 1000:,}: "
              f"{rss[-1]:.0f} MiB ({rss[-1] / rss[0]:.3f}x; goal <= 1.10x)")  # fmt: skip
    if args.ray:  # over the long run's photos, if any: an actor's start (imports, the model) is paid once
        where = folder / ("long" if args.long else "short")
        ray_table(where, loaded, job, spec, args.long or args.photos)
    shutil.rmtree(folder, ignore_errors=True)


def ray_table(folder: Path, loaded: object, job: object, spec: str, n: int) -> None:
    """Ray Data with two local one-CPU workers against one process, over the same folder."""
    import warnings

    import ray

    from hookviz.ray import Explainer

    paths = [str(p) for p in sorted((folder / "photos").iterdir())]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            kwargs = {
                "model": spec,
                "out": str(folder / "ray"),
                "weights": "none",
                "input_size": SIDE,
                "settings": CamSettings(save_raw=True),
            }
            ray.data.from_items([{"path": p} for p in paths[:32]]).map_batches(  # warm: actors, imports
                Explainer, fn_constructor_kwargs=kwargs, concurrency=2, batch_size=16, num_cpus=1
            ).take_all()
            shutil.rmtree(folder / "ray", ignore_errors=True)
            start = time.perf_counter()
            rows = (
                ray.data.from_items([{"path": p} for p in paths])
                .map_batches(
                    Explainer, fn_constructor_kwargs=kwargs, concurrency=2, batch_size=16, num_cpus=1
                )
                .take_all()
            )
            ray_s = time.perf_counter() - start
        finally:
            ray.shutdown()
    torch.set_num_threads(2)
    start = time.perf_counter()
    run(loaded, job, expand_inputs([str(folder / "photos")]), folder / "one")
    one_s = time.perf_counter() - start
    print(f"\n| {n} photos | seconds | images/s | ratio |\n|---|---|---|---|")
    print(f"| one process (2 threads) | {one_s:.1f} | {n / one_s:.1f} | 1.00x |")
    print(f"| Ray Data, 2 actors x 1 CPU ({len(rows)} rows) | {ray_s:.1f} | {n / ray_s:.1f} | "
          f"{one_s / ray_s:.2f}x |")  # fmt: skip
    os.environ.pop("RAY_ADDRESS", None)


if __name__ == "__main__":
    main()
