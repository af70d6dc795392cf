"""``trust.json`` read back: one cut short is said to be unreadable, with the fix, never taken for absent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hookviz.errors import UsageError
from hookviz.evaluation.trust_read import read_trust, trust_runs
from hookviz.io.shapes import shapes_batch
from hookviz.run.verdicts import trust_key
from hookviz.tasks import load_model
from tests.conftest import invoke, records, write_image

MODEL = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48"]


def _written(folder: Path) -> Path:
    """A whole trust.json as ``hookviz trust`` writes it (one candidate), then cut in half."""
    whole = _whole(folder).joinpath("trust.json").read_text()
    return _put(folder, whole[: len(whole) // 2])


def _whole(folder: Path, weights: str = "none") -> Path:
    """A whole trust.json as ``hookviz trust`` writes it (one candidate) in ``folder``, for the shapes CNN
    with ``weights`` (its fingerprint, as a record's settings hold it)."""
    test = {"name": "class", "value": 0.2, "ci": 0.05, "outcome": "pass", "rule": "r", "per_photo": [0.2]}
    data = {
        "model": "tests.conftest:TinyCNN", "photos": ["a", "b"], "seed": 0, "default": None,
        "candidates": [{"method": "gradcam", "layer": "features", "verdict": "recommended", "reason": "r",
                        "control": False, "tests": {"class": test}}],
        "answer": "recommended: gradcam at features", "notes": [],
        "key": {"model": "tests.conftest:TinyCNN", "weights": weights},
        "model_check": {"entropy": 0.1, "flips": 0.0, "same_class": False, "at_chance": False,
                        "reason": "ok"},
    }  # fmt: skip
    folder.mkdir(parents=True)
    whole = json.dumps(data, indent=1)
    assert read_trust(_put(folder, whole)).report.answer == data["answer"]  # whole, it reads
    return folder


def _put(folder: Path, text: str) -> Path:
    (folder / "trust.json").write_text(text)
    return folder


def test_a_truncated_trust_json_is_said_to_be_unreadable_with_the_fix(tmp_path: Path) -> None:
    folder = _written(tmp_path / "trust")
    with pytest.raises(UsageError) as caught:
        read_trust(folder)
    said = str(caught.value)
    assert "is unreadable, truncated or not JSON" in said and f"--out {folder} --overwrite" in said
    assert "holds no" not in said and "\n" not in said
    warned: list[str] = []
    assert trust_runs([tmp_path], warned.append) == [] and "truncated" in warned[0]


def test_gradcam_auto_given_a_truncated_run_says_so_rather_than_none(tmp_path: Path) -> None:
    folder = _written(tmp_path / "trust")
    photos = tmp_path / "photos"
    photos.mkdir()
    x, _, _ = shapes_batch(2, np.random.default_rng(1))
    for i, image in enumerate(x):
        write_image(photos / f"s{i}.png", (image.numpy().transpose(1, 2, 0) * 255).astype(np.uint8))
    model = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48"]
    r = invoke("gradcam", str(photos), *model, "--method", "auto", "--trust", str(folder), "--out",
               str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "truncated" in r.stderr and "--overwrite" in r.stderr and "holds no trust.json" not in r.stderr


def test_a_run_is_named_as_the_command_line_gave_it_and_listed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hookviz report cams`` run beside cams/ names its trust run ``cams/trust``: the page's header showed
    the run's absolute path (docs/img/report-verdicts.png read /tmp/...), whatever the user typed."""
    monkeypatch.chdir(tmp_path)
    photos = Path("photos")
    photos.mkdir()
    x, _, _ = shapes_batch(2, np.random.default_rng(1))
    for i, image in enumerate(x):
        write_image(photos / f"s{i}.png", (image.numpy().transpose(1, 2, 0) * 255).astype(np.uint8))
    model = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48"]
    r = invoke("gradcam", "photos", *model, "--method", "gradcam", "--out", "cams", "-q")
    assert r.exit_code == 0, r.stderr
    _whole(Path("cams") / "trust", records(Path("cams"))[0]["settings"]["weights"])
    # Found through three places (relative, its parent, absolute): one run, named as first given.
    runs = trust_runs([Path("cams/trust"), Path("cams"), tmp_path / "cams"])
    assert [r.folder for r in runs] == [Path("cams/trust")]
    assert [r.folder for r in trust_runs([tmp_path / "cams"])] == [tmp_path / "cams" / "trust"]
    r = invoke("report", "cams")
    assert r.exit_code == 0, r.stderr
    html = (tmp_path / "cams" / "index.html").read_text()
    assert "verdicts from the trust run in cams/trust (tests.conftest:TinyCNN, 2 photo(s))" in html
    assert str(tmp_path) not in html


def _photos(folder: Path) -> Path:
    folder.mkdir()
    x, _, _ = shapes_batch(2, np.random.default_rng(1))
    for i, image in enumerate(x):
        write_image(folder / f"s{i}.png", (image.numpy().transpose(1, 2, 0) * 255).astype(np.uint8))
    return folder


def test_trust_into_a_folder_whose_trust_json_is_cut_short_names_it_unreadable(tmp_path: Path) -> None:
    """Not "exists (an earlier trust run)": the file is said to be unreadable, with the fix (exit 3, before
    the model loads); a whole one there is still "an earlier trust run"."""
    folder = _written(tmp_path / "trust")
    r = invoke("trust", str(_photos(tmp_path / "photos")), *MODEL, "--out", str(folder))
    assert r.exit_code == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{folder / 'trust.json'} is unreadable, truncated or not JSON" in r.stderr
    assert f"--out {folder} --overwrite" in r.stderr and "an earlier trust run" not in r.stderr
    whole = _whole(tmp_path / "whole")
    r = invoke("trust", str(tmp_path / "photos"), *MODEL, "--out", str(whole))
    assert r.exit_code == 3 and "exists (an earlier trust run)" in r.stderr, r.stderr


def test_gradcam_auto_names_a_truncated_run_in_a_subfolder_of_trust_beside_the_one_it_draws(
    tmp_path: Path,
) -> None:
    """``--trust DIR`` with a good run in DIR and one cut short in a subfolder: the good one is drawn from,
    and the one cut short is named in a note line (not skipped in silence)."""
    weights = trust_key(load_model("tests.conftest:TinyCNN", "none", input_size=48))["weights"]  # this init's
    good = _whole(tmp_path / "trust", weights)
    bad = _written(tmp_path / "trust" / "older")
    r = invoke("gradcam", str(_photos(tmp_path / "photos")), *MODEL, "--method", "auto", "--trust", str(good),
               "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (said,) = [line for line in r.stderr.splitlines() if line.startswith(f"hookviz: note: --trust {good}")]
    assert said.startswith(f"hookviz: note: --trust {good}: left out: {bad / 'trust.json'} is unreadable")
    assert "--method auto chose gradcam at features" in r.stderr
