"""hookviz benchmarks: medians and ratios against plain inference and the peers, from ONE run.

Run with ``make bench`` (installs the ``bench`` extra: pytorch-grad-cam and torchcam, never runtime
dependencies). Everything is measured side by side in this process, interleaved round by round, so the
ratios hold even on a noisy machine. Paste the printed table into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torchvision

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_images"
HOOKVIZ = shutil.which("hookviz", path=str(Path(sys.executable).parent)) or "hookviz"


def medians(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds per function; one call of each per round, in a shuffled order (after one warm-up)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    order = list(fns)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)  # no function always runs right after the same other one
        for name in order:
            fn = fns[name]
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def compute_bench(rounds: int, batch: int) -> list[tuple[str, float, float]]:
    from hookviz.core.hooks import capture
    from hookviz.engine.explain import explain, grad_cam

    GRADIENT_METHODS = ("gradcam", "gradcampp", "xgradcam", "layercam", "hirescam")

    warnings.filterwarnings("ignore")
    from pytorch_grad_cam import GradCAM as PgcGradCAM
    from torchcam.methods import GradCAM as TcGradCAM

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(batch, 3, 224, 224)

    def plain() -> None:
        with torch.inference_mode():
            model(x)

    def ours(layer: str) -> Callable[[], None]:
        return lambda: grad_cam(model, x, layer)

    def pgc() -> None:
        with PgcGradCAM(model=model, target_layers=[model.layer4]) as cam:
            cam(input_tensor=x, targets=None)

    def torchcam() -> None:
        with TcGradCAM(model, target_layer="layer4") as extractor:
            out = model(x)
            extractor(out.argmax(1).tolist(), out)
        model.zero_grad(set_to_none=True)

    def family() -> None:
        explain(model, x, ["layer3", "layer4"], list(GRADIENT_METHODS), "top5")

    def family4() -> None:
        explain(model, x, ["layer4.0", "layer4"], list(GRADIENT_METHODS), "top5")

    with capture(model, grad_layers=["layer3"]) as cap, torch.no_grad():
        logits = model(x)
    tap = cap.captured.taps["layer3"][0]
    rows_idx = torch.arange(batch)

    def vjp() -> None:
        for j in range(5):
            torch.autograd.grad(logits[rows_idx, j].sum(), tap, retain_graph=True)

    t = medians(
        {
            "plain": plain,
            "l4": ours("layer4"),
            "l2": ours("layer2"),
            "pgc": pgc,
            "torchcam": torchcam,
            "family": family,
            "family4": family4,
            "vjp": vjp,
        },
        rounds,
    )
    return [
        ("plain inference (torch.inference_mode)", t["plain"], 1.0),
        ("hookviz Grad-CAM, layer4", t["l4"], t["l4"] / t["plain"]),
        ("hookviz Grad-CAM, layer2", t["l2"], t["l2"] / t["plain"]),
        ("pytorch-grad-cam GradCAM, layer4", t["pgc"], t["pgc"] / t["plain"]),
        ("torchcam GradCAM, layer4", t["torchcam"], t["torchcam"] / t["plain"]),
        (
            "hookviz 5 gradient methods x top-5 x layer3+layer4, one pass",
            t["family"],
            t["family"] / t["plain"],
        ),
        ("  of which: 5 input-gradient passes through layer4 (the floor)", t["vjp"], t["vjp"] / t["plain"]),
        (
            "-> many answers / its floor (inference + the 5 passes; goal <= 1.10)",
            t["family"] / (t["plain"] + t["vjp"]),
            float("nan"),
        ),
        (
            "hookviz 5 gradient methods x top-5 x layer4.0+layer4, one pass",
            t["family4"],
            t["family4"] / t["plain"],
        ),
        ("-> pytorch-grad-cam / hookviz layer4 (goal >= 3)", t["pgc"] / t["l4"], float("nan")),
        ("-> torchcam / hookviz layer4 (goal > 1)", t["torchcam"] / t["l4"], float("nan")),
    ]


PGC_SCRIPT = r"""
import sys, glob, os, cv2, numpy as np, torch, torchvision, warnings
warnings.filterwarnings("ignore")
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.image import show_cam_on_image, preprocess_image
src, out, bs = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(out, exist_ok=True)
model = torchvision.models.resnet18(weights=None).eval()
paths = sorted(glob.glob(os.path.join(src, "*.jpg")))
with GradCAM(model=model, target_layers=[model.layer4]) as cam:
    for i in range(0, len(paths), bs):
        chunk = paths[i:i + bs]
        rgbs = [cv2.imread(p)[:, :, ::-1] for p in chunk]
        floats = [np.float32(cv2.resize(r, (224, 224))) / 255 for r in rgbs]
        norm = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        x = torch.cat([preprocess_image(f, **norm) for f in floats])
        maps = cam(input_tensor=x, targets=None)
        for p, rgb, m in zip(chunk, rgbs, maps):
            up = cv2.resize(m, (rgb.shape[1], rgb.shape[0]))
            vis = show_cam_on_image(np.float32(rgb) / 255, up, use_rgb=True)
            cv2.imwrite(os.path.join(out, os.path.basename(p) + ".png"), vis[:, :, ::-1])
"""


FLOOR_SCRIPT = r"""
# The job's floor: what any tool must do for each photo (decode, resize + crop, infer in batches of 8,
# write a PNG of the photo's size), with nothing else: no hooks, no gradient, no map, no caption.
import sys, glob, os, cv2, numpy as np, torch, torchvision
from PIL import Image
src, out, bs = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(out, exist_ok=True)
model = torchvision.models.resnet18(weights=None).eval()
mean = np.array([0.485, 0.456, 0.406], np.float32)
std = np.array([0.229, 0.224, 0.225], np.float32)
paths = sorted(glob.glob(os.path.join(src, "*.jpg")))
for i in range(0, len(paths), bs):
    chunk = paths[i:i + bs]
    rgbs = [cv2.imread(p)[:, :, ::-1] for p in chunk]
    xs = []
    for rgb in rgbs:
        # torchvision's evaluation transform on a PIL image: the shorter side to 256 (antialiased), centre 224
        h, w = rgb.shape[:2]
        nh, nw = (256, int(256 * w / h)) if h <= w else (int(256 * h / w), 256)
        small = np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.BILINEAR))
        y0, x0 = int(round((nh - 224) / 2.0)), int(round((nw - 224) / 2.0))
        crop = small[y0:y0 + 224, x0:x0 + 224]
        xs.append(((crop.astype(np.float32) / 255 - mean) / std).transpose(2, 0, 1))
    with torch.inference_mode():
        model(torch.from_numpy(np.stack(xs)))
    for p, rgb in zip(chunk, rgbs):
        cv2.imwrite(os.path.join(out, os.path.basename(p) + ".png"), np.ascontiguousarray(rgb[:, :, ::-1]))
"""


def throughput_bench(rounds: int, tmp: Path, n: int, peers: bool) -> list[tuple[str, float, float]]:
    """Whole processes on ``n`` photos, interleaved: the floor script, ``hookviz gradcam`` (with per-stage
    timings from a separate run), ``hookviz featuremaps``, and (``peers``) the pytorch-grad-cam script."""
    import json

    imgs = tmp / f"imgs{n}"
    make_images(imgs, n)
    floor_py, pgc_py = tmp / "floor.py", tmp / "pgc_script.py"
    floor_py.write_text(FLOOR_SCRIPT)
    pgc_py.write_text(PGC_SCRIPT)
    common = ["--weights", "none", "-q", "--device", "cpu"]
    runs: dict[str, Callable[[Path], list[str]]] = {
        "floor": lambda o: [sys.executable, str(floor_py), str(imgs), str(o), "8"],
        "gradcam": lambda o: [HOOKVIZ, "gradcam", str(imgs), "--out", str(o), *common],
        "featuremaps": lambda o: [HOOKVIZ, "featuremaps", str(imgs), "--out", str(o), *common],
    }
    if peers:
        runs["pgc"] = lambda o: [sys.executable, str(pgc_py), str(imgs), str(o), "8"]
    times: dict[str, list[float]] = {k: [] for k in runs}
    rss: dict[str, int] = {}
    order = list(runs)
    rng = random.Random(n)
    for r in range(rounds):
        rng.shuffle(order)
        for name in order:
            out = tmp / f"{name}{n}_{r}"
            dt, peak = run_timed(runs[name](out))
            times[name].append(dt)
            rss[name] = max(rss.get(name, 0), peak)
            shutil.rmtree(out)
    t = {k: statistics.median(v) for k, v in times.items()}
    stages_file = tmp / "stages.json"
    os.environ["HOOKVIZ_TIMINGS"] = str(stages_file)
    try:
        run_timed(runs["gradcam"](tmp / f"stages{n}"))
    finally:
        del os.environ["HOOKVIZ_TIMINGS"]
    stages = json.loads(stages_file.read_text())
    rows = [
        (f"floor script, {n} photos (decode, crop, inference batch 8, write PNG)", t["floor"], 1.0),
        (f"hookviz gradcam, {n} photos (goal <= 1.25x floor)", t["gradcam"], t["gradcam"] / t["floor"]),
        (f"hookviz featuremaps, {n} photos", t["featuremaps"], t["featuremaps"] / t["floor"]),
    ]
    if peers:
        rows.append((f"pytorch-grad-cam script, {n} photos", t["pgc"], t["pgc"] / t["floor"]))
        rows.append(
            (
                f"-> pytorch-grad-cam / hookviz gradcam, {n} photos (goal >= 2)",
                t["pgc"] / t["gradcam"],
                float("nan"),
            )
        )
    for name in ("decode", "preprocess", "compute", "render", "encode", "write"):
        per = stages.get(name, 0.0) / max(stages["images"], 1) * 1000
        rows.append(
            (f"  hookviz gradcam stage: {name}, ms per photo (summed over threads)", per, float("nan"))
        )
    rows += [(f"peak RSS, {k}, {n} photos (MiB)", rss[k], rss[k] / rss["floor"]) for k in runs]
    return rows


def png_bench(rounds: int) -> list[tuple[str, float, float]]:
    """PNG encoding of a typical overlay (a photo with a heatmap, captioned) at several zlib levels."""
    import cv2
    import numpy as np

    from hookviz import render
    from hookviz.io.images import Box, load_rgb

    rgb = load_rgb(sorted(SAMPLES.glob("*.jpg"))[1])
    cam = np.random.default_rng(0).random((7, 7)).astype(np.float32)
    picture = render.caption(
        render.overlay(rgb, cam, Box(0, 0, rgb.shape[1], rgb.shape[0])), ["a caption"] * 3
    )
    bgr = np.ascontiguousarray(picture[:, :, ::-1])
    variants: dict[str, list[int]] = {
        f"zlib level {level}": [cv2.IMWRITE_PNG_COMPRESSION, level] for level in (0, 1, 3, 6, 9)
    }
    for level in (1, 3):
        variants[f"zlib level {level}, Sub filter"] = [
            cv2.IMWRITE_PNG_COMPRESSION, level, cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FILTER_SUB,
        ]  # fmt: skip
        variants[f"zlib level {level}, fast filters"] = [
            cv2.IMWRITE_PNG_COMPRESSION, level, cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FAST_FILTERS,
        ]  # fmt: skip
    variants["zlib RLE strategy, Sub filter"] = [
        cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_RLE,
        cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FILTER_SUB,
    ]  # fmt: skip
    times = medians({k: (lambda p=p: cv2.imencode(".png", bgr, p)) for k, p in variants.items()}, rounds)
    box = Box(0, 0, rgb.shape[1], rgb.shape[0])
    lines = [
        "resnet18 | Grad-CAM at layer4 | RANDOM WEIGHTS (--weights none)",
        "predicted: x",
        "explained: x",
    ]
    drawing = medians(
        {
            "overlay": lambda: render.overlay(rgb, cam, box),
            "caption": lambda: render.caption(render.enlarge_small(picture), lines),
        },
        rounds,
    )
    rows = [
        (
            "overlay of a 451x300 photo (colour map, blend): ms per call",
            drawing["overlay"] * 1000,
            float("nan"),
        ),
        (
            "caption of 3 lines (text measured, wrapped, drawn): ms per call",
            drawing["caption"] * 1000,
            float("nan"),
        ),
    ]
    for name, params in variants.items():
        size = len(cv2.imencode(".png", bgr, params)[1])
        rows.append((f"PNG {name}: ms per overlay, {size / 1024:.0f} KiB", times[name] * 1000, float("nan")))
    return rows


def make_images(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    samples = sorted(SAMPLES.glob("*.jpg"))
    for i in range(n):
        shutil.copy(samples[i % len(samples)], folder / f"img{i:04d}.jpg")


def run_timed(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (MiB) of one child process."""
    wrapper = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter(); r = subprocess.run(sys.argv[1:], capture_output=True)\n"
        "dt = time.perf_counter() - t\n"
        "sys.stderr.write(r.stderr.decode()[-2000:] if r.returncode else '')\n"
        "print(dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)\n"
    )
    res = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, check=True)
    dt, rss, rc = res.stdout.split()
    if rc != "0":
        raise RuntimeError(f"{cmd[0]} failed: {res.stderr}")
    return float(dt), int(rss) // 1024


def startup_bench(rounds: int) -> list[tuple[str, float, float]]:
    times = [run_timed([sys.executable, "-c", "import torch, torchvision"])[0] for _ in range(rounds)]
    return [
        (
            "python -c 'import torch, torchvision' (paid by both processes)",
            statistics.median(times),
            float("nan"),
        )
    ]


def memory_bench(tmp: Path) -> list[tuple[str, float, float]]:
    make_images(tmp / "imgs256", 256)
    small = tmp / "imgs16"
    make_images(small, 16)
    _, rss16 = run_timed(
        [
            HOOKVIZ,
            "gradcam",
            str(small),
            "--weights",
            "none",
            "--out",
            str(tmp / "m16"),
            "-q",
            "--device",
            "cpu",
        ]
    )
    _, rss256 = run_timed(
        [
            HOOKVIZ,
            "gradcam",
            str(tmp / "imgs256"),
            "--weights",
            "none",
            "--out",
            str(tmp / "m256"),
            "-q",
            "--device",
            "cpu",
        ]
    )
    return [
        ("peak RSS, hookviz gradcam over 16 images (MiB)", rss16, 1.0),
        ("peak RSS, hookviz gradcam over 256 images (MiB)", rss256, rss256 / rss16),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=9, help="rounds for the in-process medians")
    parser.add_argument("--process-rounds", type=int, default=3, help="rounds for the whole-process runs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--only",
        choices=["all", "compute", "throughput", "render"],
        default="all",
        help="compute: the in-process passes only; throughput: #16's rows only; render: drawing and PNG "
        "encoding only (seconds)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# hookviz bench  {time.strftime('%Y-%m-%d')}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"torchvision {torchvision.__version__}, CPU only"
    )
    print(
        f"resnet18, weights=None, batch {args.batch}, 224x224, median of {args.rounds} interleaved rounds\n"
    )
    if args.only == "compute":
        _print(compute_bench(args.rounds, args.batch))
        return
    if args.only == "render":
        _print(png_bench(args.rounds))
        return
    if args.only == "throughput":
        rows = png_bench(args.rounds)
        with tempfile.TemporaryDirectory() as d:
            rows += throughput_bench(args.process_rounds, Path(d), 32, peers=True)
            rows += throughput_bench(1, Path(d), 256, peers=True)
        _print(rows)
        return
    rows = compute_bench(args.rounds, args.batch)
    rows += png_bench(args.rounds)
    with tempfile.TemporaryDirectory() as d:
        rows += throughput_bench(args.process_rounds, Path(d), 32, peers=True)
        rows += throughput_bench(1, Path(d), 256, peers=True)
        rows += startup_bench(args.process_rounds)
        rows += memory_bench(Path(d))
    _print(rows)


def _print(rows: list[tuple[str, float, float]]) -> None:
    print(f"| {'measurement':<80} | {'median':>10} | {'ratio':>7} |")
    print(f"|{'-' * 82}|{'-' * 12}|{'-' * 9}|")
    for name, value, ratio in rows:
        unit = "" if "RSS" in name or name.startswith("->") else " ms" if " ms " in name else " s"
        if "RSS" in name:
            val = f"{value:.0f}"
        elif unit == " ms":
            val = f"{value:.1f}"
        else:
            val = f"{value:.3f}{unit}" if unit else f"{value:.2f}x"
        rat = "" if ratio != ratio else f"{ratio:.2f}x"
        print(f"| {name:<80} | {val:>10} | {rat:>7} |")


if __name__ == "__main__":
    main()
