"""Train a tiny LLaVA (Hugging Face ``LlavaForConditionalGeneration``: a CLIP tower, a projector, a Llama
decoder) to name the shape in a photo, and save it with its processor as a folder: the fixture of
``hookviz vlm``'s localisation test and of the docs' pictures.

    python scripts/train_shapes_llava.py [--steps 4000] [--out tests/fixtures/shapes_llava]

Photos are 64 x 64 noise with one shape (square, disc or cross) at a random place; the prompt
"USER: <image> what shape is this ? ASSISTANT:" and the answer "a disc" (then the end token), the loss on the
answer's tokens only. CPU only, seeded; about five minutes on two cores. Prints the held-out accuracy of the
greedy answer.
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

from hookviz.io.shapes import SHAPES, shape_mask  # noqa: E402
from tests.vlm_models import EOS, PROMPTS, build  # noqa: E402

SIZE = 64


def scene(rng: np.random.Generator) -> tuple[np.ndarray, int, np.ndarray]:
    """A 64 x 64 uint8 photo of one shape on noise, the shape's class, and its mask."""
    img = rng.normal(0.5, 0.15, (SIZE, SIZE, 3)).clip(0, 1)
    kind, r = int(rng.integers(0, 3)), int(rng.integers(7, 12))
    cy, cx = (int(rng.integers(r + 1, SIZE - r - 1)) for _ in range(2))
    mask = shape_mask(kind, cy, cx, r, SIZE, SIZE)
    img[mask] = rng.uniform(0.8, 1.0, 3) if rng.random() < 0.5 else rng.uniform(0.0, 0.2, 3)
    return (img * 255).round().astype(np.uint8), kind, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "shapes_llava")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    tower = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1}
    model, processor = build("llava", size=SIZE, vision=tower, hidden_size=64, intermediate_size=128)
    prompt = PROMPTS["llava"]
    answers = [processor.tokenizer(f"a {s}", add_special_tokens=False)["input_ids"] + [EOS] for s in SHAPES]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=args.steps, pct_start=0.1)
    start = time.perf_counter()
    model.train()
    for step in range(args.steps):
        photos, kinds = zip(*[scene(rng)[:2] for _ in range(32)], strict=True)
        enc = processor(images=list(photos), text=[prompt] * 32, return_tensors="pt")
        answer = torch.tensor([answers[k] for k in kinds])
        ids = torch.cat([enc["input_ids"], answer], dim=1)
        labels = torch.cat([torch.full_like(enc["input_ids"], -100), answer], dim=1)
        loss = model(input_ids=ids, pixel_values=enc["pixel_values"], labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0:
            took = time.perf_counter() - start
            print(f"step {step}: loss {float(loss.detach()):.3f} ({took:.0f} s)", flush=True)
    model.eval()
    test = np.random.default_rng(1234)
    right = 0
    for _ in range(100):
        photo, kind, _ = scene(test)
        enc = processor(images=photo, text=prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=2, do_sample=False)
        said = processor.tokenizer.decode(out[0, enc["input_ids"].shape[1] :])
        right += said.split()[-1:] == [SHAPES[kind]]
    print(f"held-out accuracy {right / 100:.2f} on 100 photos ({time.perf_counter() - start:.0f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    processor.save_pretrained(args.out)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"wrote {args.out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
