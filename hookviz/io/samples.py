"""Samples of several inputs (``--input rgb=photos/ --input depth=depths/``): their files paired, read and
preprocessed one input at a time, and laid side by side along the channels for the model.

Files are paired by their path under their input's folder without the suffix (``photos/a/001.jpg`` with
``depths/a/001.png``), else by stem where it is unique in every input's folder, never one partner for two
samples; the first input's files drive. Two files of one name (``001.png`` and ``001.jpg``) make their sample
ambiguous: it fails alone, naming both. A file without a
partner is a sample of its own that fails alone, naming what is missing. An input given as one file pairs
with the other inputs' single files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hookviz.errors import InputError, UsageError
from hookviz.io.images import DEFAULT_MAX_PIXELS, Box, Preprocess, load_bands, load_rgb, quote
from hookviz.io.inputs import Item, scan_dir


def parse_specs(specs: Sequence[str]) -> list[tuple[str, str]]:
    """``NAME=PATH`` specs as ``(name, path)`` pairs, in order.

    Raises:
        UsageError: a spec without ``=``, a name that is not an identifier, a name given twice, one input.
    """
    pairs: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        name = name.strip()
        if not sep or not path or not name.isidentifier():
            raise UsageError(f"--input {spec!r}: give NAME=PATH (rgb=photos/), NAME a Python identifier")
        pairs.append((name, path))
    check_names([n for n, _ in pairs])
    return pairs


def check_names(names: Sequence[str]) -> None:
    """The names of a model's inputs: two or more, each once.

    Raises:
        UsageError: one input, or a name given twice.
    """
    if len(names) < 2:
        raise UsageError(
            "--input names the inputs of a model that takes several (give two or more); for one, give the "
            "files as arguments"
        )
    twice = next((n for n in names if list(names).count(n) > 1), None)
    if twice is not None:
        raise UsageError(f"--input {twice} is given twice; give each input once")


def _files(path: str, exclude: Path | None) -> dict[str, list[Path]] | None:
    """A folder's images by their path under it without the suffix (two files of one name with other
    suffixes, ``001.png`` and ``001.jpg``, share a key); None for one file."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return None
    found: dict[str, list[Path]] = {}
    for f in scan_dir(p, exclude):
        found.setdefault(str(f.relative_to(p).with_suffix("")), []).append(f)
    return found


def _both(paths: Sequence[Path]) -> str:
    return " and ".join(quote(p) for p in paths)


def _unique_stems(
    folders: dict[str, dict[str, list[Path]]],
) -> tuple[dict[str, dict[str, list[Path]]], set[str]]:
    """Each input's files by stem, and the stems that name one file in every input's folder."""
    stems: dict[str, dict[str, list[Path]]] = {}
    for n, files in folders.items():
        for paths in files.values():
            for path in paths:
                stems.setdefault(n, {}).setdefault(path.stem, []).append(path)
    unique = set.intersection(*({s for s, ps in stems.get(n, {}).items() if len(ps) == 1} for n in folders))
    return stems, unique


def pair_inputs(pairs: Sequence[tuple[str, str]], exclude: Path | None = None) -> list[Item]:
    """Each sample as an :class:`Item` (``path``: the first input's file; ``partners``: every input's file,
    by name), or an ``error`` naming the partner that is missing or the files that make a sample ambiguous.

    A partner is found by its path under its folder without the suffix, else by its stem where that stem is
    unique in every input's folder; no file is the partner of two samples."""
    listed = {name: _files(path, exclude) for name, path in pairs}
    first, rest = pairs[0][0], [n for n, _ in pairs[1:]]
    if all(v is None for v in listed.values()):  # one file each: one sample
        missing = [f"{n}={p}" for n, p in pairs if not Path(p).expanduser().exists()]
        if missing:
            return [Item(pairs[0][1], None, f"{quote(missing[0])}: no such file or directory")]
        files = tuple((n, Path(p).expanduser()) for n, p in pairs)
        return [Item(pairs[0][1], files[0][1], partners=files)]
    folders = {n: v for n, v in listed.items() if v is not None}
    if len(folders) != len(pairs):
        one = next(n for n, v in listed.items() if v is None)
        raise UsageError(
            f"--input {one} is one file and the others are folders; give folders for all, or files"
        )
    stems, unique = _unique_stems(folders)
    used: dict[str, set[Path]] = {n: set() for n in rest}
    # Exact keys first, so that a stem never takes a file that its own path pairs elsewhere.
    for n in rest:
        used[n].update(p for key in folders[first] for p in folders[n].get(key, ()))
    items: list[Item] = []
    for key, paths in folders[first].items():
        if len(paths) > 1:
            items.append(Item(str(paths[0]), None, f"{_both(paths)} are one {first} sample ({key}): keep "
                                                    "one of them (rename or move the other)"))  # fmt: skip
            continue
        path = paths[0]
        found: list[tuple[str, Path]] = [(first, path)]
        lacking, ambiguous = [], None
        for n in rest:
            partner = folders[n].get(key)
            if partner is None and path.stem in unique:
                candidate = stems[n][path.stem][0]
                partner = [candidate] if candidate not in used[n] else None
                if partner:
                    used[n].add(candidate)
            if partner is None:
                lacking.append(n)
            elif len(partner) > 1:
                ambiguous = ambiguous or (n, partner)
            else:
                found.append((n, partner[0]))
        if ambiguous:
            n, both = ambiguous
            why = (
                f"{quote(path)}: its {n} partner is ambiguous ({_both(both)}); keep one of them (rename or "
                "move the other)"
            )
            items.append(Item(str(path), None, why))
        elif lacking:
            where = dict(pairs)[lacking[0]]
            items.append(Item(str(path), None, f"{quote(path)}: no {lacking[0]} partner (looked for "
                                               f"{quote(str(Path(where) / key) + '.*')})"))  # fmt: skip
        else:
            items.append(Item(str(path), path, partners=tuple(found)))
    for n in rest:
        every = {p for ps in folders[n].values() for p in ps}
        for path in sorted(every - used[n]):
            items.append(Item(str(path), None, f"{quote(path)}: no {first} partner for this {n} file"))
    return items


@dataclass(frozen=True)
class Sample:
    """One sample as read: each input's picture to draw on (RGB uint8), where its model input lies in it,
    and its file."""

    pictures: dict[str, np.ndarray]
    boxes: dict[str, Box]
    files: dict[str, str]


@dataclass(frozen=True)
class SeveralPreprocess:
    """Each input's own preprocessing (its bands, size, ``mean``/``std``), in the model's order; the inputs
    are laid side by side along the channels, as :class:`hookviz.models.several.Several` splits them."""

    names: tuple[str, ...]
    each: tuple[Preprocess, ...]

    kind: ClassVar[str] = "sample"
    sides: ClassVar[str] = "N"

    @property
    def bands(self) -> tuple[int, ...]:
        return tuple(p.channels for p in self.each)

    def shape(self, preprocess: Any) -> tuple[int, ...]:
        """The packed input's ``(C, H, W)``: every input's bands side by side."""
        return (preprocess.channels, preprocess.crop_size, preprocess.crop_size)

    def key(self) -> dict[str, Any]:
        return {"inputs": dict(zip(self.names, self.bands, strict=True))}

    def read(self, item: Item, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[Sample, np.ndarray, Box]:
        """A sample's files read and preprocessed: ``(the sample, the model's input, the first input's box)``.

        Raises:
            InputError: a file that cannot be read, of other bands than its input takes, or inputs that
                differ in size after preprocessing.
        """
        files = dict(item.partners)
        pictures, boxes, xs = {}, {}, []
        for name, pre in zip(self.names, self.each, strict=True):
            path = files[name]
            if pre.channels == 3:
                arr = rgb = load_rgb(path, max_pixels=max_pixels)
            else:
                arr, rgb = load_bands(path, pre.channels, max_pixels=max_pixels)
            x, box = pre(arr)
            pictures[name], boxes[name] = rgb, box
            xs.append(x)
        sizes = {tuple(x.shape[1:]) for x in xs}
        if len(sizes) > 1:
            shown = " and ".join("x".join(map(str, s)) for s in sorted(sizes))
            raise InputError(
                f"{quote(item.name)}: its inputs differ in size after preprocessing ({shown}); give --resize "
                "squash or inputs of one aspect"
            )
        sample = Sample(pictures, boxes, {n: str(p) for n, p in files.items()})
        return sample, np.concatenate(xs, axis=0), boxes[self.names[0]]


def read_sample(item: Item, preprocess: Any, max_pixels: int) -> tuple[Sample, np.ndarray, Box]:
    """:meth:`SeveralPreprocess.read` as the pipeline's reader."""
    assert isinstance(preprocess, SeveralPreprocess)
    return preprocess.read(item, max_pixels)
