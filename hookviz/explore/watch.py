"""Whether an input's file changed or went since the explorer first read it: its size, time and inode
checked on every use (one ``stat``), its SHA-256 compared when they differ (a file touched, or copied over
with the same bytes, is the same photo)."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hookviz.explore.looks import Gone


@dataclass(frozen=True)
class Seen:
    """A file as last seen: what ``stat`` says of it, and its bytes' digest."""

    size: int
    mtime_ns: int
    inode: int
    digest: str


class Watch:
    """Each input's file as first read; :meth:`changed` says when it is another since."""

    def __init__(self) -> None:
        self._seen: dict[int, Seen] = {}
        # A video's clips share one file: it is hashed once.
        self._digests: dict[tuple[str, int, int, int], str] = {}
        self._notes: dict[int, str] = {}
        self._lock = threading.Lock()

    def changed(self, index: int, path: Path, name: str) -> bool:
        """Whether input ``index``'s file holds other bytes than when first seen (then seen anew, with a
        note); False the first time.

        Raises:
            Gone: the file was deleted or moved away.
        """
        with self._lock:
            try:
                st = path.stat()
                before = self._seen.get(index)
                if before is not None and (st.st_size, st.st_mtime_ns, st.st_ino) == (
                    before.size,
                    before.mtime_ns,
                    before.inode,
                ):
                    return False
                key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
                if key not in self._digests:
                    self._digests[key] = _digest(path)
            except (FileNotFoundError, NotADirectoryError):
                raise Gone(
                    f"{name}: its file is gone (deleted or moved since the explorer listed it); put it back, "
                    "or restart hookviz explore"
                ) from None
            now = Seen(st.st_size, st.st_mtime_ns, st.st_ino, self._digests[key])
            self._seen[index] = now
            if before is None or before.digest == now.digest:
                return False
            when = time.strftime("%H:%M:%S")
            self._notes[index] = f"{name} changed on disk; read again at {when} (earlier views: the old one)"
            return True

    def note(self, index: int) -> str | None:
        """The line saying input ``index`` was re-read after it changed, if it was."""
        return self._notes.get(index)


def _digest(path: Path) -> str:
    """The SHA-256 of the file's bytes, read a MiB at a time (a video need not fit in memory twice)."""
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(2**20):
            sha.update(chunk)
    return sha.hexdigest()
