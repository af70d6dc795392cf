"""Writing files safely in a folder others may share: never half a file, never through a planted link.

Temp files are created with ``O_CREAT | O_EXCL`` under a random name (a name someone else created, a symlink
included, is never opened) and the mode ``0o666``, which the kernel narrows by the process's umask as it
stands then (nothing reads or changes the umask: another thread's files keep theirs), then renamed over the
final name (a rename replaces a symlink at the final name instead of writing through it). Appends (the
manifest) open with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from pathlib import Path

#: A temp file of :func:`atomic_write` (or of hookviz before it): ``.<name>.<pid>[.<random>].tmp``.
TEMP = re.compile(r"^\..+\.(\d+)(?:\.[A-Za-z0-9_]+)?\.tmp$")


def file_digest(path: Path) -> str:
    """The first 16 hex digits of a file's SHA-256: its content, whatever its name or time stamp."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def atomic_write(final: Path, data: bytes | str, *, exclusive: bool = False) -> Path:
    """Write ``data`` to ``final`` through a fresh temp file beside it and a rename.

    ``exclusive``: fail with ``FileExistsError`` instead of replacing an existing ``final`` (checked just
    before the rename; a hard link would make it atomic, but not every file system has them).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = _fresh(final)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        if exclusive and os.path.lexists(final):
            raise FileExistsError(final)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


#: Flags of a temp file: a new name only, never through a link, not inherited by a child process.
_FRESH = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _fresh(final: Path) -> tuple[int, Path]:
    """A new temp file beside ``final`` (``.<name>.<pid>.<random>.tmp``), open for writing, of mode 0o666 less
    the umask (as ``open`` makes a file)."""
    for _ in range(100):
        tmp = final.parent / f".{final.name[:80]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, _FRESH | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp name beside {final}")


def open_append(path: Path) -> int:
    """A file descriptor appending to ``path`` (created if missing), refusing a symlink (``OSError``,
    ``ELOOP``). If the file's last line lacks its newline (a killed writer, a hand edit), one is added first,
    so the next line is not swallowed by it."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(fd, b"\n")
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_line(fd: int, line: bytes) -> None:
    """Append one whole line to the file open at ``fd``, or nothing: a write cut short (a full disk) is
    undone (the file truncated back to where it was) and raised as ``OSError``."""
    start = os.fstat(fd).st_size
    done = 0
    try:
        while done < len(line):
            n = os.write(fd, line[done:])
            if n <= 0:
                raise OSError(28, "No space left on device")
            done += n
    except OSError:
        # Taken back only while nobody else appended after it (two runs sharing one manifest).
        if done and os.fstat(fd).st_size == start + done:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
        raise
