"""Input kinds as a registry, like tasks and methods: photos, a video's clips, volumes and samples of several
inputs are each one :class:`InputKind`, which says how its inputs are found, cut into items, read and
preprocessed, what a record of one says beyond the task's fields, and what runs after the items (a video's
whole prediction after its clips). :func:`input_kind_of` picks the kind a run takes (the newest registered
that claims the model and inputs; photos when none does).

Example (a kind of your own: a text file of numbers is a greyscale photo)::

    class Grids(InputKind):
        name = "grid"
        def claims(self, loaded, specs): return all(s.endswith(".grid") for s in specs)
        def find(self, loaded, specs, **where): return [Item(s, Path(s)) for s in specs]
        def read(self, loaded): return read_grid  # (item, preprocess, max_pixels) -> (rgb, x, box)

    register_input_kind(Grids())
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, TextIO

import numpy as np
import torch

from hookviz.errors import UsageError
from hookviz.io.images import load_rgb
from hookviz.io.inputs import Item, clip_items, expand_inputs
from hookviz.io.outputs import Output
from hookviz.io.samples import SeveralPreprocess, pair_inputs, parse_specs, read_sample
from hookviz.io.video import VideoPreprocess
from hookviz.jobs.video import VideoCamJob, video_summary
from hookviz.models.loaded import LoadedModel
from hookviz.tasks import task_of

#: How a kind reads one item: ``read(item, preprocess, max_pixels) -> (drawn on, model input, box)``.
Reader = Callable[[Item, Any, int], tuple[Any, np.ndarray, Any]]


def first_batch(
    items: list[Item], loaded: LoadedModel, n: int, prepared: Callable[[Item], np.ndarray]
) -> torch.Tensor | None:
    """The first ``n`` readable ``items``, each ``prepared`` (one that cannot be read is passed over), as one
    batch on the model's device: those of the first one's shape only (one batch), or None."""
    xs: list[np.ndarray] = []
    for item in items:
        if not item.readable:
            continue
        try:
            x = prepared(item)
        except Exception:  # an input its reader fails on (a kind's own too): its record says why
            continue
        if xs and x.shape != xs[0].shape:
            continue
        xs.append(x)
        if len(xs) == n:
            break
    return torch.from_numpy(np.stack(xs)).to(loaded.device) if xs else None


class InputKind:
    """A kind of input; the defaults are photos' (files found by their suffix, read and preprocessed as the
    model's task reads a photo)."""

    #: What lines and errors call it (``photo``, ``video``, ``volume``, ``sample``).
    name: ClassVar[str] = "photo"
    #: Whether :meth:`items` cuts an input into several (a video's clips): a progress bar counts items then.
    cuts: ClassVar[bool] = False
    #: Inputs a batch holds by default when explained from Python.
    batch_size: ClassVar[int] = 8
    #: What :func:`explain_inputs` says to a model that does not take this kind (``{name}``: the model's).
    refusal: ClassVar[str] = "{name} does not take photos"

    def claims(self, loaded: LoadedModel, specs: Sequence[str]) -> bool:
        """Whether a run of ``loaded`` over ``specs`` takes this kind."""
        return True

    def prepare(self, loaded: LoadedModel) -> LoadedModel:
        """The model-side hook, called when a run takes this kind: ``loaded`` made ready for its inputs, its
        ``inputs`` set to what the layers below ask of them (one input's traced shape, what the outputs' key
        adds, how ``--input-size`` is given: a :class:`~hookviz.models.loaded.ModelInputs`). The kinds
        hookviz ships are prepared as the model loads: theirs returns ``loaded`` as it is."""
        return loaded

    def find(
        self,
        loaded: LoadedModel,
        specs: Sequence[str],
        *,
        stdin: TextIO | None = None,
        exclude: Path | None = None,
        null: bool = False,
    ) -> list[Item]:
        """The inputs ``specs`` name (files, folders, globs, ``-``), an ``Item`` each (one with an ``error``
        for a spec that names nothing)."""
        return expand_inputs(specs, stdin, exclude=exclude, null=null)

    def items(self, loaded: LoadedModel, found: list[Item], max_pixels: int) -> list[Item]:
        """``found`` as the model takes them (a video cut into clips)."""
        return found

    def preprocess(self, loaded: LoadedModel) -> Any:
        """What turns one input into the model's input (the reader's ``preprocess``)."""
        return loaded.preprocess

    def read(self, loaded: LoadedModel) -> Reader:
        """How the pipeline reads one item."""
        return task_of(loaded).read

    def fields(self, loaded: LoadedModel) -> dict[str, Any]:
        """What every record of this kind says beyond the task's fields (photos: nothing)."""
        return {}

    def after(self, records: Iterator[dict[str, Any]], job: Any, output: Output, loaded: LoadedModel) -> Any:
        """``records`` with what follows the items (photos: nothing)."""
        return records

    def first_images(
        self, items: list[Item], loaded: LoadedModel, n: int, max_pixels: int
    ) -> torch.Tensor | None:
        """The first ``n`` readable inputs, preprocessed, as one batch on the model's device (those of the
        first one's shape only; ``--layer auto`` ranks layers on them), or None."""
        read, preprocess = self.read(loaded), self.preprocess(loaded)
        return first_batch(items, loaded, n, lambda item: read(item, preprocess, max_pixels)[1])


class Photos(InputKind):
    """Photos (the default): read with :func:`hookviz.io.images.load_rgb` into the model's input size."""

    def first_images(
        self, items: list[Item], loaded: LoadedModel, n: int, max_pixels: int
    ) -> torch.Tensor | None:
        def prepared(item: Item) -> np.ndarray:
            x, _ = loaded.preprocess(load_rgb(item.source(), max_pixels=max_pixels))
            return x

        return first_batch(items, loaded, n, prepared)


class LoadedKind(InputKind):
    """A kind the model is loaded for (a video, volume or several-input model's ``loaded.inputs``): its
    inputs are preprocessed as loaded, and ``--layer auto`` ranks layers on photos only."""

    def claims(self, loaded: LoadedModel, specs: Sequence[str]) -> bool:
        return loaded.inputs.kind == self.name

    def preprocess(self, loaded: LoadedModel) -> Any:
        return loaded.inputs

    def first_images(self, items: list[Item], loaded: LoadedModel, n: int, max_pixels: int) -> None:
        return None


class Videos(LoadedKind):
    """Video files and folders of frames, cut into clips; each video's whole prediction after its clips."""

    name = "video"
    cuts = True
    batch_size = 4
    refusal = "{name} takes photos, not videos; explain photos with hookviz.explain"

    def find(self, loaded: LoadedModel, specs: Sequence[str], **where: Any) -> list[Item]:
        stdin = where.pop("stdin", None)
        return expand_inputs(specs, stdin, video=True, **where)

    def items(self, loaded: LoadedModel, found: list[Item], max_pixels: int) -> list[Item]:
        assert isinstance(loaded.inputs, VideoPreprocess)
        return list(clip_items(found, loaded.inputs, max_pixels))

    def after(self, records: Iterator[dict[str, Any]], job: Any, output: Output, loaded: LoadedModel) -> Any:
        return with_video_summaries(records, job, output, loaded)


class Volumes(LoadedKind):
    """NIfTI, ``.npy`` and DICOM volumes, each at its own grid."""

    name = "volume"
    batch_size = 2
    refusal = "{name} does not take volumes; load it with volumes=True or task='volume'"

    def find(self, loaded: LoadedModel, specs: Sequence[str], **where: Any) -> list[Item]:
        stdin = where.pop("stdin", None)
        return expand_inputs(specs, stdin, volume=True, **where)


class Samples(LoadedKind):
    """Samples of a model of several inputs: ``NAME=PATH`` specs, their files paired by path or stem."""

    name = "sample"
    refusal = "{name} takes one input; load it with load_model(..., inputs=(names...))"

    def find(self, loaded: LoadedModel, specs: Sequence[str], **where: Any) -> list[Item]:
        several = loaded.inputs
        assert isinstance(several, SeveralPreprocess)
        pairs = parse_specs(list(specs))
        if [n for n, _ in pairs] != list(several.names):
            raise UsageError(f"--input names {', '.join(n for n, _ in pairs)}; the model was loaded with "
                             f"{', '.join(several.names)}")  # fmt: skip
        return pair_inputs(pairs, where.get("exclude"))

    def read(self, loaded: LoadedModel) -> Reader:
        return read_sample


PHOTOS, VIDEOS, VOLUMES, SAMPLES = Photos(), Videos(), Volumes(), Samples()
_KINDS: dict[str, InputKind] = {}


def register_input_kind(kind: InputKind, *, replace: bool = False) -> InputKind:
    """Add ``kind`` (checked before those registered earlier); ``replace`` swaps one of the same name."""
    if kind.name in _KINDS and not replace:
        raise ValueError(f"an input kind named {kind.name!r} is registered; pass replace=True to swap it")
    _KINDS.pop(kind.name, None)
    _KINDS[kind.name] = kind
    return kind


def unregister_input_kind(name: str) -> None:
    if name == PHOTOS.name:
        raise ValueError("photos are every model's inputs when no other kind claims them; they stay")
    _KINDS.pop(name, None)


def input_kind_of(loaded: LoadedModel, specs: Sequence[str] = ()) -> InputKind:
    """The kind a run of ``loaded`` over ``specs`` takes: the newest registered kind that claims them."""
    for kind in reversed(list(_KINDS.values())):
        if kind.claims(loaded, specs):
            return kind
    return PHOTOS


def prepared(loaded: LoadedModel, specs: Sequence[str] = ()) -> tuple[InputKind, LoadedModel]:
    """The kind a run of ``loaded`` over ``specs`` takes (:func:`input_kind_of`), and ``loaded`` as that
    kind prepares it (:meth:`InputKind.prepare`)."""
    kind = input_kind_of(loaded, specs)
    return kind, kind.prepare(loaded)


def input_kind(name: str) -> InputKind:
    """The registered kind ``name``."""
    if name not in _KINDS:
        raise UsageError(f"no input kind is named {name!r}; the kinds: {', '.join(_KINDS)}")
    return _KINDS[name]


for _kind in (PHOTOS, SAMPLES, VIDEOS, VOLUMES):
    register_input_kind(_kind)


def with_video_summaries(
    records: Iterable[dict[str, Any]], job: Any, output: Output, loaded: Any
) -> Iterator[dict[str, Any]]:
    """``records`` of a video model's clips, each video's followed by one record of the whole video's
    prediction (the mean of its clips' class probabilities; clips computed in this run), also appended to
    the manifest. A video whose clips were all skipped or failed gets none."""
    probs: dict[str, Any] = job.clip_probs if isinstance(job, VideoCamJob) else {}
    current: str | None = None
    done: list[dict[str, Any]] = []

    def summary() -> dict[str, Any] | None:
        got = [(r, probs.pop(r["prefix"])) for r in done if r.get("prefix") in probs and r["status"] == "ok"]
        if not got:
            return None
        entry: dict[str, Any] = {
            "input": current,
            "status": "ok",
            "error": None,
            "command": done[0].get("command"),
            "model": done[0].get("model"),
            "key": done[0].get("key"),
            "video": video_summary(str(current), [r for r, _ in got], [p for _, p in got], loaded),
            "outputs": [],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        output.record(entry)
        return entry

    try:
        for rec in records:
            if rec["input"] != current and done:
                if (found := summary()) is not None:
                    yield found
                done = []
            current = rec["input"]
            if rec.get("clip") is not None:
                done.append(rec)
            yield rec
        if done and (entry := summary()) is not None:
            yield entry
    finally:
        output.close()
