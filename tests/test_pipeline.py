"""Input expansion, safe deterministic output names, atomic writes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hookviz.run.pipeline import Output, expand_inputs, output_stem
from tests.conftest import (
    PATIENCE,
    ROOT,
    invoke,
    records,
    started,
    write_image,
)


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


RANDOM_64 = ["--weights", "none", "--input-size", "64", "--device", "cpu"]


class NaNForBright(nn.Module):
    """A classifier that diverges (NaN logits) on bright images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        logits = self.fc(h.mean(dim=(2, 3)))
        bright = (x.mean(dim=(1, 2, 3)) > 0.5)[:, None]
        return torch.where(bright, torch.full_like(logits, float("nan")), logits)


def make_nan() -> nn.Module:
    torch.manual_seed(0)
    return NaNForBright()


def _strict(line: str) -> dict[str, object]:
    """Parse as strict JSON: NaN / Infinity are not JSON."""

    def refuse(name: str) -> object:
        raise ValueError(f"non-JSON constant {name}")

    value = json.loads(line, parse_constant=refuse)
    assert isinstance(value, dict)
    return value


def test_non_finite_numbers_are_strict_json_and_a_nan_prediction_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    write_image(d / "dark.png", np.full((40, 40, 3), 20, np.uint8))
    write_image(d / "bright.png", np.full((40, 40, 3), 240, np.uint8))
    out = tmp_path / "out"
    r = invoke("gradcam", str(d), "--model", "tests.test_pipeline:make_nan", "--input-size", "40",
               "--mean", "0,0,0", "--std", "1,1,1", "--out", str(out), "--json", "-q")  # fmt: skip
    assert r.exit_code == 1
    recs = {Path(str(x["input"])).name: x for x in map(_strict, r.stdout.splitlines())}
    assert recs["dark.png"]["status"] == "ok"
    assert recs["bright.png"]["status"] == "error" and "not finite" in str(recs["bright.png"]["error"])
    for line in (out / "manifest.jsonl").read_text().splitlines():
        _strict(line)
    from hookviz.run.pipeline import to_json

    assert to_json({"a": float("nan"), "b": [float("inf"), 1.5]}) == '{"a": null, "b": [null, 1.5]}'


def test_folder_symlinks_are_followed_without_loops(tmp_path: Path) -> None:
    from hookviz.run.pipeline import expand_inputs

    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    write_image(real / "sub" / "x.png", np.zeros((4, 4, 3), np.uint8))
    top = tmp_path / "top"
    top.mkdir()
    (top / "link").symlink_to(real)
    (real / "sub" / "back").symlink_to(top)  # a loop through the link
    write_image(top / "y.jpg", np.zeros((4, 4, 3), np.uint8))
    (top / "y.jpg").rename(top / "y.jpg ")  # a suffix with a trailing space, as some zips leave it
    names = sorted(Path(i.name).name for i in expand_inputs([str(top)]) if i.error is None)
    assert names == ["x.png", "y.jpg "]


def test_a_file_name_that_is_not_utf8_is_processed_and_kept(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    raw = os.fsencode(d) + b"/caf\xe9.png"
    write_image(Path(os.fsdecode(raw)), np.full((40, 50, 3), 90, np.uint8))
    out = tmp_path / "out"
    r = invoke("gradcam", str(d), *RANDOM_64, "--out", str(out), "-q", "--json")
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    assert rec["status"] == "ok" and os.fsencode(str(rec["input"])) == raw  # lossless
    (line,) = (out / "manifest.jsonl").read_bytes().splitlines()
    line.decode("utf-8")  # valid UTF-8 on disk


def test_save_raw_added_to_a_finished_run_writes_only_the_arrays(two_photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert invoke("gradcam", str(two_photos), *RANDOM_64, "--out", str(out), "-q").exit_code == 0
    pngs = {p: p.stat().st_mtime_ns for p in out.glob("*.png")}
    r = invoke("gradcam", str(two_photos), *RANDOM_64, "--out", str(out), "-q", "--save-raw")
    assert r.exit_code == 0, r.stderr
    assert len(list(out.glob("*.npy"))) == 4  # map and full map, per photo
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.png")} == pngs
    assert [x["status"] for x in records(out)][-2:] == ["ok", "ok"]


TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]


def test_two_identical_runs_into_one_folder_at_once_report_no_failure(
    labelled_photos: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o"
    cmd = [
        sys.executable,
        "-m",
        "hookviz",
        "gradcam",
        str(labelled_photos),
        *TINY,
        "--out",
        str(out),
        "-q",
        "-b",
        "1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with contextlib.ExitStack() as stack:
        runs = [
            stack.enter_context(started(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True))
            for _ in range(2)
        ]
        said = [p.communicate(timeout=PATIENCE)[1] for p in runs]
    codes = [p.returncode for p in runs]
    assert codes == [0, 0], said
    recs = records(out)
    assert codes == [0, 0] and len(recs) == 8
    assert {x["status"] for x in recs} <= {"ok", "skipped"}
    assert sum(x["status"] == "ok" for x in recs) >= 4


def test_finish_records_skipped_when_another_run_completed_the_set(tmp_path: Path) -> None:
    """The race itself, forced: the final name appears between the render and the rename."""
    from hookviz.io.inputs import Item
    from hookviz.run import pipeline

    photo = write_image(tmp_path / "p.png", np.zeros((20, 20, 3), np.uint8))

    from hookviz.jobs.common import BaseJob

    class Job(BaseJob):
        kind = "toy"

        def settings(self) -> dict[str, Any]:
            return {"model": "toy"}

        def planned(self, prefix: str) -> list[str]:
            return [f"{prefix}.out.bin"]

        def compute(self, x: Any) -> Any:
            return x

        def render(self, result: Any, index: int, rgb: Any, box: Any, prefix: str) -> Any:
            (out.root / f"{prefix}.out.bin").write_bytes(b"theirs")  # the other run wins the race
            return [(f"{prefix}.out.bin", b"mine")], {}

    from hookviz.io.images import Preprocess

    out = Output(tmp_path / "o")
    out.prepare()
    pre = Preprocess(crop_size=8, resize_size=8)
    recs = list(
        pipeline.run([Item(str(photo), photo)], Job(), preprocess=pre, output=out, device="cpu", base={})
    )  # type: ignore[arg-type]
    assert recs[0]["status"] == "skipped" and "another run" in recs[0]["note"]
    assert (out.root / Path(recs[0]["outputs"][0]).name).read_bytes() == b"theirs"


def test_two_runs_writing_one_input_at_once_complete_its_set_and_neither_fails(tmp_path: Path) -> None:
    """The other run has written the first of an input's two outputs only, between this run's check and its
    writing: this run writes the second, and the set is complete: skipped, not an error."""
    from hookviz.io.images import Preprocess
    from hookviz.io.inputs import Item
    from hookviz.jobs.common import BaseJob
    from hookviz.run import pipeline

    photo = write_image(tmp_path / "p.png", np.zeros((20, 20, 3), np.uint8))

    class Job(BaseJob):
        kind = "toy"

        def settings(self) -> dict[str, Any]:
            return {"model": "toy"}

        def planned(self, prefix: str) -> list[str]:
            return [f"{prefix}.a.bin", f"{prefix}.b.bin"]

        def compute(self, x: Any) -> Any:
            return x

        def render(self, result: Any, index: int, rgb: Any, box: Any, prefix: str) -> Any:
            (out.root / f"{prefix}.a.bin").write_bytes(b"theirs")  # the other run is one file ahead
            return [(f"{prefix}.a.bin", b"mine"), (f"{prefix}.b.bin", b"mine")], {}

    out = Output(tmp_path / "o")
    out.prepare()
    pre = Preprocess(crop_size=8, resize_size=8)
    recs = list(
        pipeline.run([Item(str(photo), photo)], Job(), preprocess=pre, output=out, device="cpu", base={})
    )  # type: ignore[arg-type]
    assert recs[0]["status"] == "skipped" and "another run" in recs[0]["note"], recs[0]
    a, b = (out.root / Path(o).name for o in recs[0]["outputs"])
    assert (a.read_bytes(), b.read_bytes()) == (b"theirs", b"mine")
