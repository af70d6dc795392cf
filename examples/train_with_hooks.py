"""Train a small CNN with DropBlock and gradient clipping attached by hooks, no change to the model's code.

    python examples/train_with_hooks.py            # 300 steps, well under a minute on a CPU
    python examples/train_with_hooks.py --steps 30

The task: tell squares, discs and crosses apart on noisy 48x48 images. Every ``--log-every`` steps it
prints the loss, the global gradient norm before clipping, and the layers with the smallest and
largest output-gradient norms (from tensor hooks), then the held-out accuracy at the end.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hookviz.io.shapes import shapes_batch
from hookviz.training.gradients import GlobalNormClipper, gradient_flow
from hookviz.training.regularize import attach_dropblock


def make_batch(n: int, rng: np.random.Generator, size: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` labelled images of squares (0), discs (1) and crosses (2): hookviz's synthetic shapes."""
    x, y, _ = shapes_batch(n, rng, size)
    return x, y


def make_model() -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, 16),
        nn.MaxPool2d(2),
        *block(16, 32),
        nn.MaxPool2d(2),
        *block(32, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--drop-prob", type=float, default=0.1)
    parser.add_argument("--max-norm", type=float, default=1.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    # DropBlock on the outputs of the 2nd and 3rd conv blocks (modules "6" and "10" are their ReLUs),
    # ramped up over the first half of training; global-norm clipping after every backward.
    dropblock = attach_dropblock(
        model, ["6", "10"], args.drop_prob, block_size=3, schedule_steps=args.steps // 2
    )
    clipper = GlobalNormClipper(model, args.max_norm)
    start = time.perf_counter()
    try:
        model.train()
        for step in range(1, args.steps + 1):
            x, y = make_batch(32, rng)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()  # the clipper scales all .grad when backward ends
            opt.step()
            if step % args.log_every == 0 or step == args.steps:
                flow = gradient_flow(model, x, lambda z, y=y: F.cross_entropy(z, y), ["0", "4", "8", "13"])
                low = min(flow.outputs, key=lambda s: s.norm)
                high = max(flow.outputs, key=lambda s: s.norm)
                print(
                    f"step {step:4d}  loss {loss.item():.4f}  grad norm {clipper.last_norm:.3f} "
                    f"(clipped to {args.max_norm})  drop_prob {dropblock.current_drop_prob():.3f}  "
                    f"output-grad norms: min {low.name} {low.norm:.2e}, max {high.name} {high.norm:.2e}"
                )
    finally:
        dropblock.remove()
        clipper.remove()
    model.eval()
    x, y = make_batch(500, np.random.default_rng(1))
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    print(f"held-out accuracy {accuracy:.1%} after {args.steps} steps ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
