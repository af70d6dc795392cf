"""Writing files safely (:mod:`hookviz.io.files`): whole files through a rename, the user's umask, appends."""

from __future__ import annotations

import importlib
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from hookviz.errors import OutputError
from hookviz.io import files
from hookviz.io.files import TEMP, append_line, atomic_write
from hookviz.run.pipeline import Output
from tests.conftest import (
    invoke,
    records,
)


def test_a_written_file_takes_the_umask_in_force_when_it_is_written(tmp_path: Path) -> None:
    """The mode is 0o666 less the umask of the moment (one set after hookviz was imported included), and no
    temp file is left beside it."""
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "a.txt", "one")
        os.umask(0o002)
        atomic_write(tmp_path / "b.txt", b"two")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "b.txt").stat().st_mode) == 0o664
    assert (tmp_path / "a.txt").read_text() == "one" and sorted(p.name for p in tmp_path.iterdir()) == [
        "a.txt",
        "b.txt",
    ]


def test_importing_and_writing_never_change_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing calls ``os.umask`` (setting it to read it would give a file another thread creates in that
    instant the wrong mode): the module imported afresh and a hundred writes from eight threads with
    ``os.umask`` made to fail."""

    def refused(mask: int) -> int:
        raise AssertionError(f"os.umask({mask:o}) called")

    monkeypatch.setattr(os, "umask", refused)
    importlib.reload(files)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(100):
                files.atomic_write(tmp_path / f"{n}.{i % 3}.txt", f"{n} {i}")
        except BaseException as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"{n}.{k}.txt" for n in range(8) for k in range(3))
    assert (tmp_path / "5.0.txt").read_text() == "5 99" and (tmp_path / "5.1.txt").read_text() == "5 97"


def test_a_temp_name_is_one_the_cleanup_recognises(tmp_path: Path) -> None:
    """The temp file's name matches :data:`TEMP` (what a later run removes after a crash) and an existing
    final name is kept with ``exclusive``."""
    fd, tmp = files._fresh(tmp_path / "map.png")
    os.close(fd)
    match = TEMP.match(tmp.name)
    assert match is not None and int(match.group(1)) == os.getpid()
    atomic_write(tmp_path / "map.png", b"x")
    with pytest.raises(FileExistsError):
        atomic_write(tmp_path / "map.png", b"y", exclusive=True)
    assert (tmp_path / "map.png").read_bytes() == b"x"


RANDOM_64 = ["--weights", "none", "--input-size", "64", "--device", "cpu"]


def test_planted_links_never_redirect_a_write(two_photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    from hookviz.io.files import atomic_write

    # The old predictable temp names, planted for this process: mkstemp never opens them.
    target = out / "x.png"
    (out / f".x.png.{os.getpid()}.tmp").symlink_to(victim)
    atomic_write(target, b"png")
    assert victim.read_text() == "precious" and target.read_bytes() == b"png"
    # A link at the final name is replaced by the file, not written through.
    link = out / "y.png"
    link.symlink_to(victim)
    atomic_write(link, b"new")
    assert victim.read_text() == "precious" and not link.is_symlink()
    # A manifest that is a link is refused in one line (exit 3).
    (out / "manifest.jsonl").symlink_to(victim)
    r = invoke("gradcam", str(two_photos), *RANDOM_64, "--out", str(out), "-q")
    assert r.exit_code == 3 and "a symlink is refused" in r.stderr, r.stderr
    assert victim.read_text() == "precious"


def test_a_manifest_without_its_last_newline_keeps_the_next_record(two_photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.jsonl").write_text('{"input": "old.png", "status": "error", "error": "cut"}')
    assert invoke("gradcam", str(two_photos), *RANDOM_64, "--out", str(out), "-q").exit_code == 0
    recs = records(out)
    assert [Path(str(x["input"])).name for x in recs] == ["old.png", "a.png", "b.png"]


TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]


def test_a_line_that_cannot_be_written_whole_is_taken_back_and_said(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n')
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    real = os.write
    calls = [0]

    def full_disk(f: int, data: bytes) -> int:
        calls[0] += 1
        if calls[0] == 1:
            return real(f, data[:7])  # half the line fits
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        append_line(fd, b'{"b": 2, "c": 3}\n')
    monkeypatch.setattr(os, "write", real)
    os.close(fd)
    assert path.read_text() == '{"a": 1}\n'  # no half line

    out = Output(tmp_path / "o")
    out.prepare()
    monkeypatch.setattr(
        os, "write", lambda f, d: (_ for _ in ()).throw(OSError(28, "No space left on device"))
    )
    with pytest.raises(OutputError, match="No space left on device"):
        out.record({"input": "x"})


def test_a_symlinked_manifest_is_refused_before_any_output(labelled_photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (tmp_path / "elsewhere.jsonl").write_text("")
    (out / "manifest.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    r = invoke("gradcam", str(labelled_photos), *TINY, "--out", str(out))
    assert r.exit_code == 3 and "a symlink is refused" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["manifest.jsonl"]  # no PNG was written
