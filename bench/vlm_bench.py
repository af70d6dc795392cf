"""``hookviz vlm`` (issue #50): the cost per answer token of LLaVA-CAM and the image tokens' Grad-CAM made
from one teacher-forced pass (one forward, a backward per token reusing its graph), against re-running the
model for each token (a forward and a backward per token, the way a per-token loop over an explainer does
it).

A LLaVA-1.5-shaped model built from a config (random weights; the cost does not depend on them): a CLIP
tower of 6 layers at 224 px (256 image tokens), a Llama decoder of 6 layers, width 384; an answer of 12
tokens. Medians over interleaved rounds. Run with ``make bench`` or ``python bench/vlm_bench.py``.

The second table (issue #60): photos per second through the ``vlm`` job on the pipeline, the answers
generated (8 tokens) and their logit-lens maps drawn, with ``--batch-size 8`` (one ``generate`` for the
batch: LLaVA's prompts have one length) against ``--batch-size 1`` (one photo at a time), and the CPU
seconds each takes (the work done, which a loaded machine's wall clock hides)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hookviz.io.images import encode_png  # noqa: E402
from hookviz.vlm.families import family_of  # noqa: E402
from hookviz.vlm.run import VlmSettings, vlm_run  # noqa: E402
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


def photos_per_second(vlm: Vlm, rounds: int, n: int = 16) -> None:
    """The ``vlm`` job over ``n`` photos, batched and one by one (interleaved rounds, medians)."""
    settings = VlmSettings(prompt=PROMPTS["llava"], max_new_tokens=8, methods=("logitlens",))
    with tempfile.TemporaryDirectory(prefix="hookviz-vlm-bench-") as tmp:
        folder = Path(tmp) / "in"
        folder.mkdir()
        for i in range(n):
            rgb = np.random.default_rng(i).integers(0, 256, (300, 400, 3), dtype=np.uint8)
            (folder / f"p{i}.png").write_bytes(encode_png(rgb))
        times: dict[int, list[float]] = {8: [], 1: []}
        cpu: dict[int, list[float]] = {8: [], 1: []}
        for r in range(rounds + 1):  # the first round warms up
            for size in times:
                start, used = time.perf_counter(), time.process_time()
                run = vlm_run(vlm, folder, settings, out=Path(tmp) / f"out{r}-{size}", batch_size=size)
                assert [rec["status"] for rec in run.records()] == ["ok"] * n
                if r:
                    times[size].append(time.perf_counter() - start)
                    cpu[size].append(time.process_time() - used)
    one, batched = (n / statistics.median(times[s]) for s in (1, 8))
    work = {s: statistics.median(cpu[s]) for s in (1, 8)}
    print(
        f"\n# photos per second: {n} photos, answers of 8 tokens generated, logit-lens maps, {rounds} rounds"
    )
    print("| measurement | photos/s | ratio | CPU seconds (all threads) | ratio |\n|---|---|---|---|---|")
    print(
        f"| `hookviz vlm --batch-size 1` (one photo at a time) | {one:.2f} | 1.00x | {work[1]:.1f} | 1.00x |"
    )
    print(f"| `hookviz vlm --batch-size 8` (the batch's answers from one generate) | {batched:.2f} | "
          f"{batched / one:.2f}x | {work[8]:.1f} | {work[8] / work[1]:.2f}x |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--photos-only", action="store_true", help="the photos-per-second table alone")
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
    if args.photos_only:
        photos_per_second(vlm, args.rounds)
        return
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
    photos_per_second(vlm, args.rounds)


if __name__ == "__main__":
    main()
