"""``hookviz vlm`` (issue #50): the cost per answer token of LLaVA-CAM and the image tokens' Grad-CAM made
from one teacher-forced pass (one forward, a backward per token reusing its graph), against re-running the
model for each token (a forward and a backward per token, the way a per-token loop over an explainer does
it).

A LLaVA-1.5-shaped model built from a config (random weights; the cost does not depend on them): a CLIP
tower of 6 layers at 224 px (256 image tokens), a Llama decoder of 6 layers, width 384; an answer of 12
tokens. Medians over interleaved rounds. Run with ``make bench`` or ``python bench/vlm_bench.py``."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hookviz.vlm.families import family_of  # noqa: E402
from hookviz.vlm.words import Vlm, encode, explain_words  # noqa: E402
from tests.vlm_models import PROMPTS, WORDS, build  # noqa: E402

ANSWER = " ".join(["a", "disc", "it", "is", "a", "square", "the", "cross", "is", "an", "a", "disc"])


def per_token(vlm: Vlm, photo: np.ndarray, layer: int) -> None:
    """The baseline: for each answer token, a forward over prompt and answer and one backward."""
    enc = encode(vlm, photo, PROMPTS["llava"])
    answer = vlm.processor.tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    ids = torch.cat([enc["input_ids"], torch.tensor([answer])], dim=1)
    image = (ids[0] == 4).nonzero().flatten()
    n = enc["input_ids"].shape[1]
    lm = vlm.model.model.language_model
    for t, token in enumerate(answer):
        kept = {}
        handle = lm.layers[layer].register_forward_hook(
            lambda m, a, o, kept=kept: kept.update(h=o[0] if isinstance(o, tuple) else o)
        )
        try:
            logits = vlm.model(input_ids=ids, pixel_values=enc["pixel_values"]).logits
        finally:
            handle.remove()
        (grad,) = torch.autograd.grad(logits[0, n - 1 + t, token], [kept["h"]])
        torch.relu(kept["h"][0, image] @ grad[0, image].mean(0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tower = {
        "hidden_size": 384,
        "intermediate_size": 1536,
        "num_hidden_layers": 6,
        "num_attention_heads": 6,
        "patch_size": 14,
    }
    model, processor = build("llava", size=224, vision=tower, hidden_size=384, intermediate_size=1536,
                             num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=6)  # fmt: skip
    processor.patch_size = 14
    vlm = Vlm(model, processor, family_of(model), "llava-bench")
    photo = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    tokens = len(ANSWER.split())
    assert all(w in WORDS for w in ANSWER.split())
    ours, loop = [], []
    explain_words(vlm, photo, PROMPTS["llava"], answer=ANSWER, methods=("llavacam",))  # warm-up
    for _ in range(args.rounds):
        start = time.perf_counter()
        explain_words(vlm, photo, PROMPTS["llava"], answer=ANSWER, methods=("llavacam", "towercam"), layer=3)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        per_token(vlm, photo, 3)
        loop.append(time.perf_counter() - start)
    a, b = statistics.median(ours), statistics.median(loop)
    print(
        f"# hookviz vlm bench: LLaVA-shaped, 256 image tokens, {tokens} answer tokens, {args.rounds} rounds"
    )
    print("| measurement | all tokens | per token | ratio |\n|---|---|---|---|")
    per = b / tokens * 1000
    print(f"| a forward and a backward per token (the loop) | {b * 1000:.0f} ms | {per:.0f} ms | 1.00x |")
    print(f"| hookviz vlm: one forward, a backward per token (two methods) | {a * 1000:.0f} ms | "
          f"{a / tokens * 1000:.0f} ms | {a / b:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
