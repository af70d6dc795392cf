"""A run's output folder: atomic writes under it and its manifest, a record a line (strict JSON), read back to
resume a run."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hookviz.errors import OutputError
from hookviz.io.files import TEMP, append_line, atomic_write, open_append

#: What a file name may hold: ASCII letters, digits, ``_``, ``.`` and ``-``; anything else becomes ``_``.
UNSAFE = re.compile(r"[^\w.-]+", re.ASCII)


def safe_name(text: str) -> str:
    """``text`` as a piece of a file name: only ``[A-Za-z0-9_.-]``, no leading or trailing dot or ``_``."""
    return UNSAFE.sub("_", text).strip("._") or "x"


MANIFEST = "manifest.jsonl"


class MapStore(Protocol):
    """Where raw maps (``.npy`` outputs) go instead of files (``--maps``: ``hookviz.io.sinks.ZarrMaps``).
    ``write`` gets the bytes of the ``.npy`` file (``np.load(io.BytesIO(data))`` is the map), called from the
    run's worker threads one call at a time (an SQLite connection: ``check_same_thread=False``); the record's
    outputs say ``location(name)``; a ``write`` that raises fails that input, saying the store."""

    def exists(self, name: str) -> bool: ...

    def write(self, name: str, data: bytes, attrs: dict[str, Any]) -> str: ...

    def location(self, name: str) -> str: ...


class RecordSink(Protocol):
    """Where each record goes besides the manifest (``--records``: :class:`hookviz.io.sinks.RecordTable`);
    ``close()`` once the run is done."""

    def add(self, record: dict[str, Any]) -> None: ...

    def close(self) -> Any: ...


@dataclass
class Output:
    """Atomic writes under one folder, its manifest, and the sinks the run writes into besides (given when it
    is built: a store for the raw maps, a sink for the records)."""

    root: Path
    overwrite: bool = False
    #: The file records are appended to: ``manifest.jsonl``, or a torchrun rank's part of it.
    manifest: str = MANIFEST
    _manifest_fd: int | None = field(default=None, repr=False)
    #: The latest result record (``ok`` or ``skipped``) per output prefix, read from an earlier manifest.
    previous: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    #: Where raw maps (``.npy`` outputs) go instead of files: a Zarr store (``hookviz.io.sinks.ZarrMaps``).
    maps: MapStore | None = None
    #: Whether PNG pictures are written (``--no-pictures``: the raw maps and records only).
    pictures: bool = True
    #: Where each record also goes (``--records``: a Parquet table), as it is appended to the manifest.
    records: RecordSink | None = None
    _maps_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def prepare(self) -> None:
        """Create the folder (:func:`make_folder`), clean what a killed run left, read the earlier results.

        Raises:
            OutputError: the folder cannot be used.
        """
        make_folder(self.root)
        self._clean_stale_temps()
        self.previous = read_results(self.root / MANIFEST)
        if os.path.lexists(self.root / self.manifest):
            self._open_manifest()  # refused before any work (a symlink), not after the first output

    def _open_manifest(self) -> None:
        if self._manifest_fd is not None:
            return
        try:
            self._manifest_fd = open_append(self.root / self.manifest)
        except OSError as exc:
            raise OutputError(
                f"--out {self.root}: cannot append to {self.manifest} ({exc.strerror or exc}; a symlink "
                "is refused); remove it or choose another --out"
            ) from None

    def _clean_stale_temps(self) -> None:
        """Remove temp files left by a killed run (their process is gone); complete outputs are untouched."""
        for tmp in self.root.glob(".*.tmp"):
            m = TEMP.match(tmp.name)
            if m and not process_alive(int(m.group(1))):
                tmp.unlink(missing_ok=True)

    def path(self, name: str) -> Path:
        if "/" in name or "\\" in name or name.startswith(".") or name in ("", ".", ".."):
            raise ValueError(f"unsafe output name {name!r}")
        return self.root / name

    def write(
        self, name: str, data: bytes, *, replace: bool = False, attrs: dict[str, Any] | None = None
    ) -> Path | str:
        """Write ``data`` to ``root/name`` through a temp file and a rename: never half a file (a raw map into
        the Zarr store instead, when there is one, with ``attrs``; its location returned).

        Raises:
            FileExistsError: the file exists and neither ``overwrite`` nor ``replace`` is on.
        """
        if self.maps is not None and name.endswith(".npy"):
            if self.maps.exists(name) and not (self.overwrite or replace):
                raise FileExistsError(self.maps.location(name))
            with self._maps_lock:  # a store's write() is called one at a time, from the run's threads
                try:
                    self.maps.write(name, data, attrs or {})
                except Exception as exc:
                    raise OutputError(
                        f"--maps: the store {type(self.maps).__name__}'s write() failed on {name} "
                        f"({_said(exc)})"
                    ) from exc
            return str(self.maps.location(name))
        return atomic_write(self.path(name), data, exclusive=not (self.overwrite or replace))

    def keeps(self, name: str) -> bool:
        """Whether output ``name`` is written at all (no PNG with ``pictures`` off)."""
        return kept(name, self.pictures)

    def exists(self, name: str) -> bool:
        """Whether output ``name`` is there (a raw map: complete in the Zarr store)."""
        if self.maps is not None and name.endswith(".npy"):
            return bool(self.maps.exists(name))
        return self.path(name).exists()

    def where(self, name: str) -> str:
        """Where output ``name`` is (a file's path, or a raw map's array in the Zarr store)."""
        if self.maps is not None and name.endswith(".npy"):
            return str(self.maps.location(name))
        return str(self.path(name))

    def record(self, entry: dict[str, Any]) -> None:
        """Append one whole line to the manifest (never interleaved or cut: a line that cannot be written
        whole, on a full disk, is taken back and the run stops with an :class:`OutputError`)."""
        self._open_manifest()
        assert self._manifest_fd is not None
        line = (to_json(entry) + "\n").encode("utf-8")
        start = os.fstat(self._manifest_fd).st_size
        try:
            append_line(self._manifest_fd, line)
        except OSError as exc:
            raise OutputError(
                f"--out {self.root}: cannot append to {self.manifest} ({exc.strerror or exc}); the run "
                "stopped: free some space and rerun (finished inputs are skipped)"
            ) from None
        if self.records is None:
            return
        try:
            self.records.add(entry)
        except Exception as exc:  # the line is taken back: a record is in both, or in neither
            if os.fstat(self._manifest_fd).st_size == start + len(line):  # nobody appended after it
                os.ftruncate(self._manifest_fd, start)
            raise OutputError(
                f"--records: the sink {type(self.records).__name__}'s add() failed on {entry.get('input')!r} "
                f"({_said(exc)}); the run stopped, that input in neither the manifest nor the sink: fix the "
                "sink and rerun (finished inputs are skipped, that one completed)"
            ) from exc

    def close(self) -> None:
        """Close the manifest (a later record opens it again); the sinks stay open (:meth:`finish`)."""
        if self._manifest_fd is not None:
            os.close(self._manifest_fd)
            self._manifest_fd = None

    def finish(self) -> None:
        """Close the manifest and the records' sink (its table put in place): the run is over."""
        self.close()
        if self.records is not None:
            try:
                self.records.close()
            except Exception as exc:
                raise OutputError(
                    f"--records: the sink {type(self.records).__name__}'s close() failed ({_said(exc)}); "
                    f"{self.root / self.manifest} holds every record: the sink may lack some"
                ) from exc


def kept(name: str, pictures: bool) -> bool:
    """Whether output ``name`` is written where ``pictures`` says whether PNGs are (``--no-pictures``)."""
    return pictures or not name.endswith(".png")


def _said(exc: BaseException) -> str:
    """An exception in one line: its type and its message's first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def make_folder(root: Path) -> None:
    """Create ``root`` (a run's output folder, before its sinks open there); fail clearly if it is a file or
    not writable.

    Raises:
        OutputError: the folder cannot be used.
    """
    if root.exists() and not root.is_dir():
        raise OutputError(f"--out {root}: is a file, not a folder; choose another --out")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"--out {root}: cannot create the folder ({exc.strerror})") from None
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".hookviz-probe-"):
            pass
    except OSError as exc:
        raise OutputError(
            f"--out {root}: the folder is not writable ({exc.strerror}); choose another --out"
        ) from None


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by None, in nested dicts and lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def to_json(entry: dict[str, Any]) -> str:
    """One record as strict JSON on one line: non-finite numbers are ``null`` (``NaN`` is not JSON), and a
    file name that is not valid UTF-8 (its bytes kept by Python as lone surrogates) is written with ``\\u``
    escapes, which Python's ``json`` and ``os.fsencode`` turn back into the very same bytes."""
    line = json.dumps(finite(entry), ensure_ascii=False, allow_nan=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(finite(entry), ensure_ascii=True, allow_nan=False)
    return line


def read_results(manifest: Path) -> dict[str, dict[str, Any]]:
    """The latest ``ok``/``skipped`` record per output prefix in a manifest (unreadable lines ignored)."""
    found: dict[str, dict[str, Any]] = {}
    try:
        lines = manifest.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("status") in ("ok", "skipped") and rec.get("prefix"):
            found[str(rec["prefix"])] = rec
    return found


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (a temp file or manifest part of a dead one may be reclaimed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def settings_key(settings: dict[str, Any]) -> str:
    """8 hex digits that change whenever anything in ``settings`` (what changes the pixels) changes."""
    text = json.dumps(settings, sort_keys=True, ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def command_words(head: Sequence[str], inputs: Sequence[str], options: Sequence[str]) -> list[str]:
    """The words of a command that reproduces a run (``shlex.join`` them): ``head`` (``hookviz trust``), the
    inputs, the options; where an input's name starts with ``-`` (``-rf.jpg``, ``--out.jpg``), the options
    come first and the inputs after ``--``, so that a shell reading the line back takes them as inputs."""
    if any(i.startswith("-") and i != "-" for i in inputs):
        return [*head, *options, "--", *inputs]
    return [*head, *inputs, *options]
