"""Inputs where the data lives: any fsspec URL (``s3://``, ``gs://``, ``https://``, ``file://``), WebDataset
tar shards (``shards/{000..099}.tar``, local or at a URL), and tables of paths or URLs (Parquet, CSV, JSON
lines).

Nothing is copied whole. An object is read when its item is (one request for its bytes); a shard is listed by
its tar headers (a seekable file: fsspec reads ranges), and each member is then one range read of its bytes.
Credentials and an S3-compatible endpoint come the usual way (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, as
boto3 reads them). A shard or object that cannot be read is an error for its items alone.
"""

from __future__ import annotations

import csv
import json
import os
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from hookviz.errors import InputError, UsageError, first_line
from hookviz.io.images import Bytes, image_suffixes

#: ``scheme://``: what makes a spec a URL (a Windows drive ``C:\\`` is not one).
_URL = re.compile(r"^[a-z][a-z0-9+.-]+://", re.IGNORECASE)
#: The columns a table's path may be in, when ``--inputs-column`` does not say.
PATH_COLUMNS = ("path", "url", "uri", "image", "file", "filename")
#: The columns a row's class may be in (``--target label`` explains it): the first of these a table has.
LABEL_COLUMNS = ("target", "label", "class", "cls")
#: What a shard is listed with: small blocks, so reading headers does not fetch the members' bytes.
_LIST_BLOCK = 1 << 16


def is_url(spec: str) -> bool:
    return bool(_URL.match(spec))


def is_shard(spec: str) -> bool:
    """A WebDataset shard or a pattern of them (``.tar``, after any brace pattern)."""
    return spec.lower().endswith(".tar") or spec.lower().endswith(".tar}")


@dataclass(frozen=True)
class Blob:
    """Bytes of an input that is not a local file: an object at ``url``, or ``size`` bytes from ``start`` in
    it (a shard's member). ``name`` is what records and lines call it."""

    url: str
    name: str
    start: int | None = None
    size: int | None = None
    #: What the record should say about it (a shard sample's other images, left out).
    note: str | None = None

    def open(self) -> Bytes:
        """The bytes, read now (one request).

        Raises:
            InputError: the object is missing or cannot be read.
        """
        fs, where = filesystem(self.url)
        try:
            if self.start is None:
                data = fs.cat_file(where)
            else:
                data = fs.cat_file(where, start=self.start, end=self.start + (self.size or 0))
        except FileNotFoundError:
            raise InputError(f"{self.name!r}: no such object") from None
        except Exception as exc:  # a store's own errors: refused, unreachable, throttled
            raise InputError(f"{self.name!r}: cannot read it ({first_line(exc, 160)})") from None
        return Bytes(bytes(data), self.name)


def filesystem(url: str) -> tuple[Any, str]:
    """fsspec's file system for ``url`` and the path in it (a local path: the local file system)."""
    import fsspec

    if not is_url(url):
        return fsspec.filesystem("file"), url
    protocol = url.split("://", 1)[0].lower()
    return _cached_fs(protocol, _endpoint() if protocol in ("s3", "s3a") else None), url


def storage_options(url: str) -> dict[str, Any]:
    """What another library's fsspec call needs to reach ``url`` as hookviz does (an S3 endpoint)."""
    endpoint = _endpoint() if url.split("://", 1)[0].lower() in ("s3", "s3a") else None
    return {"endpoint_url": endpoint} if endpoint else {}


def _endpoint() -> str | None:
    """An S3-compatible endpoint named the way boto3 reads it."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def forget_filesystems() -> None:
    """Drop the file systems made so far (the next URL makes its own: a changed endpoint or credentials)."""
    _cached_fs.cache_clear()


@lru_cache(maxsize=8)
def _cached_fs(protocol: str, endpoint: str | None) -> Any:
    import fsspec

    try:
        if endpoint is not None:
            return fsspec.filesystem(protocol, endpoint_url=endpoint)
        return fsspec.filesystem(protocol)
    except (ImportError, ValueError) as exc:  # s3fs, gcsfs not installed; an unknown protocol
        raise UsageError(
            f"{protocol}:// URLs: {first_line(exc, 160)} (pip install s3fs, gcsfs, ...)"
        ) from None


# -- brace patterns --------------------------------------------------------------------------------
_BRACE = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """``shards/{000..099}.tar`` as its 100 names (zero padding kept), ``{a,b}`` as its alternatives; each
    brace expanded in turn, left to right."""
    found = _BRACE.search(pattern)
    if found is None:
        return [pattern]
    inside, head, tail = found.group(1), pattern[: found.start()], pattern[found.end() :]
    span = re.fullmatch(r"(\d+)\.\.(\d+)", inside)
    if span:
        lo, hi = span.group(1), span.group(2)
        width = len(lo) if lo.startswith("0") else 0
        choices = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        choices = inside.split(",")
    return [name for choice in choices for name in expand_braces(f"{head}{choice}{tail}")]


# -- what specs find --------------------------------------------------------------------------------
#: One input found: its name, where its bytes are (a local path or a Blob) or why it cannot be read, and its
#: label (a shard sample's ``.cls``, a table's target column) if it has one.
Found = tuple[str, Path | Blob | None, str | None, str | None]


def find_stored(spec: str) -> Iterator[Found]:
    """The inputs a URL or shard spec names: each shard's members, an object, or the images under a prefix
    (a URL ending in ``/``) or matching a glob."""
    if is_shard(spec):
        for shard in expand_braces(spec):
            yield from shard_members(shard)
        return
    fs, where = filesystem(spec)
    try:
        if any(c in spec for c in "*?["):
            names = sorted(fs.glob(where))
        elif spec.endswith("/"):
            names = sorted(fs.find(where))
        else:
            yield spec, Blob(spec, spec), None, None
            return
    except Exception as exc:  # unreachable, refused
        yield spec, None, f"{spec!r}: cannot list it ({first_line(exc, 160)})", None
        return
    protocol = spec.split("://", 1)[0]
    urls = [
        n if "://" in n else f"{protocol}://{n}" for n in names if Path(n).suffix.lower() in image_suffixes()
    ]
    if not urls:
        yield spec, None, f"{spec!r}: no images found there", None
    for url in urls:
        yield url, Blob(url, url), None, None


def shard_members(shard: str) -> Iterator[Found]:
    """A WebDataset shard's samples (members grouped by key, ``dir/key.ext``, as WebDataset groups them): each
    key's first image, in order, with its ``.cls`` as the label; a sample of several images names the others
    in its note, a sample of none is an error of its own. A shard that is missing, not a tar or cut short
    gives the samples read whole before the fault, then one error."""
    fs, where = filesystem(shard)
    samples: dict[str, _Sample] = {}
    try:
        total = int(fs.size(where))
        opened = fs.open(where, "rb", block_size=_LIST_BLOCK) if is_url(shard) else open(where, "rb")  # noqa: SIM115
        with opened as f, tarfile.open(fileobj=f, mode="r:") as tar:
            end = 0
            for member in tar:
                end = member.offset_data + -(-member.size // 512) * 512
                if end > total:  # its bytes are not all there
                    raise EOFError("cut short")
                if not member.isfile():
                    continue
                key, _, ext = _split_key(member.name)
                sample = samples.setdefault(key, _Sample())
                sample.members.append(member.name)
                if ext.lower() == "cls" and member.size < 256:
                    sample.label = tar.extractfile(member).read().decode("utf-8", "replace").strip()  # type: ignore[union-attr]
                elif is_image_extension(ext):
                    sample.images.append(member)
            if total < end + 1024:  # no end-of-archive blocks: cut at a member's boundary
                raise EOFError("cut short: no end-of-archive marker")
    except FileNotFoundError:
        yield shard, None, f"{shard!r}: no such shard", None
        return
    except (tarfile.TarError, EOFError, OSError) as exc:
        yield from _images(shard, samples, whole=False)
        count = sum(1 for s in samples.values() if s.images)
        after = f" after {count} sample(s)" if count else ""
        yield shard, None, f"{shard!r}: not a readable tar shard{after} ({first_line(exc, 120)})", None
        return
    except Exception as exc:  # a store's own errors
        yield shard, None, f"{shard!r}: cannot read it ({first_line(exc, 160)})", None
        return
    yield from _images(shard, samples, whole=True)


@dataclass
class _Sample:
    """One key's members in a shard: their names, its images (tar members) and its ``.cls`` label."""

    members: list[str] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)
    label: str | None = None


def is_image_extension(ext: str) -> bool:
    """Whether a WebDataset extension (``png``, ``seg.png``, ``multi.dot.jpg``) is an image's: its last
    component, as WebDataset's image decoder looks at it."""
    return f".{ext.rsplit('.', 1)[-1].lower()}" in image_suffixes()


def _images(shard: str, samples: dict[str, _Sample], whole: bool) -> Iterator[Found]:
    """Each sample's first image as an input (the others named in its note); a sample without an image, an
    error (not for the last sample of a shard cut short: the rest of it may be past the cut)."""
    last = next(reversed(samples), None)
    for key, sample in samples.items():
        if not sample.images:
            if whole or key != last:
                members = ", ".join(m.rpartition("/")[2] for m in sample.members[:4])
                why = f"{shard}#{key}: no image in this sample (its members: {members})"
                yield f"{shard}#{key}", None, why, sample.label
            continue
        image, others = sample.images[0], sample.images[1:]
        name = f"{shard}#{image.name}"
        note = None
        if others:
            left = ", ".join(o.name.rpartition("/")[2] for o in others)
            first = image.name.rpartition("/")[2]
            note = f"this sample has {len(sample.images)} images: {first} is explained, {left} left out"
        yield name, Blob(shard, name, image.offset_data, image.size, note), None, sample.label


def _split_key(name: str) -> tuple[str, str, str]:
    """WebDataset's key and extension: the folder and the basename up to its first dot, and the rest."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), dot, ext


def read_table(path: str, column: str | None = None) -> list[Found]:
    """A table's inputs: Parquet, CSV or JSON lines (a file or a URL), one per row of its path column
    (``column``, else the first of :data:`PATH_COLUMNS` it has), with its label (the first of
    :data:`LABEL_COLUMNS` it has). A relative local path is read from the table's folder; a URL as it is.

    Raises:
        UsageError: the table cannot be read, or has no such column.
    """
    rows = table_rows(path)
    names = list(rows[0]) if rows else []
    chosen = column or next((c for c in PATH_COLUMNS if c in names), None)
    if chosen is None or chosen not in names:
        wanted = f"no column {column!r}" if column else f"no path column ({', '.join(PATH_COLUMNS)})"
        raise UsageError(
            f"--inputs-table {path}: {wanted}; its columns: {', '.join(names) or 'none'} (name one with "
            "--inputs-column)"
        )
    base = "" if is_url(path) else str(Path(path).parent)
    labels = next((c for c in LABEL_COLUMNS if c in names), None)
    found: list[Found] = []
    for i, row in enumerate(rows, start=1):
        value = row.get(chosen)
        label = None if labels is None or row.get(labels) is None else str(row[labels])
        if value is None or not str(value).strip():
            found.append((f"{path}:{i}", None, f"{path} row {i}: no {chosen}", None))
        elif is_url(str(value)):
            found.append((str(value), Blob(str(value), str(value)), None, label))
        else:
            local = Path(str(value)).expanduser()
            local = local if local.is_absolute() or not base else Path(base) / local
            found.append((str(value), local, None, label))
    return found


def table_rows(path: str) -> list[dict[str, Any]]:
    """A table's rows as dicts: Parquet (pyarrow), CSV or JSON lines, a file or a URL.

    Raises:
        UsageError: it cannot be read, or is none of these.
    """
    fs, where = filesystem(path)
    suffix = path.lower().rsplit(".", 1)[-1]
    try:
        if suffix == "parquet":
            import pyarrow.parquet as pq

            with fs.open(where, "rb") as f:
                return pq.read_table(f).to_pylist()
        with fs.open(where, "rt", encoding="utf-8") as f:
            if suffix == "csv":
                return list(csv.DictReader(f))
            if suffix in ("jsonl", "ndjson", "json"):
                return [json.loads(line) for line in f if line.strip()]
    except ImportError:
        raise UsageError("--inputs-table FILE.parquet needs pyarrow: pip install 'hookviz[data]'") from None
    except FileNotFoundError:
        raise UsageError(f"--inputs-table {path}: no such table") from None
    except Exception as exc:  # a table its reader refuses
        raise UsageError(f"--inputs-table {path}: cannot read it ({first_line(exc, 160)})") from None
    raise UsageError(f"--inputs-table {path}: give a .parquet, .csv or .jsonl table")
