"""Many inputs, one process: expand inputs, batch them through a job, write outputs atomically.

The pipeline touches the file system but never the console: it yields one record per input
(the same dict it appends to ``manifest.jsonl``), and the CLI decides what to print.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypedDict

import cv2
import numpy as np
import torch

from hookviz.core.memory import default_budget, human
from hookviz.errors import HookvizError, UsageError
from hookviz.io import timing
from hookviz.io.images import DEFAULT_MAX_PIXELS, Box, Preprocess, quote
from hookviz.io.inputs import Item, expand_inputs, read_input
from hookviz.io.outputs import MANIFEST, Output, finite, kept, settings_key, to_json
from hookviz.run.files import Files
from hookviz.run.names import item_prefix, output_prefix, output_stem

if TYPE_CHECKING:  # the protocol every job follows (hookviz.jobs); the pipeline imports no job
    from hookviz.io.samples import SeveralPreprocess
    from hookviz.io.video import VideoPreprocess
    from hookviz.io.volume import VolumePreprocess
    from hookviz.jobs.common import Job

__all__ = [
    "MANIFEST",
    "Item",
    "Output",
    "expand_inputs",
    "finite",
    "output_prefix",
    "output_stem",
    "run",
    "to_json",
]


#: Record fields that describe one run of an input rather than its result.
_RUN_FIELDS = ("input", "status", "error", "note", "time")


#: Reads one input: ``read(item, preprocess, max_pixels)`` -> (what is drawn on, input array, box).
Reader = Callable[[Item, Any, int], tuple[Any, np.ndarray, Box]]

#: Records one input of a computed batch, once its render is done.
_Finisher = Callable[[], dict[str, Any]]


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class Pacing(TypedDict, total=False):
    """The keywords of :func:`run` that a caller passes on as given (:func:`hookviz.run.runner.run_job`):
    batching, threads, resuming, limits, notes; their defaults are :func:`run`'s."""

    batch_size: int
    workers: int
    skip_existing: bool
    max_pixels: int
    max_memory: int | None
    note: Callable[[str], None] | None


def refuse_nothing(job: Job, pictures: bool) -> None:
    """Refuse a run that would write no file (``--no-pictures`` and no raw map), before anything is made.

    Raises:
        UsageError: ``job`` plans only pictures and ``pictures`` is off.
    """
    if not pictures and not any(kept(n, pictures) for n in job.planned("input")):
        raise UsageError("--no-pictures: this run would write no file; add --save-raw or --maps zarr")


def run(
    items: Iterable[Item],
    job: Job,
    *,
    preprocess: Preprocess | VideoPreprocess | VolumePreprocess | SeveralPreprocess,
    output: Output,
    device: Any,
    base: dict[str, Any],
    batch_size: int = 8,
    workers: int = 2,
    skip_existing: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_memory: int | None = None,
    note: Callable[[str], None] | None = None,
    read: Reader = read_input,
) -> Iterator[dict[str, Any]]:
    """Stream ``items`` through ``job`` in batches and yield one manifest record per input.

    Every output name starts with ``<stem>-<path hash>.<model>.<key>``, where the key hashes the job's
    :meth:`~Job.settings` (model, weights, method, layer, target, look), so runs with other settings
    never collide and an existing output is known to match these settings. An input whose outputs
    all exist is ``skipped`` (its record repeats the results of the run that made them); one whose
    outputs exist only in part (a killed run) is completed with ``skip_existing``, else an ``error``.
    Decoding the next batch and rendering and writing the previous one (in one thread pool) overlap with
    the model's work on the current one; records still follow the input order. Inputs of one
    size form one model batch (photos whose aspect is kept form several). One bad input gives an
    ``error`` record and the rest go on. A job that estimates its memory (``memory(shape)``) has a batch
    split so that the estimate stays under ``max_memory`` bytes (default: half of what is available), and
    ``note`` is told once. ``read`` reads one input (a task's :meth:`~hookviz.tasks.Task.read`).

    Raises:
        HookvizError: a problem that would fail every input (a bad layer, target or device).
    """
    if batch_size < 1:
        raise UsageError(f"--batch-size {batch_size}: must be at least 1")
    if skip_existing and output.overwrite:
        raise UsageError("--overwrite and --skip-existing contradict each other; pass one")
    refuse_nothing(job, output.pictures)
    budget = max_memory if max_memory is not None else default_budget(device)
    state = _Run(
        job, output, device, base, skip_existing, budget, note, (read, preprocess, max_pixels), workers
    )
    # Decoding and rendering run in the pool's threads, one image each; OpenCV's own thread pool on top
    # of them (and of torch's) would oversubscribe the cores. (Neutral on 2 cores, within noise: 1.10x vs
    # 1.13x the floor with OpenCV's 2 threads; it matters where OpenCV would start one thread per core.)
    cv2_threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield from state.records(_batches(items, batch_size, state.model, state.key))
    finally:
        state.pool.shutdown(wait=True, cancel_futures=True)
        cv2.setNumThreads(cv2_threads)
        output.close()
        timing.dump(state.done)


def _batches(items: Iterable[Item], size: int, model: str, key: str) -> Iterator[list[tuple[Item, str]]]:
    """``items`` with their output prefixes, ``size`` readable ones at a time; an input that cannot be read
    stays in its place among the others, so records keep input order."""
    chunk: list[tuple[Item, str]] = []
    readable = 0
    for item in items:
        if not item.readable:
            chunk.append((item, ""))
            continue
        chunk.append((item, item_prefix(item, model, key)))
        readable += 1
        if readable == size:
            yield chunk
            chunk, readable = [], 0
    if chunk:
        yield chunk


#: One input on its way: (item, prefix, its decoding, note). The note is an error, "skipped", "fill"
#: (outputs exist, no earlier record: compute the results for the record but write nothing), or "add"
#: (only raw arrays are missing: write those, keep the rest).
_Started = tuple[Item, str, "Future[Any] | None", "str | None"]


class _Run:
    """One run of a job over batches: decoding, computing, rendering and recording, each a step."""

    def __init__(
        self,
        job: Job,
        output: Output,
        device: Any,
        base: dict[str, Any],
        skip_existing: bool,
        budget: int,
        note: Callable[[str], None] | None,
        reading: tuple[Reader, Any, int],
        workers: int,
    ) -> None:
        self.job, self.output, self.device = job, output, device
        self.budget, self.note, self.reading = budget, note, reading
        self.files = Files(job, output, skip_existing)
        settings = job.settings()
        self.key = settings_key(settings)
        self.base = {**base, "key": self.key, "settings": settings}
        self.model = str(settings.get("model", "model"))
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers))
        self.said_split: set[tuple[int, ...]] = set()
        self.done = 0
        #: The output prefixes this run has started, and the record of each (an input listed twice, as a
        #: table's duplicate row, is done once: its second listing repeats the first's record).
        self.seen: set[str] = set()
        self.recorded: dict[str, dict[str, Any]] = {}

    def records(self, batches: Iterator[list[tuple[Item, str]]]) -> Iterator[dict[str, Any]]:
        """Each input's record, in input order: the next batch decodes and this one renders while the model
        works."""
        previous: list[_Finisher] = []
        pending = self.start(next(batches, []))
        while pending:
            current, pending = pending, []
            nxt = next(batches, None)
            if nxt is not None:
                pending = self.start(nxt)  # decode the next batch while this one computes
            try:
                finishers = self.compute(current)
            except HookvizError:
                for f in previous:  # the batch before is done: record it before stopping
                    yield f()
                previous = []
                raise
            for f in previous:  # rendered while this batch computed
                yield f()
            previous = finishers
        for f in previous:
            yield f()

    def split(self, members: list[int], shape: tuple[int, ...], pixels: int = 0) -> list[list[int]]:
        """``members`` in batches whose estimated memory stays under the budget (their pictures drawn on
        photos of ``pixels`` pixels at most)."""
        est = self.job.memory((len(members), *shape))
        if est is None:
            return [members]
        est = est.drawn_on(pixels)
        n = est.fitting(self.budget, len(members))
        alone = est.total(1) > self.budget  # nothing left to split: said, and run
        if self.note is not None and shape not in self.said_split and (alone or n < len(members)):
            self.said_split.add(shape)
            side = "x".join(str(v) for v in shape[1:])
            self.note(
                f"one input of {side} alone holds about {human(est.total(1))}, over --max-memory "
                f"{human(self.budget)}: running one input at a time, which may exceed the limit; a smaller "
                "--input-size or fewer methods and layers would fit"
                if alone
                else f"a batch of {len(members)} would hold about {human(est.total(len(members)))}, over "
                f"--max-memory {human(self.budget)}: running {n} at a time"
            )
        return [members[i : i + n] for i in range(0, len(members), n)]

    def record(self, item: Item, status: str, error: str | None = None, **fields: Any) -> dict[str, Any]:
        entry = {"input": item.name, "status": status, "error": error, **self.base, **fields}
        if (
            item.partners
        ):  # a sample of several inputs: every file of it, by input (the pipeline records them)
            entry["inputs"] = {name: str(path) for name, path in item.partners}
        if item.blob is not None and item.blob.note:  # what its store knows (a shard sample's other images)
            entry["note"] = "; ".join(n for n in (entry.get("note"), item.blob.note) if n)
        entry.setdefault("outputs", [])
        entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.output.record(entry)
        if entry.get("prefix"):
            self.recorded.setdefault(str(entry["prefix"]), entry)
        return entry

    def start(self, chunk: list[tuple[Item, str]]) -> list[_Started]:
        """Each input of ``chunk`` with what to do about it; the readable ones start decoding."""
        started: list[_Started] = []
        for item, prefix in chunk:
            if item.error is None and prefix in self.seen:  # listed again: recorded after its first listing
                started.append((item, prefix, None, "again"))
                continue
            self.seen.add(prefix)
            note = item.error if item.error is not None else self.files.state(item, prefix)
            if item.error is not None or note not in (None, "fill", "add"):
                started.append((item, prefix, None, note))
            else:
                read, preprocess, max_pixels = self.reading
                started.append((item, prefix, self.pool.submit(read, item, preprocess, max_pixels), note))
        return started

    def skipped(self, item: Item, prefix: str, fields: dict[str, Any], why: str) -> dict[str, Any]:
        kept = {k: v for k, v in fields.items() if k not in _RUN_FIELDS and k not in self.base}
        kept["prefix"] = prefix
        kept["outputs"] = [self.output.where(n) for n in self.files.planned(prefix)]
        return self.record(item, "skipped", note=why, **kept)

    def again(self, item: Item, prefix: str) -> dict[str, Any]:
        """The record of an input listed a second time in this run: ``skipped``, repeating the first
        listing's results (recorded before it: records follow the input order), or an error where that
        failed."""
        first = self.recorded.get(prefix)
        if first is None:
            return self.record(item, "error", f"{quote(item.name)}: listed twice in this run; its first "
                                              "listing failed (see its record)")  # fmt: skip
        return self.skipped(item, prefix, first, "listed twice in this run: done once, for its first listing")

    def finish(self, item: Item, prefix: str, box: Box, note: str | None, fut: Future[Any]) -> dict[str, Any]:
        """Wait for one input's render and writing, and record it."""
        fields: dict[str, Any] = {}
        try:
            written, fields = fut.result()
            fields["box"] = [box.x0, box.y0, box.x1, box.y1]
            if note == "fill":
                return self.skipped(item, prefix, fields, "outputs exist for these settings")
            if isinstance(written, OSError):
                raise written
        except HookvizError as exc:  # what it found before failing (``exc.fields``) is kept in its record
            return self.record(item, "error", f"{quote(item.name)}: {exc}", **getattr(exc, "fields", {}))
        except FileExistsError as exc:
            if all(self.output.exists(n) for n in self.files.planned(prefix)):
                # Another run with these settings finished this input meanwhile (two runs into one --out):
                # the set is complete, so it is skipped here, not failed.
                return self.skipped(item, prefix, fields, "outputs written by another run meanwhile")
            return self.record(
                item, "error", f"{quote(item.name)}: output exists: {exc} (pass --overwrite to replace it)"
            )
        except OSError as exc:
            return self.record(
                item, "error", f"{quote(item.name)}: cannot write output ({exc.strerror or exc})"
            )
        except Exception as exc:  # a rendering bug on one image must not stop the others
            return self.record(item, "error", f"{quote(item.name)}: cannot render: {_describe(exc)}")
        self.done += 1
        return self.record(item, "ok", prefix=prefix, outputs=written, **fields)

    def _render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, item: Item, prefix: str, note: str | None
    ) -> tuple[list[str] | OSError | None, dict[str, Any]]:
        """One input's files rendered and written (in a pool thread): ``(written paths, or the OSError that
        stopped the writing; the record's fields)``; nothing is written for "fill"."""
        with timing.stage("render"):
            files, fields = self.job.render(result, index, rgb, box, prefix)
        fields = self.files.named(fields, prefix)
        if note == "fill":
            return None, fields
        try:
            with timing.stage("write"):
                attrs = {"input": item.name, "box": [box.x0, box.y0, box.x1, box.y1], "prefix": prefix}
                return self.files.write(files, note, attrs), fields
        except OSError as exc:  # raised by finish, with the fields kept for its record
            return exc, fields

    def compute(self, current: list[_Started]) -> list[_Finisher]:
        """Run the model on one decoded batch now and start rendering it; return, in input order, what
        records each input once its render is done (so rendering overlaps the next batch's compute)."""
        finishers: list[_Finisher | int] = []
        ready: list[tuple[Item, str, np.ndarray, Box, str | None]] = []
        xs: list[np.ndarray] = []
        for item, prefix, fut, note in current:
            if fut is None:
                if note == "skipped":
                    why = "outputs exist for these settings"
                    finishers.append(partial(self.skipped, item, prefix, self.output.previous[prefix], why))
                elif note == "again":
                    finishers.append(partial(self.again, item, prefix))
                else:
                    finishers.append(partial(self.record, item, "error", note))
                continue
            try:
                rgb, x, box = fut.result()
            except HookvizError as exc:
                finishers.append(partial(self.record, item, "error", str(exc)))
                continue
            except Exception as exc:  # a reader of one's own (an input kind's) failing on one input
                finishers.append(
                    partial(self.record, item, "error", f"{quote(item.name)}: cannot read: {_describe(exc)}")
                )
                continue
            finishers.append(len(ready))
            ready.append((item, prefix, rgb, box, note))
            xs.append(x)
        placed, failed = self._run_model(ready, xs)
        out: list[_Finisher] = []
        for slot in finishers:
            if not isinstance(slot, int):
                out.append(slot)
                continue
            item, prefix, rgb, box, note = ready[slot]
            if slot in failed:
                out.append(partial(self.record, item, "error", failed[slot]))
                continue
            result, j = placed[slot]
            fut = self.pool.submit(self._render, result, j, rgb, box, item, prefix, note)
            out.append(partial(self.finish, item, prefix, box, note, fut))
        return out

    def _run_model(
        self, ready: list[tuple[Item, str, np.ndarray, Box, str | None]], xs: list[np.ndarray]
    ) -> tuple[dict[int, tuple[Any, int]], dict[int, str]]:
        """The job's results for the decoded inputs (``result, row`` by input), and the inputs whose batch the
        model failed on. Inputs of one size form one batch; photos of other sizes (a segmentation model keeps
        each photo's aspect, a detector takes it as it is) form their own."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, x in enumerate(xs):
            groups.setdefault(tuple(x.shape), []).append(i)
        placed: dict[int, tuple[Any, int]] = {}
        failed: dict[int, str] = {}
        for shape, group in groups.items():
            parts = []
            drawn = max(int(np.prod(np.shape(ready[i][2])[:2])) for i in group)  # the pictures' photos
            for members in self.split(group, shape, drawn):
                result = self._compute_part(ready, xs, members, failed)
                if result is not None:
                    parts.append(result)
                    placed.update({i: (result, j) for j, i in enumerate(members)})
            if len(parts) > 1:
                self.job.joined(parts)  # one batch computed in parts: rendered as the whole one
        return placed, failed

    def _compute_part(
        self,
        ready: list[tuple[Item, str, np.ndarray, Box, str | None]],
        xs: list[np.ndarray],
        members: list[int],
        failed: dict[int, str],
    ) -> Any:
        """The job's result for the inputs ``members``, or None with why in ``failed`` (the model failed)."""
        batch = torch.from_numpy(np.stack([xs[i] for i in members]))
        # Pinned host memory lets the copy to the GPU overlap with work already queued.
        batch = batch.pin_memory().to(self.device, non_blocking=True) if self.cuda else batch.to(self.device)
        # evaluate's objects: where each photo's are
        shown = [(ready[i][0], ready[i][2], ready[i][3]) for i in members]
        self.job.annotate(shown, (int(batch.shape[-2]), int(batch.shape[-1])))
        try:
            with timing.stage("compute"):
                return self.job.compute(batch)
        except HookvizError:
            raise  # a bad layer/target fails every batch alike: stop with its message
        except Exception as exc:  # a model failure on this batch must not stop the others
            for i in members:
                failed[i] = f"{quote(ready[i][0].name)}: the model failed on this batch: {_describe(exc)}"
            return None
