"""Writing files safely (:mod:`hookviz.io.files`): whole files through a rename, the user's umask, appends."""

from __future__ import annotations

import importlib
import os
import stat
import threading
from pathlib import Path

import pytest

from hookviz.io import files
from hookviz.io.files import TEMP, atomic_write


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
