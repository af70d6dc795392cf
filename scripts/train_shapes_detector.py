"""Train ``examples/shapes_detector.py`` on synthetic shape scenes and save the test fixture (fp16).

    python scripts/train_shapes_detector.py [--steps 600] [--out tests/fixtures/shapes_detector.safetensors]

CPU only, seeded; a few minutes on two cores. Prints the held-out precision and recall at IoU 0.5.
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

from examples.shapes_detector import make_detector  # noqa: E402
from hookviz.io.shapes import shapes_scene  # noqa: E402


def scenes(n: int, rng: np.random.Generator) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    images, targets = [], []
    for _ in range(n):
        img, boxes, labels, _ = shapes_scene(rng)
        images.append(torch.from_numpy(img.transpose(2, 0, 1).copy()))
        targets.append({"boxes": torch.from_numpy(boxes), "labels": torch.from_numpy(labels) + 1})
    return images, targets


def evaluate(model: torch.nn.Module, n: int = 100, seed: int = 1234) -> tuple[float, float]:
    """Precision and recall at IoU 0.5 with the right class, score >= 0.5, on ``n`` held-out scenes."""
    from torchvision.ops import box_iou

    images, targets = scenes(n, np.random.default_rng(seed))
    hits = found = wanted = 0
    model.eval()
    with torch.no_grad():
        for out, t in zip(model(images), targets, strict=True):
            keep = out["scores"] >= 0.5
            boxes, labels = out["boxes"][keep], out["labels"][keep]
            found += len(boxes)
            wanted += len(t["boxes"])
            if len(boxes):
                iou = box_iou(t["boxes"], boxes)
                same = t["labels"][:, None] == labels[None]
                hits += int(((iou >= 0.5) & same).any(dim=1).sum())
    return hits / max(found, 1), hits / max(wanted, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "tests" / "fixtures" / "shapes_detector.safetensors"
    )
    args = parser.parse_args()
    from safetensors.torch import save_file

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make_detector()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=args.steps)
    start = time.perf_counter()
    model.train()
    for step in range(args.steps):
        images, targets = scenes(8, rng)
        losses = model(images, targets)
        loss = sum(losses.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0:
            print(f"step {step}: loss {float(loss):.3f} ({time.perf_counter() - start:.0f} s)", flush=True)
    precision, recall = evaluate(model)
    print(f"held-out: precision {precision:.3f}, recall {recall:.3f} (IoU 0.5, score 0.5)")
    state = {k: v.detach().half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(args.out))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
