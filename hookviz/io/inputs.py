"""What the user named, as a list of inputs: files, folders (searched recursively, symlinks followed once),
globs, and paths on stdin; each unreadable spec an :class:`Item` with its error, so a run reports it and
goes on."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from hookviz.errors import InputError, UsageError
from hookviz.io import timing
from hookviz.io.images import (
    DEFAULT_MAX_PIXELS,
    Box,
    Bytes,
    Preprocess,
    image_suffixes,
    load_bands,
    load_rgb,
    quote,
)
from hookviz.io.stores import Blob, find_stored, is_shard, is_url, read_table
from hookviz.io.video import (
    VIDEO_SUFFIXES,
    Clip,
    ClipFrames,
    VideoInfo,
    VideoPreprocess,
    frame_files,
    plan_clips,
    probe,
    read_clip,
)
from hookviz.io.volume import is_dicom_folder, volume_suffix


@dataclass(frozen=True)
class Item:
    """One input as the user named it, or the reason it cannot be read."""

    name: str
    path: Path | None
    error: str | None = None
    #: One clip of a video (:mod:`hookviz.io.video`): which frames, and what the file holds.
    clip: Clip | None = None
    info: VideoInfo | None = None
    #: A sample of several inputs (:mod:`hookviz.io.samples`): each input's name and file, in order.
    partners: tuple[tuple[str, Path], ...] = ()
    #: Where the bytes are when they are not a local file (:mod:`hookviz.io.stores`: a URL, a shard's member).
    blob: Blob | None = None
    #: The input's class as its data set labels it (a table's target column, a shard sample's ``.cls``):
    #: ``--target label`` explains it.
    label: str | None = None

    @property
    def readable(self) -> bool:
        """Whether there is something to read (no error, a file or a blob)."""
        return self.error is None and (self.path is not None or self.blob is not None)

    def source(self) -> Path | Bytes:
        """What a reader opens: the local file, or the blob's bytes, read now.

        Raises:
            InputError: the blob cannot be read (a missing object, a store that refuses).
        """
        if self.blob is not None:
            return self.blob.open()
        assert self.path is not None
        return self.path


def _has_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def scan_dir(root: Path, exclude: Path | None, video: bool = False, volume: bool = False) -> list[Path]:
    """Image files under ``root``, sorted; hidden files and folders (``.x``, ``._x.jpg``) are skipped.

    Symlinked folders are followed, each real folder once (a link back to an ancestor, or two links to
    one folder, cannot loop or list a photo twice). In ``exclude`` (the output folder) hookviz's own
    outputs are left out and any other photo is listed. A suffix is compared without surrounding spaces
    (``photo.jpg `` from a Windows zip is a photo).
    """
    suffixes = VIDEO_SUFFIXES if video else image_suffixes()
    found = []
    visited: set[Path] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath)
        real = real_path(here)
        if real in visited:
            dirnames[:] = []
            continue
        visited.add(real)
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and real_path(here / d) not in visited
        )
        ours = exclude is not None and real == exclude  # the output folder: its photos count, ours do not
        if video and not ours and frame_files(here):  # a folder of frames is one video
            found.append(here)
            dirnames[:] = []
            continue
        if volume and not ours and is_dicom_folder(here):  # a folder of DICOM slices is one volume
            found.append(here)
            dirnames[:] = []
            continue
        if volume:
            found += [here / f for f in sorted(filenames) if not f.startswith(".") and volume_suffix(Path(f))]
            continue
        found += [
            here / f
            for f in sorted(filenames)
            if not f.startswith(".")
            and Path(f).suffix.strip().lower() in suffixes
            and not (ours and is_output_name(f))
        ]
    return found


#: What an output file's name looks like (``<stem>-<path hash>.<model>.<settings key>.``): such files in the
#: output folder are never read back as inputs; the photos a user keeps there are.
OUTPUT_NAME = re.compile(r"-[0-9a-f]{8}\.[\w.-]+\.[0-9a-f]{8}\.")
#: The images hookviz writes under a fixed name (``hookviz trust``'s grid): in the output folder, not inputs.
OWN_IMAGES = frozenset({"trust.png"})


def is_output_name(name: str) -> bool:
    """Whether a file named ``name`` in the output folder is one of hookviz's own outputs."""
    return bool(OUTPUT_NAME.search(name)) or name in OWN_IMAGES


def refuse_out_among_inputs(out: Path, specs: Sequence[object]) -> None:
    """Refuse an ``--out`` folder that is also one of the input folders: outputs would be read back as inputs.

    Raises:
        UsageError: ``out`` is (the real folder of) an input folder.
    """
    real_out = real_path(out)
    for spec in specs:
        folder = isinstance(spec, str | Path) and str(spec) != "-" and Path(spec).is_dir()
        if folder and real_path(Path(str(spec))) == real_out:
            raise UsageError(f"--out {str(out)!r} is also an input folder; outputs would be read "
                             "back as inputs. Choose another --out")  # fmt: skip


def real_path(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return p.absolute()


def expand_inputs(
    specs: Sequence[str],
    stdin: TextIO | None = None,
    *,
    exclude: Path | None = None,
    null: bool = False,
    video: bool = False,
    volume: bool = False,
) -> list[Item]:
    """Files, directories (searched recursively for images), globs, and ``-`` (paths read from stdin).

    With ``video`` (a video model's inputs), folders are searched for video files and folders of frames
    (a folder holding images is one video, its frames in natural order). With ``volume``, folders are
    searched for ``.nii``, ``.nii.gz`` and ``.npy`` files and DICOM series folders (a folder of DICOM files is
    one volume).

    Stdin holds one path per line (blank lines and CRLF endings are fine) or, with ``null``,
    NUL-separated paths (``find -print0``), which may contain any character. Directory symlinks are
    followed, each real folder once (no loops); hidden files and folders are skipped; in ``exclude`` (the
    output folder) hookviz's own outputs are never listed, a user's photos are; each real file is listed
    once. A spec that finds nothing (a missing file, an empty folder, empty stdin) becomes an ``Item`` with
    an ``error``, so the caller reports it and goes on.
    """
    exclude = real_path(exclude) if exclude is not None else None
    names: list[str] = []
    stdin_empty = False
    for spec in specs:
        if spec == "-":
            if stdin is None:
                continue
            if null:
                # Names may hold newlines and spaces; only an empty chunk or a lone final newline is noise.
                read = [p for p in stdin.read().split("\0") if p not in ("", "\n")]
            else:
                read = [line.rstrip("\r\n") for line in stdin if line.strip()]
            stdin_empty = not read
            names += read
        else:
            names.append(spec)
    items: list[Item] = []
    if stdin_empty:
        items.append(Item("-", None, "stdin: no paths were given (empty input)"))
    seen: set[Path] = set()
    seen_names: set[str] = set()

    def add(name: str, path: Path) -> None:
        real = real_path(path)
        if exclude is not None and real.parent == exclude and is_output_name(path.name):
            return  # an output of an earlier run, matched by a glob
        if real not in seen:
            seen.add(real)
            items.append(Item(name, path))

    for name in names:
        path = Path(name).expanduser()
        if is_url(name) or (is_shard(name) and not path.is_dir()):  # a store's objects, a shard's samples
            for found, where, error, label in find_stored(name):
                if found not in seen_names:
                    seen_names.add(found)
                    blob = where if isinstance(where, Blob) else None
                    items.append(Item(found, None, error, blob=blob, label=label))
        elif path.is_dir() and volume and is_dicom_folder(path):
            add(name, path)
        elif path.is_dir():
            files = scan_dir(path, exclude, video, volume)
            if not files:
                what = "videos or folders of frames" if video else "volumes" if volume else "images"
                items.append(Item(name, None, f"{quote(name)}: no {what} found in this folder"))
            for f in files:
                add(str(f), f)
        elif path.exists() or os.path.lexists(path):
            add(name, path)
        elif _has_glob(name):
            hits = sorted(glob.glob(os.path.expanduser(name), recursive=True))
            files = [Path(h) for h in hits if Path(h).is_file()]
            if not files:
                items.append(Item(name, None, f"{quote(name)}: no file matches this pattern"))
            for f in files:
                add(str(f), f)
        else:
            items.append(Item(name, None, f"{quote(name)}: no such file or directory"))
    return items


def table_items(table: str, column: str | None = None) -> list[Item]:
    """The inputs a table lists (:func:`hookviz.io.stores.read_table`), an :class:`Item` each: a local file,
    an object at a URL, or a row's error.

    Raises:
        UsageError: the table cannot be read or has no path column.
    """
    items = []
    for name, where, error, label in read_table(table, column):
        if isinstance(where, Blob):
            items.append(Item(name, None, error, blob=where, label=label))
        elif where is not None and not where.is_file():
            items.append(Item(name, None, f"{quote(name)}: no such file ({where})"))
        else:
            items.append(Item(name, where, error, label=label))
    return items


def clip_items(
    items: Iterable[Item], p: VideoPreprocess, max_pixels: int = DEFAULT_MAX_PIXELS
) -> Iterator[Item]:
    """Each video's clips as inputs (:func:`hookviz.io.video.plan_clips`), in order; a video that cannot be
    opened (or a photo given to a video model) is one ``Item`` with its error, and the others go on."""
    for item in items:
        if item.error is not None or item.path is None:
            yield item
            continue
        path = item.path
        suffix = path.suffix.strip().lower()
        if not path.is_dir() and suffix not in VIDEO_SUFFIXES and suffix in image_suffixes():
            yield Item(
                item.name,
                None,
                f"{quote(item.name)}: a photo, and the model takes videos; give a video file or a folder of "
                "its frames",
            )
            continue
        try:
            info = probe(path, max_pixels)
        except InputError as exc:
            yield Item(item.name, None, str(exc))
            continue
        for clip in plan_clips(info, p):
            yield Item(item.name, path, clip=clip, info=info)


def read_input(item: Item, preprocess: Any, max_pixels: int) -> tuple[Any, np.ndarray, Box]:
    """One input as ``(what is drawn on, the model's input, where the model saw it)``: a photo, or a
    video's clip (its frames, a :class:`~hookviz.io.video.ClipFrames`)."""
    if item.clip is not None:  # a video's clip: its frames (a ClipFrames) instead of a photo
        with timing.stage("decode"):
            assert item.path is not None
            frames, times = read_clip(item.path, item.clip, item.info, max_pixels)
        with timing.stage("preprocess"):
            x, box = preprocess(frames)
        fps = (item.info.fps if item.info is not None and item.info.fps else 0.0) or 0.0
        rate = fps / preprocess.step(fps or None) if fps else 8.0
        return ClipFrames(frames, times, item.clip, rate), x, box
    own = preprocess if isinstance(preprocess, Preprocess) else None  # a photo model's (a user's: RGB)
    channels = own.channels if own is not None else 3
    with timing.stage("decode"):
        source = item.source()
        if channels != 3:  # a model that takes the image's own bands (greyscale, 16-bit, 4-band)
            bands, rgb = load_bands(source, channels, max_pixels=max_pixels)
        else:
            rgb = bands = load_rgb(
                source, max_pixels=max_pixels, alpha=own.alpha if own is not None else "white"
            )
    with timing.stage("preprocess"):
        x, box = preprocess(bands)
    return rgb, x, box
