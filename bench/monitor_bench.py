"""The training monitor's cost (issue #37): a training step of resnet18 with ``hookviz.Monitor`` attached,
on a step when it does not log (only its non-finite watch runs) and on a step when it logs, against the same
step without it: blocks of four steps take turns on one model (plain, with the monitor, plain again), medians.
The second plain row is the control: the ratio of two identical plain rows is this machine's noise.
Run with ``make bench`` or ``python bench/monitor_bench.py [--blocks 24]``."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F
import torchvision

from hookviz.training.monitor import Monitor


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.randint(0, 10, (args.batch,))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    base: list[float] = []
    again: list[float] = []  # the same plain step in its own blocks: the noise between two identical rows
    quiet: list[float] = []
    with tempfile.TemporaryDirectory() as logs:
        for _ in range(2):  # warm up
            _step(model, opt, x, y)
        # Blocks of 4 steps: plain, with the monitor attached, plain again, in a rotating order.
        rows = (base, quiet, again)
        for b in range(args.blocks):
            for k in range(3):
                row = rows[(b + k) % 3]
                watched = row is quiet
                monitor = Monitor(model, x[:4], labels=y[:4], every=10**9, log_dir=logs) if watched else None
                for i in range(4):
                    t0 = time.perf_counter()
                    _step(model, opt, x, y)
                    if monitor is not None:
                        monitor.step(i + 1)  # never a logging step
                    row.append(time.perf_counter() - t0)
                if monitor is not None:
                    monitor.close()
        monitor = Monitor(model, x[:4], labels=y[:4], every=1, log_dir=logs)
        logging = []
        for i in range(5):
            t0 = time.perf_counter()
            _step(model, opt, x, y)
            monitor.step(i)
            logging.append(time.perf_counter() - t0)
        monitor.close()
    b, a, q, lg = (statistics.median(v) for v in (base, again, quiet, logging))
    print(
        f"resnet18, batch {args.batch} at {args.size} px, CPU, {torch.get_num_threads()} threads, medians of "
        f"{len(base)} steps each"
    )
    print(f"| plain training step | {b * 1000:.1f} ms | 1.00x |")
    print(f"| the same plain step again (control: the noise) | {a * 1000:.1f} ms | {a / b:.3f}x |")
    print(f"| with the monitor, a step it does not log | {q * 1000:.1f} ms | {q / b:.3f}x |")
    print(
        f"| with the monitor, a step it logs (Grad-CAM of 4 probes, statistics, gradient norms) | "
        f"{lg * 1000:.1f} ms | {lg / b:.2f}x |"
    )


if __name__ == "__main__":
    main()
