"""Scores other than a class: ``--similar-to`` a reference photo and ``--prompt`` for image-text models, on
models trained here on the shapes; the wrappers leave the model as found and keep its layer names."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hookviz.engine.explain import explain
from hookviz.io.shapes import draw_shape, shape_mask
from tests.conftest import (
    evaluation_file,
    invoke,
    records,
    train_on_shapes,
    write_image,
)
from tests.shapes_net import ShapesNet

RAW = ["--input-size", "48", "--resize", "shorter", "--mean", "0,0,0", "--std", "1,1,1"]


def _scene(
    rng: np.random.Generator,
    left: int,
    right: int,
    h: int = 48,
    w: int = 96,
    radii: tuple[int, int] = (7, 10),
) -> tuple[np.ndarray, dict]:
    """A noisy ``h`` x ``w`` photo with shape ``left`` in its left half and ``right`` in its right half."""
    img = rng.normal(0.5, 0.15, (h, w, 3)).clip(0, 1)
    masks = {}
    for half, kind in ((0, left), (1, right)):
        r = int(rng.integers(*radii))
        room = max(0, min(6, w // 4 - r - 1))
        cy, cx = (
            int(rng.integers(r + 1, h - r - 1)),
            w // 4 + half * w // 2 + int(rng.integers(-room, room + 1)),
        )
        masks[kind] = shape_mask(kind, cy, cx, r, h, w)
        img[masks[kind]] = rng.uniform(0.8, 1.0, 3) if rng.random() < 0.5 else rng.uniform(0.0, 0.2, 3)
    return (img * 255).round().astype(np.uint8), masks


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """ShapesNet trained for a few seconds, 12 photos of a square beside a disc, reference photos."""
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("targets")
    save_file(train_on_shapes(ShapesNet(), 400).state_dict(), str(d / "net.safetensors"))
    rng = np.random.default_rng(5)
    (d / "scenes").mkdir()
    masks = {}
    for i in range(12):
        rgb, m = _scene(rng, *((0, 1) if i % 2 == 0 else (1, 0)))
        write_image(d / "scenes" / f"s{i:02d}.png", rgb)
        masks[f"s{i:02d}"] = m
    for kind, name in ((0, "square"), (1, "disc")):
        img, _ = draw_shape(kind, 48, rng)
        write_image(d / f"{name}.png", (img * 255).round().astype(np.uint8))
    return {"dir": d, "masks": masks}


@pytest.mark.parametrize(("reference", "kind"), [("disc", 1), ("square", 0)])
def test_similarity_to_a_reference_lights_up_the_shape_it_shows(
    shapes: dict, tmp_path: Path, reference: str, kind: int
) -> None:
    d: Path = shapes["dir"]  # type: ignore[assignment]
    out = tmp_path / "o"
    r = invoke("gradcam", str(d / "scenes"), "--model", "tests.shapes_net:make", "--weights",
               str(d / "net.safetensors"), *RAW, "--similar-to", str(d / f"{reference}.png"), "--save-raw",
               "--out", str(out), "-q")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    recs = records(out)
    assert len(recs) == 12
    other = 1 - kind
    for rec in recs:
        assert rec["target"]["name"] == f"similarity to {reference}.png"
        assert 0.0 < rec["target"]["score"] <= 1.0  # the cosine itself, not a softmax over one "class"
        m = np.load(next(o for o in rec["outputs"] if o.endswith(".full.npy")))
        masks = shapes["masks"][Path(rec["input"]).stem]  # type: ignore[index]
        assert m[masks[kind]].mean() > 3 * m[masks[other]].mean(), rec["input"]
        y, x = np.unravel_index(np.nanargmax(m), m.shape)
        near = [np.hypot(*(np.argwhere(masks[k]).mean(0) - (y, x))) for k in (0, 1)]
        assert int(np.argmin(near)) == kind, rec["input"]


def test_similarity_wrapper_keeps_names_and_leaves_the_model_as_found(shapes: dict) -> None:
    from hookviz.models.scores import similar_to
    from hookviz.tasks import load_model

    d: Path = shapes["dir"]  # type: ignore[assignment]
    loaded = load_model("tests.shapes_net:make", str(d / "net.safetensors"), input_size=48, resize="shorter",
                        mean=(0, 0, 0), std=(1, 1, 1))  # fmt: skip
    before = {n for n, _ in loaded.model.named_modules()}
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in loaded.model.modules())
    wrapped = similar_to(loaded, d / "disc.png")
    assert {n for n, _ in wrapped.model.named_modules()} == before  # layer4 stays layer4 (body, head here)
    x = torch.rand(2, 3, 48, 48)
    cos = wrapped.model(x)
    emb = loaded.model.body(x).mean(dim=(2, 3))
    ref = wrapped.model.reference
    torch.testing.assert_close(cos[:, 0], torch.nn.functional.cosine_similarity(emb, ref[None], dim=1))
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in loaded.model.modules()) == hooks
    # A deep copy (the sanity check randomises one) reads its own copy of the network.
    twin = copy.deepcopy(wrapped.model)
    torch.nn.init.zeros_(twin.head.weight)
    for p in twin.body.parameters():
        torch.nn.init.normal_(p)
    assert not torch.allclose(twin(x), cos) and torch.equal(wrapped.model(x), cos)
    # --embedding LAYER: that layer's output, averaged over positions.
    at_body = similar_to(loaded, d / "disc.png", "body.2")
    emb = loaded.model.body[:3](x).mean(dim=(2, 3))
    ref = at_body.model.reference
    torch.testing.assert_close(at_body.model(x)[:, 0], torch.nn.functional.cosine_similarity(emb, ref[None]))
    assert at_body.labels_id.endswith("body.2:output")


def test_similarity_runs_through_evaluate_and_sanity(shapes: dict, tmp_path: Path) -> None:
    d: Path = shapes["dir"]  # type: ignore[assignment]
    common = ["--model", "tests.shapes_net:make", "--weights", str(d / "net.safetensors"), *RAW,
              "--similar-to", str(d / "disc.png")]  # fmt: skip
    scenes = [str(p) for p in sorted((d / "scenes").iterdir())[:4]]
    r = invoke("evaluate", *scenes, *common, "--out", str(tmp_path / "e"), "-q", "--json")
    assert r.exit_code == 0, r.stderr
    rows = json.loads(evaluation_file(tmp_path / "e").read_text())
    row = next(r for r in (rows["rows"] if isinstance(rows, dict) else rows) if r["method"] == "gradcam")
    assert row["insertion_auc"] > row["deletion_auc"]
    r = invoke("sanity", *scenes[:2], *common, "--out", str(tmp_path / "s"), "-q")
    assert r.exit_code == 0, r.stderr


def test_target_options_refuse_in_one_line(shapes: dict, tmp_path: Path) -> None:
    d: Path = shapes["dir"]  # type: ignore[assignment]
    photo = str(d / "disc.png")
    base = ["gradcam", photo, "--model", "tests.shapes_net:make", "--weights", "none", *RAW, "--out",
            str(tmp_path / "o")]  # fmt: skip
    for extra, words in (
        (["--embedding", "body"], "give --similar-to too"),
        (["--prompt", "a disc"], "needs an image-text model"),
        (["--similar-to", str(d / "missing.png")], "cannot read it as an image"),
        (["--similar-to", photo, "--embedding", "nope"], "no such layer"),
        (["--similar-to", photo, "--prompt", "a disc"], "not both"),
    ):
        r = invoke(*base, *extra)
        assert r.exit_code == 2, (extra, r.stderr)
        assert words in r.stderr and len(r.stderr.strip().splitlines()) <= 2, (extra, r.stderr)


# -- image-text models: the CLIP of scripts/train_shapes_clip.py ---------------------------------------------

CLIP = Path(__file__).resolve().parent / "fixtures" / "shapes_clip"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """10 photos of 64 x 64, a square and a disc side by side (which side alternates), with their masks."""
    d = tmp_path_factory.mktemp("pairs")
    rng = np.random.default_rng(11)
    masks = {}
    for i in range(10):
        rgb, m = _scene(rng, *((0, 1) if i % 2 == 0 else (1, 0)), h=64, w=64, radii=(9, 12))
        write_image(d / f"p{i:02d}.png", rgb)
        masks[f"p{i:02d}"] = m
    return {"dir": d, "masks": masks}


def test_each_prompt_lights_up_the_shape_it_names() -> None:
    """20 photos of a square beside a disc: where the model sees both (its two likeliest of "a square",
    "a disc", "a cross" are those two), Chefer's map for "a square" is hotter on the square than on the disc,
    and the map for "a disc" on the disc, in 32 of 36 (photo, prompt) pairs (chance: half). Grad-CAM at the
    last block's input gets 25 and LeGrad 19 on this model: in the README, not asserted."""
    import torch.nn.functional as F

    from hookviz.models.scores import with_prompts
    from hookviz.tasks import load_model

    loaded = with_prompts(load_model(f"hf:{CLIP}"), ["a square", "a disc", "a cross"])
    rng = np.random.default_rng(3)
    xs, masks = [], []
    for i in range(20):
        rgb, m = _scene(rng, *((0, 1) if i % 2 == 0 else (1, 0)), h=64, w=64, radii=(9, 12))
        xs.append(torch.from_numpy(loaded.preprocess(rgb)[0]))
        masks.append(m)
    layer = "vision_model.encoder.layers.3.layer_norm1"
    ex = explain(loaded.model, torch.stack(xs), [layer], ["chefer"], [0, 1])
    seen = [i for i in range(20) if set(ex.probs[i].argsort(descending=True)[:2].tolist()) == {0, 1}]
    assert len(seen) >= 15
    right = 0
    for i in seen:
        for k in (0, 1):
            m = F.interpolate(
                ex.maps[("chefer", layer)][i : i + 1, k : k + 1], size=(64, 64), mode="bilinear"
            )
            right += int(m[0, 0][masks[i][k]].mean() > m[0, 0][masks[i][1 - k]].mean())
    assert right >= 0.75 * 2 * len(seen), (right, len(seen))


def test_prompts_file_top_k_and_refusals(pairs: dict, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a square\n\na photo of a disc\na cross\n")
    photo = str(next(iter(sorted(pairs["dir"].iterdir()))))  # type: ignore[union-attr]
    r = invoke("gradcam", photo, "--model", f"hf:{CLIP}", "--prompts", str(prompts), "--target", "top2",
               "--method", "rollout", "--out", str(tmp_path / "o"), "-q", "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    names = [m["target"]["name"] for m in rec["maps"]]
    assert sorted(names) == ["a photo of a disc", "a square"]  # the two shapes present, not the cross
    assert rec["predicted"]["name"] in names and rec["settings"]["labels"].startswith("prompts:")
    r = invoke("gradcam", photo, "--model", f"hf:{CLIP}", "--out", str(tmp_path / "n"))
    assert r.exit_code == 2 and "is an image-text model: give --prompt" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = invoke("summary", "--model", f"hf:{CLIP}", "--format", "json")  # the image tower, no prompt needed
    assert r.exit_code == 0, r.stderr


def test_similarity_on_an_image_text_model_uses_its_image_embedding(pairs: dict, tmp_path: Path) -> None:
    from hookviz.models.scores import similar_to
    from hookviz.tasks import load_model

    scenes = sorted(pairs["dir"].iterdir())  # type: ignore[union-attr]
    loaded = load_model(f"hf:{CLIP}")
    wrapped = similar_to(loaded, scenes[0])
    x = torch.randn(2, 3, 64, 64)
    clip = loaded.model.wrapped
    with torch.no_grad():
        image = clip.get_image_features(pixel_values=x)
        image = image if isinstance(image, torch.Tensor) else image.pooler_output
        got = wrapped.model(x)[:, 0]
    torch.testing.assert_close(
        got, torch.nn.functional.cosine_similarity(image, wrapped.model.reference[None])
    )
    r = invoke("gradcam", str(scenes[1]), "--model", f"hf:{CLIP}", "--similar-to", str(scenes[0]),
               "--method", "chefer", "--out", str(tmp_path / "o"), "-q", "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["target"]["name"] == f"similarity to {scenes[0].name}"


def test_a_siglip_folder_takes_prompts(tmp_path: Path) -> None:
    """SigLIP: a sigmoid model with a bias and an attention-pooling head (random weights, the fixture's
    tokenizer): prompts padded to the maximum length, every method family runs."""

    import transformers as t

    torch.manual_seed(0)
    config = t.SiglipConfig(
        text_config={"vocab_size": 13, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 8},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": 64, "patch_size": 8},
    )  # fmt: skip
    d = tmp_path / "siglip"
    t.SiglipModel(config).save_pretrained(d)
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(CLIP / name, d / name)
    photo = write_image(tmp_path / "p.png", np.random.default_rng(0).integers(0, 256, (64, 80, 3), np.uint8))
    r = invoke("gradcam", str(photo), "--model", f"hf:{d}", "--prompt", "a disc", "--prompt", "a square",
               "--method", "gradcam,rollout,chefer,legrad", "--save-raw", "--out", str(tmp_path / "o"), "-q",
               "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    assert all(m["finite"] for m in rec["maps"]) and len(rec["maps"]) == 4


# -- --target parsed once (hookviz/core/targets.py) ----------------------------------------------------------


def test_target_words_are_parsed_once_into_one_typed_value() -> None:
    from hookviz.core.targets import Classes, Labelled, Positive, Top, parse, said
    from hookviz.errors import TargetError

    names = ["cat", "dog", "tabby", "Tabby cat"]
    assert parse("top1", names, 4) == Top(1) and parse(" TOP3 ", names, 4) == Top(3)
    assert parse("dog,1, class 2 ,tabby", names, 4) == Classes((1, 2))  # each class once, in order
    assert (
        parse("positive", names, 4, threshold=0.3) == Positive(0.3) and parse("label", names, 4) == Labelled()
    )
    assert [said(t) for t in (Top(1), Top(5), Classes((3, 1)), Positive(0.5), Labelled())] == [
        "top1", "top5", [3, 1], {"positive": 0.5}, "label"
    ]  # fmt: skip
    for bad, why in (
        ("top5", "top1..top4"),
        ("top²", "top1..top4"),
        ("7", "out of range"),
        ("cow", "not a class"),
    ):
        with pytest.raises(TargetError, match=why):
            parse(bad, names, 4)
    with pytest.raises(TargetError, match="no class names"):
        parse("cat", None, 4)


def test_explain_takes_the_parsed_target_as_its_words_give_it() -> None:
    """``Top(2)`` and ``Classes`` reach the explain pass as they are; the Python API's words give the same."""
    from hookviz.core.targets import Classes, Top
    from hookviz.engine.explain import explain
    from tests.conftest import TinyCNN

    torch.manual_seed(0)
    model, x = TinyCNN().eval(), torch.rand(3, 3, 32, 32)
    typed = explain(model, x, ["features"], ["gradcam"], Top(2))
    words = explain(model, x, ["features"], ["gradcam"], "top2")
    order = typed.probs.argsort(dim=1, descending=True)[:, :2]
    assert torch.equal(typed.targets, order) and torch.equal(words.targets, order)
    torch.testing.assert_close(typed.maps[("gradcam", "features")], words.maps[("gradcam", "features")])
    chosen = explain(model, x, ["features"], ["gradcam"], Classes((1, 0)))
    assert chosen.targets.tolist() == [[1, 0]] * 3


RANDOM_64 = ["--weights", "none", "--input-size", "64", "--device", "cpu"]


def test_superscript_target_is_a_usage_error(two_photos: Path, tmp_path: Path) -> None:
    r = invoke("gradcam", str(two_photos), *RANDOM_64, "--target", "²", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "Traceback" not in r.stderr and "internal error" not in r.stderr


TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]


def test_top3_records_every_class_explained(labelled_photos: Path, tmp_path: Path) -> None:
    r = invoke("gradcam", str(labelled_photos / "p0.png"), *TINY, "--target", "top3", "--out",
               str(tmp_path / "o"), "--json", "-q")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout.splitlines()[0])
    assert [t["index"] for t in rec["targets"]] == [m["target"]["index"] for m in rec["maps"]][:3]
    assert len({t["index"] for t in rec["targets"]}) == 3 and rec["targets"][0] == rec["target"]
    scores = [t["score"] for t in rec["targets"]]
    assert scores == sorted(scores, reverse=True)


def test_top_k_on_a_model_of_one_output_says_there_is_one_value(tmp_path: Path) -> None:
    from tests.test_heads import REGRESSOR

    photo = write_image(tmp_path / "p.png", np.random.default_rng(1).integers(0, 256, (32, 32, 3), np.uint8))
    args = ["--model", REGRESSOR, "--weights", "DEFAULT", "--input-size", "32", "--head", "raw"]
    r = invoke("gradcam", str(photo), *args, "--target", "top3", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "has one output, so there is one value to explain" in r.output, r.output
    assert "top1..top1" not in r.output
    assert (
        invoke("gradcam", str(photo), *args, "--target", "top1", "--out", str(tmp_path / "o")).exit_code == 0
    )
