"""Memory bounded (issue #32): peak RSS of a heavy request, and FullGrad's cost against Grad-CAM's; the
``--max-memory`` estimate against the batch's peak (issue #59).

1. The request that was killed at 14.6 GB: 4 mosaics of 448 px through an EfficientNet (the Lite family's
   layout, weights=None), 16 methods, top-5, the default batch; whole ``hookviz gradcam`` processes, peak RSS
   of each (``RUSAGE_CHILDREN``), with the default ``--max-memory`` and with ``--max-memory 1G``.
2. FullGrad and Grad-CAM on one 448 px photo, in process, medians of interleaved rounds.
3. The estimate against the peak: resnet18, mobilenet_v3_small, efficientnet_b0 (weights=None) at 112, 224
   and 448 px, gradcam, saliency, rise (64 masks) and all, 1 and 8 photos (4 at 448 px), each a ``hookviz
   gradcam`` run of one batch in a process of its own (the CLI's own code): the estimate the planner sized
   it with (old: its tensors alone), the growth of the process's resident memory from just before the batch
   (model loaded, photos decoded; ``VmHWM`` reset there) to the end of the run (its pass, pictures and
   files), and then the batch's tensor peak (computed again under the profiler: its memory events).

Run with ``make bench`` (or ``python bench/memory_bench.py``, ``--only estimate`` for 3); paste the tables
into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def _status(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def tensor_peak(fn: Any) -> int:
    """The peak of torch's allocated bytes while ``fn()`` runs, over those allocated before it (the profiler's
    memory events, in the order they happened)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    now = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        now += e.nbytes()
        peak = max(peak, now)
    return peak


def case(model: str, size: str, methods: str, images: int, extra: list[str]) -> None:
    """One ``hookviz gradcam`` run of ``images`` photos as one batch, in this process: the estimate the
    planner sizes the batch with (its tensors alone, and with what a pass costs beside them), the growth of
    the process's resident memory from just before the batch (model loaded, photos decoded) to the run's end
    (``VmHWM`` reset there: the pass, its maps, their pictures and files), and then the batch's tensor peak
    (the same batch computed again under the profiler). Printed as JSON."""
    from hookviz.cli import app
    from hookviz.run import pipeline

    seen: list[Any] = []
    run_model = pipeline._Run._run_model

    def measured(self: Any, ready: Any, xs: Any) -> Any:
        if not seen:
            gc.collect()
            with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
                f.write("5")  # VmHWM from here
            seen.append((self, ready, xs, _status("VmRSS")))
        return run_model(self, ready, xs)

    pipeline._Run._run_model = measured  # type: ignore[method-assign]
    photos = sorted((ROOT / "sample_images").glob("*.jpg"))
    with tempfile.TemporaryDirectory() as d:
        for i in range(images):
            shutil.copy(photos[i % len(photos)], Path(d) / f"p{i}.jpg")
        app(["gradcam", d, "--model", model, "--weights", "none", "--input-size", size, "--device", "cpu",
             "--method", methods, "--out", str(Path(d) / "out"), "-q", "-b", str(images), *extra],
            standalone_mode=False)  # fmt: skip
        grown = _status("VmHWM") - seen[0][3]
        run, ready, xs, _ = seen[0]
        est = run.job.memory((len(xs), *xs[0].shape)).drawn_on(
            max(r[2].shape[0] * r[2].shape[1] for r in ready)
        )
        peak = tensor_peak(lambda: run_model(run, ready, xs))
    print(json.dumps({"images": len(xs), "estimate": est.total(len(xs)), "old": est.tensors(len(xs)),
                      "tensors": peak, "rss": grown}))  # fmt: skip


#: The estimate against the process's growth: each model, method set and input size, 1 to 8 photos.
GRID = [(model, size, methods, images) for size, counts in (("112", (1, 8)), ("224", (1, 8)), ("448", (1, 4)))
        for images in counts for model in ("resnet18", "mobilenet_v3_small", "efficientnet_b0")
        for methods in ("gradcam", "saliency", "rise", "all")]  # fmt: skip


def estimate_rows(cases: list[tuple[str, str, str, int]]) -> list[tuple[float, float]]:
    """Each case in a process of its own, a table row printed as it comes: (new / tensor peak, new / RSS)."""
    ratios = []
    for model, size, methods, images in cases:
        extra = ["--masks", "64"] if methods == "rise" else []
        cmd = [sys.executable, __file__, "--case", model, size, methods, str(images), *extra]
        r = json.loads(
            subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
        )
        mb = {k: r[k] / 2**20 for k in ("old", "estimate", "tensors", "rss")}
        ratios.append((r["estimate"] / r["tensors"], r["estimate"] / r["rss"]))
        cells = [f"{mb[k]:,.0f} MB" for k in ("old", "estimate", "tensors", "rss")]
        cells += [f"{r['old'] / r['rss']:.2f}x", f"{ratios[-1][1]:.2f}x", f"{ratios[-1][0]:.2f}x"]
        print(f"| {model} {size} px {methods} ({images}) | {' | '.join(cells)} |", flush=True)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", choices=("request", "estimate"), help="one part of the bench")
    parser.add_argument("--case", nargs="+", help=argparse.SUPPRESS)  # one estimate case, in its own process
    args, extra = parser.parse_known_args()
    if args.case:
        model, size, methods, images = args.case[:4]
        return case(model, size, methods, int(images), [*args.case[4:], *extra])
    print(f"# hookviz memory bench  {time.strftime('%Y-%m-%d')}\n")
    if args.only != "request":
        print("The estimate behind --max-memory (old: the tensors alone; new: with what the process grows by")
        print("beside them) against the process's resident growth over the batch, and its tensor peak\n")
        print(
            "| case (photos) | old | new | tensor peak | RSS growth | old / RSS | new / RSS | new / tensors |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        ratios = estimate_rows(GRID)
        print(
            f"\nnew / RSS growth: {min(r[1] for r in ratios):.2f}x to {max(r[1] for r in ratios):.2f}x; "
            f"new / tensor peak: {min(r[0] for r in ratios):.2f}x to {max(r[0] for r in ratios):.2f}x\n"
        )
        if args.only == "estimate":
            return None
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
