"""hookviz sae's commands (hookviz/cli/sae.py): their inputs (``-`` on stdin, ``--null``), the names of
explain's pictures, refusals of bad values and unwritable folders, ``--debug``, what an interrupted or
diverged run says."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hookviz.errors import InputError
from hookviz.sae import store
from tests.conftest import Trained, invoke
from tests.test_sae import LAYER, _cli, run, shapes_folder, weights  # noqa: F401  (fixtures)

#: Each a whole command over a trained dictionary: in make test, not the inner loop (make test-fast).
pytestmark = pytest.mark.slow

QUICK = ["--width", "2x", "--k", "8", "--vectors", "512", "--batch", "256", "--buffer", "512"]


def _copy(run: Path, tmp_path: Path) -> Path:  # noqa: F811
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _photos(shapes_folder: Path, n: int) -> list[str]:  # noqa: F811
    return [str(p) for p in sorted(shapes_folder.glob("*.png"))[:n]]


def test_features_over_no_readable_input_keeps_the_earlier_features_json(
    weights: Path,  # noqa: F811
    run: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A typo in DATA, or empty stdin: one line, exit 1, and the features.json already there untouched (it
    used to be replaced by one of 0 inputs)."""
    folder = _copy(run, tmp_path)
    (folder / "features").mkdir(exist_ok=True)
    kept = folder / "features" / "features.json"
    kept.write_text('{"earlier": true}\n')
    model = _cli(weights, tmp_path)
    for data, given in (("nosuchdir", None), ("-", "")):
        res = invoke("sae", "features", str(folder), data, *model, input=given)
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 1 and len(lines) == 1, (data, res.output)
        assert ("no such file" if data != "-" else "stdin") in lines[0]
        assert kept.read_text() == '{"earlier": true}\n'


def test_paths_on_stdin_reach_every_sae_command(
    weights: Path,  # noqa: F811
    run: Path,  # noqa: F811
    shapes_folder: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``-`` reads paths from stdin (one a line, or NUL-separated with -0) in train, features and explain;
    under torchrun train refuses it in one line said by rank 0 alone (it used to say --eval held out all 0
    inputs)."""
    model, photos = _cli(weights, tmp_path), _photos(shapes_folder, 6)
    folder = _copy(run, tmp_path)
    res = invoke("sae", "features", str(folder), "-", *model, "--detail", "0", input="\n".join(photos[:4]))
    assert res.exit_code == 0, res.output
    assert json.loads((folder / "features" / "features.json").read_text())["inputs"] == 4
    res = invoke("sae", "features", str(folder), "-", "-0", *model, "--detail", "0",
                 input="\0".join(photos[:2]) + "\0")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads((folder / "features" / "features.json").read_text())["inputs"] == 2
    out = tmp_path / "ex"
    res = invoke("sae", "explain", "-", "--sae", str(folder), *model, "--out", str(out), "--json",
                 input="\n".join(photos[:3]))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert len(res.stdout.strip().splitlines()) == 3 and len(list(out.glob("*.sae.png"))) == 3
    trained = tmp_path / "trained"
    res = invoke("sae", "train", "-", *model, "--layer", LAYER, *QUICK, "--out", str(trained), "-q",
                 input="\n".join(photos))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads((trained / store.CONFIG).read_text())["status"] == "finished"
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, said in (("0", 1), ("1", 0)):
        monkeypatch.setenv("RANK", rank)
        res = invoke("sae", "train", "-", *model, "--layer", LAYER, "--out", str(tmp_path / "t"), input="")
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == said, (rank, res.output)
        assert all("not supported under torchrun" in line for line in lines)
    assert not (tmp_path / "t").exists()


def test_explain_names_never_collide_nor_replace_an_earlier_picture(
    weights: Path,  # noqa: F811
    run: Path,  # noqa: F811
    shapes_folder: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Two x.png in different folders, and bad\\xff.png beside bad.png, get a picture each (the names every
    command gives: stem, path hash, model, settings key); a rerun with other settings writes beside the
    earlier pictures, one with the same settings skips its photos unless --overwrite."""
    model, photos = _cli(weights, tmp_path), _photos(shapes_folder, 3)
    dup = tmp_path / "dup"
    for sub, photo in (("a", photos[0]), ("b", photos[1])):
        (dup / sub).mkdir(parents=True)
        shutil.copy(photo, dup / sub / "x.png")
    shutil.copy(photos[2], dup / "bad.png")
    odd = os.fsdecode(b"bad\xff.png")
    shutil.copy(photos[0], dup / odd)
    names = [str(dup / "a" / "x.png"), str(dup / "b" / "x.png"), str(dup / "bad.png"), str(dup / odd)]
    out = tmp_path / "exd"

    def explained(*more: str) -> list[dict[str, object]]:
        res = invoke("sae", "explain", *names, "--sae", str(run), *model, "--out", str(out), "--json", *more)
        assert res.exit_code == 0, res.output
        return [json.loads(line) for line in res.stdout.strip().splitlines()]

    first = explained()
    pictures = [str(r["picture"]) for r in first]
    assert len(set(pictures)) == 4 and all(Path(p).is_file() for p in pictures)
    assert all(Path(p).name.startswith(("x-", "bad-", "bad_-")) for p in pictures)
    stamps = {p: Path(p).stat().st_mtime_ns for p in pictures}
    other = explained("--strongest", "1")
    assert len({str(r["picture"]) for r in other} | set(pictures)) == 8
    assert len(list(out.glob("*.sae.png"))) == 8
    again = explained()
    assert [r["status"] for r in again] == ["skipped"] * 4 and [r["picture"] for r in again] == pictures
    assert all(Path(p).stat().st_mtime_ns == t for p, t in stamps.items())
    replaced = explained("--overwrite")
    assert [r["picture"] for r in replaced] == pictures and all("features" in r for r in replaced)


def test_unwritable_folders_are_one_line_exit_3(
    weights: Path,  # noqa: F811
    run: Path,  # noqa: F811
    shapes_folder: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """features on a run folder whose features/ cannot be made, explain into an --out that cannot be a
    folder: one line, exit 3 (they were internal errors, exit 70)."""
    model, photo = _cli(weights, tmp_path), _photos(shapes_folder, 1)
    folder = _copy(run, tmp_path)
    shutil.rmtree(folder / "features", ignore_errors=True)
    (folder / "features").write_text("in the way")
    res = invoke("sae", "features", str(folder), *photo, *model, "--detail", "0")
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 3 and len(lines) == 1 and "cannot write" in lines[0], res.output
    (tmp_path / "afile").write_text("x")
    res = invoke("sae", "explain", *photo, "--sae", str(run), *model, "--out", str(tmp_path / "afile"))
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 3 and len(lines) == 1 and "not a folder" in lines[0], res.output


def test_the_sae_commands_take_debug(
    weights: Path,  # noqa: F811
    run: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """--debug (which the internal-error line names) is an option of each sae command: the error raised
    with its traceback rather than said in one line."""
    model = _cli(weights, tmp_path)
    res = invoke("sae", "features", str(run), "nosuchdir", *model, "--debug")
    assert isinstance(res.exception, InputError), res.output
    for command in ("train", "explain", "import"):
        assert "--debug" in invoke("sae", command, "--help").stdout


def test_non_finite_values_and_a_diverging_training_are_refused(
    trained: Trained,
    weights: Path,  # noqa: F811
    run: Path,  # noqa: F811
    shapes_folder: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """--lr inf or nan, --scale inf or nan: one line, exit 2; a learning rate that makes the training diverge
    stops it in one line (exit 2), no dictionary left claimed trained; JSON written is strict (NaN as
    null)."""
    model, photos = _cli(weights, tmp_path), _photos(shapes_folder, 2)
    bad_lr = ["--layer", LAYER, "--lr", "inf", "--out", str(tmp_path / "t")]
    res = invoke("sae", "train", *photos, *model, *bad_lr)
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "--lr inf" in lines[0], res.output
    for value in ("inf", "nan"):  # (--lr nan: refused by the option's lower bound)
        res = invoke("sae", "explain", *photos, "--sae", str(run), *model, "--feature", "3", "--scale", value,
                     "--out", str(tmp_path / "e"))  # fmt: skip
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and "--scale" in lines[0], res.output
    assert not (tmp_path / "t").exists() and not (tmp_path / "e").exists()
    out = tmp_path / "diverged"
    res = invoke("sae", "train", str(shapes_folder), *model, "--layer", LAYER, *QUICK, "--lr", "1e6",
                 "--out", str(out), "--json")  # fmt: skip
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "diverged" in lines[-1], res.output
    assert res.stdout == "" and not any(
        (out / n).exists() for n in (store.CONFIG, store.WEIGHTS, "metrics.json")
    )
    store.write_json(tmp_path / "m.json", {"explained_variance": float("nan"), "kl": float("inf")})
    assert json.loads((tmp_path / "m.json").read_text()) == {"explained_variance": None, "kl": None}


def test_an_interrupted_run_says_rerunning_train_resumes_it(
    shapes_folder: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """features and explain on a run killed while training (its config.json and checkpoint, no weights):
    one line, exit 2, that says the training was interrupted and the same train command resumes it (it used
    to say there was no dictionary here)."""
    folder = tmp_path / "killed"
    folder.mkdir()
    (folder / store.CONFIG).write_text(json.dumps({"format": store.FORMAT, "status": "training"}))
    (folder / store.CHECKPOINT).write_bytes(b"partial")
    photo = _photos(shapes_folder, 1)
    for args in (["features", str(folder), *photo], ["explain", *photo, "--sae", str(folder)]):
        res = (
            invoke("sae", *args, "--out", str(tmp_path / "o")) if "explain" in args else invoke("sae", *args)
        )
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1, res.output
        assert "interrupted" in lines[0] and "resumes it" in lines[0]
