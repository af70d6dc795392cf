"""Train ``examples/shapes_vit.py`` on the synthetic shapes and save the test fixture.

    python scripts/train_shapes_vit.py [--steps 2000] [--out tests/fixtures/shapes_vit.safetensors]

CPU only, seeded; a few minutes on two cores. Prints the held-out accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.shapes_vit import SIZE, make_vit  # noqa: E402
from hookviz.io.shapes import shapes_batch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "shapes_vit.safetensors")
    args = parser.parse_args()
    from safetensors.torch import save_file

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make_vit()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=args.steps, pct_start=0.1)
    start = time.perf_counter()
    model.train()
    for step in range(args.steps):
        x, y, _ = shapes_batch(64, rng, SIZE)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0:
            print(
                f"step {step}: loss {float(loss.detach()):.3f} ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    model.eval()
    x, y, _ = shapes_batch(500, np.random.default_rng(1234), SIZE)
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    print(f"held-out accuracy {accuracy:.3f} on 500 images")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(args.out))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
