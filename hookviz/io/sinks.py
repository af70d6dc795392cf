"""Results as a data set: the records as a Parquet table (a row per input x target x method x layer), the raw
maps in one chunked Zarr store; each at a local path or an fsspec URL (``s3://bucket/run/maps.zarr``).

Both are written per input, as the pipeline finishes it: a Zarr array per input, method and layer (its own
chunk: two ranks or two threads never write one), and a Parquet part per process and run, put in place whole
at the end (``records.parquet/part-<run>-<R>.parquet``: the run's start time and a random id, rank ``R``;
pyarrow and every engine read the folder as one table). A part is never replaced: a second run into the folder
(more photos, other settings, another torchrun job, fewer ranks) adds its own, and a skipped input whose rows
the table holds already adds none.
"""

from __future__ import annotations

import io
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hookviz.errors import OutputError, UsageError, first_line
from hookviz.io.stores import filesystem, is_url, storage_options

#: The Parquet table's columns: the record's fields, then one map's (null where a record has no map).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("input", "string"), ("status", "string"), ("error", "string"), ("command", "string"),
    ("model", "string"), ("weights", "string"), ("task", "string"), ("key", "string"), ("prefix", "string"),
    ("predicted_index", "int64"), ("predicted_name", "string"), ("predicted_score", "float64"),
    ("method", "string"), ("layer", "string"), ("target_index", "int64"), ("target_name", "string"),
    ("target_score", "float64"), ("map_min", "float64"), ("map_max", "float64"), ("finite", "bool"),
    ("file", "string"), ("raw", "string"), ("box", "list<int64>"), ("time", "string"),
)  # fmt: skip


def record_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A manifest record as table rows: one per map (target x method x layer), or one for a record without
    maps (an error, a skipped input's record holds its maps again)."""
    predicted = record.get("predicted") or {}
    fields = ("input", "status", "error", "command", "model", "weights", "task", "key", "prefix", "time")
    base = {
        **{k: _text(record.get(k)) for k in fields},
        "predicted_index": predicted.get("index"),
        "predicted_name": _text(predicted.get("name")),
        "predicted_score": predicted.get("score"),
        "box": [int(v) for v in record["box"]] if isinstance(record.get("box"), list) else None,
    }
    outputs = [str(o) for o in record.get("outputs") or []]
    rows = []
    for entry in record.get("maps") or []:
        # A vision-language model's map (``vlm``) has an answer token for its target.
        target = entry.get("target") or (
            {"index": entry["token"], "name": entry.get("text"), "score": entry.get("prob")}
            if "token" in entry
            else {}
        )
        file = str(entry.get("file") or "")
        rows.append({
            **base, "method": entry.get("method"), "layer": _text(entry.get("layer")),
            "target_index": target.get("index"), "target_name": _text(target.get("name")),
            "target_score": target.get("score"), "map_min": entry.get("min"), "map_max": entry.get("max"),
            "finite": entry.get("finite"), "file": file or None,
            "raw": entry.get("raw") or _raw_of(file, outputs),
        })  # fmt: skip
    return rows or [base]


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _raw_of(file: str, outputs: list[str]) -> str | None:
    """Where a map's raw array went: its ``.npy`` beside the PNG, or its array in the Zarr store."""
    if not file.endswith(".png"):
        return None
    stem = file[: -len(".png")]
    prefix, array = _array_name(f"{stem}.npy")
    return next((w for w in outputs if w.endswith((f"{stem}.npy", f"/{prefix}/{array}"))), None)


def _array_name(name: str) -> tuple[str, str]:
    """An output name's input prefix (``<stem>-<hash>.<model>.<key>``) and the rest (the array's name)."""
    parts = name[: -len(".npy")].split(".")
    # <stem>-<hash> . <model...> . <key: 8 hex> . <rest>: the key is the first 8-hex part after the stem.
    for i in range(1, len(parts)):
        if len(parts[i]) == 8 and all(c in "0123456789abcdef" for c in parts[i]):
            return ".".join(parts[: i + 1]), ".".join(parts[i + 1 :])
    return parts[0], ".".join(parts[1:])


def run_id() -> str:
    """A name for one run's parts: when it started (sorts in time order) and 8 random hex digits."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


class RecordTable:
    """The run's rows, written as one Parquet file at ``where/part-<run>-<rank>.parquet`` when the run ends
    (a row group every ``rows`` rows meanwhile, so a long run holds little). Rows of a ``skipped`` record are
    left out when the table (every part there) holds that input's rows for these settings already."""

    def __init__(self, where: str, rank: int = 0, rows: int = 512, run: str | None = None) -> None:
        try:
            import pyarrow as pa
        except ImportError:
            raise UsageError("--records parquet needs pyarrow: pip install 'hookviz[data]'") from None
        self.pa = pa
        self.schema = pa.schema(
            [(n, pa.list_(pa.int64()) if t.startswith("list") else t) for n, t in COLUMNS]
        )
        self.where, self.rank, self.limit = where.rstrip("/"), rank, rows
        self.run = run or run_id()
        self.final = f"{self.where}/part-{self.run}-{rank}.parquet"
        temp = f"{self.where}/.part-{self.run}-{rank}.{os.getpid()}.tmp"
        self.temp = self.final if is_url(self.where) else temp
        self.pending: list[dict[str, Any]] = []
        self.writer: Any = None
        self.count = 0
        #: The output prefixes (input x settings) whose rows the table holds.
        self.held = held_prefixes(self.where)

    def add(self, record: dict[str, Any]) -> None:
        prefix = record.get("prefix")
        if record.get("status") == "skipped" and prefix in self.held:
            return  # its rows are there (an earlier run's, or this run's for the same input listed twice)
        self.pending += record_rows(record)
        if prefix:
            self.held.add(str(prefix))
        if len(self.pending) >= self.limit:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        if self.writer is None:
            fs, path = _fs(self.temp)
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.writer = pq.ParquetWriter(path, self.schema, filesystem=_arrow_fs(fs))
        if self.pending:
            self.writer.write_table(self.pa.Table.from_pylist(self.pending, schema=self.schema))
            self.count += len(self.pending)
            self.pending = []

    def close(self) -> str | None:
        """Write what is left and put the file in place (a local one by a rename: never half a table); None
        when the run added no row (no part is written)."""
        if self.writer is None and not self.pending:
            return None
        self._flush()
        self.writer.close()
        if self.temp != self.final:
            os.replace(self.temp, self.final)  # a name of this run's own: nothing there to replace
        return self.final


def held_prefixes(where: str) -> set[str]:
    """The output prefixes of the rows in the Parquet table at ``where`` (every part; none when there is no
    table yet).

    Raises:
        OutputError: a table that is there but cannot be read.
    """
    import pyarrow.dataset as ds

    fs, path = _fs(where)
    try:
        if not fs.isdir(path):
            return set()
        parts = ds.dataset(fs._strip_protocol(path), format="parquet", filesystem=_arrow_fs(fs))
        if not parts.files:
            return set()
        table = parts.to_table(columns=["prefix"])
    except Exception as exc:  # a part pyarrow refuses, a store that refuses
        why = first_line(exc, 160)
        raise OutputError(f"--records {where}: cannot read the table there ({why})") from None
    return {str(p) for p in table.column("prefix").to_pylist() if p}


class ZarrMaps:
    """Raw maps in one Zarr store (v3): an array per input and map (``<prefix>/<method>.<layer>[.full]``,
    float16, one chunk), with the input, its crop box in the photo and the shape's meaning as attributes;
    ``complete`` is set once its chunk is written, so a killed run's half-written array is redone."""

    def __init__(self, where: str) -> None:
        try:
            import zarr
        except ImportError:
            raise UsageError("--maps zarr needs zarr: pip install 'hookviz[data]'") from None
        self.zarr, self.where = zarr, where.rstrip("/")
        options = storage_options(self.where) if is_url(self.where) else None
        self.root = _open_group(zarr, self.where, options)

    def location(self, name: str) -> str:
        prefix, array = _array_name(name)
        return f"{self.where}/{prefix}/{array}"

    def exists(self, name: str) -> bool:
        prefix, array = _array_name(name)
        try:
            found = self.root[f"{prefix}/{array}"]
        except KeyError:
            return False
        return bool(found.attrs.get("complete"))

    def write(self, name: str, data: bytes, attrs: dict[str, Any]) -> str:
        """An ``.npy`` output as its array (float16), its attributes, then ``complete``."""
        values = np.load(io.BytesIO(data), allow_pickle=False).astype(np.float16)
        prefix, array = _array_name(name)
        made = self.root.create_array(
            f"{prefix}/{array}", shape=values.shape, chunks=values.shape, dtype="float16", overwrite=True,
            attributes=attrs,
        )  # fmt: skip
        made[...] = values
        made.attrs.update({"complete": True})
        return self.location(name)


def _open_group(zarr: Any, where: str, options: dict[str, Any] | None) -> Any:
    """The store's root group, made if there is none. Two ranks or workers opening a new store at once: one
    finds none, then the other's group where it goes to make it, or reads the group's metadata while the other
    is writing it (a local file, empty or half written); opened again, it is there."""
    reason: Exception = OSError("not opened")
    for attempt in range(8):
        try:
            return zarr.open_group(where, mode="a", storage_options=options)
        except (zarr.errors.ContainsGroupError, json.JSONDecodeError) as exc:
            reason = exc
            time.sleep(0.02 * (attempt + 1))
        except Exception as exc:  # unreachable, refused, not a Zarr store
            reason = exc
            break
    raise OutputError(f"--maps {where}: cannot open it as a Zarr store ({first_line(reason, 160)})")


def _fs(where: str) -> tuple[Any, str]:
    import fsspec

    if not is_url(where):
        return fsspec.filesystem("file"), where
    return filesystem(where)


def _arrow_fs(fs: Any) -> Any:
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    return PyFileSystem(FSSpecHandler(fs))


#: Makes a sink: ``factory(where, rank)``, ``where`` the place resolved from the option (a path or URL),
#: ``rank`` the torchrun rank writing (0 in one process).
SinkFactory = Callable[[str, int], Any]


@dataclass(frozen=True)
class Sink:
    """A registered sink: ``--records NAME`` (what each record also goes to) or ``--maps NAME`` (where the raw
    maps go); ``NAME`` alone puts it at ``OUT/<records|maps>.NAME``, a path or URL ending in ``.NAME`` there.
    """

    name: str
    kind: str
    factory: SinkFactory


#: The sinks by (kind, name): ``records`` sinks take :class:`hookviz.io.outputs.RecordSink`'s calls,
#: ``maps`` sinks :class:`hookviz.io.outputs.MapStore`'s.
SINKS: dict[tuple[str, str], Sink] = {}


def register_sink(name: str, factory: SinkFactory, *, kind: str = "records") -> Sink:
    """Make ``--records NAME`` (or, with ``kind="maps"``, ``--maps NAME``) write through ``factory(where,
    rank)``: a records sink has ``add(record)`` (called after the manifest line; raising takes that line back
    and stops the run) and ``close()``; a maps store ``exists(name)``,
    ``write(name, data, attrs)`` (``data``: the bytes of the ``.npy`` file; called from the run's threads, one
    call at a time) and ``location(name)`` (what the records say). Returns the registered :class:`Sink`.

    Raises:
        UsageError: ``kind`` is neither records nor maps; ``name`` is not a plain word.
    """
    if kind not in ("records", "maps"):
        raise UsageError(f"register_sink({name!r}): kind {kind!r} is neither records nor maps")
    if not name.isidentifier():
        raise UsageError(f"register_sink({name!r}): a sink's name is one word (letters, digits, _)")
    SINKS[(kind, name)] = sink = Sink(name, kind, factory)
    return sink


def unregister_sink(name: str, *, kind: str = "records") -> None:
    """Take back :func:`register_sink`'s ``name`` (a test's, a plugin's)."""
    SINKS.pop((kind, name), None)


register_sink("parquet", lambda where, rank: RecordTable(where, rank))
register_sink("zarr", lambda where, rank: ZarrMaps(where), kind="maps")


def _place(kind: str, value: str, out: Path) -> tuple[Sink, str]:
    """The registered sink ``value`` names and where it writes."""
    if (kind, value) in SINKS:
        return SINKS[(kind, value)], str(out / f"{kind}.{value}")
    names = [name for k, name in SINKS if k == kind]
    for name in names:
        if value.rstrip("/").endswith(f".{name}"):
            return SINKS[(kind, name)], value
    said, ends = " or ".join(names), " or .".join(names)
    raise UsageError(f"--{kind} {value}: give {said}, or a folder or URL ending in .{ends}")


def data_sinks(out: Path, maps: str | None, records: str | None, rank: int = 0) -> tuple[Any, Any]:
    """The maps store (``--maps``) and the records sink (``--records``) a run writes into, each None when not
    asked for: a registered name (``zarr``, ``parquet``) puts it under ``out`` (``OUT/maps.zarr``,
    ``OUT/records.parquet``), else it is a local path or URL ending in ``.NAME``. Both values are checked
    before either is opened.

    Raises:
        UsageError: another value; a missing package. OutputError: a store that cannot be opened.
    """
    store = _place("maps", maps, out) if maps is not None else None
    table = _place("records", records, out) if records is not None else None
    return (
        store[0].factory(store[1], rank) if store is not None else None,
        table[0].factory(table[1], rank) if table is not None else None,
    )
