"""Train a tiny CLIP (Hugging Face ``CLIPModel``) on the synthetic shapes and their names, and save it as a
complete Hugging Face folder (config, weights, a word-level tokenizer, the image processor's config): the test
fixture for ``--prompt``.

    python scripts/train_shapes_clip.py [--steps 1500] [--out tests/fixtures/shapes_clip]

Images are 64 x 64 with one shape (square, disc or cross), or two side by side; each step scores every image
against a sentence naming each shape ("a square", "a photo of a disc", ...) with SigLIP's sigmoid loss (a
sentence matches an image that holds its shape), so an image's embedding says every shape it holds. CPU only,
seeded; a few minutes on two cores. Prints the held-out zero-shot accuracy with the prompts "a square",
"a disc", "a cross" on single shapes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hookviz.io.shapes import SHAPES, shape_mask  # noqa: E402

SIZE = 64
WORDS = ["[PAD]", "[UNK]", "[SOS]", "[EOS]", "a", "an", "the", "photo", "picture", "of", *SHAPES]
TEMPLATES = ("a {}", "the {}", "a photo of a {}", "a picture of the {}")


def shapes(n: int, rng: np.random.Generator, pairs: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy 64 x 64 images in [0, 1] and which shapes each holds ``(n, 3)``: one large shape, or (a
    share ``pairs`` of them) two different shapes side by side."""
    xs, ys = [], []
    for _ in range(n):
        img = rng.normal(0.5, 0.15, (SIZE, SIZE, 3)).clip(0, 1)
        present = np.zeros(3, dtype=np.float32)
        if rng.random() < pairs:
            kinds = rng.permutation(3)[:2]
            places = [(int(rng.integers(9, 12)), SIZE // 4 + half * SIZE // 2) for half in (0, 1)]
        else:
            kinds = rng.permutation(3)[:1]
            r = int(rng.integers(9, 14))
            places = [(r, int(rng.integers(r + 1, SIZE - r - 1)))]
        for k, (r, cx) in zip(kinds, places, strict=True):
            cy = int(rng.integers(r + 1, SIZE - r - 1))
            img[shape_mask(int(k), cy, cx, r, SIZE, SIZE)] = (
                rng.uniform(0.8, 1.0, 3) if rng.random() < 0.5 else rng.uniform(0.0, 0.2, 3)
            )
            present[k] = 1
        xs.append(img.transpose(2, 0, 1))
        ys.append(present)
    return torch.from_numpy(np.stack(xs)).float(), torch.from_numpy(np.stack(ys))


def tokenizer() -> object:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[SOS] $A [EOS]", special_tokens=[("[SOS]", 2), ("[EOS]", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[SOS]", eos_token="[EOS]",
        model_max_length=8,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "shapes_clip")
    args = parser.parse_args()
    import transformers as T

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    tok = tokenizer()
    config = T.CLIPConfig(
        text_config={"vocab_size": len(WORDS), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 8,
                     "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3},
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                       "num_attention_heads": 4, "image_size": SIZE, "patch_size": 8},
        projection_dim=32,
    )  # fmt: skip
    model = T.CLIPModel(config)
    bias = torch.nn.Parameter(torch.tensor(-2.0))  # the sigmoid loss's bias (training only)
    mean, std = torch.full((1, 3, 1, 1), 0.5), torch.full((1, 3, 1, 1), 0.25)
    opt = torch.optim.AdamW([*model.parameters(), bias], lr=1e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=args.steps, pct_start=0.1)
    start = time.perf_counter()
    model.train()
    for step in range(args.steps):
        x, present = shapes(64, rng)
        sentences = [TEMPLATES[int(rng.integers(0, len(TEMPLATES)))].format(name) for name in SHAPES]
        enc = tok(sentences, padding=True, return_tensors="pt")  # type: ignore[operator]
        pixels = (x - mean) / std
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], pixel_values=pixels)
        loss = F.binary_cross_entropy_with_logits(out.logits_per_image + bias, present)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0:
            took = time.perf_counter() - start
            print(f"step {step}: loss {float(loss.detach()):.3f} ({took:.0f} s)", flush=True)
    model.eval()
    x, present = shapes(300, np.random.default_rng(1234), pairs=0.0)
    enc = tok([f"a {s}" for s in SHAPES], padding=True, return_tensors="pt")  # type: ignore[operator]
    with torch.no_grad():
        logits = model(**enc, pixel_values=(x - mean) / std).logits_per_image
    accuracy = float((logits.argmax(1) == present.argmax(1)).float().mean())
    print(f"held-out zero-shot accuracy {accuracy:.3f} on 300 single-shape images")
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)  # type: ignore[attr-defined]
    T.CLIPImageProcessor(
        size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE}, image_mean=[0.5] * 3,
        image_std=[0.25] * 3,
    ).save_pretrained(args.out)  # fmt: skip
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"wrote {args.out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
