"""What spares the model a second forward pass over an input, and what keeps it busy while the dictionary
trains: the vectors of every input kept in memory while they all fit (passes after the first then run no
forward pass), ``--cache`` (each input's vectors written once to shards on disk, read back by later passes
and later runs), and a thread that reads, preprocesses and runs the next block while the steps train on
this one."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import queue
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.errors import OutputError
from hookviz.io.files import atomic_write
from hookviz.io.inputs import Item
from hookviz.io.stores import is_url
from hookviz.sae.vectors import Block, Source

#: Vectors per shard file of ``--cache`` (a shard is written once this many are waiting, and at the end).
SHARD_ROWS = 65_536


class Kept:
    """Every input's vectors held in memory while they come to at most ``limit`` vectors in all; past that,
    none (the memory stays bounded whatever the number of inputs, and each pass runs the model again)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.rows, self.full = limit, 0, False
        self.vectors: dict[int, Tensor] = {}

    def get(self, place: int) -> Tensor | None:
        return self.vectors.get(place)

    def put(self, place: int, v: Tensor) -> None:
        if self.full or place in self.vectors:
            return
        self.rows += v.shape[0]
        if self.rows > self.limit:
            self.full = True
            self.vectors.clear()
            return
        self.vectors[place] = v


class Shards:
    """``--cache``: each input's vectors written once to ``.npy`` shards in ``folder`` (a subfolder per
    model, layer, preprocessing and inputs, :func:`cache_key`), each with a ``.json`` of the inputs it holds
    written after it (a shard without one is not read); read back through a memory map."""

    def __init__(self, folder: Path, key: dict[str, Any], writer: int = 0) -> None:
        text = json.dumps(key, sort_keys=True)
        self.root, self.folder = folder, folder / hashlib.sha256(text.encode()).hexdigest()[:16]
        self._written(lambda: self.folder.mkdir(parents=True, exist_ok=True))
        self._written(lambda: atomic_write(self.folder / "key.json", text + "\n"))
        self.where: dict[int, tuple[str, int, int]] = {}  # place -> (shard, first row, rows)
        self.maps: dict[str, np.ndarray] = {}
        self.sums: dict[str, tuple[int, str]] = {}  # shard -> (bytes, SHA-256) its .json says it holds
        self.pending: list[tuple[int, Tensor]] = []
        self.writer, self.written = writer, 0  # a torchrun rank's shards are named after it
        for meta in sorted(self.folder.glob("shard-*.json")):
            if meta.stem.startswith(f"shard-{writer}-"):
                self.written = max(self.written, int(meta.stem.split("-")[2]) + 1)
            listed = json.loads(meta.read_text(encoding="utf-8"))
            self.sums[meta.stem] = (int(listed.get("bytes", -1)), str(listed.get("sha256", "")))
            for place, first, rows in listed["inputs"]:
                self.where[int(place)] = (meta.stem, int(first), int(rows))

    def _written(self, write: Any) -> None:
        """``write()``, a folder that cannot be written said in one line (exit 3) naming the fix."""
        try:
            write()
        except OSError as e:
            raise OutputError(f"--cache {self.root}: cannot write there ({e.strerror or e}); give a folder "
                              "you can write to as --cache, or leave --cache out") from None  # fmt: skip

    def get(self, place: int) -> Tensor | None:
        if place not in self.where:
            return None
        shard, first, rows = self.where[place]
        if shard not in self.maps and not self._opened(shard):
            return None
        return torch.from_numpy(np.array(self.maps[shard][first : first + rows]))

    def _opened(self, shard: str) -> bool:
        """The shard mapped after its bytes are checked against the length and SHA-256 its .json gives; one
        cut short, overwritten or without them is not read: its inputs are run again (and written anew)."""
        path = self.folder / f"{shard}.npy"
        size, digest = self.sums.get(shard, (-1, ""))
        try:
            good = path.stat().st_size == size and _digest(path) == digest
            if good:
                self.maps[shard] = np.load(path, mmap_mode="r")
        except (OSError, ValueError):
            good = False
        if not good:
            self.where = {p: at for p, at in self.where.items() if at[0] != shard}
        return good

    def agrees(self, place: int, v: Tensor) -> None:
        """Forget every shard where what they hold for ``place`` is not ``v`` (the model run now): the model
        computes otherwise than the one that wrote them (its code changed under the same structure)."""
        held = self.get(place)
        scale = float(v.abs().max()) if v.numel() else 0.0
        if held is not None and not torch.allclose(held, v.cpu().float(), rtol=1e-3, atol=1e-3 * scale):
            self.where.clear()

    def put(self, place: int, v: Tensor) -> None:
        self.pending.append((place, v))
        if sum(t.shape[0] for _, t in self.pending) >= SHARD_ROWS:
            self.flush()

    def flush(self) -> None:
        """The waiting vectors as one shard (the array, then its list of inputs with the array's length and
        SHA-256: the shard's commit)."""
        if not self.pending:
            return
        buf, listed, first = io.BytesIO(), [], 0
        np.save(buf, np.concatenate([to_numpy(t) for _, t in self.pending]))
        name = f"shard-{self.writer}-{self.written:05d}"
        for place, t in self.pending:
            listed.append([place, first, t.shape[0]])
            self.where[place] = (name, first, t.shape[0])
            first += t.shape[0]
        data = buf.getvalue()
        self.sums[name] = (len(data), hashlib.sha256(data).hexdigest())
        meta = {"inputs": listed, "bytes": len(data), "sha256": self.sums[name][1]}
        self._written(lambda: atomic_write(self.folder / f"{name}.npy", data))
        self._written(lambda: atomic_write(self.folder / f"{name}.json", json.dumps(meta) + "\n"))
        self.pending, self.written = [], self.written + 1


def code_digest(model: nn.Module) -> str:
    """What the model computes besides its weights, cheaply: its module tree as printed (every layer's kind
    and settings: a ReLU made a Tanh shows) and the source of each module class not from torch (a changed
    ``forward``); the first 16 hex digits of a SHA-256 over them."""
    sha = hashlib.sha256(repr(model).encode("utf-8", "surrogateescape"))
    kinds = {f"{c.__module__}.{c.__qualname__}": c for c in (type(m) for m in model.modules())}
    for name, kind in sorted(kinds.items()):
        sha.update(name.encode())
        if not name.startswith("torch."):
            with contextlib.suppress(OSError, TypeError):  # no source kept (a REPL, a compiled module)
                sha.update(inspect.getsource(kind).encode("utf-8", "surrogateescape"))
    return sha.hexdigest()[:16]


def identity(item: Item) -> str:
    """What tells one input's content apart: its name and the SHA-256 of the bytes of each local file it
    reads (its file, a sample's partners; a local shard's member: the member's bytes), never their size or
    modification time (files copied with their times, then swapped, keep both); an object in a store by its
    URL (and, a shard's member, its place and size), nothing asked of the store."""
    parts, files = [item.name], dict.fromkeys([item.path, *(p for _, p in item.partners)])
    if item.blob is not None:
        parts.append(f"{item.blob.url}@{item.blob.start}+{item.blob.size}")
        if not is_url(item.blob.url):
            parts.append(_digest(Path(item.blob.url), item.blob.start, item.blob.size))
    for path in (p for p in files if p is not None):
        parts.append(f"{path} {_digest(path)}")
    return "\t".join(parts)


def _digest(path: Path, start: int | None = None, size: int | None = None) -> str:
    """The SHA-256 of a file's bytes (``size`` of them from ``start`` where given), read a MiB at a time;
    ``missing`` where it cannot be read (the input is then left out when read, and named)."""
    sha, left = hashlib.sha256(), size if size is not None else -1
    try:
        with path.open("rb") as f:
            f.seek(start or 0)
            while left != 0 and (chunk := f.read(2**20 if left < 0 else min(left, 2**20))):
                sha.update(chunk)
                left = left - len(chunk) if left > 0 else left
    except OSError:
        return "missing"
    return sha.hexdigest()


def cache_key(fingerprint: str, layer: str, preprocess: object, inputs: Sequence[str]) -> dict[str, Any]:
    """What decides the inputs' vectors: the model (its weights' ``fingerprint``, which the caller extends
    with what its code computes), the layer, the preprocessing, and the inputs (each its :func:`identity`,
    in the order given: their places are the cache's index). An input replaced or edited under its name
    changes the key: the whole cache is written again, in a subfolder of its own. A name that is not UTF-8
    (bytes kept by the file system as surrogates) is hashed as its bytes."""
    text = "\n".join(inputs).encode("utf-8", "surrogateescape")
    listed = hashlib.sha256(text).hexdigest()
    return {"fingerprint": fingerprint, "layer": layer, "preprocess": repr(preprocess), "inputs": listed}


def cached(model: Source, kept: Kept, shards: Shards | None = None) -> Source:
    """``model``'s vectors, taken from memory, then from the shards, before the model is run (on the inputs
    found in neither, together); what the model gives is kept and written."""

    def source(places: Sequence[int]) -> list[Tensor | None]:
        out: list[Tensor | None] = []
        for place in places:
            v = kept.get(place)
            if v is None and shards is not None:
                v = shards.get(place)
                if v is not None:
                    kept.put(place, v)
            out.append(v)
        missing = [i for i, v in enumerate(out) if v is None]
        if missing:
            for i, v in zip(missing, model([places[i] for i in missing]), strict=True):
                out[i] = v
                if v is not None:
                    kept.put(places[i], v)
                    if shards is not None:
                        shards.put(places[i], v)
        return out

    return source


class Prefetched:
    """``blocks`` drawn by a thread of its own, ``depth`` ahead of the consumer: reading, preprocessing and
    the forward pass of the next block run while the steps train on this one (torch releases the GIL in its
    operations). :meth:`close` stops the thread before the model is used for anything else."""

    def __init__(self, blocks: Iterator[Block], depth: int = 1) -> None:
        self.blocks, self.done = blocks, threading.Event()
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._fill, name="hookviz-sae-prefetch", daemon=True)
        self.thread.start()

    def _fill(self) -> None:
        try:
            for block in self.blocks:
                if not self._give(("block", block)):
                    return
        except BaseException as e:  # handed to the consumer, which raises it
            self._give(("error", e))
            return
        self._give(("end", None))

    def _give(self, item: tuple[str, Any]) -> bool:
        while not self.done.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Block]:
        while True:
            kind, value = self.queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value

    def close(self) -> None:
        self.done.set()
        self.thread.join()
