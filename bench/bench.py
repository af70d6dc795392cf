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
    from hookviz.attribution import explain, grad_cam
    from hookviz.cams import GRADIENT_METHODS
    from hookviz.hooks import capture

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


def process_bench(rounds: int, tmp: Path, n: int) -> list[tuple[str, float, float]]:
    imgs = tmp / f"imgs{n}"
    make_images(imgs, n)
    script = tmp / "pgc_script.py"
    script.write_text(PGC_SCRIPT)
    ours_t, theirs_t = [], []
    for r in range(rounds):
        out_a, out_b = tmp / f"a{n}_{r}", tmp / f"b{n}_{r}"
        cmd = [
            HOOKVIZ,
            "gradcam",
            str(imgs),
            "--weights",
            "none",
            "--out",
            str(out_a),
            "-q",
            "--device",
            "cpu",
        ]
        ours_t.append(run_timed(cmd)[0])
        theirs_t.append(run_timed([sys.executable, str(script), str(imgs), str(out_b), "8"])[0])
        assert len(list(out_a.glob("*.png"))) == n and len(list(out_b.glob("*.png"))) == n
    a, b = statistics.median(ours_t), statistics.median(theirs_t)
    return [
        (f"hookviz gradcam, {n} images, whole process", a, 1.0),
        (f"pytorch-grad-cam script, {n} images, batch 8, show_cam_on_image + imwrite", b, b / a),
    ]


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
    rows = compute_bench(args.rounds, args.batch)
    with tempfile.TemporaryDirectory() as d:
        rows += startup_bench(args.process_rounds)
        rows += process_bench(args.process_rounds, Path(d), 64)
        rows += process_bench(1, Path(d), 256)
        rows += memory_bench(Path(d))
    print(f"| {'measurement':<80} | {'median':>10} | {'ratio':>7} |")
    print(f"|{'-' * 82}|{'-' * 12}|{'-' * 9}|")
    for name, value, ratio in rows:
        unit = "" if "RSS" in name or name.startswith("->") else " s"
        val = f"{value:.0f}" if "RSS" in name else f"{value:.3f}{unit}" if unit else f"{value:.2f}x"
        rat = "" if ratio != ratio else f"{ratio:.2f}x"
        print(f"| {name:<80} | {val:>10} | {rat:>7} |")


if __name__ == "__main__":
    main()
