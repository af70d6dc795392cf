"""TCAV: equal to captum's on the same model, layer, folders and seed; on the model trained on the shapes a
"disc" concept is significant for the disc class while a random folder used as a concept is not."""

from __future__ import annotations

import json
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from hookviz.concepts.tcav import Seeds, layer_activations, scores, tcav, train_cav
from hookviz.errors import UsageError
from hookviz.io.shapes import draw_shape
from tests.conftest import TinyCNN, Trained, invoke, write_image

LAYER = "features.6"  # the second block's ReLU: the class's gradient there varies with the photo


def _shapes(kind: int | None, n: int, seed: int) -> torch.Tensor:
    """``n`` photos of one kind of shape (``None``: plain noise, a random concept)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if kind is None:
            img = rng.normal(0.5, 0.15, (48, 48, 3)).clip(0, 1).astype(np.float32)
        else:
            img, _ = draw_shape(kind, 48, rng)
        out.append(torch.from_numpy(img).permute(2, 0, 1))
    return torch.stack(out)


def _mixed(n: int, seed: int) -> torch.Tensor:
    """A random folder: photos of every kind, and noise."""
    rng = np.random.default_rng(seed)
    parts = [
        _shapes(int(k) if k < 3 else None, 1, seed * 1000 + i) for i, k in enumerate(rng.integers(0, 4, n))
    ]
    return torch.cat(parts)


def test_equal_to_captum(tmp_path: Path) -> None:
    from captum.concept import TCAV, Concept

    torch.manual_seed(0)
    model = TinyCNN().eval()
    x = _shapes(1, 12, seed=1)
    concept = _shapes(1, 16, seed=2)
    randoms = [_mixed(16, seed=10 + i) for i in range(3)]
    got = tcav(
        model, lambda: [x], LAYER, 1, {"disc": lambda: [concept]}, [lambda r=r: [r] for r in randoms], seed=7
    )

    c = Concept(0, "disc", [concept])
    rs = [Concept(i + 1, f"random{i}", [r]) for i, r in enumerate(randoms)]
    sets = [[c, r] for r in rs] + [[rs[i], rs[(i + 1) % 3]] for i in range(3)]
    random.seed(7)
    np.random.seed(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = TCAV(model, [LAYER], model_id="m", save_path=str(tmp_path / "cav")).interpret(x, sets, target=1)
    from captum.concept._utils.common import concepts_to_str

    theirs = [float(ref[concepts_to_str(s)][LAYER]["sign_count"][0]) for s in sets]
    mags = [float(ref[concepts_to_str(s)][LAYER]["magnitude"][0]) for s in sets]
    ours = got.concepts[0]
    np.testing.assert_allclose(ours.sign_counts + got.null.sign_counts, theirs, atol=1e-6)
    np.testing.assert_allclose(ours.magnitudes + got.null.magnitudes, mags, rtol=1e-4, atol=1e-7)
    assert len(set(theirs)) > 1  # the runs differ: the comparison is not of constants


def test_mean_cav_and_scores_by_hand() -> None:
    a = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    b = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    cav = train_cav(a, b, method="mean")
    assert torch.equal(cav.vector, torch.tensor([2.0, -2.0]))
    grads = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]])  # dots 2, -2, 2
    sign, magnitude = scores(grads, cav)
    assert sign == pytest.approx(2 / 3) and magnitude == pytest.approx(2 / 3)
    with pytest.raises(UsageError, match="choose one of linear, mean"):
        train_cav(a, b, method="svm")


def test_linear_cav_separates_and_repeats_with_its_seed() -> None:
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.normal(0, 1, (40, 8)).astype(np.float32)) + torch.eye(8)[0] * 4
    b = torch.from_numpy(rng.normal(0, 1, (40, 8)).astype(np.float32))
    one, two = train_cav(a, b, seeds=Seeds(3)), train_cav(a, b, seeds=Seeds(3))
    assert torch.equal(one.vector, two.vector) and one.accuracy >= 0.9
    assert int(one.vector.abs().argmax()) == 0 and float(one.vector[0]) > 0  # towards the concept


@pytest.mark.slow  # a t-test over trained CAVs: in make test, not the inner loop
def test_a_disc_concept_matters_to_discs_and_random_ones_do_not(trained: Trained) -> None:
    """Under the null a p-value is uniform: of ten random folders used as concepts (against one shared null,
    so their p-values move together) a handful at most may come out significant at 0.05; the disc concept is
    significant at half that level (p 0.008, deterministic with its seeds). At the last ReLU, where its CAVs
    tell discs from the random folders (held-out accuracy about 0.75; at features.6 they are at chance, and so
    not meaningful)."""
    model = trained.model
    discs = _shapes(1, 30, seed=100)
    concept = _shapes(1, 30, seed=200)
    randoms = [_mixed(30, seed=300 + i) for i in range(10)]
    fakes = {f"random{i}": (lambda i=i: [_mixed(30, seed=400 + i)]) for i in range(10)}
    res = tcav(
        model, lambda: [discs], "features.10", 1, {"disc": lambda: [concept], **fakes},
        [lambda r=r: [r] for r in randoms], seed=0,
    )  # fmt: skip
    disc, *rand = res.concepts
    assert disc.meaningful and disc.mean >= 0.9 and disc.significant, disc
    assert disc.p_value is not None and disc.p_value < 0.025, disc
    assert sum(bool(r.significant) for r in rand) <= 3, [r.p_value for r in rand]
    assert np.mean([r.mean for r in rand]) < disc.mean - 0.15


def test_layer_activations_are_the_flattened_output() -> None:
    torch.manual_seed(0)
    model = TinyCNN().train()
    x = torch.rand(3, 3, 48, 48)
    acts = layer_activations(model, [x[:2], x[2:]], LAYER)
    assert model.training
    with torch.no_grad():
        want = model.eval().features[:7](x).flatten(1)
    torch.testing.assert_close(acts, want)


def test_cli_writes_the_table_and_json(tmp_path: Path, trained: Trained) -> None:
    weights = tmp_path / "w.pt"
    torch.save(trained.model.state_dict(), weights)
    (tmp_path / "labels.txt").write_text("square\ndisc\ncross\n")

    def folder(name: str, photos: torch.Tensor) -> str:
        (tmp_path / name).mkdir()
        for i, p in enumerate(photos):
            write_image(
                tmp_path / name / f"{i:02d}.png", (p.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            )
        return str(tmp_path / name)

    inputs = folder("discs", _shapes(1, 12, seed=1))
    concept = folder("concept", _shapes(1, 12, seed=2))
    randoms = [folder(f"random{i}", _mixed(12, seed=20 + i)) for i in range(3)]
    model = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--labels",
             str(tmp_path / "labels.txt"), "--input-size", "48", "--resize", "squash", "--mean", "0,0,0",
             "--std", "1,1,1", "--device", "cpu"]  # fmt: skip
    rand = [a for r in randoms for a in ("--random", r)]
    res = invoke("tcav", inputs, *model, "--layer", LAYER, "--target", "disc", "--concept", f"disc={concept}",
                 *rand, "--out", str(tmp_path / "out"))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "disc" in res.output and "p=" in res.output
    data = json.loads(next((tmp_path / "out").glob("tcav.*.json")).read_text())
    layer = data["layers"][0]
    assert layer["layer"] == LAYER and layer["inputs"] == 12 and data["target"]["name"] == "disc"
    assert [c["concept"] for c in layer["concepts"]] == ["disc"] and len(layer["concepts"][0]["runs"]) == 3
    bad = invoke("tcav", inputs, *model, "--layer", LAYER, "--target", "disc", "--concept", "disc",
                 *rand, "--out", str(tmp_path / "out2"))  # fmt: skip
    assert bad.exit_code == 2 and "--concept disc: give NAME=FOLDER" in bad.output


TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]


def _tcav_folders(root: Path) -> tuple[str, str, list[str]]:
    """Inputs, a concept and five random folders of noise photos (32 px); the concept is a copy of random
    folder 0 under another path (its CAVs cannot beat chance)."""
    rng = np.random.default_rng(5)

    def folder(name: str, n: int = 10) -> str:
        (root / name).mkdir(parents=True)
        for i in range(n):
            write_image(root / name / f"{i}.png", rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
        return str(root / name)

    inputs = folder("inputs", 6)
    randoms = [folder(f"random{i}") for i in range(5)]
    shutil.copytree(randoms[0], root / "concept")
    return inputs, str(root / "concept"), randoms


@pytest.mark.slow
def test_tcav_outputs_are_keyed_a_rerun_skipped_and_folders_distinct(tmp_path: Path) -> None:
    inputs, concept, randoms = _tcav_folders(tmp_path)
    rand = [a for r in randoms for a in ("--random", r)]
    head = ["tcav", inputs, *TINY, "--target", "1", "--layer", "features.4"]
    args = [*head, "--concept", f"c={concept}", *rand, "--out", str(tmp_path / "out")]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    (one,) = (tmp_path / "out").glob("tcav.*.json")
    data = json.loads(one.read_text())
    assert one.name == f"tcav.{data['key']}.json"
    # A copy of a random folder: CAVs at chance, never significant, said so.
    (c,) = data["layers"][0]["concepts"]
    assert c["meaningful"] is False and c["significant"] is False and c["cav_accuracy"] <= 0.65
    assert "not meaningful" in first.output
    before = one.read_bytes()
    again = invoke(*args)
    assert again.exit_code == 0 and "skipped" in again.output and one.read_bytes() == before
    other = invoke(*args[:-2], "--seed", "1", "--out", str(tmp_path / "out"))
    assert other.exit_code == 0, other.output
    assert len(list((tmp_path / "out").glob("tcav.*.json"))) == 2 and one.read_bytes() == before
    # The same random folder five times, a concept that is a random folder, or inside one: refused.
    for bad, why in (
        ([a for _ in range(5) for a in ("--random", randoms[1])], "the same folder as --random"),
        (["--random", concept, *rand[2:]], "the same folder as --concept c"),
        (["--random", str(tmp_path), *rand[2:]], "overlaps"),
    ):
        r = invoke(*head, "--concept", f"c={concept}", *bad, "--out", str(tmp_path / "bad"))
        assert r.exit_code == 2 and why in r.output, r.output
    twice = invoke(*head, "--concept", f"c={concept}", "--concept", f"c={randoms[1]}", *rand[4:])
    assert twice.exit_code == 2 and "given twice" in twice.output


def test_a_concept_its_cavs_tell_apart_is_meaningful() -> None:
    """The chance test passes a real concept: bright photos against noise."""
    import torch

    from hookviz.concepts.tcav import Seeds, above_chance, train_cav

    g = torch.Generator().manual_seed(0)
    noise = [torch.rand(30, 16, generator=g) for _ in range(3)]
    bright = torch.rand(30, 16, generator=g) + 0.6
    seeds = Seeds(0)
    assert above_chance([train_cav(bright, n, seeds=seeds) for n in noise]) is True
    assert above_chance([train_cav(noise[0], n, seeds=seeds) for n in noise[1:]]) is False
    assert above_chance([train_cav(bright, n, method="mean") for n in noise]) is None
