"""What ``hookviz trust`` checks before it computes: the ``--budget`` (a duration, counted from the process's
start, so that loading the model is part of it) and the ``--out`` folder (a result there already, or another
run writing into it: refused at once, not after the battery has run)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from hookviz.errors import OutputError, UsageError
from hookviz.io.outputs import make_folder

__all__ = ["LOCK", "MAX_BUDGET", "claimed", "held", "parse_budget", "process_started"]

#: The longest budget taken: a week (a larger one is a typo, such as ``1e9``).
MAX_BUDGET = 7 * 24 * 3600.0
#: The file a run holds in its ``--out`` folder while it computes: the process id that holds it.
LOCK = "trust.lock"
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
_IMPORTED = time.monotonic()


def parse_budget(text: str | float | None) -> float | None:
    """``--budget``: seconds (``600``), or a duration in ``h``, ``m`` and ``s`` (``10m``, ``1m30s``,
    ``1h15m``); None for no budget.

    Raises:
        UsageError: anything else, zero, or more than a week.
    """
    if text is None:
        return None
    if isinstance(text, bool):  # True is not one second
        raise UsageError(f"--budget {text}: a time above zero and at most a week, such as 600, 90s or 10m")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        word = text.strip().lower().replace(" ", "")
        parts = _DURATION.fullmatch(word)
        if re.fullmatch(r"\d+(\.\d+)?", word):
            seconds = float(word)
        elif parts is not None and any(parts.groups()):
            seconds = sum(float(g or 0) * unit for g, unit in zip(parts.groups(), (3600, 60, 1), strict=True))
        else:
            seconds = -1.0
    if not 0 < seconds <= MAX_BUDGET:
        said = "a time above zero and at most a week, such as 600, 90s, 10m, 1m30s or 1h"
        raise UsageError(f"--budget {text}: {said}")
    return seconds


def process_started() -> float:
    """When this process started, as a :func:`time.monotonic` reading (where the system does not say: when
    this module was first imported, before the model loads)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = float(fields[19]) / os.sysconf("SC_CLK_TCK")  # since boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError, AttributeError):
        return _IMPORTED
    return min(_IMPORTED, time.monotonic() - max(0.0, uptime - ticks))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return False
    return True


def _lock(lock: Path, out: Path, what: str) -> None:
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            text = lock.read_text(encoding="utf-8", errors="replace").strip()
            if not text or (text.isdigit() and _alive(int(text))):  # empty: its writer is writing its pid
                held = f"process {text}" if text else "a process"
                raise OutputError(
                    f"another {what} ({held}) is writing into {out}; wait for it or "
                    f"give another --out (delete {lock} if no such run is going)"
                ) from None
            lock.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return
    raise OutputError(f"{lock} keeps coming back: another {what} is starting in {out}; give another --out")


@contextlib.contextmanager
def claimed(out: Path, files: tuple[str, ...], overwrite: bool) -> Iterator[None]:
    """Hold ``out`` for one trust run while it computes and writes: refused at once when an earlier result is
    there (unless ``overwrite``) or another run holds it (``OUT/trust.lock`` with a live process id); a lock
    left by a process that is gone is taken over.

    Raises:
        OutputError: the folder holds a result (a `trust.json` that cannot be read said as such, with the
            fix), or another run is writing into it.
    """
    there = [out / f for f in files if (out / f).exists()]
    if there and not overwrite:
        raise OutputError(_earlier(there))
    with held(out, LOCK, "hookviz trust"):
        yield


def _earlier(there: list[Path]) -> str:
    """Why an earlier result in ``--out`` stops a run: it is there, or its ``trust.json`` is there and cannot
    be parsed (cut short by a full disk or a kill: said to be unreadable, with the fix)."""
    for file in there:
        if file.name == "trust.json":
            try:
                json.loads(file.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                return (f"{file} is unreadable, truncated or not JSON ({exc}); run hookviz trust again with "
                        f"--out {file.parent} --overwrite")  # fmt: skip
    return f"{there[0]} exists (an earlier trust run); --overwrite replaces it, or another --out"


@contextlib.contextmanager
def held(out: Path, name: str, what: str) -> Iterator[None]:
    """``out`` held by this process while the block runs: ``OUT/name`` holds its process id; one line (exit
    3) where a live process holds it already (``what`` names that run); a lock whose process is gone is taken
    over. A folder it made and left empty is removed.

    Raises:
        OutputError: another run is writing into ``out``, or ``out`` cannot be a folder written to.
    """
    made = not out.exists()
    make_folder(out)  # a file, or a folder that cannot be made or written: one line
    lock = out / name
    _lock(lock, out, what)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        if made and not any(out.iterdir()):  # refused before it wrote anything: leave no trace
            out.rmdir()
