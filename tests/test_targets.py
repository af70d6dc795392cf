"""Scores other than a class: ``--similar-to`` a reference photo and ``--prompt`` for image-text models, on
models trained here on the shapes; the wrappers leave the model as found and keep its layer names."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hookviz.shapes import draw_shape, shape_mask
from tests.conftest import invoke, records, train_on_shapes, write_image
from tests.shapes_net import ShapesNet

RAW = ["--input-size", "48", "--resize", "shorter", "--mean", "0,0,0", "--std", "1,1,1"]


def _scene(
    rng: np.random.Generator, left: int, right: int, h: int = 48, w: int = 96
) -> tuple[np.ndarray, dict]:
    """A noisy ``h`` x ``w`` photo with shape ``left`` in its left half and ``right`` in its right half."""
    img = rng.normal(0.5, 0.15, (h, w, 3)).clip(0, 1)
    masks = {}
    for half, kind in ((0, left), (1, right)):
        r = int(rng.integers(7, 10))
        cy, cx = int(rng.integers(r + 1, h - r - 1)), w // 4 + half * w // 2 + int(rng.integers(-6, 7))
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
    from hookviz.models import load_model
    from hookviz.targets import similar_to

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


def test_similarity_runs_through_evaluate_and_sanity(shapes: dict, tmp_path: Path) -> None:
    d: Path = shapes["dir"]  # type: ignore[assignment]
    common = ["--model", "tests.shapes_net:make", "--weights", str(d / "net.safetensors"), *RAW,
              "--similar-to", str(d / "disc.png")]  # fmt: skip
    scenes = [str(p) for p in sorted((d / "scenes").iterdir())[:4]]
    r = invoke("evaluate", *scenes, *common, "--out", str(tmp_path / "e"), "-q", "--json")
    assert r.exit_code == 0, r.stderr
    rows = json.loads((tmp_path / "e" / "evaluation.json").read_text())
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
