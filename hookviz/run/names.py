"""The names of a run's outputs: every file of one input starts ``<stem>-<path hash>.<model>.<settings key>``,
so that two inputs never collide and an output already there is known to match these settings."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hookviz.io.inputs import Item, real_path
from hookviz.io.outputs import UNSAFE, safe_name
from hookviz.io.video import clip_suffix

__all__ = ["item_prefix", "output_prefix", "output_stem", "url_stem"]


def output_stem(path: Path) -> str:
    """A deterministic, collision-free, safe name for one input: ``<clean stem>-<8 hex of its real path>``.

    Two ``cat.jpg`` in different folders get different names; the name holds only ``[A-Za-z0-9_.-]``,
    never starts with ``-`` or ``.``, and cannot contain a path separator.
    """
    digest = hashlib.sha1(str(real_path(path)).encode("utf-8", "surrogateescape")).hexdigest()[:8]
    name = path.name[: -len(".nii.gz")] if path.name.lower().endswith(".nii.gz") else path.stem
    stem = UNSAFE.sub("_", name).lstrip("-._")[:60] or "image"
    return f"{stem}-{digest}"


def output_prefix(path: Path, model: str, key: str) -> str:
    """``<stem>-<path hash>.<model>.<settings key>``: the start of every output name of one input."""
    return f"{output_stem(path)}.{safe_name(model)}.{key}"


def url_stem(url: str) -> str:
    """:func:`output_stem` of an input that is not a local file (an object's URL, ``shard.tar#key.jpg``): its
    last name's stem, and 8 hex of the whole URL."""
    digest = hashlib.sha1(url.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    last = url.rsplit("#", 1)[-1].rstrip("/").rsplit("/", 1)[-1]
    stem = UNSAFE.sub("_", last.partition(".")[0]).lstrip("-._")[:60] or "image"
    return f"{stem}-{digest}"


def item_prefix(item: Item, model: str, key: str) -> str:
    """The output prefix of a readable item: its file's, or its blob's URL's; a clip's suffix after it."""
    if item.blob is not None:
        prefix = f"{url_stem(item.blob.name)}.{safe_name(model)}.{key}"
    else:
        assert item.path is not None
        prefix = output_prefix(item.path, model, key)
    return prefix + (clip_suffix(item.clip) if item.clip is not None else "")
