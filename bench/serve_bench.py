"""A shell loop with ``hookviz serve`` (issue #38): a call's time against the interpreter's own start and
the CLI's parse (``hookviz --help``), against the same call without a server, and the server's memory
over many calls.

Every call is a whole ``hookviz`` process, as a shell loop runs it: ``hookviz gradcam PHOTO --weights none``
(resnet18, one photo of sample_images/, writing its PNG and manifest). Medians; the rows are measured in
this one run. Run with ``make bench`` or ``python bench/serve_bench.py [--calls 1000]``."""

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

ROOT = Path(__file__).resolve().parent.parent
HOOKVIZ = shutil.which("hookviz", path=str(Path(sys.executable).parent)) or "hookviz"
PHOTOS = sorted((ROOT / "sample_images").glob("*.jpg"))


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 0, r.stderr
    return time.perf_counter() - t0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1000, help="calls for the server's memory row")
    parser.add_argument("--loop", type=int, default=50, help="calls timed in the loop")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    sock = tmp / "private" / "server.sock"
    env = {**os.environ, "HOOKVIZ_SERVER": str(sock)}
    here = {**os.environ, "HOOKVIZ_SERVER": "none"}
    server = subprocess.Popen([HOOKVIZ, "serve", "--socket", str(sock), "--idle-timeout", "0"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        from hookviz.serve.client import ask

        while ask(sock, {"op": "status"}) is None:
            time.sleep(0.2)

        def call(i: int, e: dict[str, str]) -> list[str]:
            return [HOOKVIZ, "gradcam", str(PHOTOS[i % len(PHOTOS)]), "--weights", "none", "--out",
                    str(tmp / "out"), "-q", "--overwrite"]  # fmt: skip

        _timed(call(0, env), env)  # the first call loads the model; the server keeps it warm
        loop = [_timed(call(i, env), env) for i in range(args.loop)]
        helps = [_timed([HOOKVIZ, "--help"], here) for _ in range(10)]
        bare = [_timed([sys.executable, "-c", "pass"], here) for _ in range(10)]
        alone = [_timed(call(i, here), here) for i in range(3)]
        rss0 = _rss_mib(server.pid)
        t0 = time.perf_counter()
        for _ in range(args.calls):
            _timed([HOOKVIZ, "layers", "--model", "resnet18", "--weights", "none"], env)
        per_layers = (time.perf_counter() - t0) / max(1, args.calls)
        rss1 = _rss_mib(server.pid)
    finally:
        ask(sock, {"op": "stop"})
        server.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    m = statistics.median
    rows = [
        ("python -c pass", m(bare), float("nan")),
        ("hookviz --help (the interpreter's start and the CLI's parse)", m(helps), 1.0),
        (f"hookviz gradcam PHOTO through the server, median of {args.loop} calls (goal <= 0.5 s)", m(loop),
         m(loop) / m(helps)),
        ("  the same, mean", statistics.fmean(loop), statistics.fmean(loop) / m(helps)),
        ("hookviz gradcam PHOTO without a server (median of 3)", m(alone), m(alone) / m(helps)),
        ("-> without / with the server", m(alone) / m(loop), float("nan")),
        (f"hookviz layers through the server, mean of {args.calls} calls", per_layers, per_layers / m(helps)),
        (f"server RSS before the {args.calls} calls (MiB)", rss0, float("nan")),
        ("server RSS after them (MiB)", rss1, rss1 / rss0),
    ]  # fmt: skip
    print(f"# hookviz serve bench  {time.strftime('%Y-%m-%d')}\n")
    print(f"| {'measurement':<86} | {'value':>9} | {'ratio':>6} |")
    print(f"|{'-' * 88}|{'-' * 11}|{'-' * 8}|")
    for name, value, ratio in rows:
        shown = (
            f"{value:.0f}"
            if "MiB" in name
            else f"{value:.2f}x"
            if name.startswith("->")
            else f"{value:.3f} s"
        )
        print(f"| {name:<86} | {shown:>9} | {'' if ratio != ratio else f'{ratio:.2f}x':>6} |")


if __name__ == "__main__":
    main()
