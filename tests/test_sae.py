"""``hookviz sae``: sparse dictionaries of a layer trained from live hooks. A planted dictionary is recovered;
the quality figures equal an independent NumPy computation; an interrupted run resumes to the dictionary an
uninterrupted one gives; bad input is one line and exit 2."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.errors import UsageError
from hookviz.io.inputs import expand_inputs, read_input
from hookviz.io.shapes import draw_shape
from hookviz.sae import api, dictionary, interchange, store, views
from hookviz.sae.api import load_sae, train_sae
from hookviz.sae.dictionary import Shape
from hookviz.sae.training import TrainSettings, train_vectors
from hookviz.sae.vectors import readable
from tests.conftest import PATIENCE, Trained, invoke, run_cli, started, tiny_loaded, write_image

ROOT = Path(__file__).resolve().parent.parent

LAYER = "features.10"  # the last ReLU of TinyCNN: (B, 64, 12, 12) for a 48-pixel input
#: Small, fast settings for the shapes model (every figure below is seeded).
QUICK = TrainSettings(width="2x", k=8, vectors=12_000, batch=256, lr=2e-3, buffer=2048, checkpoint_every=10)


@pytest.fixture(scope="module")
def shapes_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """36 photos of one shape each (squares, discs, crosses in turn), 48 pixels."""
    root = tmp_path_factory.mktemp("shapes")
    rng = np.random.default_rng(5)
    for i in range(36):
        img, _ = draw_shape(i % 3, 48, rng)
        write_image(root / f"s{i:02d}.png", (img * 255).round().astype(np.uint8))
    return root


@pytest.fixture(scope="module")
def weights(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "shapes.pt"
    torch.save(trained.model.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def run(trained: Trained, shapes_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dictionary of the shapes model's last map, trained through the library call."""
    folder = tmp_path_factory.mktemp("sae") / "run"
    done = train_sae(tiny_loaded(trained.model), expand_inputs([str(shapes_folder)]), LAYER, folder, QUICK)
    assert done.status == "trained"
    return folder


def _cli(weights: Path, tmp: Path) -> list[str]:
    labels = tmp / "labels.txt"
    labels.write_text("square\ndisc\ncross\n")
    return ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--labels", str(labels),
            "--input-size", "48", "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1",
            "--device", "cpu"]  # fmt: skip


def test_a_planted_dictionary_is_recovered() -> None:
    """Vectors made of 3 of 64 known unit atoms (magnitudes 0.5 to 1.5) plus noise and an offset: a TopK
    dictionary of 128 features finds at least 90 % of the atoms at cosine 0.9 or more."""
    g = torch.Generator().manual_seed(0)
    d, n_atoms, k, n = 32, 64, 3, 20_000
    atoms = torch.randn(n_atoms, d, generator=g)
    atoms /= atoms.norm(dim=1, keepdim=True)
    picked = torch.stack([torch.randperm(n_atoms, generator=g)[:k] for _ in range(n)])
    codes = torch.zeros(n, n_atoms).scatter(1, picked, torch.rand(n, k, generator=g) + 0.5)
    x = codes @ atoms + 0.01 * torch.randn(n, d, generator=g) + 0.3
    settings = TrainSettings(arch="topk", k=k, vectors=256 * 300, batch=256, lr=3e-3)
    sae, _, progress = train_vectors(x, Shape("topk", d, 128, k), settings)
    best = (atoms @ dictionary.dictionary_of(sae).T).max(1).values
    assert float((best >= 0.9).float().mean()) >= 0.9, best
    assert settings.vectors <= progress.seen < settings.vectors + settings.batch


def _numpy_stats(x: np.ndarray, x_hat: np.ndarray, z: np.ndarray) -> dict[str, float]:
    fired = z > 0
    rate = fired.mean(0)
    return {
        "explained_variance": 1 - ((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum(),
        "l0": fired.sum(1).mean(),
        "dead": (rate == 0).mean(),
        "dense": (rate > 0.1).mean(),
    }


def test_metrics_equal_a_numpy_computation(trained: Trained, run: Path, shapes_folder: Path) -> None:
    """metrics.json's code figures are those of NumPy over the same vectors; the model-level ones are those of
    a forward hook written here (top-1 agreement, change in cross-entropy)."""
    found = load_sae(run, tiny_loaded(trained.model))
    metrics = json.loads((run / store.METRICS).read_text())
    photos = sorted(shapes_folder.glob("*.png"))
    x = torch.stack(
        [torch.from_numpy(np.asarray(_rgb(p), np.float32) / 255).permute(2, 0, 1) for p in photos]
    )
    kept: list[torch.Tensor] = []
    model = trained.model.eval()
    module = dict(model.named_modules())[LAYER]
    handle = module.register_forward_hook(lambda m, a, o: kept.append(o.detach().clone()))
    with torch.no_grad():
        logits = model(x)
    handle.remove()
    v = kept[0].permute(0, 2, 3, 1).reshape(-1, kept[0].shape[1])
    vn = found.norm.apply(v)
    with torch.no_grad():
        z = dictionary.encode(found.sae, vn)
        hat = dictionary.decode(found.sae, z)
    want = _numpy_stats(vn.numpy().astype(np.float64), hat.numpy().astype(np.float64), z.numpy())
    for key, value in want.items():
        assert metrics[key] == pytest.approx(float(value), abs=1e-4), key
    assert metrics["vectors"] == v.shape[0] and metrics["inputs"] == len(photos)
    rec = found.norm.undo(hat).reshape(kept[0].shape[0], 12, 12, -1).permute(0, 3, 1, 2)
    swap = module.register_forward_hook(lambda m, a, o: rec)
    with torch.no_grad():
        replaced = model(x)
    swap.remove()
    label = logits.argmax(1)
    agree = float((replaced.argmax(1) == label).float().mean())
    ce = torch.nn.functional.cross_entropy
    delta = float(ce(replaced, label) - ce(logits, label))
    assert metrics["top1_agreement"] == pytest.approx(agree, abs=1e-6)
    assert metrics["delta_ce"] == pytest.approx(delta, abs=1e-5)
    assert metrics["explained_variance"] > 0.8 and metrics["l0"] == pytest.approx(8.0)


def _rgb(path: Path) -> Any:
    from PIL import Image

    return Image.open(path).convert("RGB")


def test_an_interrupted_run_resumes_to_the_same_dictionary(
    trained: Trained, shapes_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed after its second checkpoint (the third never written) resumes from it and ends with the
    dictionary of a run never interrupted; the resumed run says so; a finished run is not trained again."""
    loaded, items = tiny_loaded(trained.model), expand_inputs([str(shapes_folder)])
    whole = train_sae(loaded, items, LAYER, tmp_path / "whole", QUICK)
    real, calls = store.save_checkpoint, []

    def killed(folder: Path, state: dict[str, Any]) -> None:
        calls.append(state["step"])
        if len(calls) == 3:
            raise KeyboardInterrupt  # the process dies here
        real(folder, state)

    monkeypatch.setattr(store, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        train_sae(loaded, items, LAYER, tmp_path / "cut", QUICK)
    monkeypatch.setattr(store, "save_checkpoint", real)
    assert (tmp_path / "cut" / store.CHECKPOINT).is_file() and not (tmp_path / "cut" / store.WEIGHTS).exists()
    again = train_sae(loaded, items, LAYER, tmp_path / "cut", QUICK)
    assert again.status == "resumed" and whole.status == "trained"
    from safetensors.torch import load_file

    a, b = (
        load_file(str(tmp_path / "whole" / store.WEIGHTS)),
        load_file(str(tmp_path / "cut" / store.WEIGHTS)),
    )
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)
    assert again.metrics["explained_variance"] == pytest.approx(whole.metrics["explained_variance"], abs=1e-5)
    assert train_sae(loaded, items, LAYER, tmp_path / "cut", QUICK).status == "skipped"


def test_the_command_trains_and_refuses_bad_input(
    trained: Trained, weights: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """hookviz sae train writes the run folder and prints its figures; a pooled layer, an impossible k or
    width, a run folder of another model, a count past the counters' bound, --out the photos' folder or
    empty, and an empty --cache are each one line and exit 2, writing nothing."""
    model = _cli(weights, tmp_path)
    out = tmp_path / "run"
    quick = ["--width", "2x", "--k", "8", "--vectors", "3000", "--batch", "256", "--buffer", "2048"]
    res = invoke("sae", "train", str(shapes_folder), *model, "--layer", LAYER, *quick, "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "explained variance" in res.stdout and "top-1 agreement" in res.stdout
    config = json.loads((out / store.CONFIG).read_text())
    assert (config["arch"], config["d"], config["width"], config["k"]) == ("topk", 64, 128, 8)
    assert config["status"] == "finished" and config["norm"]["scale"] > 0
    assert config["fingerprint"] == store.fingerprint(trained.model)
    again = invoke("sae", "train", str(shapes_folder), *model, "--layer", LAYER, *quick, "--out", str(out))
    assert again.exit_code == 0 and "skipped" in again.stdout

    other = torch.nn.Module()
    other_weights = tmp_path / "other.pt"
    state = {k: v + 0.01 if v.is_floating_point() else v for k, v in trained.model.state_dict().items()}
    torch.save(state, other_weights)
    del other
    bad = {
        "pooled": [*model, "--layer", "pool", *quick, "--out", str(tmp_path / "a")],
        "k": [*model, "--layer", LAYER, "--width", "16", "--k", "16", "--out", str(tmp_path / "b")],
        "width": [*model, "--layer", LAYER, "--width", "wide", "--out", str(tmp_path / "c")],
        "model": [*_cli(other_weights, tmp_path), "--layer", LAYER, *quick, "--out", str(out)],
        "buffer": [*model, "--layer", LAYER, *quick, "--buffer", "100", "--out", str(tmp_path / "d")],
        "huge": [*model, "--layer", LAYER, "--width", "100000000x", "--out", str(tmp_path / "e")],
        "vectors": [*model, "--layer", LAYER, *quick, "--vectors", "9" * 23, "--out", str(tmp_path / "f")],
        "out=inputs": [*model, "--layer", LAYER, *quick, "--out", str(shapes_folder), "--cache", "auto"],
        "out empty": [*model, "--layer", LAYER, *quick, "--out", ""],
        "cache empty": [*model, "--layer", LAYER, *quick, "--out", str(tmp_path / "g"), "--cache", ""],
    }
    before = sorted(p.name for p in shapes_folder.iterdir())
    for what, args in bad.items():
        res = invoke("sae", "train", str(shapes_folder), *args)
        assert res.exit_code == 2, (what, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, (what, lines)
    assert not any((tmp_path / name).exists() for name in "abdefg")
    assert sorted(p.name for p in shapes_folder.iterdir()) == before
    assert not (Path.cwd() / store.CONFIG).exists()


def _kinds(folder: Path) -> dict[str, int]:
    return {str(p): int(p.stem[1:]) % 3 for p in sorted(folder.glob("*.png"))}


def _inputs(folder: Path) -> tuple[list[str], torch.Tensor]:
    names = sorted(str(p) for p in folder.glob("*.png"))
    x = torch.stack(
        [torch.from_numpy(np.asarray(_rgb(Path(n)), np.float32) / 255).permute(2, 0, 1) for n in names]
    )
    return names, x


def test_a_class_loses_more_to_its_strongest_features_than_to_random_ones(
    trained: Trained, run: Path, shapes_folder: Path
) -> None:
    """Per shape, its 5 features of highest mean code over its photos, zeroed together in the reconstruction,
    lower its logit at least 3x more than 5 random features do (the mean of 10 seeded draws)."""
    from hookviz.sae import features

    found = load_sae(run, tiny_loaded(trained.model))
    names, x = _inputs(shapes_folder)
    kinds = torch.tensor([_kinds(shapes_folder)[n] for n in names])
    maps = features.code_maps(found, trained.model, x)
    rng = np.random.default_rng(0)
    for c in range(3):
        mine = x[kinds == c]
        strongest = maps[kinds == c].mean((0, 2, 3)).argsort(descending=True)[:5].tolist()
        drop = -float(features.edited(found, trained.model, mine, features.scaled(strongest, 0.0))[c])
        draws = [rng.choice(found.shape.width, 5, replace=False).tolist() for _ in range(10)]
        random = np.mean(
            [-float(features.edited(found, trained.model, mine, features.scaled(r, 0.0))[c]) for r in draws]
        )
        assert drop > 0 and drop >= 3 * random, (c, drop, random)


def test_features_top_patches_sheets_and_explain(
    trained: Trained, weights: Path, run: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """sae features: every feature's top patches name an input and a box inside its 48-pixel photo, the
    detailed ones have a sheet and the classes their ablation lowers; for each shape a feature's top patches
    are at least 90 % that shape. sae explain: a picture per photo, the probabilities moved by an ablation."""
    model = _cli(weights, tmp_path)
    res = invoke("sae", "features", str(run), str(shapes_folder), *model, "--detail", "6")
    assert res.exit_code == 0, res.output
    data = json.loads((run / "features" / "features.json").read_text())
    assert data["inputs"] == 36 and len(data["features"]) == 128
    kinds = _kinds(shapes_folder)
    purest = {c: 0.0 for c in range(3)}
    for f in data["features"]:
        for p in f["top"]:
            x0, y0, x1, y1 = p["box"]
            assert 0 <= x0 < x1 <= 48 and 0 <= y0 < y1 <= 48 and p["input"] in kinds
        if len(f["top"]) == 8:
            share = np.bincount([kinds[p["input"]] for p in f["top"]], minlength=3) / 8
            purest[int(share.argmax())] = max(purest[int(share.argmax())], float(share.max()))
        assert sum(f["histogram"]["counts"]) == 36 * 144
    assert all(v >= 0.9 for v in purest.values()), purest
    detailed = [f for f in data["features"] if "sheet" in f]
    assert len(detailed) == 6 and all(len(f["classes"]) == 3 for f in detailed)
    for f in detailed:
        picture = _rgb(run / f["sheet"])
        assert picture.size[0] > 100
    f0 = detailed[0]["feature"]
    out = tmp_path / "explained"
    photo = sorted(shapes_folder.glob("*.png"))[0]
    res = invoke("sae", "explain", str(photo), "--sae", str(run), *model, "--feature", str(f0), "--json",
                 "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(record["picture"]).is_file() and record["features"]
    moved = record["scaled"]["classes"]
    assert len(moved) == 3 and abs(sum(c["before"] for c in moved) - 1) < 1e-4
    bad = invoke(
        "sae", "explain", str(photo), "--sae", str(run), *model, "--feature", "999", "--out", str(out)
    )
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1


def _foreign(d: int, width: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w_dec = torch.randn(width, d, generator=g)
    return {
        "W_enc": torch.randn(d, width, generator=g) / d**0.5,
        "b_enc": torch.randn(width, generator=g) * 0.1,
        "W_dec": w_dec / w_dec.norm(dim=1, keepdim=True) * 0.7,
        "b_dec": torch.randn(d, generator=g),
    }


@pytest.mark.parametrize("kind", ["prisma", "saev"])
def test_vit_prisma_and_saev_files_are_read(trained: Trained, kind: str, tmp_path: Path) -> None:
    """A ViT-Prisma folder (config.json, weights.pt; TopK 6) and a saev file (header line then the state dict;
    ReLU) written here are imported; the dictionary reconstructs vectors as their own formula does."""
    from hookviz.sae.api import import_sae

    t = _foreign(64, 96, seed=1 if kind == "prisma" else 2)
    if kind == "prisma":
        path = tmp_path / "prisma"
        path.mkdir()
        cfg = {"d_in": 64, "d_sae": 96, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 6},
               "architecture": "standard", "normalize_activations": "none"}  # fmt: skip
        (path / "config.json").write_text(json.dumps(cfg))
        torch.save(t, path / "weights.pt")
    else:
        path = tmp_path / "sae.pt"
        header = {
            "schema": 2,
            "cfg": {"d_vit": 64, "exp_factor": 1.5, "activation": {"cls": "Relu", "params": {}}},
        }
        with open(path, "wb") as f:
            f.write((json.dumps(header) + "\n").encode())
            torch.save(t, f)
    found = import_sae(path, kind, tiny_loaded(trained.model), LAYER, tmp_path / "run")
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(3)) + 1
    pre = ((x - t["b_dec"]) if kind == "prisma" else x) @ t["W_enc"] + t["b_enc"]
    codes = torch.relu(pre)
    if kind == "prisma":
        top = codes.topk(6, dim=1)
        codes = torch.zeros_like(codes).scatter(1, top.indices, top.values)
    want = codes @ t["W_dec"] + t["b_dec"]
    with torch.no_grad():
        z = dictionary.encode(found.sae, found.norm.apply(x))
        got = found.norm.undo(dictionary.decode(found.sae, z))
    torch.testing.assert_close(z, codes, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    wrong = tmp_path / "wrong"
    with pytest.raises(UsageError, match="64-wide"):
        import_sae(path, kind, tiny_loaded(trained.model), "features.6", wrong)


def test_features_and_explain_take_the_model_options_from_the_run(
    trained: Trained, weights: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """A run trained through the command keeps its model options in config.json: sae features and explain
    given only the run folder load that model (the features equal those with the options repeated); options
    given again are checked against the run's fingerprint (other weights: one line, exit 2)."""
    model = _cli(weights, tmp_path)
    out = tmp_path / "run"
    quick = ["--width", "2x", "--k", "8", "--vectors", "3000", "--batch", "256", "--buffer", "2048"]
    res = invoke("sae", "train", str(shapes_folder), *model, "--layer", LAYER, *quick, "--out", str(out))
    assert res.exit_code == 0, res.output
    options = json.loads((out / store.CONFIG).read_text())["options"]
    assert options["model"] == "tests.conftest:TinyCNN" and options["weights"] == str(weights.resolve())
    assert str(options["input_size"]) == "48" and options["resize"] == "squash"
    assert options["mean"] == [0, 0, 0] and "device" not in options
    alone = invoke("sae", "features", str(out), str(shapes_folder), "--detail", "2", "--device", "cpu")
    assert alone.exit_code == 0, alone.output
    first = json.loads((out / "features" / "features.json").read_text())
    repeated = invoke("sae", "features", str(out), str(shapes_folder), *model, "--detail", "2")
    assert repeated.exit_code == 0, repeated.output
    second = json.loads((out / "features" / "features.json").read_text())
    assert first["inputs"] == 36 and [f["top"] for f in first["features"]] == [
        f["top"] for f in second["features"]
    ]
    photo = sorted(shapes_folder.glob("*.png"))[0]
    told = invoke("sae", "explain", str(photo), "--sae", str(out), "--feature", "0", "--json",
                  "--device", "cpu", "--out", str(tmp_path / "e"))  # fmt: skip
    assert told.exit_code == 0, told.output
    moved = json.loads(told.stdout.strip().splitlines()[-1])["scaled"]["classes"]
    assert {c["name"] for c in moved} <= {"square", "disc", "cross"}
    state = {k: v + 0.01 if v.is_floating_point() else v for k, v in trained.model.state_dict().items()}
    torch.save(state, tmp_path / "other.pt")
    other = invoke("sae", "features", str(out), str(shapes_folder), "--weights", str(tmp_path / "other.pt"))
    assert other.exit_code == 2 and "another model" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1


def test_quality_is_measured_on_held_out_inputs(
    trained: Trained, shapes_folder: Path, tmp_path: Path
) -> None:
    """--eval 0.25 keeps the last 9 of the 36 photos out of training (the stream never reads them) and
    measures the quality on those 9: the explained variance equals NumPy's over their vectors; metrics.json
    says so."""
    loaded, items = tiny_loaded(trained.model), expand_inputs([str(shapes_folder)])
    read: list[str] = []
    real, real_each = api.read_batch, api.read_each

    def spy(chunk: Any, *args: Any) -> Any:
        read.extend(item.name for item in chunk)
        return real(chunk, *args)

    def spy_each(chunk: Any, *args: Any) -> Any:
        read.extend(item.name for item in chunk)
        return real_each(chunk, *args)

    settings = dataclasses.replace(QUICK, vectors=3000, eval=0.25)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "read_batch", spy)
        mp.setattr(api, "read_each", spy_each)
        done = train_sae(loaded, items, LAYER, tmp_path / "run", settings)
    held = {item.name for item in items[27:]}
    m = done.metrics
    assert (m["evaluated_on"], m["held_out_inputs"], m["inputs"], m["vectors"]) == ("held_out", 9, 9, 9 * 144)
    assert held <= set(read)  # read for the evaluation ...
    assert read.count(items[30].name) == 1  # ... once, and never by the training stream
    found = load_sae(tmp_path / "run", loaded)
    _, x = _inputs(shapes_folder)
    kept: list[torch.Tensor] = []
    handle = dict(trained.model.named_modules())[LAYER].register_forward_hook(
        lambda mod, a, o: kept.append(o.detach().clone())
    )
    with torch.no_grad():
        trained.model.eval()(x[27:])
    handle.remove()
    vn = found.norm.apply(kept[0].permute(0, 2, 3, 1).reshape(-1, kept[0].shape[1]))
    with torch.no_grad():
        z = dictionary.encode(found.sae, vn)
        hat = dictionary.decode(found.sae, z)
    want = _numpy_stats(vn.numpy().astype(np.float64), hat.numpy().astype(np.float64), z.numpy())
    assert m["explained_variance"] == pytest.approx(float(want["explained_variance"]), abs=1e-4)
    with pytest.raises(UsageError, match="--eval"):
        train_sae(loaded, items[:1], LAYER, tmp_path / "none", dataclasses.replace(settings, eval=0.5))


VIT = ["--model", f"{Path(__file__).parent.parent / 'examples' / 'shapes_vit.py'}:make_vit", "--weights",
       str(Path(__file__).parent / "fixtures" / "shapes_vit.safetensors"), "--input-size", "64", "--resize",
       "squash", "--mean", "0,0,0", "--std", "1,1,1", "--device", "cpu"]  # fmt: skip
VIT_LAYER = "encoder.layers.encoder_layer_2"  # (B, 1 + 8 x 8, 64): the class token, then the patch tokens


@pytest.mark.slow
def test_a_vit_s_patch_tokens_are_the_vectors_and_their_patches_the_boxes(tmp_path: Path) -> None:
    """The shapes ViT (a class token, then 8 x 8 patch tokens of 64): sae train takes 64 vectors per photo
    (the class token left out, and passed through the reconstruction unchanged); sae features' boxes are
    the 8-pixel patch of the token's cell; sae explain maps the 8 x 8 grid onto a 64 x 80 photo (--save-raw),
    its peak in the peak token's patch."""
    from hookviz.sae import features, quality

    rng = np.random.default_rng(7)
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(12):
        img, _ = draw_shape(i % 3, 64, rng)
        write_image(photos / f"s{i:02d}.png", (img * 255).round().astype(np.uint8))
    out = tmp_path / "run"
    quick = ["--width", "2x", "--k", "8", "--vectors", "3000", "--batch", "256", "--buffer", "1024"]
    res = invoke("sae", "train", str(photos), *VIT, "--layer", VIT_LAYER, *quick, "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    metrics = json.loads(res.stdout.strip().splitlines()[-1])
    assert (metrics["inputs"], metrics["vectors"]) == (12, 12 * 64) and metrics["top1_agreement"] is not None
    config = json.loads((out / store.CONFIG).read_text())
    assert config["layout"] == {"kind": "tokens", "prefix": 1, "grid": [8, 8]} and config["d"] == 64
    res = invoke("sae", "features", str(out), str(photos), "--detail", "3", "--device", "cpu")
    assert res.exit_code == 0, res.output
    data = json.loads((out / "features" / "features.json").read_text())
    assert data["field"] == [8, 8] and data["inputs"] == 12
    for f in data["features"]:
        for p in f["top"]:
            r, c = p["cell"]
            assert p["box"] == [8 * c, 8 * r, 8 * c + 8, 8 * r + 8], p
        assert sum(f["histogram"]["counts"]) == 12 * 64
    from hookviz.report import build_report

    page = build_report(out).read_text()  # the report's feature view of this run
    sheets = [f["sheet"] for f in data["features"] if "sheet" in f]
    assert len(sheets) == 3 and all(f'src="{s}"' in page for s in sheets)
    loaded = _vit_loaded()
    found = load_sae(out, loaded)
    x = torch.from_numpy(np.asarray(_rgb(photos / "s00.png"), np.float32) / 255).permute(2, 0, 1)[None]
    from hookviz.sae.vectors import layer_output

    tokens = layer_output(loaded.model, VIT_LAYER, x)
    with torch.no_grad():
        rebuilt = quality.reconstruct(found, tokens)
    assert torch.equal(rebuilt[:, 0], tokens[:, 0]) and not torch.allclose(rebuilt[:, 1:], tokens[:, 1:])
    wide = write_image(tmp_path / "wide.png", np.asarray(_rgb(photos / "s01.png").resize((80, 64))))
    res = invoke("sae", "explain", str(wide), "--sae", str(out), "--save-raw", "--json", "--device", "cpu",
                 "--out", str(tmp_path / "ex"))  # fmt: skip
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout.strip().splitlines()[-1])
    raw = np.load(record["raw"])
    assert record["grid"] == [8, 8] and record["size"] == [64, 80] and raw.shape == (3, 64, 80)
    squash = dataclasses.replace(loaded.preprocess, resize="squash")  # as the command's --resize squash
    _, wx, _ = read_input(expand_inputs([str(wide)])[0], squash, 10**8)
    maps = features.code_maps(found, loaded.model, torch.as_tensor(wx)[None])[0]
    for j, entry in enumerate(record["features"]):
        code = maps[entry["feature"]]
        assert entry["peak"] == pytest.approx(float(code.max()), rel=1e-4)
        r, c = divmod(int(code.argmax()), 8)
        y, x_ = np.unravel_index(raw[j].argmax(), raw[j].shape)
        assert (y // 8, x_ // 10) == (r, c) and 0.7 * entry["peak"] <= raw[j].max() <= entry["peak"] + 1e-4


def _vit_loaded() -> Any:
    import sys

    from safetensors.torch import load_file

    sys.path.insert(0, str(Path(__file__).parent.parent))
    from examples.shapes_vit import make_vit

    model = make_vit()
    model.load_state_dict(load_file(str(Path(__file__).parent / "fixtures" / "shapes_vit.safetensors")))
    return tiny_loaded(model.eval(), 64)


@pytest.mark.parametrize(("family", "prefix"), [("llava", 1), ("paligemma", 0)])
@pytest.mark.slow
def test_a_vision_language_model_s_vision_tower(family: str, prefix: int, tmp_path: Path) -> None:
    """A tiny LLaVA (a CLIP tower: a class token, then 8 x 8 patch tokens) and PaliGemma (SigLIP: patch
    tokens only), saved and loaded as hookviz loads them (--model hf:DIR): a block of the vision tower is the
    layer; 64 vectors per photo; the model's output is an image embedding, not class scores, so the quality
    gives its cosine with the reconstruction in place (below 1: the tower's output does change) and no top-1;
    sae features' boxes lie within the part of each photo the model saw; explain maps the 8 x 8 grid onto
    the photo and, for a scaled feature, gives the embedding's cosine and no classes."""
    pytest.importorskip("transformers")
    from tests.vlm_models import save

    folder = save(family, tmp_path / family)
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(4)
    sizes = [(57, 95), (64, 64), (90, 70), (48, 80), (64, 64), (70, 56)]
    for i, (h, w) in enumerate(sizes):
        write_image(photos / f"p{i}.png", rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    model = ["--model", f"hf:{folder}", "--weights", "DEFAULT", "--device", "cpu"]
    out, layer = tmp_path / "run", "vision_tower.encoder.layers.1"
    quick = ["--width", "4x", "--k", "4", "--vectors", "1500", "--batch", "128", "--buffer", "384"]
    res = invoke("sae", "train", str(photos), *model, "--layer", layer, *quick, "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    metrics = json.loads(res.stdout.strip().splitlines()[-1])
    assert (metrics["inputs"], metrics["vectors"]) == (6, 6 * 64)
    assert metrics["top1_agreement"] is None and metrics["delta_ce"] is None
    assert 0 < metrics["output_cosine"] < 0.999
    config = json.loads((out / store.CONFIG).read_text())
    assert config["layout"] == {"kind": "tokens", "prefix": prefix, "grid": [8, 8]} and config["width"] == 128
    res = invoke("sae", "features", str(out), str(photos), "--detail", "2", "--device", "cpu")
    assert res.exit_code == 0, res.output
    data = json.loads((out / "features" / "features.json").read_text())
    assert data["inputs"] == 6 and data["field"] == [8, 8]
    _boxes_within_their_photos(data, sizes)
    assert all("classes" not in f for f in data["features"])
    res = invoke("sae", "explain", str(photos / "p0.png"), "--sae", str(out), "--feature", "0", "--save-raw",
                 "--json", "--device", "cpu", "--out", str(tmp_path / "ex"))  # fmt: skip
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout.strip().splitlines()[-1])
    assert record["grid"] == [8, 8] and np.load(record["raw"]).shape == (len(record["features"]), 57, 95)
    assert record["scaled"]["classes"] == [] and -1 <= record["scaled"]["output_cosine"] <= 1


@pytest.mark.parametrize(
    ("family", "layer", "prefix", "grid"),
    [
        ("llava-next", "vision_tower.encoder.layers.1", 1, [4, 4]),
        ("idefics3", "vision_model.encoder.layers.1", 0, [8, 8]),
        ("internvl", "vision_tower.encoder.layer.1", 1, [4, 4]),
    ],
)
@pytest.mark.slow
def test_the_towers_of_llava_next_idefics3_and_internvl(
    family: str, layer: str, prefix: int, grid: list[int], tmp_path: Path
) -> None:
    """LLaVA-NeXT (its base view: a CLIP tower of 32 px, a class token, then 4 x 4 patches), Idefics3 (its
    global view: 8 x 8 patches, no class token) and InternVL (one tile of 32 px: a class token, 4 x 4):
    sae train takes the patch tokens of one view per photo as the vectors, the quality gives the image
    embedding's cosine with the reconstruction in place (below 1), and sae features' boxes lie within each
    photo."""
    from tests.vlm_models import save

    folder = save(family, tmp_path / family)
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(5)
    sizes = [(57, 95), (64, 64), (90, 70), (48, 80)]
    for i, (h, w) in enumerate(sizes):
        write_image(photos / f"p{i}.png", rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    model = ["--model", f"hf:{folder}", "--weights", "DEFAULT", "--device", "cpu"]
    quick = ["--width", "2x", "--k", "4", "--vectors", "600", "--batch", "64", "--buffer", "256"]
    out = tmp_path / "run"
    res = invoke("sae", "train", str(photos), *model, "--layer", layer, *quick, "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    metrics = json.loads(res.stdout.strip().splitlines()[-1])
    assert (metrics["inputs"], metrics["vectors"]) == (4, 4 * grid[0] * grid[1])
    assert metrics["top1_agreement"] is None and 0 < metrics["output_cosine"] < 0.999
    config = json.loads((out / store.CONFIG).read_text())
    assert config["layout"] == {"kind": "tokens", "prefix": prefix, "grid": grid} and config["width"] == 64
    res = invoke("sae", "features", str(out), str(photos), "--detail", "1", "--device", "cpu")
    assert res.exit_code == 0, res.output
    data = json.loads((out / "features" / "features.json").read_text())
    assert data["inputs"] == 4 and data["field"] == [8, 8]  # each patch 8 x 8 of the input
    _boxes_within_their_photos(data, sizes)


def _weights_of(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / store.WEIGHTS))


def test_a_second_run_with_the_cache_runs_no_forward_pass(
    trained: Trained, shapes_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--cache: the first run writes every input's vectors once (36 photos x 144 rows, in shards); a second
    run over the same inputs reads them: it reads no photo and runs the model once (the probe of the layer's
    width), and ends with the dictionary of the first."""
    loaded, items = tiny_loaded(trained.model), expand_inputs([str(shapes_folder)])
    first = train_sae(loaded, items, LAYER, tmp_path / "one", QUICK, cache=tmp_path / "cache")
    (key,) = list((tmp_path / "cache").iterdir())
    rows = sum(np.load(p, mmap_mode="r").shape[0] for p in key.glob("shard-*.npy"))
    assert rows == 36 * 144 and len(list(key.glob("shard-*.json"))) == len(list(key.glob("shard-*.npy")))
    calls = {"read": 0, "forward": 0}
    real_read, real_forward = api.read_each, api.layer_output

    def reading(*args: Any) -> Any:
        calls["read"] += 1
        return real_read(*args)

    def forward(*args: Any) -> Any:
        calls["forward"] += 1
        return real_forward(*args)

    monkeypatch.setattr(api, "read_each", reading)
    monkeypatch.setattr(api, "layer_output", forward)
    second = train_sae(loaded, items, LAYER, tmp_path / "two", QUICK, cache=tmp_path / "cache")
    assert calls == {"read": 0, "forward": 1}, calls
    a, b = _weights_of(tmp_path / "one"), _weights_of(tmp_path / "two")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-5)
    assert first.metrics["steps"] == second.metrics["steps"]
    assert first.metrics["training_vectors"] == second.metrics["training_vectors"] >= QUICK.vectors


def _cached_rows(key: Path, place: int) -> np.ndarray:
    """The vectors a cache subfolder holds for the input at ``place`` (its shards' lists say where)."""
    for meta in sorted(key.glob("shard-*.json")):
        for at, first, rows in json.loads(meta.read_text())["inputs"]:
            if at == place:
                return np.load(meta.with_suffix(".npy"))[first : first + rows]
    raise AssertionError(f"{key} holds no vectors of input {place}")


def test_a_photo_replaced_under_its_name_is_not_read_from_the_cache(
    trained: Trained, shapes_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--cache keys each input by its name and its bytes' SHA-256: a photo overwritten under its name
    (other pixels, another mtime) gives the second run a key of its own, whose vectors for that photo are
    the new photo's (equal to those of a fresh cache of the new photos, unlike the first run's)."""
    photos = tmp_path / "photos"
    shutil.copytree(shapes_folder, photos)
    for extra in sorted(photos.iterdir())[6:]:
        extra.unlink()
    loaded, settings = tiny_loaded(trained.model), dataclasses.replace(QUICK, vectors=2000)
    train_sae(loaded, expand_inputs([str(photos)]), LAYER, tmp_path / "one", settings, cache=tmp_path / "c")
    (old,) = list((tmp_path / "c").iterdir())
    changed = sorted(photos.iterdir())[2]
    before = changed.stat()
    img, _ = draw_shape(1, 48, np.random.default_rng(99))
    write_image(changed, (255 - img * 255).round().astype(np.uint8))
    os.utime(changed, ns=(before.st_atime_ns, before.st_mtime_ns + 5 * 10**9))
    read: list[str] = []
    real = api.read_each

    def spy(chunk: Any, *args: Any) -> Any:
        read.extend(item.name for item in chunk)
        return real(chunk, *args)

    monkeypatch.setattr(api, "read_each", spy)
    items = expand_inputs([str(photos)])
    train_sae(loaded, items, LAYER, tmp_path / "two", settings, cache=tmp_path / "c")
    (new,) = [key for key in (tmp_path / "c").iterdir() if key != old]
    assert str(changed) in read
    train_sae(loaded, items, LAYER, tmp_path / "three", settings, cache=tmp_path / "fresh")
    (fresh,) = list((tmp_path / "fresh").iterdir())
    np.testing.assert_allclose(_cached_rows(new, 2), _cached_rows(fresh, 2), atol=1e-6)
    assert np.abs(_cached_rows(old, 2) - _cached_rows(new, 2)).max() > 0.1
    np.testing.assert_allclose(_cached_rows(old, 0), _cached_rows(new, 0), atol=1e-6)  # the others unchanged


def test_an_input_s_cache_identity_follows_its_content(tmp_path: Path) -> None:
    """The cache knows an input by its name and its bytes: the same bytes touched are the same input; two
    photos of one size and one mtime swapped between their names (cp -p, unzip, rsync -t) are each another
    input; a name that is not UTF-8 makes a key."""
    from hookviz.sae.cache import cache_key, identity

    a, b = tmp_path / "a.png", tmp_path / "b.png"
    a.write_bytes(b"a" * 100)  # the key reads bytes only: two contents of one size
    b.write_bytes(b"b" * 100)
    item_a, item_b = expand_inputs([str(a), str(b)])
    first_a, first_b = identity(item_a), identity(item_b)
    assert identity(item_a) == first_a and first_a.startswith(item_a.name)
    st = a.stat()
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert identity(item_a) == first_a  # touched: the same bytes
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    for path in (a, b):
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert identity(item_a) != first_a and identity(item_b) != first_b
    odd = write_image(tmp_path / os.fsdecode(b"c\xff.png"), np.zeros((8, 8, 3), np.uint8))
    (item,) = expand_inputs([str(odd)])
    key = cache_key("f", LAYER, None, [identity(item)])
    assert key != cache_key("f", LAYER, None, [first_a]) and len(key["inputs"]) == 64


def _six(shapes_folder: Path, tmp_path: Path) -> Path:
    photos = tmp_path / "photos"
    photos.mkdir()
    for photo in sorted(shapes_folder.iterdir())[:6]:
        shutil.copy2(photo, photos / photo.name)
    return photos


def test_a_model_whose_code_changed_is_not_served_from_the_cache(
    trained: Trained, shapes_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same weights with a ReLU made a Tanh (the model's code changed, its weights file not) make another
    cache key: the second run's dictionary is the one a fresh cache gives, not the first run's; were the
    code's digest blind to it, the probe's vectors, unlike the shards', make the run forget the shards."""
    import copy

    from hookviz.sae import cache

    items = expand_inputs([str(_six(shapes_folder, tmp_path))])
    settings = dataclasses.replace(QUICK, vectors=2000)
    relu = tiny_loaded(trained.model)
    changed = copy.deepcopy(trained.model)
    first = next(i for i, m in enumerate(changed.features) if isinstance(m, torch.nn.ReLU))
    changed.features[first] = torch.nn.Tanh()
    tanh = tiny_loaded(changed)
    assert store.fingerprint(changed) == store.fingerprint(trained.model)
    train_sae(relu, items, LAYER, tmp_path / "one", settings, cache=tmp_path / "c")
    train_sae(tanh, items, LAYER, tmp_path / "two", settings, cache=tmp_path / "c")
    train_sae(tanh, items, LAYER, tmp_path / "fresh", settings, cache=tmp_path / "f")
    one, two, fresh = (_weights_of(tmp_path / n) for n in ("one", "two", "fresh"))
    assert len(list((tmp_path / "c").iterdir())) == 2
    for name in two:
        torch.testing.assert_close(two[name], fresh[name], atol=1e-6, rtol=1e-5)
    assert max(float((one[n] - two[n]).abs().max()) for n in one) > 1e-3

    monkeypatch.setattr(api, "code_digest", lambda model: "blind")
    assert cache.code_digest is not api.code_digest
    train_sae(relu, items, LAYER, tmp_path / "three", settings, cache=tmp_path / "b")
    train_sae(tanh, items, LAYER, tmp_path / "four", settings, cache=tmp_path / "b")
    four = _weights_of(tmp_path / "four")
    for name in four:
        torch.testing.assert_close(four[name], fresh[name], atol=1e-6, rtol=1e-5)


def test_a_damaged_shard_is_run_again_and_an_unwritable_cache_is_one_line(
    trained: Trained, shapes_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard cut short (its .json still there) or overwritten with zeros fails the length and SHA-256 its
    .json gives: its inputs are run again and the dictionary is the first run's; a cache folder that cannot
    be written (a read-only file system) is an OutputError (exit 3) naming --cache."""
    from hookviz.errors import OutputError
    from hookviz.sae import cache

    items = expand_inputs([str(_six(shapes_folder, tmp_path))])
    loaded, settings = tiny_loaded(trained.model), dataclasses.replace(QUICK, vectors=2000)
    train_sae(loaded, items, LAYER, tmp_path / "one", settings, cache=tmp_path / "c")
    one = _weights_of(tmp_path / "one")
    (shard,) = (tmp_path / "c").glob("*/shard-0-00000.npy")
    size = shard.stat().st_size
    for n, damage in enumerate([b"\x93NUMPY", bytes(size)]):
        shard.write_bytes(damage)
        train_sae(loaded, items, LAYER, tmp_path / f"again{n}", settings, cache=tmp_path / "c")
        again = _weights_of(tmp_path / f"again{n}")
        for name in one:
            torch.testing.assert_close(again[name], one[name], atol=1e-6, rtol=1e-5)

    def refused(path: Path, data: Any) -> None:
        raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr(cache, "atomic_write", refused)
    with pytest.raises(OutputError, match="--cache .*Read-only file system") as caught:
        train_sae(loaded, items, LAYER, tmp_path / "ro", settings, cache=tmp_path / "ro-cache")
    assert caught.value.exit_code == 3 and "\n" not in str(caught.value)


def test_vectors_kept_in_memory_spare_the_later_passes(
    trained: Trained, shapes_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 36 photos' vectors (5,184) fit in the kept blocks: over about 2.3 passes each photo is read and
    run once; with --keep 0 every pass reads them again; the dictionary is the same either way."""
    loaded, items = tiny_loaded(trained.model), expand_inputs([str(shapes_folder)])
    read: list[str] = []
    real = api.read_each

    def spy(chunk: Any, *args: Any) -> Any:
        read.extend(item.name for item in chunk)
        return real(chunk, *args)

    monkeypatch.setattr(api, "read_each", spy)
    train_sae(loaded, items, LAYER, tmp_path / "kept", QUICK)
    assert sorted(read) == sorted(item.name for item in items)
    read.clear()
    train_sae(loaded, items, LAYER, tmp_path / "again", dataclasses.replace(QUICK, keep=0))
    assert len(read) > 2 * 36
    a, b = _weights_of(tmp_path / "kept"), _weights_of(tmp_path / "again")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_from_its_checkpoint(
    weights: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """hookviz sae train killed with SIGKILL once its first checkpoint is on disk (step 25 of 600): started
    again, it resumes there (says so, the steps before not taken again) and ends with the dictionary of a run
    never interrupted; run once more it is not trained again, and --overwrite trains it again."""
    args = ["sae", "train", str(shapes_folder), *_cli(weights, tmp_path), "--layer", LAYER, "--width", "2x",
            "--k", "8", "--vectors", str(256 * 600), "--batch", "256", "--buffer", "2048", "--lr", "2e-3",
            "--checkpoint-every", "25"]  # fmt: skip
    cut = tmp_path / "cut"
    command = [sys.executable, "-m", "hookviz", *args, "--out", str(cut), "--quiet"]
    with started(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        deadline = time.monotonic() + PATIENCE
        while not (cut / store.CHECKPOINT).is_file():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    step = int(torch.load(cut / store.CHECKPOINT, weights_only=True)["step"])
    assert 25 <= step < 600 and step % 25 == 0 and not (cut / store.WEIGHTS).exists()
    assert json.loads((cut / store.CONFIG).read_text())["status"] == "training"
    res = run_cli([sys.executable, "-m", "hookviz", *args, "--out", str(cut), "--json"], cwd=ROOT)
    assert res.returncode == 0, res.stderr
    resumed = json.loads(res.stdout.strip().splitlines()[-1])
    assert resumed["status"] == "resumed" and resumed["resumed_from_step"] == step
    assert resumed["training_vectors"] >= 256 * 600 and not (cut / store.CHECKPOINT).exists()
    whole = invoke(*args, "--out", str(tmp_path / "whole"), "--json")
    assert whole.exit_code == 0, whole.output
    assert json.loads(whole.stdout.strip().splitlines()[-1])["steps"] == resumed["steps"]
    a, b = _weights_of(tmp_path / "whole"), _weights_of(cut)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)
    before = (cut / store.WEIGHTS).read_bytes()
    again = invoke(*args, "--out", str(cut), "--json")
    assert json.loads(again.stdout.strip().splitlines()[-1])["status"] == "skipped"
    assert (cut / store.WEIGHTS).read_bytes() == before
    over = invoke(*args, "--out", str(cut), "--json", "--overwrite", "--vectors", str(256 * 30))
    assert (
        over.exit_code == 0
        and json.loads(over.stdout.strip().splitlines()[-1])["training_vectors"] >= 256 * 30
    )


#: ``python -c PEAK REPORT ARGS...``: ``hookviz ARGS`` whose peak resident memory (bytes) goes to REPORT.
PEAK = """import resource, runpy, sys
report, sys.argv = sys.argv[1], ["hookviz", *sys.argv[2:]]
try:
    runpy.run_module("hookviz", run_name="__main__", alter_sys=True)
finally:
    open(report, "w").write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
"""


@pytest.mark.slow
def test_peak_memory_is_flat_from_1k_to_10k_photos(weights: Path, tmp_path: Path) -> None:
    """hookviz sae train over 1,000 and over 10,000 photos of 32 pixels (64 vectors of 64 a photo), the same
    640,000 training vectors (a pass over the 10,000; ten over the 1,000), each in its own process: the peak
    resident memory of the second is within 24 MiB of the first's (holding the vectors of every photo would
    add 148 MiB)."""
    rng = np.random.default_rng(0)
    peaks, seen = {}, {}
    for n in (1000, 10_000):
        folder = tmp_path / f"photos{n}"
        folder.mkdir()
        for i in range(n):
            write_image(folder / f"p{i:05d}.png", rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
        model = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--input-size", "32",
                 "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1", "--device", "cpu"]  # fmt: skip
        args = ["sae", "train", str(folder), *model, "--layer", LAYER, "--width", "2x", "--k", "8",
                "--vectors", "640000", "--batch", "4096", "--buffer", "8192", "--json",
                "--out", str(tmp_path / f"run{n}")]  # fmt: skip
        report = tmp_path / f"rss{n}"
        res = run_cli([sys.executable, "-c", PEAK, str(report), *args], cwd=ROOT)
        assert res.returncode == 0, res.stderr
        peaks[n] = int(report.read_text())
        seen[n] = json.loads(res.stdout.strip().splitlines()[-1])["training_vectors"]
    assert seen[10_000] == 640_000 and seen[1000] > 600_000  # one pass over the 10,000 (ten over the 1,000)
    assert peaks[10_000] - peaks[1000] < 24 * 2**20, {n: p / 2**20 for n, p in peaks.items()}


@pytest.mark.slow
def test_torchrun_trains_one_dictionary_as_good_as_one_process(
    weights: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """torchrun --nproc-per-node 2 (gloo, CPU): each rank trains on its half of the photos, the gradients
    averaged (the ranks end with the same weights, checked at the end), the vectors asked for as one
    process; rank 0 writes one dictionary, measured as well as the one process's (explained variance within
    0.03, the same top-1 agreement within 0.1)."""
    args = ["sae", "train", str(shapes_folder), *_cli(weights, tmp_path), "--layer", LAYER, "--width", "2x",
            "--k", "8", "--vectors", "12000", "--batch", "256", "--buffer", "2048", "--lr", "2e-3",
            "--checkpoint-every", "10", "--json"]  # fmt: skip
    res = invoke(*args, "--out", str(tmp_path / "one"))
    assert res.exit_code == 0, res.output
    one = json.loads(res.stdout.strip().splitlines()[-1])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    ran = run_cli([*torchrun, "-m", "hookviz", *args, "--out", str(tmp_path / "two")], env=env, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stdout.strip().splitlines() if line.startswith("{")]
    assert len(lines) == 1, ran.stdout  # rank 0 alone says it
    two = lines[0]
    assert two["status"] == "trained"
    # --vectors honoured by both: trained until 12,000 vectors, the last step (each rank's batch) past it.
    assert all(12_000 <= r["training_vectors"] < 12_000 + 2 * 256 for r in (one, two)), (one, two)
    assert two["explained_variance"] >= one["explained_variance"] - 0.03, (one, two)
    assert abs(two["top1_agreement"] - one["top1_agreement"]) <= 0.1
    folder = tmp_path / "two"
    assert json.loads((folder / store.CONFIG).read_text())["status"] == "finished"
    assert not (folder / store.CHECKPOINT).exists() and (folder / store.WEIGHTS).is_file()


@pytest.mark.slow
def test_torchrun_holds_its_folder_as_one_process_does(
    weights: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """Under torchrun rank 0 takes --out's sae.lock before any rank writes: into a folder a live process
    holds, the job is refused in one line (rank 0's, exit 3; rank 1 learns of it and does not wait) and the
    folder is left as it was; while one job trains, its rank 0's process id is in the lock and a second job
    into the same --out is refused, naming it."""
    args = ["sae", "train", str(shapes_folder), *_cli(weights, tmp_path), "--layer", LAYER, "--width", "2x",
            "--k", "8", "--batch", "256", "--buffer", "2048", "--checkpoint-every", "5"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    held, busy = tmp_path / "held", tmp_path / "busy"
    held.mkdir()
    (held / "sae.lock").write_text(str(os.getpid()))
    res = run_cli(
        [*torchrun, "-m", "hookviz", *args, "--vectors", "3000", "--out", str(held)], env=env, cwd=ROOT
    )
    said = [line for line in res.stderr.splitlines() if line.startswith("hookviz[")]
    assert res.returncode != 0 and re.search(r"exitcode\s*:\s*3 ", res.stderr), res.stderr
    assert len(said) == 1 and said[0].startswith("hookviz[rank 0]: error: another hookviz sae train"), said
    assert f"process {os.getpid()}" in said[0] and sorted(p.name for p in held.iterdir()) == ["sae.lock"]
    first = [*torchrun, "-m", "hookviz", *args, "--vectors", str(10**8), "--out", str(busy), "--quiet"]
    with started(first, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        deadline = time.monotonic() + PATIENCE
        while not (busy / store.CHECKPOINT).is_file():  # training: every rank past its first steps
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.05)
        owner = int((busy / "sae.lock").read_text())
        os.kill(owner, 0)  # alive
        status = Path(f"/proc/{owner}/status")
        if status.exists():  # Linux: a rank torchrun started, not the launcher
            parent = next(line for line in status.read_text().splitlines() if line.startswith("PPid:"))
            assert int(parent.split()[1]) == proc.pid
        assert owner != proc.pid
        again = run_cli([*torchrun, "-m", "hookviz", *args, "--out", str(busy)], env=env, cwd=ROOT)
        said = [line for line in again.stderr.splitlines() if line.startswith("hookviz[")]
        assert again.returncode != 0 and len(said) == 1 and f"process {owner}" in said[0], again.stderr
        assert proc.poll() is None and int((busy / "sae.lock").read_text()) == owner


def test_vectors_are_honoured_over_few_inputs(trained: Trained, shapes_folder: Path, tmp_path: Path) -> None:
    """2 photos (144 vectors each) and --vectors 2000 with --batch 1024: passes repeat until 2000 vectors were
    trained on (not 2 steps of one pass's 288)."""
    items = expand_inputs([str(p) for p in sorted(shapes_folder.iterdir())[:2]])
    settings = dataclasses.replace(QUICK, vectors=2000, batch=1024, buffer=1024)
    done = train_sae(tiny_loaded(trained.model), items, LAYER, tmp_path / "run", settings)
    assert 2000 <= done.metrics["training_vectors"] < 2000 + 288, done.metrics
    assert done.metrics["steps"] == 7  # ceil(2000 / 288): every step a pass's 288 vectors


def _hostile(shapes_folder: Path, tmp_path: Path) -> Path:
    """3 good photos sorted between an empty file and a text file named as photos."""
    folder = tmp_path / "hostile"
    folder.mkdir()
    for p in sorted(shapes_folder.glob("*.png"))[:3]:
        (folder / f"b{p.name}").write_bytes(p.read_bytes())
    (folder / "a_empty.png").write_bytes(b"")
    (folder / "c_text.png").write_text("not a photo\n")
    return folder


def test_unreadable_inputs_are_named_once_and_the_others_done(
    trained: Trained, weights: Path, run: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """explain and features go on past unreadable photos: one error line each, every good photo done, exit
    1; train names each unreadable input once however many passes it made."""
    hostile, model = _hostile(shapes_folder, tmp_path), _cli(weights, tmp_path)
    mine = tmp_path / "run"
    shutil.copytree(run, mine)
    out = tmp_path / "explained"
    res = invoke("sae", "explain", str(hostile), "--sae", str(mine), *model, "--json", "--out", str(out))
    assert res.exit_code == 1, res.output
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 2 and "a_empty.png" in errors[0] and "c_text.png" in errors[1], errors
    assert len(res.stdout.strip().splitlines()) == 3 and len(list(out.glob("*.sae.png"))) == 3
    res = invoke("sae", "features", str(mine), str(hostile), *model, "--detail", "0")
    assert res.exit_code == 1, res.output
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 2 and "a_empty.png" in errors[0] and "c_text.png" in errors[1], errors
    assert json.loads((mine / "features" / "features.json").read_text())["inputs"] == 3
    settings = dataclasses.replace(QUICK, vectors=2000, batch=256, buffer=256)
    done = train_sae(
        tiny_loaded(trained.model), expand_inputs([str(hostile)]), LAYER, tmp_path / "t", settings
    )
    assert done.metrics["training_vectors"] >= 2000  # passes over 3 photos' 432 vectors: 5 or more
    assert len(done.skipped_inputs) == 2, done.skipped_inputs


def test_an_unreadable_checkpoint_or_dictionary(
    trained: Trained, shapes_folder: Path, tmp_path: Path
) -> None:
    """A checkpoint cut short is removed and the run starts over, saying so; a dictionary cut short is one
    line naming the file and --overwrite (exit 2), for features and explain and for train, which does not
    call the run finished."""
    items, loaded = (
        expand_inputs([str(p) for p in sorted(shapes_folder.iterdir())[:2]]),
        tiny_loaded(trained.model),
    )
    settings = dataclasses.replace(QUICK, vectors=600, batch=128, buffer=256)
    folder = tmp_path / "run"
    whole = train_sae(loaded, items, LAYER, str(folder), settings)
    config = json.loads((folder / store.CONFIG).read_text())
    store.write_json(folder / store.CONFIG, {**config, "status": "training"})
    (folder / store.CHECKPOINT).write_bytes(b"PK\x03\x04 cut short")
    again = train_sae(loaded, items, LAYER, folder, settings)
    assert again.status == "trained" and len(again.notes) == 1 and "checkpoint.pt" in again.notes[0]
    assert again.metrics["training_vectors"] == whole.metrics["training_vectors"]
    assert not (folder / store.CHECKPOINT).exists()
    assert load_sae(str(folder), loaded).shape.width == 128  # a str is a folder as a Path is
    data = (folder / store.WEIGHTS).read_bytes()
    (folder / store.WEIGHTS).write_bytes(data[: len(data) // 2])
    for call in (lambda: load_sae(folder, loaded), lambda: train_sae(loaded, items, LAYER, folder, settings)):
        with pytest.raises(UsageError, match="sae.safetensors: unreadable.*--overwrite"):
            call()
    assert train_sae(loaded, items, LAYER, folder, settings, overwrite=True).status == "trained"


def test_a_second_train_into_one_folder_is_refused(
    weights: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """A live process's sae.lock in --out: train refuses in one line naming it (exit 3) before computing; a
    lock whose process is gone is taken over, and the run removes it at its end."""
    photos = [str(p) for p in sorted(shapes_folder.iterdir())[:2]]
    args = ["sae", "train", *photos, *_cli(weights, tmp_path), "--layer", LAYER, "--width", "2x", "--k", "8",
            "--vectors", "300", "--batch", "128", "--buffer", "256"]  # fmt: skip
    out = tmp_path / "run"
    out.mkdir()
    (out / "sae.lock").write_text(str(os.getpid()))
    res = invoke(*args, "--out", str(out))
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 3 and len(lines) == 1 and str(os.getpid()) in lines[0], res.output
    assert sorted(p.name for p in out.iterdir()) == ["sae.lock"]
    (out / "sae.lock").write_text("999999999")  # no such process
    res = invoke(*args, "--out", str(out))
    assert res.exit_code == 0, res.output
    assert (out / store.WEIGHTS).is_file() and not (out / "sae.lock").exists()


def test_an_out_that_cannot_be_a_folder_is_one_line(
    weights: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """--out naming a file is one line (exit 3, the file kept), not an internal error from taking the lock."""
    photo = str(sorted(shapes_folder.iterdir())[0])
    taken = tmp_path / "notes.txt"
    taken.write_text("keep me")
    res = invoke("sae", "train", photo, *_cli(weights, tmp_path), "--layer", LAYER, "--out", str(taken))
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 3 and len(lines) == 1 and "is a file, not a folder" in lines[0], res.output
    assert taken.read_text() == "keep me"


def test_an_oversized_photo_is_not_told_of_an_absent_option(shapes_folder: Path) -> None:
    """The sae commands have no --max-pixels: an input over the limit is named without advice to raise it."""
    skipped: list[str] = []
    items = expand_inputs([str(sorted(shapes_folder.iterdir())[0])])
    assert list(readable(items, None, 100, skipped)) == []
    assert len(skipped) == 1 and "over the limit" in skipped[0] and "--max-pixels" not in skipped[0], skipped


def test_explain_says_a_feature_is_inactive_on_a_photo(
    trained: Trained, run: Path, shapes_folder: Path, tmp_path: Path
) -> None:
    """--feature F where F fires nowhere on the photo: ``active`` false and the photo's top classes, their
    probabilities unchanged; where F fires, ``active`` true."""
    loaded = tiny_loaded(trained.model)
    found = load_sae(run, loaded)
    item = expand_inputs([str(sorted(shapes_folder.iterdir())[0])])[0]
    record = views.explain_photo(found, loaded, item, tmp_path, strongest=128, feature=0)
    fired = {f["feature"] for f in record["features"]}
    idle = next(f for f in range(found.shape.width) if f not in fired)
    off = views.explain_photo(found, loaded, item, tmp_path, feature=idle)["scaled"]
    assert off["active"] is False and len(off["classes"]) == 3
    before = [c["before"] for c in off["classes"]]
    assert before == sorted(before, reverse=True) and sum(before) == pytest.approx(1, abs=1e-4)
    assert all(abs(c["after"] - c["before"]) < 1e-6 for c in off["classes"])
    on = views.explain_photo(found, loaded, item, tmp_path, feature=record["features"][0]["feature"])
    assert on["scaled"]["active"] is True


@pytest.mark.parametrize(
    "cfg",
    [{"top_k": 6}, {"activation": {"cls": "Relu", "params": {"top-k": 6}}}, {"k": 6, "activation": "topk"}],
)
def test_a_saev_header_that_speaks_of_topk_is_not_read_as_relu(cfg: dict[str, Any], tmp_path: Path) -> None:
    """A saev file whose header marks TopK other than as saev writes it is refused in one line, not read as
    a ReLU SAE; saev's own form is read with its k."""
    tensors = _foreign(8, 16, 0)
    for name, header in (
        ("odd", {"cfg": cfg}),
        ("saev", {"cfg": {"activation": {"cls": "TopK", "params": {"top_k": 6}}}}),
    ):
        path = tmp_path / f"{name}.pt"
        with open(path, "wb") as f:
            f.write((json.dumps(header) + "\n").encode())
            torch.save(tensors, f)
        if name == "odd":
            with pytest.raises(UsageError, match="TopK"):
                interchange.read_saev(path)
        else:
            assert interchange.read_saev(path)[1] == 6


def test_a_folder_without_a_finished_dictionary_is_refused_before_a_model_loads(
    shapes_folder: Path, tmp_path: Path
) -> None:
    """sae features and sae explain on a folder train never wrote (or never finished) say so in one line, exit
    2, before loading a model: with no --model given they used to fall back to resnet18's weights and fail
    fetching them (exit 3, a network error)."""
    photo = str(sorted(shapes_folder.iterdir())[0])
    empty = tmp_path / "empty"
    empty.mkdir()
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / store.CONFIG).write_text(json.dumps({"format": store.FORMAT, "status": "training"}))
    (unfinished / store.WEIGHTS).write_bytes(b"")
    for folder, said in ((empty, "no hookviz dictionary here"), (unfinished, "has not finished")):
        o = str(tmp_path / "o")
        for args in (["features", str(folder), photo], ["explain", photo, "--sae", str(folder), "--out", o]):
            res = invoke("sae", *args)
            lines = res.stderr.strip().splitlines()
            assert res.exit_code == 2 and len(lines) == 1 and said in lines[0], (args, res.output)
    assert not (tmp_path / "o").exists()


def _boxes_within_their_photos(data: dict[str, Any], sizes: list[tuple[int, int]]) -> None:
    """Every top patch's box of features.json inside its photo (``p{i}.png``: ``sizes[i]``, (h, w))."""
    shapes = {f"p{i}.png": s for i, s in enumerate(sizes)}
    for f in data["features"]:
        for p in f["top"]:
            h, w = shapes[Path(p["input"]).name]
            x0, y0, x1, y1 = p["box"]
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, (p, h, w)
