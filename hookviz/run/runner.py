"""A run in the library: :class:`Run` does what ``hookviz gradcam`` and every per-image command do over
their inputs (choose the input kind, find and shard the inputs, build the job, open the output and its sinks,
skip or resume, merge under torchrun, build the report) and tells it as events (:mod:`hookviz.run.events`):
the command line prints them, Python reads them (:func:`explain_inputs`, :class:`hookviz.ray.Explainer`).

:func:`run_job` is its core: a job over items, the pipeline run with the kind's reader, and what the kind runs
after (a video's whole prediction after its clips)."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookviz import tasks
from hookviz.errors import HookvizError, UsageError
from hookviz.io.images import DEFAULT_MAX_PIXELS
from hookviz.io.inputs import Item, refuse_out_among_inputs, table_items
from hookviz.io.outputs import MANIFEST, MapStore, Output, RecordSink, make_folder
from hookviz.io.sinks import data_sinks
from hookviz.jobs.build import BuiltJob, JobFactory, RunContext, auto_line
from hookviz.jobs.settings import CamSettings, check_keywords, check_names, checked_init, settings_of
from hookviz.models.loaded import LoadedModel
from hookviz.render.notebook import Records
from hookviz.report import build_report
from hookviz.run import distributed, pipeline, verdicts
from hookviz.run.events import Built, Event, Finished, Note, Record, Started, Written
from hookviz.run.kinds import InputKind, input_kind, input_kind_of, prepared
from hookviz.tasks import cam_job, task_of

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from hookviz.jobs.common import Job
    from hookviz.run.distributed import Dist

#: What a run is over: files, folders, globs, URLs (``-``: paths on stdin); a model of several inputs' folders
#: by name; or items already found (:class:`hookviz.io.inputs.Item`, as a Ray batch's rows).
Inputs = str | Path | Mapping[str, str | Path] | Sequence[str | Path] | Sequence[Item]

#: Exit codes a torchrun rank ends with besides a :class:`~hookviz.errors.HookvizError`'s (as the CLI's).
INTERRUPTED, INTERNAL = 130, 70


def run_job(
    job: Job,
    loaded: LoadedModel,
    items: Iterable[Item],
    output: Output,
    *,
    kind: InputKind | None = None,
    **pacing: Unpack[pipeline.Pacing],
) -> Iterator[dict[str, Any]]:
    """``job`` over ``items`` (found and cut by ``kind``, default the one ``loaded`` takes), writing into
    ``output``: one record per item, and what the kind adds after them (a video's whole prediction);
    ``pacing``: :func:`hookviz.run.pipeline.run`'s (``batch_size``, ``workers``, ``skip_existing``, ...)."""
    kind = kind or input_kind_of(loaded)
    base = {
        "command": job.kind,
        "model": loaded.name,
        "weights": loaded.weights,
        "pretrained": loaded.pretrained,
        **task_of(loaded).fields(loaded),
        **kind.fields(loaded),
    }
    preprocess, read = kind.preprocess(loaded), kind.read(loaded)
    records = pipeline.run(
        items, job, preprocess=preprocess, output=output, device=loaded.device, base=base, read=read, **pacing
    )
    return kind.after(records, job, output, loaded)


class Run:
    """One run of a job over inputs, writing into ``out`` what the command line writes; iterate it for its
    events (:data:`hookviz.run.events.Event`), or call :meth:`records` for the records alone.

    Args:
        model: a :func:`hookviz.load_model` model, or ``load(device)`` that loads one on the device given
            (under torchrun: ``cuda:LOCAL_RANK`` where ``device`` is ``auto`` and there is CUDA).
        inputs: see :data:`Inputs`.
        job: a job factory (``factory(loaded, context)``: a job or a :class:`~hookviz.jobs.build.BuiltJob`),
            or the :class:`~hookviz.jobs.build.CamSettings` of ``gradcam``'s job; default Grad-CAM.
        out: the output folder (or an :class:`~hookviz.io.outputs.Output` already prepared, with its sinks:
            kept open, as :class:`hookviz.ray.Explainer` keeps one for all its batches).
        records: as ``--records``: a registered sink's name (``parquet``,
            :func:`hookviz.io.sinks.register_sink`'s), a path or URL ending in ``.NAME``, or a sink itself.
        maps: as ``--maps`` (``zarr``, ...); gradcam's raw maps are then kept (``save_raw``), as ``--maps``
            keeps them.
        overwrite: as ``--overwrite``; ``skip_existing``, ``batch_size`` (None: the input kind's),
            ``workers``, ``max_pixels``, ``max_memory``, ``report``, ``null``, ``inputs_table`` and
            ``inputs_column`` likewise as the options of the same names; ``pictures``: not ``--no-pictures``.
        kind: the input kind expected (``video``, ``volume``, ``sample``, ...): a model that takes another is
            refused; ``command``: a command refused where the model's task does not take it.
        torchrun: whether to take the torchrun environment's rank (its shard of the inputs, one manifest
            merged by rank 0 at the end); ``progress(label)`` gives a ``(done, total)`` callback for the
            passes of slow methods within a batch.

    Examples:
        >>> for event in Run(load_model("resnet18"), "photos/", out="cams/", records="parquet"):
        ...     print(event)
    """

    def __init__(
        self,
        model: LoadedModel | Callable[[str], LoadedModel],
        inputs: Inputs = (),
        job: JobFactory | CamSettings | None = None,
        *,
        out: str | Path | Output = "out",
        records: str | RecordSink | None = None,
        maps: str | MapStore | None = None,
        overwrite: bool = False,
        skip_existing: bool = False,
        pictures: bool = True,
        batch_size: int | None = None,
        workers: int = 2,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        max_memory: int | None = None,
        report: bool = False,
        null: bool = False,
        inputs_table: str | None = None,
        inputs_column: str | None = None,
        kind: str | None = None,
        command: str | None = None,
        device: str = "auto",
        torchrun: bool = True,
        progress: Callable[[str], Callable[[int, int], None]] | None = None,
    ) -> None:
        if overwrite and skip_existing:
            raise UsageError("--overwrite and --skip-existing contradict each other; pass one")
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"batch_size {batch_size}: must be at least 1 (as --batch-size)")
        self.model, self.inputs = model, _specs(inputs)
        if not callable(job):  # gradcam's settings: a maps store is for their raw maps
            settings = job or CamSettings()
            job = partial(cam_job, dataclasses.replace(settings, save_raw=True) if maps else settings)
        self.factory: JobFactory = job
        self.output = out if isinstance(out, Output) else None
        self.out = out.root if isinstance(out, Output) else Path(out)
        if isinstance(out, Output) and (records is not None or maps is not None):
            raise UsageError("Run(out=Output(...)): give the Output its sinks (maps=, records=), not the Run")
        self.sinks = (maps, records)
        self.pictures, self.overwrite, self.skip_existing = pictures, overwrite, skip_existing
        self.batch_size, self.workers = batch_size, workers
        self.max_pixels, self.max_memory = max_pixels, max_memory
        self.report, self.null, self.table = report, null, (inputs_table, inputs_column)
        self.kind, self.command, self.device, self.progress = kind, command, device, progress
        self.dist: Dist | None = distributed.from_env() if torchrun else None
        #: Whether this process speaks for the run (rank 0 under torchrun).
        self.lead = self.dist is None or self.dist.rank == 0
        self.ok = self.failed = 0
        #: The job, once built (:class:`~hookviz.run.events.Built`).
        self.job: Job | None = None

    def __iter__(self) -> Iterator[Event]:
        self.ok = self.failed = 0
        if self.dist is None:
            yield from self._shard()
            yield Finished(self.ok, self.failed, 1 if self.failed else 0)
        else:
            yield from self._ranked(self.dist)

    def records(self) -> Records:
        """Run to the end: the records (a list a notebook displays as the overlays, with their captions)."""
        return Records([e.record for e in self if isinstance(e, Record)])

    def find(self, loaded: LoadedModel) -> tuple[InputKind, LoadedModel, list[Item]]:
        """The input kind ``loaded`` takes for the inputs (refused where ``kind`` asks another), the model as
        the kind prepares it (:meth:`~hookviz.run.kinds.InputKind.prepare`), and every input found (the whole
        list: not this rank's shard, not cut into clips).

        Raises:
            UsageError: a model that does not take ``kind``.
        """
        specs = [str(s) for s in self.inputs if not isinstance(s, Item)]
        taken, loaded = prepared(loaded, specs)
        if self.kind is not None and taken.name != self.kind:
            raise UsageError(input_kind(self.kind).refusal.format(name=loaded.name))
        if len(specs) < len(self.inputs):  # items already found
            return taken, loaded, [s for s in self.inputs if isinstance(s, Item)]
        stdin = sys.stdin if "-" in specs else None
        found = taken.find(loaded, specs, stdin=stdin, exclude=self.out, null=self.null) if specs else []
        if self.table[0] is not None:
            found += table_items(self.table[0], self.table[1])
        return taken, loaded, found

    def _ranked(self, dist: Dist) -> Iterator[Event]:
        """This rank's shard; once every rank is done, rank 0 merges the manifest parts and builds the report;
        the last event's code is the worst rank's on rank 0 (torchrun exits with rank 0's)."""
        joined = distributed.init(dist)
        code, where = 0, f"[rank {dist.rank}]: "
        try:
            yield from self._shard()
            code = 1 if self.failed else 0
        except KeyboardInterrupt:
            yield Note("rank", where + "interrupted")
            code = INTERRUPTED
        except HookvizError as exc:
            if dist.rank == 0 or not isinstance(exc, UsageError):  # a usage error is the same on every rank
                yield Note("rank", f"{where}error: {exc}")
            code = exc.exit_code
        except Exception as exc:
            said = getattr(exc, "exit_code", None)  # a command's own exit (click's), said already
            if not isinstance(said, int):
                first = (str(exc).strip().splitlines() or [""])[0]
                yield Note("rank", f"{where}internal error: {type(exc).__name__}: {first}")
            code = said if isinstance(said, int) else INTERNAL
        worst = distributed.finish(dist, code, leave=joined)  # every rank is done writing here
        if dist.rank == 0 and self.out.is_dir():
            manifest = self.out / MANIFEST
            before = manifest.read_bytes() if manifest.exists() else b""
            distributed.merge_parts(self.out, MANIFEST, only_dead=False, job=dist.job)
            distributed.clear_progress(self.out, dist)
            added = manifest.read_bytes()[len(before) :].decode("utf-8", "replace")
            yield Written(len(before), self.command, merged=added)
            yield from self._report()
        # Only rank 0 ends with the worst code: a rank that exits non-zero first makes torchrun stop the
        # others, which could cut rank 0's merge short.
        yield Finished(self.ok, self.failed, worst if dist.rank == 0 else 0)

    def _shard(self) -> Generator[Event, None, None]:
        """One process's run (the whole run, or one torchrun rank's shard of it)."""
        refuse_out_among_inputs(self.out, self.inputs)
        dist = self.dist
        device = distributed.device_and_threads(dist, self.device) if dist is not None else self.device
        loaded = self.model if isinstance(self.model, LoadedModel) else self.model(device)
        kind, loaded, everything = self.find(loaded)
        items = kind.items(loaded, distributed.shard(everything, dist), self.max_pixels)  # by file
        job = yield from self._built(loaded, kind, everything)
        # Refused before the folder and its sinks are made: a refused run leaves nothing behind.
        pipeline.refuse_nothing(job, self.output.pictures if self.output is not None else self.pictures)
        output = self.output or self._output()
        yield Started(len(items) if kind.cuts else len(everything), self._done())
        manifest = self.out / MANIFEST
        start = manifest.stat().st_size if manifest.is_file() else 0  # --log: what this run adds
        try:
            yield from self._records(job, loaded, kind, items, output)
        finally:
            if self.output is None:
                output.finish()
        if dist is None:
            yield Written(start, job.kind)
            yield from self._report()
        if self.failed:
            rank = f"rank {dist.rank}: " if dist is not None else ""
            yield Note("failed", f"{rank}{self.failed} of {len(items)} input(s) failed; see {manifest}")

    def _records(
        self, job: Job, loaded: LoadedModel, kind: InputKind, items: list[Item], output: Output
    ) -> Iterator[Event]:
        """Each record, after the notes the pipeline and the job took on the way to it."""
        notes: list[str] = []
        found = run_job(
            job, loaded, items, output, kind=kind, batch_size=self.batch_size or kind.batch_size,
            workers=self.workers, skip_existing=self.skip_existing, max_pixels=self.max_pixels,
            max_memory=self.max_memory, note=notes.append,
        )  # fmt: skip
        for done, rec in enumerate(found, start=1):
            yield from (Note("note", text) for text in [*notes, *job.take_notes()])
            notes.clear()
            if "video" not in rec:  # a whole video's prediction counts no input
                failed = rec["status"] == "error"
                self.ok, self.failed = self.ok + (not failed), self.failed + failed
            yield Record(rec)
            if rec["status"] == "ok" and rec.get("note"):  # a shard sample's other images
                yield Note("note", f"{rec['input']}: {rec['note']}")
            if self.dist is not None:
                distributed.write_progress(self.out, self.dist, done)

    def _built(
        self, loaded: LoadedModel, kind: InputKind, everything: list[Item]
    ) -> Generator[Event, None, Job]:
        """The job, and what its building found: how ``--layer auto`` chose (said by rank 0), its notes, how
        the model was set up."""
        # The first images of the whole input list, not of this rank's shard: every rank sees the same.
        context = RunContext(first_images=lambda n: kind.first_images(everything, loaded, n, self.max_pixels))
        if self.dist is not None:
            context = RunContext(first_images=context.first_images, agree=distributed.agree)
        if self.command is not None:
            tasks.refuse(loaded, self.command)
        made = self.factory(loaded, context)
        built = made if isinstance(made, BuiltJob) else BuiltJob(job=made)
        self.job = built.job
        yield Built(built.job)
        if built.auto is not None and self.lead:
            yield Note("auto", auto_line(built.auto))
        for text in built.notes:
            yield Note("built", text)
        if built.slow and self.progress is not None:
            built.job.progress = self.progress("extra passes of " + ", ".join(built.slow))
        job: Job = built.job
        tasks.refuse(loaded, job.kind)
        notes = list(
            job.loaded.notes
        )  # how the command set the model up (prompts cut to the tokenizer's limit)
        if not loaded.pretrained:
            notes.append(f"{loaded.name} has RANDOM weights (--weights none); maps show mechanics only")
        yield from (Note("setup", text) for text in [*notes, *tasks.hints(loaded)])
        return job

    def _output(self) -> Output:
        """The output folder ready, with its sinks (parts a killed torchrun job left merged first)."""
        if self.lead and self.out.is_dir():
            distributed.merge_parts(self.out, MANIFEST, only_dead=True)
        dist = self.dist
        maps, records = (
            self.sinks
        )  # a sink's name (or place) opened here, in the folder; a sink given, as it is
        make_folder(self.out)
        named = data_sinks(
            self.out, maps if isinstance(maps, str) else None, records if isinstance(records, str) else None,
            dist.rank if dist is not None else 0,
        )  # fmt: skip
        output = Output(
            self.out, overwrite=self.overwrite, manifest=dist.part_name if dist is not None else MANIFEST,
            pictures=self.pictures, maps=named[0] if isinstance(maps, str) else maps,
            records=named[1] if isinstance(records, str) else records,
        )  # fmt: skip
        output.prepare()
        return output

    def _done(self) -> Callable[[], int] | None:
        """Under torchrun, on rank 0: how many inputs every rank has done."""
        dist = self.dist
        if dist is None or dist.rank != 0:
            return None
        return lambda: distributed.global_progress(self.out, dist)

    def _report(self) -> Iterator[Event]:
        """``report``: the HTML page over the manifest, and what building it warned of."""
        if not self.report:
            return
        warned: list[str] = []
        path = build_report(self.out, warn=warned.append)
        yield from (Note("warning", text) for text in warned)
        yield Note("report", str(path))


def _specs(inputs: Inputs) -> list[Any]:
    """The inputs as a list: a string or path a one-element list, a model's several inputs ``NAME=PATH``."""
    if isinstance(inputs, Mapping):
        return [f"{n}={p}" for n, p in inputs.items()]
    if isinstance(inputs, (str, Path)):
        return [str(inputs)]
    return [s if isinstance(s, Item) else str(s) for s in inputs]


def explain_inputs(
    loaded: Any,
    inputs: Inputs,
    out: str | Path,
    settings: CamSettings | Mapping[str, Any] | None = None,
    *,
    kind: str | None = None,
    trust: str | Path | None = None,
    **given: Any,
) -> Records:
    """The ``hookviz gradcam`` of any model over its kind of inputs, from Python: the maps written under
    ``out`` as the command writes them, and the records, also appended to ``out/manifest.jsonl`` (a list
    of dicts that a notebook displays as the overlays, with their captions). A :class:`Run` to its end.

    Args:
        loaded: :func:`hookviz.load_model`'s model: photos, a video model (its ``video`` says how clips are
            sampled), a volume model, or a model of several inputs (``inputs=(names...)``).
        inputs: files, folders, globs; for several inputs each one's folder (or file) by name, in the model's
            order (``{"rgb": "photos/", "depth": "depth/"}``).
        settings: a :class:`hookviz.jobs.settings.CamSettings` (layers, methods, target, colours,
            ``save_raw``) or a mapping of them; default: Grad-CAM at the default layer, the top class.
        kind: the input kind expected (``video``, ``volume``, ``sample``, a registered one): a model that
            takes another is refused.
        trust: ``methods=("auto",)``: the folder of a ``hookviz trust`` run of this model and weights (else
            one in ``out``, else one made on the first photos and kept in ``out/trust.KEY/``), as ``gradcam
            --method auto --trust DIR`` (:func:`hookviz.run.verdicts.auto_choice` says what it chose).
        given: :class:`Run`'s settings (``records="parquet"``, ``maps="zarr"``, ``skip_existing``,
            ``overwrite``, ``batch_size`` (default: the kind's), ``report``, ...) and settings by keyword
            (``methods=("layercam",)``) over ``settings``; a name neither has is refused, the closest named.

    Raises:
        UsageError: a model that does not take ``kind``, settings that do not apply to it.
        UntrustedError: ``methods=("auto",)`` and the trust run says no map here can be trusted.

    Examples:
        >>> records = explain_inputs(load_model("r3d_18"), "videos/", "out/")
        >>> [r["video"]["name"] for r in records if "video" in r]
    """
    run = {k: given.pop(k) for k in list(given) if k in RUN_KEYWORDS}
    check_names(CamSettings, given, "explain_inputs", others=RUN_KEYWORDS)
    chosen = settings_of(CamSettings, settings, **given)
    if verdicts.wants_auto(chosen):
        auto = verdicts.auto_choice(loaded, trust=None if trust is None else Path(trust), out=Path(out),
                                    photos=_specs(inputs))  # fmt: skip
        chosen = verdicts.auto_settings(chosen, auto)
    elif trust is not None:
        raise UsageError("trust= goes with methods=('auto',): the trust run --method auto draws from")
    return Run(loaded, inputs, chosen, out=out, kind=kind, **run).records()


#: :class:`Run`'s keyword settings (what :func:`explain_inputs` hands it rather than the job's settings).
RUN_KEYWORDS = frozenset(inspect.signature(Run.__init__).parameters) - {"self", "model", "inputs", "job"}


_TAKES = RUN_KEYWORDS | {"model", "inputs", "job"}
_FIELDS = [f.name for f in dataclasses.fields(CamSettings)]
setattr(Run, "__init__", checked_init(Run.__init__, lambda kw: check_keywords("Run", kw, _TAKES, _FIELDS)))  # noqa: B010


def explain_videos(loaded: Any, inputs: Any, out: str | Path, settings: Any = None, **kw: Any) -> list[Any]:
    """:func:`explain_inputs` of a video model: each clip's overlay videos and contact sheet, then each
    video's whole prediction."""
    return explain_inputs(loaded, inputs, out, settings, kind="video", **kw)


def explain_volumes(loaded: Any, inputs: Any, out: str | Path, settings: Any = None, **kw: Any) -> list[Any]:
    """:func:`explain_inputs` of a volume model: NIfTI overlays, orthogonal slices, mosaics and sweeps."""
    return explain_inputs(loaded, inputs, out, settings, kind="volume", **kw)


def explain_samples(loaded: Any, inputs: Any, out: str | Path, settings: Any = None, **kw: Any) -> list[Any]:
    """:func:`explain_inputs` of a model of several inputs (``inputs``: each one's folder by name)."""
    return explain_inputs(loaded, inputs, out, settings, kind="sample", **kw)
