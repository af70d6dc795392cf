"""Input expansion, safe deterministic output names, atomic writes."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from hookviz.run.pipeline import Output, expand_inputs, output_stem
from tests.conftest import write_image


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    img = np.full((8, 8, 3), 128, np.uint8)
    (tmp_path / "a" / "deep").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "empty").mkdir()
    write_image(tmp_path / "a" / "cat.jpg", img)
    write_image(tmp_path / "a" / "deep" / "dog.PNG", img)
    write_image(tmp_path / "b" / "cat.jpg", img)
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    os.symlink(tmp_path / "a", tmp_path / "a" / "deep" / "loop")  # a symlink loop
    return tmp_path


def test_directories_globs_files_and_missing(tree: Path) -> None:
    items = expand_inputs(
        [str(tree / "a"), str(tree / "b" / "*.jpg"), str(tree / "nope.jpg"), str(tree / "empty")]
    )
    names = [Path(i.name).relative_to(tree).as_posix() if i.error is None else i.error for i in items]
    assert names[:3] == ["a/cat.jpg", "a/deep/dog.PNG", "b/cat.jpg"]
    assert "no such file or directory" in names[3]
    assert "no images found" in names[4]


def test_stdin_with_crlf_blank_lines_and_duplicates(tree: Path) -> None:
    text = f"{tree}/a/cat.jpg\r\n\r\n  \n{tree}/b/cat.jpg\n{tree}/a/cat.jpg\n"
    items = expand_inputs(["-"], io.StringIO(text))
    assert [i.name for i in items] == [f"{tree}/a/cat.jpg", f"{tree}/b/cat.jpg"]
    assert all(i.error is None for i in items)


def test_outputs_in_the_output_folder_are_never_read_back(tree: Path) -> None:
    """An --out folder inside an input folder: hookviz's outputs there are not inputs, a user's photo is."""
    (tree / "a" / "out").mkdir()
    ours = "cat-0123abcd.resnet18.89abcdef.gradcam.layer4.png"
    for name in (ours, "holiday.png"):
        write_image(tree / "a" / "out" / name, np.zeros((4, 4, 3), np.uint8))
    items = expand_inputs([str(tree / "a")], exclude=tree / "a" / "out")
    assert not any(ours in i.name for i in items)
    assert any(i.name.endswith("out/holiday.png") for i in items)
    globbed = expand_inputs([str(tree / "a" / "**" / "*.png")], exclude=tree / "a" / "out")
    assert not any(ours in i.name for i in globbed) and any("holiday" in i.name for i in globbed)


def test_output_names_are_deterministic_collision_free_and_safe(tree: Path) -> None:
    a, b = output_stem(tree / "a" / "cat.jpg"), output_stem(tree / "b" / "cat.jpg")
    assert a != b and a.startswith("cat-") and a == output_stem(tree / "a" / "cat.jpg")
    for weird in ["-rf --overwrite.jpg", "../../etc/passwd.png", "ünï cödé spaced.jpg", ".hidden.png"]:
        stem = output_stem(Path(weird))
        assert "/" not in stem and not stem.startswith(("-", ".")) and stem.isascii()
        assert all(c.isalnum() or c in "_.-" for c in stem)


def test_atomic_write_and_no_overwrite(tmp_path: Path) -> None:
    out = Output(tmp_path / "o")
    out.prepare()
    p = out.write("x.png", b"first")
    assert p.read_bytes() == b"first"
    with pytest.raises(FileExistsError):
        out.write("x.png", b"second")
    assert p.read_bytes() == b"first"
    Output(tmp_path / "o", overwrite=True).write("x.png", b"second")
    assert p.read_bytes() == b"second"
    assert sorted(f.name for f in (tmp_path / "o").iterdir()) == ["x.png"]  # no temp files left
    with pytest.raises(ValueError, match="unsafe"):
        out.write("../escape.png", b"")


def test_stage_timings_account_for_every_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HOOKVIZ_TIMINGS=FILE: per-stage seconds of the run (encode taken out of render), and the photo count;
    records still come in input order although each batch renders while the next one computes."""
    import json

    from hookviz.io import timing
    from tests.conftest import invoke, records

    target = tmp_path / "stages.json"
    monkeypatch.setenv("HOOKVIZ_TIMINGS", str(target))
    monkeypatch.setattr(timing, "ENABLED", True)
    monkeypatch.setattr(timing, "_TOTALS", {})
    rng = np.random.default_rng(0)
    photos = [
        write_image(tmp_path / f"p{i}.png", rng.integers(0, 255, (60 + i, 80, 3), dtype=np.uint8))
        for i in range(5)
    ]
    out = tmp_path / "out"
    r = invoke(
        "gradcam", *map(str, photos), "--weights", "none", "--batch-size", "2", "--out", str(out), "-q"
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert [rec["input"] for rec in records(out)] == [str(p) for p in photos]
    stages = json.loads(target.read_text())
    assert stages["images"] == 5
    for name in ("decode", "preprocess", "compute", "render", "encode", "write"):
        assert stages[name] > 0, name
