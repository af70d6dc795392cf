"""The private folder of the photos dropped onto an explorer's page: made on the first drop (mode 0700, its
name holding the explorer's process id), removed when the explorer stops, and swept at the next start when the
explorer that made it is gone without removing it (killed, its machine off)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

PREFIX = "hookviz-explore-"
_NAMED = re.compile(rf"{PREFIX}(\d+)-\w+")


def make() -> Path:
    """A new private folder in the temporary folder, named after this process."""
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))  # mode 0700: the user's only


def remove(folder: Path | None) -> None:
    """Remove ``folder`` and the photos in it (nothing when it is ``None`` or already gone)."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def sweep(root: Path | None = None) -> list[Path]:
    """Remove the folders of explorers whose process is gone; the ones removed.

    Only folders named as :func:`make` names them, owned by this user, whose process no longer runs: another
    user's, a running explorer's, or a link are left alone (a process id reused since keeps one a while).

    Args:
        root: where to look; the temporary folder by default.
    """
    if sys.platform == "win32":  # no owner to check, and os.kill there ends the process it names
        return []
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        named = _NAMED.fullmatch(folder.name)
        try:
            info = folder.lstat()
        except OSError:
            continue
        if named is None or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if not _alive(int(named[1])):
            remove(folder)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process id: not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True
