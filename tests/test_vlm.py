"""``hookviz vlm``: each family built offline from a tiny config runs end to end; its image tokens are placed
on the photo where its own processor puts the photo; attention equals ``output_attentions`` and LLaVA-CAM
equals Grad-CAM by hand; the model is left as found; bad input is one line; and on a LLaVA trained here to
name the shape in a photo, the shape word's map lies on the shape."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.errors import UsageError
from hookviz.vlm.families import Family, family_of, register_family, unregister_family
from hookviz.vlm.pictures import render_words
from hookviz.vlm.words import Vlm, encode, explain_words
from tests.conftest import hook_counts, invoke, records, run_cli, write_image
from tests.test_report import browser  # noqa: F401 - the browser fixture
from tests.vlm_models import FAMILIES, PROMPTS, WORDS, build, save

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 15),
    reason="hookviz vlm needs transformers 5.15 (hookviz[vlm])",
)
FIXTURE = Path(__file__).parent / "fixtures" / "shapes_llava"
WORD_IDS = {w: i for i, w in enumerate(WORDS)}


def _vlm(family: str, **kw: Any) -> Vlm:
    model, processor = build(family, **kw)
    return Vlm(model, processor, family_of(model), family)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_runs_end_to_end_from_its_folder(family: str, tmp_path: Path) -> None:
    folder = save(family, tmp_path / family)
    rng = np.random.default_rng(0)
    photo = write_image(tmp_path / "p.png", rng.integers(0, 256, (57, 95, 3), dtype=np.uint8))
    out = tmp_path / "out"
    r = invoke(
        "vlm",
        str(photo),
        "--model",
        f"hf:{folder}",
        "--prompt",
        PROMPTS[family],
        "--answer",
        "a disc",
        "--save-raw",
        "--out",
        str(out),
    )
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    assert rec["status"] == "ok" and rec["answer"] == "a disc" and not rec["generated"]
    assert [t["text"].strip() for t in rec["tokens"]] == ["a", "disc"]
    assert len(rec["maps"]) == 2 * 6 and all(0 < t["prob"] < 1 for t in rec["tokens"])
    names = {Path(p).name for p in rec["outputs"]}
    assert sum(n.endswith(".words.png") for n in names) == 1 and sum(n.endswith(".npy") for n in names) == 12
    raw = np.load(next(p for p in rec["outputs"] if ".llavacam.t02-disc" in p and p.endswith(".npy")))
    grids = rec["grids"]
    assert list(raw.shape) == (grids[0] if len(grids) == 1 else [sum(r * c for r, c in grids)])
    # Generated (greedy), and one word chosen.
    gen = ["--max-new-tokens", "2", "--method", "attention", "--tokens", "nothing-said", "--json"]
    r = invoke(
        "vlm",
        str(photo),
        "--model",
        f"hf:{folder}",
        "--prompt",
        PROMPTS[family],
        *gen,
        "--out",
        str(tmp_path / "gen"),
    )
    assert r.exit_code == 1, r.stderr  # nothing drawn: the answer kept in an error record
    rec = json.loads(r.stdout.splitlines()[-1])
    assert (
        rec["status"] == "error"
        and rec["generated"]
        and len(rec["tokens"]) <= 2
        and rec["maps"] == []
        and "none of the words 'nothing-said'" in rec["error"]
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_the_image_tokens_lie_where_the_processor_puts_the_photo(family: str) -> None:
    """A bright block planted in the photo: the share of each token's processed pixels that are bright (the
    processor's own output, unflattened) equals the share of the photo pixels the geometry gives that
    token that lie in the block."""
    vlm = _vlm(family)
    h, w = 57, 95
    photo = np.full((h, w, 3), 20, np.uint8)
    photo[10:46, 22:74] = 235
    encoded = encode(vlm, photo, PROMPTS[family])
    placement = vlm.family.placement(vlm.model, vlm.processor, encoded, (h, w))
    block = np.zeros((h, w), bool)
    block[10:46, 22:74] = True
    for processed, geometry in zip(_processed_views(vlm, encoded, placement), placement.views, strict=True):
        grid = geometry.grid
        bright = processed > (processed.max() + processed.min()) / 2
        ph, pw = processed.shape[0] // grid[0], processed.shape[1] // grid[1]
        seen = bright.reshape(grid[0], ph, grid[1], pw).mean(axis=(1, 3))
        rows, cols = geometry.cells()
        placed = np.zeros(grid)
        for r in range(grid[0]):
            for c in range(grid[1]):
                mine = (rows[:, None] == r) & (cols[None, :] == c)
                placed[r, c] = block[mine].mean() if mine.any() else 0.0
        assert np.abs(seen - placed).max() < 0.2, (seen.round(2), placed.round(2))
        assert (placed[seen > 0.9] > 0.7).all() and (placed[seen < 0.1] < 0.3).all()
    views = {"idefics3": 5, "llava-next": 2, "internvl": 3}  # tiles and a global view; a base view and tiles
    assert len(placement.views) == views.get(family, 1)


def _processed_views(vlm: Vlm, encoded: dict[str, Any], placement: Any) -> list[np.ndarray]:
    """Each view's normalised first channel as the processor made it, cut to the view's tokens: LLaVA-NeXT's
    tiles joined into one picture and its unpadded rows or columns taken, as the model joins their tokens."""
    views = [v[0] if v.ndim == 3 else v for v in vlm.family.views(encoded)]
    if vlm.family.name != "llava-next" or len(placement.views) == 1:  # (a thin photo: no tile rows)
        return views[: len(placement.views)]
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape

    side = int(vlm.model.config.vision_config.image_size)
    th, tw = get_anyres_image_grid_shape(
        list(encoded["image_sizes"][0].tolist()), vlm.model.config.image_grid_pinpoints, side
    )
    canvas = np.concatenate(
        [np.concatenate(views[1 + i * tw : 1 + (i + 1) * tw], axis=1) for i in range(th)], axis=0
    )
    big = placement.views[1]
    ch, cw = canvas.shape
    y0 = (ch - big.y.size) // 2
    x0 = (cw - big.x.size) // 2
    return [views[0], canvas[y0 : y0 + big.y.size, x0 : x0 + big.x.size]]


def test_attention_equals_output_attentions_and_the_model_is_left_as_found() -> None:
    vlm = _vlm("llava")
    rng = np.random.default_rng(1)
    photo = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    enc = encode(vlm, photo, PROMPTS["llava"])
    with torch.no_grad():
        vlm.model(**enc)  # transformers adds its own output-recording hooks on the first call
    before = vlm.model.config._attn_implementation, hook_counts(vlm.model)
    wm = explain_words(vlm, photo, PROMPTS["llava"], answer="a cross", methods=("attention", "logitlens"))
    assert (vlm.model.config._attn_implementation, hook_counts(vlm.model)) == before
    ids = torch.cat([enc["input_ids"], torch.tensor([[16, 21]])], dim=1)
    vlm.model.set_attn_implementation("eager")
    with torch.no_grad():
        att = vlm.model(input_ids=ids, pixel_values=enc["pixel_values"], output_attentions=True).attentions
    vlm.model.set_attn_implementation(before[0])
    image = (ids[0] == 4).nonzero().flatten()
    n = enc["input_ids"].shape[1]
    with torch.no_grad():
        logits = vlm.model(input_ids=ids, pixel_values=enc["pixel_values"]).logits[0]
    for t, token in enumerate((16, 21)):
        direct = torch.stack([a[0, :, n - 1 + t, image] for a in att]).mean(dim=(0, 1)).numpy()
        np.testing.assert_allclose(wm.maps["attention"][t].ravel(), direct, rtol=1e-5, atol=1e-7)
        # The logit lens: the model's own logits at the image positions, for this word.
        np.testing.assert_allclose(
            wm.maps["logitlens"][t], logits[image, token].numpy(), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("batch", [8, 1])
def test_llava_cam_equals_grad_cam_by_hand_token_by_token(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batched backward passes (8 at once) or one by one: the same as a forward and a backward per token."""
    from hookviz.vlm import words

    monkeypatch.setattr(words, "GRAD_BATCH", batch)
    vlm = _vlm("llava", seed=3)
    photo = np.random.default_rng(2).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    grads_before = [p.grad for p in vlm.model.parameters()]
    wm = explain_words(
        vlm,
        photo,
        PROMPTS["llava"],
        answer="a square",
        methods=("llavacam", "towercam", "tokengrad"),
        layer=0,
    )
    assert all(p.grad is None for p in vlm.model.parameters()) and all(g is None for g in grads_before)
    enc = encode(vlm, photo, PROMPTS["llava"])
    ids = torch.cat([enc["input_ids"], torch.tensor([[16, 19]])], dim=1)
    image = (ids[0] == 4).nonzero().flatten()
    n = enc["input_ids"].shape[1]
    for t, token in enumerate((16, 19)):
        kept = {}
        layer = vlm.model.model.language_model.layers[0]
        handle = layer.register_forward_hook(
            lambda m, a, o: kept.update(h=o[0] if isinstance(o, tuple) else o)
        )
        try:
            logits = vlm.model(input_ids=ids, pixel_values=enc["pixel_values"]).logits
        finally:
            handle.remove()
        (grad,) = torch.autograd.grad(logits[0, n - 1 + t, token], [kept["h"]])
        weights = grad[0, image].mean(dim=0)
        cam = torch.relu(kept["h"][0, image] @ weights).detach().numpy()
        np.testing.assert_allclose(wm.maps["llavacam"][t].ravel(), cam, rtol=1e-4, atol=1e-6)
        size = grad[0, image].norm(dim=1).numpy()
        np.testing.assert_allclose(wm.maps["tokengrad"][t].ravel(), size, rtol=1e-4, atol=1e-7)
        assert wm.maps["llavacam"][t].max() > 0
    probs = torch.softmax(logits[0, n - 1 : n + 1].detach(), -1)[[0, 1], [16, 19]]
    np.testing.assert_allclose(wm.answer.probs, probs.numpy(), rtol=1e-5)


def test_bad_input_is_one_line_and_a_bad_photo_stops_nothing(tmp_path: Path) -> None:
    folder = save("llava", tmp_path / "llava")
    photo = write_image(tmp_path / "p.png", np.zeros((40, 40, 3), np.uint8))
    model = ["--model", f"hf:{folder}", "--out", str(tmp_path / "out")]
    cases = [
        (["--prompt", PROMPTS["llava"], "--answer", "a zebra"], "does not know 'zebra'"),
        (["--prompt", "what shape is this ?"], "holds no image token"),
        (["--prompt", PROMPTS["llava"], "--method", "gradcam"], "hookviz vlm has attention"),
        (["--prompt", PROMPTS["llava"], "--layer", "9"], "has 2 decoder layers"),
        (["--prompt", PROMPTS["llava"], "--layer", "1"], "reaches no answer token"),
        (
            ["--prompt", PROMPTS["llava"], "--layer", "model.language_model.layers.1"],
            "reaches no answer token",
        ),
        (
            ["--prompt", PROMPTS["llava"], "--layer", "vision_tower.x"],
            "--layer vision_tower.x: no decoder layer is named so (they are model.language_model.layers.0 to "
            "model.language_model.layers.1); give a decoder layer's name or its index (0 to 1)",
        ),
        (
            ["--prompt", PROMPTS["llava"], "--layer", "model.language_model.layer.0"],
            "no decoder layer is named so; did you mean 'model.language_model.layers.0' or "
            "'model.language_model.layers.1'?",
        ),
    ]
    for extra, said in cases:
        r = invoke("vlm", str(photo), *model, *extra)
        assert r.exit_code == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    clip = Path(__file__).parent / "fixtures" / "shapes_clip"
    r = invoke(
        "vlm", str(photo), "--model", f"hf:{clip}", "--prompt", "<image> a", "--out", str(tmp_path / "o")
    )
    assert (
        r.exit_code == 2 and "vision-language model" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    )
    r = invoke(
        "vlm",
        str(tmp_path / "missing.png"),
        str(photo),
        *model,
        "--prompt",
        PROMPTS["llava"],
        "--max-new-tokens",
        "1",
    )
    assert r.exit_code == 1 and "missing.png" in r.stderr
    assert [rec["status"] for rec in records(tmp_path / "out")] == ["error", "ok"]
    # A rerun resumes: the photo done is skipped (its files untouched), the missing one fails again.
    done = records(tmp_path / "out")[1]
    stamps = {p: Path(p).stat().st_mtime_ns for p in done["outputs"]}
    r = invoke("vlm", str(tmp_path / "missing.png"), str(photo), *model, "--prompt", PROMPTS["llava"],
               "--max-new-tokens", "1", "--json")  # fmt: skip
    assert r.exit_code == 1
    again = [json.loads(line) for line in r.stdout.splitlines()]
    assert [rec["status"] for rec in again] == ["error", "skipped"]
    assert again[1]["answer"] == done["answer"] and again[1]["outputs"] == done["outputs"]
    assert {p: Path(p).stat().st_mtime_ns for p in done["outputs"]} == stamps
    r = invoke("vlm", str(photo), *model, "--prompt", PROMPTS["llava"], "--max-new-tokens", "1")
    assert r.exit_code == 0 and r.stdout.strip().endswith("(skipped: done by an earlier run)"), r.stdout
    assert not r.stderr.strip(), r.stderr


@pytest.mark.skipif(not FIXTURE.is_dir(), reason="make the fixture: python scripts/train_shapes_llava.py")
def test_on_a_trained_llava_the_shape_word_s_map_lies_on_the_shape() -> None:
    """100 held-out photos of one shape: the model names it, and the word's map peaks on the shape (its
    highest token's pixels touch the shape) for at least 85 % of them with at least one method; a random
    map's peak does so far less often."""
    from hookviz.io.shapes import SHAPES
    from hookviz.vlm.words import load_vlm
    from scripts.train_shapes_llava import scene

    vlm = load_vlm(f"hf:{FIXTURE}", "cpu")
    rng, chance = np.random.default_rng(4321), np.random.default_rng(0)
    hits = dict.fromkeys(
        ["attention", "tokengrad", "llavacam", "towercam", "logitlens", "tam", "relevancy", "random"], 0
    )
    named = 0
    for _ in range(100):
        photo, kind, mask = scene(rng)
        wm = explain_words(vlm, photo, PROMPTS["llava"], max_new_tokens=2, methods=tuple(hits)[:-1])
        named += wm.answer.text.split()[-1:] == [SHAPES[kind]]
        word = len(wm.answer.tokens) - 1

        def on_shape(scores: np.ndarray) -> bool:
            ys, xs = wm.placement.token_pixels(int(np.argmax(scores)))
            return bool(mask[np.ix_(ys, xs)].any())

        for method, stack in wm.maps.items():
            hits[method] += on_shape(stack[word])
        hits["random"] += on_shape(chance.random(wm.placement.tokens))
    assert named >= 90, named
    best = max(v for k, v in hits.items() if k != "random")
    assert best >= 85 and hits["random"] <= 45, hits


@pytest.mark.skipif(not FIXTURE.is_dir(), reason="make the fixture: python scripts/train_shapes_llava.py")
def test_the_report_shows_the_answer_and_pointing_at_a_word_shows_its_maps(
    tmp_path: Path,
    browser: Any,  # noqa: F811
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from scripts.train_shapes_llava import scene

    photo, _, _ = scene(np.random.default_rng(5))
    path = write_image(tmp_path / "<b>disc<i>.png", photo)  # a hostile name stays text
    out = tmp_path / "out"
    r = invoke(
        "vlm",
        str(path),
        "--model",
        f"hf:{FIXTURE}",
        "--prompt",
        PROMPTS["llava"],
        "--out",
        str(out),
        "--max-new-tokens",
        "2",
        "--report",
    )
    assert r.exit_code == 0, r.stderr
    browser.get((out / "index.html").as_uri())
    words = browser.find_elements(By.CSS_SELECTOR, ".answer .word")
    (rec,) = records(out)
    assert [w.text for w in words] == [t["text"].strip() for t in rec["tokens"]]
    ActionChains(browser).move_to_element(words[1]).perform()
    shown = [f for f in browser.find_elements(By.CSS_SELECTOR, ".thumbs figure") if f.is_displayed()]
    assert len(shown) == 6 and all(f.get_attribute("data-token") == "1" for f in shown)
    assert browser.execute_script("return document.querySelectorAll('.card h2 b').length") == 0


@pytest.mark.skipif(not FIXTURE.is_dir(), reason="make the fixture: python scripts/train_shapes_llava.py")
def test_on_the_trained_llava_the_pointing_maps_beat_a_random_one_at_deletion_and_insertion() -> None:
    from hookviz.vlm.faithful import word_faithfulness
    from hookviz.vlm.words import load_vlm
    from scripts.train_shapes_llava import scene

    vlm = load_vlm(f"hf:{FIXTURE}", "cpu")
    rng = np.random.default_rng(99)
    found: dict[str, list[float]] = {
        "deletion": [],
        "insertion": [],
        "random_deletion": [],
        "random_insertion": [],
    }
    for _ in range(10):
        photo, _, _ = scene(rng)
        wm = explain_words(
            vlm, photo, PROMPTS["llava"], answer=None, max_new_tokens=2, methods=("attention",)
        )
        got = word_faithfulness(vlm, wm, "attention", len(wm.answer.tokens) - 1)
        found["deletion"].append(got["deletion_auc"])
        found["insertion"].append(got["insertion_auc"])
        found["random_deletion"].append(got["random"]["deletion_auc"])
        found["random_insertion"].append(got["random"]["insertion_auc"])
    mean = {k: float(np.mean(v)) for k, v in found.items()}
    assert mean["deletion"] < mean["random_deletion"] - 0.3, mean
    assert mean["insertion"] > mean["random_insertion"] + 0.3, mean


@pytest.mark.parametrize("family", FAMILIES)
def test_each_image_token_comes_from_the_pixels_its_placement_gives_it(family: str) -> None:
    """A planted signal through the whole model: with the vision tower's attention outputs zeroed (no patch
    sees another), each image token the decoder receives depends only on its own patches; the pixels its
    embedding's gradient reaches lie in the view and cell the placement gives it (patch embedding, pixel
    shuffle, merges, tiles, unpadding and row-end tokens all in the model's own order)."""
    vlm = _vlm(family, seed=1)
    for name, module in vlm.model.named_modules():
        if name.endswith(("self_attn.out_proj", "attn.proj", "attention.projection_layer")):
            torch.nn.init.zeros_(module.weight)
            torch.nn.init.zeros_(module.bias)
    photo = np.random.default_rng(3).integers(0, 256, (57, 95, 3), dtype=np.uint8)
    encoded = encode(vlm, photo, PROMPTS[family])
    placement = vlm.family.placement(vlm.model, vlm.processor, encoded, (57, 95))
    pixels = encoded["pixel_values"].float().requires_grad_(True)
    kept = {}
    lm = vlm.family.language_model(vlm.model)
    handle = lm.register_forward_pre_hook(lambda m, a, k: kept.update(x=k["inputs_embeds"]), with_kwargs=True)
    try:
        vlm.model(**{**encoded, "pixel_values": pixels.to(encoded["pixel_values"].dtype)})
    finally:
        handle.remove()
    image = (encoded["input_ids"][0] == vlm.family.image_token(vlm.model)).nonzero().flatten()
    assert len(image) == placement.tokens
    placed = placement.placed()
    starts = np.cumsum(
        [0] + [r * (c + v.row_extra) for v, (r, c) in zip(placement.views, placement.grids, strict=True)]
    )
    rng = np.random.default_rng(0)
    for k in sorted(rng.choice(len(image), size=min(16, len(image)), replace=False)):
        (grad,) = torch.autograd.grad(kept["x"][0, image[k]].sum(), [pixels], retain_graph=True)
        if not placed[k]:  # a row-end token: a learned vector, no pixel behind it
            assert float(grad.abs().max()) == 0
            continue
        views = _processed_views(vlm, {**encoded, "pixel_values": grad.abs()}, placement)
        v = int(np.searchsorted(starts, k, side="right") - 1)
        r, c = placement.grids[v]
        width = c + placement.views[v].row_extra
        row, col = divmod(int(k - starts[v]), width)
        reach = views[v]
        assert sum(float(other.sum()) for i, other in enumerate(views) if i != v) == 0, k
        ys, xs = np.nonzero(reach > 0)
        h, w = reach.shape
        assert ys.min() >= row * h // r and ys.max() < (row + 1) * h // r, (k, row, ys.min(), ys.max())
        assert xs.min() >= col * w // c and xs.max() < (col + 1) * w // c, (k, col, xs.min(), xs.max())


def test_relevancy_equals_chefer_s_rule_by_hand_through_the_decoder_and_the_tower() -> None:
    vlm = _vlm("llava", seed=5)
    photo = np.random.default_rng(6).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    wm = explain_words(vlm, photo, PROMPTS["llava"], answer="it is a disc", methods=("relevancy",))
    enc = encode(vlm, photo, PROMPTS["llava"])
    answer = [WORD_IDS[w] for w in ("it", "is", "a", "disc")]
    ids = torch.cat([enc["input_ids"], torch.tensor([answer])], dim=1)
    image = (ids[0] == 4).nonzero().flatten()
    n = enc["input_ids"].shape[1]
    vlm.model.set_attn_implementation("eager")
    tower: list[torch.Tensor] = []
    layers = vlm.model.model.vision_tower.encoder.layers
    handles = [layer.self_attn.register_forward_hook(lambda m, a, o: tower.append(o[1])) for layer in layers]

    def rolled(attentions: list[torch.Tensor], grads: tuple[torch.Tensor, ...]) -> torch.Tensor:
        r = torch.eye(attentions[0].shape[-1])
        for a, g in zip(attentions, grads, strict=True):
            r = r + (g[0] * a[0]).clamp(min=0).mean(0).detach() @ r
        return r

    try:
        for t, token in enumerate(answer):
            tower.clear()
            out = vlm.model(input_ids=ids, pixel_values=enc["pixel_values"], output_attentions=True)
            decoder = list(out.attentions)
            grads = torch.autograd.grad(out.logits[0, n - 1 + t, token], decoder + tower)
            through = rolled(decoder, grads[: len(decoder)])[n - 1 + t, image]
            patches = through @ rolled(tower, grads[len(decoder) :])[1:, 1:]  # the CLS token left out
            np.testing.assert_allclose(wm.maps["relevancy"][t], patches.numpy(), rtol=1e-4, atol=1e-6)
    finally:
        for h in handles:
            h.remove()


def test_the_logit_lens_and_tam_read_the_final_states_of_the_one_pass_the_probabilities_came_from(
    forwards: list[str],
) -> None:
    """One teacher-forced pass of the model a photo, whether the methods asked take gradients or not: the
    logit lens and TAM read the final states it kept, and equal what a pass of their own reads."""
    from hookviz.vlm.model import forced
    from hookviz.vlm.tam import final_states

    torch.manual_seed(0)
    vlm = _vlm("llava")
    photo = np.random.default_rng(5).integers(0, 256, (40, 52, 3), dtype=np.uint8)
    made = {}
    for methods in (("logitlens", "tam"), ("llavacam", "logitlens", "tam")):
        forwards.clear()
        made[methods] = explain_words(vlm, photo, PROMPTS["llava"], answer="a disc", methods=methods)
        assert forwards.count("LlavaForConditionalGeneration") == 1, methods
    plain, graded = made.values()
    for m in ("logitlens", "tam"):
        np.testing.assert_allclose(plain.maps[m], graded.maps[m], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(plain.answer.probs, graded.answer.probs, rtol=1e-5)
    inputs = forced(encode(vlm, photo, PROMPTS["llava"]), plain.answer)
    final = final_states(vlm.model, vlm.model.model.language_model, inputs)
    with torch.no_grad():
        lens = vlm.model.lm_head(final[0, plain.image]).float()[:, plain.answer.token_ids].T
    np.testing.assert_allclose(plain.maps["logitlens"], lens.numpy(), rtol=1e-4, atol=1e-5)
    assert np.ptp(plain.maps["logitlens"]) > 0


def test_tam_s_rank_gaussian_filter_keeps_a_flat_map_and_quiets_a_lone_spike() -> None:
    from hookviz.vlm.tam import rank_gaussian

    flat = np.full((5, 6), 0.4)
    np.testing.assert_allclose(rank_gaussian(flat), flat)
    rng = np.random.default_rng(0)
    noisy = rng.uniform(0.2, 0.3, (8, 8))
    noisy[4, 4] = 1.0  # one spike
    out = rank_gaussian(noisy)
    padded = np.pad(noisy, 1, mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3)).reshape(8, 8, 9)
    assert (out >= windows.min(-1) - 1e-12).all() and (out <= windows.max(-1) + 1e-12).all()
    # The spike sits at the top rank, far from the middle one: it weighs little, far below a box mean.
    assert out[4, 4] < windows[4, 4].mean() - 0.05 and out[4, 4] < 0.35


@pytest.mark.parametrize("size", [(40, 100), (400, 1000), (210, 500)])
def test_llava_next_s_tile_grid_is_drawn_at_its_place_where_it_hangs_over_the_photo_s_edge(
    size: tuple[int, int],
) -> None:
    """LLaVA-NeXT's unpadded tile grid reaches past the photo's top and bottom by part of a row: drawn, each
    token's map peaks (a lone hot token, the base view cold) within a pixel of the record's peak, the centre
    of the photo pixels its cell covers (the grid cut at the photo's edge, not squeezed onto it)."""
    vlm = _vlm("llava-next")
    h, w = size
    encoded = encode(vlm, np.zeros((h, w, 3), np.uint8), PROMPTS["llava-next"])
    placement = vlm.family.placement(vlm.model, vlm.processor, encoded, size)
    base, tiles = placement.views
    y0, y1 = tiles.y.span()
    assert y0 < -1 and y1 > h + 1, (y0, y1)  # the grid hangs over the edge
    rows, cols = tiles.grid
    start = base.grid[0] * base.grid[1]
    checked = 0
    for r in range(rows):
        for c in range(cols):
            k = start + r * (cols + tiles.row_extra) + c
            ys, xs = placement.token_pixels(k)
            cell = tiles.y.step * tiles.y.size / rows
            if ys.min() == 0 or ys.max() == h - 1 or xs.min() == 0 or xs.max() == w - 1:
                continue  # a cell cut by the photo's edge: its drawn peak is its centre, off the photo
            scores = np.zeros(placement.tokens)
            scores[k] = 1.0
            picture = placement.picture(scores)
            y, x = np.unravel_index(np.nanargmax(picture), picture.shape)
            px, py = placement.peak(scores)
            assert abs(x - px) <= 1 and abs(y - py) <= 1, (r, c, (x, y), (px, py), cell)
            checked += 1
    assert checked >= cols - 2


ODD = [("llava", (1, 1)), ("llava", (4, 4)), ("qwen2-vl", (1, 1)), ("qwen2-vl", (4, 4)),
       ("qwen2-vl", (3, 400)), ("paligemma", (2, 2)), ("internvl", (4, 4)), ("llava-next", (4, 4)),
       ("llava-next", (17, 300)), ("llava-next", (9, 150)), ("llava-next", (300, 17)),
       ("llava-next", (3, 400)), ("idefics3", (2, 2)), ("idefics3", (28, 28)), ("idefics3", (20, 28)),
       ("idefics3", (17, 300)), ("idefics3", (9, 150))]  # fmt: skip


@pytest.mark.parametrize(("family", "size"), ODD, ids=[f"{f}-{h}x{w}" for f, (h, w) in ODD])
def test_odd_photos_the_model_runs_are_explained_and_placed_where_the_processor_puts_them(
    family: str, size: tuple[int, int]
) -> None:
    """Tiny, thin and very wide photos (read as (H, W, C), never as channels first): the map has a score per
    image token the model reads, and each token's centre, placed on the photo, lies in the planted block
    where the processor's own output is bright there, outside it where dark."""
    vlm = _vlm(family)
    h, w = size
    photo = np.full((h, w, 3), 20, np.uint8)
    y0, y1 = (h // 4, h - h // 4) if h >= 4 else (0, h)
    x0, x1 = (w // 4, w - w // 4) if w >= 4 else (0, w)
    photo[y0:y1, x0:x1] = 235
    block = np.zeros((h, w), bool)
    block[y0:y1, x0:x1] = True
    wm = explain_words(vlm, photo, PROMPTS[family], answer="a disc", methods=("attention",))
    encoded = encode(vlm, photo, PROMPTS[family])
    image = (encoded["input_ids"][0] == vlm.family.image_token(vlm.model)).sum()
    placement = wm.placement
    assert wm.maps["attention"].shape == (2, placement.tokens) and placement.tokens == int(image)
    assert placement.picture(wm.maps["attention"][1]).shape == (h, w)
    checked = 0
    for processed, g in zip(_processed_views(vlm, encoded, placement), placement.views, strict=True):
        if not g.grid[0] * g.grid[1]:  # a tall photo's LLaVA-NeXT tiles keep no column: row-end tokens alone
            continue
        (rows, cols), middle = g.grid, (processed.max() + processed.min()) / 2
        ph, pw = processed.shape[0] // rows, processed.shape[1] // cols
        seen = (processed > middle).reshape(rows, ph, cols, pw).mean(axis=(1, 3))
        for r in range(rows):
            for c in range(cols):
                y = g.y.origin + g.y.step * ((r + 0.5) * ph - 0.5)
                x = g.x.origin + g.x.step * ((c + 0.5) * pw - 0.5)
                if 0 <= y < h and 0 <= x < w and (seen[r, c] > 0.9 or seen[r, c] < 0.1) and np.ptp(processed):
                    assert block[int(y), int(x)] == (seen[r, c] > 0.5), (r, c, y, x, seen[r, c])
                    checked += 1
    # (Qwen2-VL's and InternVL's few tokens over a tiny photo: none wholly bright or dark.)
    assert checked > 0 or h * w <= 4 or family in ("qwen2-vl", "internvl")


def test_a_photo_the_model_cannot_take_is_its_own_error_record_and_the_others_go_on(tmp_path: Path) -> None:
    folder = save("qwen2-vl", tmp_path / "qwen")
    rng = np.random.default_rng(0)
    photos = [
        write_image(tmp_path / f"{name}.png", rng.integers(0, 256, (*size, 3), dtype=np.uint8))
        for name, size in [("dot", (1, 1)), ("small", (4, 4)), ("line", (2, 1000)), ("photo", (57, 95))]
    ]
    out = tmp_path / "out"
    r = invoke("vlm", *map(str, photos), "--model", f"hf:{folder}", "--prompt", PROMPTS["qwen2-vl"],
               "--answer", "a disc", "--method", "attention", "--out", str(out))  # fmt: skip
    assert r.exit_code == 1, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"hookviz: {photos[2]}: a photo of 1000x2 pixels: the processor cannot take it (absolute aspect "
        "ratio must be smaller than 200, got 500.0)",
        f"hookviz: 1 of 4 input(s) failed; see {out / 'manifest.jsonl'}",  # as every command says it
    ]
    got = {Path(rec["input"]).name: rec for rec in records(out)}
    assert {k: v["status"] for k, v in got.items()} == {
        "dot.png": "ok",
        "small.png": "ok",
        "line.png": "error",
        "photo.png": "ok",
    }
    assert got["dot.png"]["box"] == [0, 0, 1, 1] and got["dot.png"]["maps"][1]["peak"] == [0, 0]


def test_a_prompt_with_two_image_tokens_an_empty_answer_and_words_not_in_the_answer(tmp_path: Path) -> None:
    folder = save("llava", tmp_path / "llava")
    photo = write_image(tmp_path / "p.png", np.zeros((40, 40, 3), np.uint8))
    model = ["--model", f"hf:{folder}", "--method", "attention"]
    for extra, said in [
        (["--prompt", "USER: <image> <image> what shape is this ? ASSISTANT:"],
         "holds 2 image tokens; hookviz vlm explains one photo per prompt: put <image> in it once"),
        (["--prompt", PROMPTS["llava"], "--answer", ""],
         "--answer '': an empty answer has no words to explain"),
        (["--prompt", PROMPTS["llava"], "--answer", "  "], "an empty answer has no words to explain"),
    ]:  # fmt: skip
        r = invoke("vlm", str(photo), *model, *extra, "--out", str(tmp_path / "bad"))
        assert r.exit_code == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # Some of the words: those drawn, the others named; none of them: an error record keeping the answer.
    answer = ["--prompt", PROMPTS["llava"], "--answer", "a disc"]
    r = invoke("vlm", str(photo), *model, *answer, "--tokens", "disc,zebra", "--out", str(tmp_path / "some"))
    assert r.exit_code == 0, r.stderr
    assert r.stderr.strip() == (
        f"hookviz: note: {photo}: the answer 'a disc' has no word 'zebra' (its words: 'a', 'disc'); the "
        "others are drawn"
    )
    (rec,) = records(tmp_path / "some")
    assert rec["status"] == "ok" and [m["text"] for m in rec["maps"]] == ["disc"]
    r = invoke("vlm", str(photo), *model, *answer, "--tokens", "zebra,cat", "--out", str(tmp_path / "none"))
    assert r.exit_code == 1
    assert r.stderr.strip() == (  # the photo's name quoted, as the pipeline quotes it for every command
        f"hookviz: {str(photo)!r}: the answer 'a disc' has none of the words 'zebra', 'cat'; nothing drawn "
        "(its words: 'a', 'disc')\n"
        f"hookviz: 1 of 1 input(s) failed; see {tmp_path / 'none' / 'manifest.jsonl'}"
    )
    (rec,) = records(tmp_path / "none")
    assert rec["status"] == "error" and rec["answer"] == "a disc" and rec["maps"] == []
    assert rec["outputs"] == []
    assert not any(p.suffix == ".png" for p in (tmp_path / "none").iterdir())


def _photos(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True)
    for i in range(n):
        rgb = np.random.default_rng(10 + i).integers(0, 256, (40 + 6 * i, 60, 3), dtype=np.uint8)
        write_image(folder / f"p{i}.png", rgb)
    return folder


@pytest.fixture
def forwards() -> Iterator[list[str]]:
    """The name of every module called while the test runs (a global forward hook, removed after)."""
    called: list[str] = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: called.append(type(module).__name__)
    )
    yield called
    handle.remove()


def test_vlm_writes_the_table_and_the_store_and_a_rerun_with_skip_existing_computes_nothing(
    tmp_path: Path, forwards: list[str]
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    zarr = pytest.importorskip("zarr")
    folder = save("llava", tmp_path / "llava")
    photos = _photos(tmp_path / "in", 3)
    out = tmp_path / "out"
    args = ["vlm", str(photos), "--model", f"hf:{folder}", "--prompt", PROMPTS["llava"], "--answer", "a disc",
            "--method", "llavacam,attention", "--records", "parquet", "--maps", "zarr",
            "--out", str(out)]  # fmt: skip
    r = invoke(*args)
    assert r.exit_code == 0, r.stderr
    recs = records(out)
    assert [rec["status"] for rec in recs] == ["ok"] * 3 and all(rec["command"] == "vlm" for rec in recs)
    assert any(name.startswith("LlavaForConditionalGeneration") for name in forwards)
    rows = pq.read_table(out / "records.parquet").to_pylist()
    assert len(rows) == 3 * 2 * 2  # photos x methods x words
    assert {(r["method"], r["target_name"].strip()) for r in rows} == {
        (m, w) for m in ("llavacam", "attention") for w in ("a", "disc")
    }
    store = zarr.open_group(str(out / "maps.zarr"), mode="r")
    assert sorted(store.keys()) == sorted(rec["prefix"] for rec in recs)
    for rec in recs:
        entry = next(m for m in rec["maps"] if m["method"] == "llavacam" and m["token"] == 1)
        array = store[rec["prefix"]][entry["file"][len(rec["prefix"]) + 1 : -len(".png")]]
        assert list(array.shape) == rec["grids"][0] and array.attrs["complete"]
        assert float(np.nanmax(np.asarray(array[...], np.float32))) == pytest.approx(entry["max"], rel=1e-3)
    stamps = {p: p.stat().st_mtime_ns for p in out.iterdir() if p.suffix == ".png"}
    forwards.clear()
    r = invoke(*args, "--skip-existing")
    assert r.exit_code == 0, r.stderr
    assert forwards == []  # nothing computed: not one module of the model called
    again = records(out)[3:]
    assert [rec["status"] for rec in again] == ["skipped"] * 3
    assert [rec["outputs"] for rec in again] == [rec["outputs"] for rec in recs]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert len(pq.read_table(out / "records.parquet").to_pylist()) == 3 * 2 * 2  # skipped rows not repeated


def test_overwrite_redoes_every_photo_and_a_rerun_without_it_keeps_them(
    tmp_path: Path, forwards: list[str]
) -> None:
    """As for every job: a rerun keeps what exists (nothing computed); ``--overwrite`` computes every photo
    again and replaces each file (a new file in its place, a spoiled map made right); with
    ``--skip-existing`` it is refused in one line."""
    folder = save("llava", tmp_path / "llava")
    photos = _photos(tmp_path / "in", 2)
    out = tmp_path / "out"
    args = ["vlm", str(photos), "--model", f"hf:{folder}", "--prompt", PROMPTS["llava"], "--answer", "a disc",
            "--method", "llavacam", "--save-raw", "--out", str(out)]  # fmt: skip
    assert invoke(*args).exit_code == 0
    first = records(out)
    files = [Path(p) for rec in first for p in rec["outputs"]]
    raw = {p: np.load(p) for p in files if p.suffix == ".npy"}
    assert len(files) == 2 * (2 * 2 + 1) and len(raw) == 4
    forwards.clear()
    r = invoke(*args)
    assert r.exit_code == 0 and forwards == [], r.stderr
    assert [rec["status"] for rec in records(out)[2:]] == ["skipped"] * 2
    spoiled = next(iter(raw))
    np.save(spoiled, np.zeros_like(raw[spoiled]))
    inodes = {p: p.stat().st_ino for p in files}
    forwards.clear()
    r = invoke(*args, "--overwrite")
    assert r.exit_code == 0, r.stderr
    assert any(name.startswith("LlavaForConditionalGeneration") for name in forwards)
    again = records(out)[4:]
    assert [rec["status"] for rec in again] == ["ok"] * 2
    assert [rec["outputs"] for rec in again] == [rec["outputs"] for rec in first]
    assert all(p.stat().st_ino != inodes[p] for p in files)  # each file written anew (a rename over it)
    for p, before in raw.items():
        np.testing.assert_allclose(np.load(p), before, rtol=1e-5, atol=1e-7)
    assert np.abs(raw[spoiled]).max() > 0
    r = invoke(*args, "--overwrite", "--skip-existing")
    assert r.exit_code == 2 and "contradict each other" in r.stderr, r.stderr


def test_vlm_run_from_python_writes_what_the_command_writes(tmp_path: Path) -> None:
    """``vlm_run`` is the command's :class:`hookviz.run.Run`: the same records (key, answer, maps) and the
    same raw maps, from Python with no code of its own for the output, the sinks or the manifest."""
    from hookviz.vlm.run import VlmSettings, vlm_run

    folder = save("llava", tmp_path / "llava")
    photos = _photos(tmp_path / "in", 2)
    args = ["--model", f"hf:{folder}", "--prompt", PROMPTS["llava"], "--answer", "a disc", "--method",
            "llavacam,logitlens", "--save-raw", "--out", str(tmp_path / "cli")]  # fmt: skip
    r = invoke("vlm", str(photos), *args)
    assert r.exit_code == 0, r.stderr
    settings = VlmSettings(prompt=PROMPTS["llava"], answer="a disc", methods=("llavacam", "logitlens"))
    run = vlm_run(f"hf:{folder}", photos, settings, out=tmp_path / "py", maps="zarr", records="parquet")
    got, mine = run.records(), records(tmp_path / "py")
    assert [rec["prefix"] for rec in got] == [rec["prefix"] for rec in mine] and len(mine) == 2
    rows = pytest.importorskip("pyarrow.parquet").read_table(tmp_path / "py" / "records.parquet").num_rows
    assert (
        rows == sum(len(rec["maps"]) for rec in mine) == 2 * 2 * 2
        and (tmp_path / "py" / "maps.zarr").is_dir()
    )
    for ours, theirs in zip(mine, records(tmp_path / "cli"), strict=True):
        # One key (--maps keeps the raw maps, as --save-raw): the same names, answer, probabilities and maps.
        assert {k: v for k, v in ours.items() if k not in ("time", "outputs", "maps")} == {
            k: v for k, v in theirs.items() if k not in ("time", "outputs", "maps")
        }
        for a, b in zip(ours["maps"], theirs["maps"], strict=True):
            assert {**a, "max": 0} == {**b, "max": 0} and a["max"] == pytest.approx(b["max"], rel=1e-5)


def test_photos_batched_give_the_answers_and_maps_of_one_photo_at_a_time(tmp_path: Path) -> None:
    """LLaVA's prompts have one length whatever the photo: a batch's answers come from one ``generate``;
    they, and every map, equal those made one photo at a time."""
    folder = save("llava", tmp_path / "llava")
    photos = _photos(tmp_path / "in", 4)
    got = {}
    for size in (4, 1):
        out = tmp_path / f"b{size}"
        r = invoke("vlm", str(photos), "--model", f"hf:{folder}", "--prompt", PROMPTS["llava"],
                   "--max-new-tokens", "3", "--method", "tokengrad", "--save-raw", "--batch-size", str(size),
                   "--out", str(out))  # fmt: skip
        assert r.exit_code == 0, r.stderr
        got[size] = {Path(rec["input"]).name: rec for rec in records(out)}
    assert len(got[4]) == 4
    for name, one in got[1].items():
        batched = got[4][name]
        assert batched["tokens"] == one["tokens"] and batched["generated"]
        for a, b in zip(batched["outputs"], one["outputs"], strict=True):
            assert Path(a).name == Path(b).name
            if a.endswith(".npy"):
                np.testing.assert_allclose(np.load(a), np.load(b), rtol=1e-4, atol=1e-6)


def test_layer_takes_the_decoder_layer_s_name_or_a_glob_naming_one(tmp_path: Path) -> None:
    folder = save("llava", tmp_path / "llava")
    photo = write_image(tmp_path / "p.png", np.random.default_rng(3).integers(0, 256, (40, 40, 3), np.uint8))
    base = ["vlm", str(photo), "--model", f"hf:{folder}", "--prompt", PROMPTS["llava"], "--answer", "a disc",
            "--method", "llavacam", "--save-raw"]  # fmt: skip
    keys = {}
    for given in ("0", "model.language_model.layers.0", "*.layers.0"):
        out = tmp_path / given.replace("*", "star")
        r = invoke(*base, "--layer", given, "--out", str(out))
        assert r.exit_code == 0, r.stderr
        (rec,) = records(out)
        keys[given] = rec["key"]
        assert rec["settings"]["layer"] == 0 and rec["maps"][0]["layer"] == 0
    assert len(set(keys.values())) == 1  # one layer, one key: the outputs of one are the others'
    r = invoke(*base, "--layer", "*.layers.*", "--out", str(tmp_path / "many"))
    assert r.exit_code == 2 and "names 2 decoder layers (0 to 1); give one" in r.stderr, r.stderr


class _Renamed(Family):
    """A family from outside the package: LLaVA's layout under a name of its own, counting its calls."""

    name = "test-llava"
    model_types = ("llava",)
    calls = 0

    def placement(self, model: Any, processor: Any, encoded: dict[str, Any], photo: tuple[int, int]) -> Any:
        _Renamed.calls += 1
        return super().placement(model, processor, encoded, photo)

    def tower(self, model: Any) -> Any:
        return model.model.vision_tower


def test_a_family_registered_from_outside_the_package_runs_vlm(tmp_path: Path) -> None:
    folder = save("llava", tmp_path / "llava")
    photo = write_image(tmp_path / "p.png", np.random.default_rng(4).integers(0, 256, (40, 52, 3), np.uint8))
    args = ["vlm", str(photo), "--model", f"hf:{folder}", "--prompt", PROMPTS["llava"], "--answer", "a disc",
            "--method", "llavacam,relevancy", "--save-raw"]  # fmt: skip
    r = invoke(*args, "--out", str(tmp_path / "builtin"))
    assert r.exit_code == 0, r.stderr
    register_family(_Renamed())
    try:
        with pytest.raises(ValueError, match="give a new name"):
            register_family(_Renamed())
        assert family_of(build("llava")[0]).name == "test-llava"
        r = invoke(*args, "--out", str(tmp_path / "ours"))
        assert r.exit_code == 0, r.stderr
        assert _Renamed.calls == 2  # the folder's check (a plain photo, before any) and the photo
        with pytest.raises(UsageError, match="it knows test-llava, llava, llava-next"):
            family_of(SimpleNamespace(config=SimpleNamespace(model_type="clip")))
    finally:
        unregister_family("test-llava")
    assert family_of(build("llava")[0]).name == "llava"
    (ours,), (theirs,) = records(tmp_path / "ours"), records(tmp_path / "builtin")
    assert ours["key"] != theirs["key"]  # the family is part of the key: the same maps under another key
    assert [m["file"].replace(ours["key"], theirs["key"]) for m in ours["maps"]] == [
        m["file"] for m in theirs["maps"]
    ]
    for a, b in zip(ours["outputs"], theirs["outputs"], strict=True):
        if a.endswith(".npy"):
            np.testing.assert_allclose(np.load(a), np.load(b), rtol=1e-5, atol=1e-7)


def test_the_vlm_table_says_each_map_s_layer_and_its_token_s_probability(tmp_path: Path) -> None:
    """Without --layer, every map of a method reading a decoder layer (tokengrad, llavacam) says the layer
    chosen, in the record and the table; each row's target_score is its answer token's probability."""
    pq = pytest.importorskip("pyarrow.parquet")
    folder = save("llava", tmp_path / "llava")
    photo = write_image(tmp_path / "p.png", np.random.default_rng(6).integers(0, 256, (40, 40, 3), np.uint8))
    out = tmp_path / "out"
    r = invoke("vlm", str(photo), "--model", f"hf:{folder}", "--prompt", PROMPTS["llava"], "--answer",
               "a disc", "--method", "tokengrad,llavacam,attention", "--records", "parquet",
               "--out", str(out))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    probs = {t["index"]: t["prob"] for t in rec["tokens"]}
    rows = pq.read_table(out / "records.parquet").to_pylist()
    assert len(rows) == 3 * 2  # methods x words
    for row in rows:
        assert (
            row["target_score"] == pytest.approx(probs[row["target_index"]]) and 0 < row["target_score"] <= 1
        )
        assert (row["layer"] == "0") == (row["method"] != "attention"), row  # 2 decoder layers: the middle, 0
        assert row["layer"] is None or row["method"] != "attention"


def test_the_family_is_part_of_the_output_key(tmp_path: Path) -> None:
    """A family registered for the built-in's model type, run into the built-in's --out: its own outputs
    (another key, the family in the settings), not 'skipped: done by an earlier run'."""
    folder = save("llava", tmp_path / "llava")
    photo = write_image(tmp_path / "p.png", np.random.default_rng(5).integers(0, 256, (40, 40, 3), np.uint8))
    out = tmp_path / "out"
    args = ["vlm", str(photo), "--model", f"hf:{folder}", "--prompt", PROMPTS["llava"], "--answer", "a disc",
            "--method", "llavacam", "--out", str(out)]  # fmt: skip
    r = invoke(*args)
    assert r.exit_code == 0, r.stderr
    register_family(_Renamed())
    try:
        r = invoke(*args)
        assert r.exit_code == 0, r.stderr
    finally:
        unregister_family("test-llava")
    theirs, ours = records(out)
    assert ours["status"] == "ok" and theirs["status"] == "ok", ours
    assert (theirs["settings"]["family"], ours["settings"]["family"]) == ("llava", "test-llava")
    assert ours["key"] != theirs["key"] and not set(ours["outputs"]) & set(theirs["outputs"])


@pytest.mark.slow
def test_two_torchrun_ranks_write_the_manifest_one_process_writes(tmp_path: Path) -> None:
    folder = save("llava", tmp_path / "llava")
    _photos(tmp_path / "in", 4)
    (tmp_path / "in" / "broken.png").write_text("not a picture")
    args = ["-m", "hookviz", "vlm", "in", "--model", f"hf:{folder}", "--prompt", PROMPTS["llava"],
            "--max-new-tokens", "2", "--method", "llavacam,attention", "--save-raw",
            "--device", "cpu"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = run_cli([sys.executable, *args, "--out", "one"], cwd=tmp_path, env=env)
    two = run_cli([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   *args, "--out", "two", "--json"], cwd=tmp_path, env=env)  # fmt: skip
    assert one.returncode == two.returncode == 1, two.stderr  # broken.png failed; the others were done
    assert not list((tmp_path / "two").glob(".manifest.rank*"))

    def kept(out: str) -> list[dict[str, Any]]:
        recs = sorted(records(tmp_path / out), key=lambda rec: rec["input"])
        return [{k: v for k, v in rec.items() if k not in ("time", "outputs")} for rec in recs]

    assert kept("one") == kept("two") and len(kept("one")) == 5
    assert [json.loads(line)["input"] for line in two.stdout.splitlines()] == [
        rec["input"] for rec in records(tmp_path / "two")
    ]
    names = {out: sorted(p.name for p in (tmp_path / out).iterdir() if p.suffix in (".png", ".npy"))
             for out in ("one", "two")}  # fmt: skip
    drawn = sum(2 * len(rec["maps"]) + 1 for rec in records(tmp_path / "one") if rec["status"] == "ok")
    assert names["one"] == names["two"] and len(names["one"]) == drawn >= 4 * (2 * 2 + 1)
    for name in names["one"]:
        if name.endswith(".npy"):
            a, b = np.load(tmp_path / "one" / name), np.load(tmp_path / "two" / name)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_folder_without_its_tokenizer_or_processor_is_one_line_about_the_folder(
    family: str, tmp_path: Path
) -> None:
    """The model saved alone, or with its image processor and no tokenizer (an empty tokenizer loads in its
    place for some families): one line naming what the folder lacks and how to save it, exit 3, never a
    traceback or exit 70, and no photo read."""
    model, processor = build(family)
    bare, no_tokenizer = tmp_path / "bare", tmp_path / "notok"
    model.save_pretrained(bare)
    model.save_pretrained(no_tokenizer)
    processor.image_processor.save_pretrained(no_tokenizer)
    photo = write_image(tmp_path / "p.png", np.zeros((40, 50, 3), np.uint8))
    for folder, lacks in [(bare, "no image processor and no tokenizer"), (no_tokenizer, "no tokenizer")]:
        out = tmp_path / f"out-{folder.name}"
        r = invoke("vlm", str(photo), "--model", f"hf:{folder}", "--prompt", "what is this ?", "--answer",
                   "a disc", "--out", str(out))  # fmt: skip
        assert r.exit_code == 3, r.stderr
        assert r.stderr.strip().splitlines() == [
            f"hookviz: error: --model hf:{folder}: {lacks} beside the model (the folder holds no "
            + ("preprocessor_config.json or processor_config.json or " if folder == bare else "")
            + "tokenizer.json or tokenizer_config.json); save the model's own processor beside it with "
            "processor.save_pretrained(DIR)"
        ]
        assert not (out / "manifest.jsonl").exists()


def test_a_broken_processor_is_one_line_about_the_folder_before_any_photo(tmp_path: Path) -> None:
    """A PaliGemma processor saved without ``image_seq_length`` and a LLaVA tokenizer that does not know
    ``<image>``: one line about the folder, exit 3, before any photo (no record); another model type is
    refused naming the families hookviz vlm knows (exit 2)."""
    photos = [write_image(tmp_path / f"{n}.png", np.zeros((30, 45, 3), np.uint8)) for n in ("a", "b")]
    pali = save("paligemma", tmp_path / "pali")
    config = json.loads((pali / "processor_config.json").read_text())
    config.pop("image_seq_length", None)
    config.get("image_processor", {}).pop("image_seq_length", None)
    (pali / "processor_config.json").write_text(json.dumps(config))
    llava = save("llava", tmp_path / "llava")
    tok = json.loads((llava / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "<image>"]
    tok["model"]["vocab"]["<picture>"] = tok["model"]["vocab"].pop("<image>")  # id 4 is another word now
    (llava / "tokenizer.json").write_text(json.dumps(tok))
    cases = [
        (pali, PROMPTS["paligemma"], 3, "pali: its processor cannot make the model's inputs of a plain 64x48 "
         "photo and the prompt (TypeError: "),
        (llava, PROMPTS["llava"], 3, f"--model hf:{llava}: its tokenizer does not know the model's image "
         "token (id 4; it reads '<image>' as ["),
        (Path(__file__).parent / "fixtures" / "shapes_clip", "<image> a", 2, "clip is not a vision-language "
         "model hookviz vlm knows (it knows llava, llava-next, paligemma, qwen2-vl, idefics3, internvl)"),
    ]  # fmt: skip
    for folder, prompt, code, said in cases:
        out = tmp_path / f"out-{folder.name}"
        r = invoke("vlm", *map(str, photos), "--model", f"hf:{folder}", "--prompt", prompt, "--answer",
                   "a disc", "--out", str(out))  # fmt: skip
        assert r.exit_code == code and said in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (out / "manifest.jsonl").exists()


def test_a_map_with_nothing_in_it_has_no_peak_and_the_record_says_so(tmp_path: Path) -> None:
    """A map whose image tokens all score zero (TAM, where the interference takes off all of a word's
    evidence) or one value: its peak is null and the record's note names it; a map with something in it
    keeps its peak."""
    vlm = _vlm("llava")
    rgb = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    wm = explain_words(vlm, rgb, PROMPTS["llava"], answer="a disc", methods=("tokengrad", "tam"))
    wm.maps["tam"][1] = 0.0
    wm.maps["tokengrad"][0] = 0.25
    _, record = render_words(wm, rgb, "p.vlm", "llava", tokens=[0, 1])
    peaks = {(m["method"], m["token"]): m["peak"] for m in record["maps"]}
    assert peaks[("tam", 1)] is None and peaks[("tokengrad", 0)] is None
    assert peaks[("tam", 0)] is not None and peaks[("tokengrad", 1)] is not None
    assert all(0 <= x < 50 and 0 <= y < 40 for p in peaks.values() if p for x, y in [p])
    assert record["note"] == (
        "tokengrad of 'a' is flat (every image token 0.25); tam of 'disc' is zero everywhere: a map with "
        "nothing in it points nowhere, so its peak is null"
    )
    wm.maps["tam"][1, 3] = 1.0
    assert "note" not in render_words(wm, rgb, "p.vlm", "llava", tokens=[1])[1]
