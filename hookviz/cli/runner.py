"""The shared body of the per-image commands: model options, the reporter (progress, records on stdout), the
run over inputs (one process, or one torchrun rank's shard), and the run-then-summarise step."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import typer

from hookviz.cli import tracking
from hookviz.cli.app import (
    EXIT_INPUTS_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    fail,
    stdout_reserved,
)
from hookviz.cli.loading import load_warm
from hookviz.cli.options import RUNNING, ModelOptions, Prompts, RunOptions, Sampling
from hookviz.errors import HookvizError
from hookviz.io import trackers
from hookviz.models.labels import class_label
from hookviz.report import build_report
from hookviz.run import distributed

if TYPE_CHECKING:  # names for annotations only: importing them here would load torch for --help
    from hookviz.io.inputs import Item
    from hookviz.io.outputs import Output
    from hookviz.jobs import Job
    from hookviz.jobs.build import BuiltJob, JobFactory, RunContext
    from hookviz.models.loaded import LoadedModel
    from hookviz.run.distributed import Dist
    from hookviz.run.kinds import InputKind


class Reporter:
    """Progress on stderr (a bar on a terminal), result lines on ``out``; counts ok and failed inputs.

    Lines bound for the same terminal as the bar are printed through the bar's console, so they scroll
    above it instead of tearing it.
    """

    def __init__(self, out: IO[str], quiet: bool, as_json: bool) -> None:
        self.out, self.quiet, self.as_json = out, quiet, as_json
        self.ok = self.failed = 0
        self.lines = True
        self.bar: Any = None
        self._inner: Any = None
        #: Under torchrun, rank 0's bar counts every rank's inputs (``count_from()`` adds them up).
        self.count_from: Callable[[], int] | None = None

    def start(self, total: int) -> None:
        """Show the bar (on a terminal, unless quiet) for ``total`` inputs."""
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(transient=True, console=Console(stderr=True), redirect_stdout=False)
            self.bar.start()
            self._task = self.bar.add_task("images", total=total)

    def inner(self, label: str) -> Callable[[int, int], None]:
        """A ``progress(done, total)`` callback for slow work inside one batch (Score-CAM's passes)."""

        def update(done: int, total: int) -> None:
            if self.bar is None:
                return
            if self._inner is None:
                self._inner = self.bar.add_task(label, total=total)
            self.bar.update(self._inner, completed=done, total=total)

        return update

    def say(self, text: str, err: bool = False) -> None:
        to_terminal = err or (hasattr(self.out, "isatty") and self.out.isatty())
        if self.bar is not None and to_terminal:
            self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        elif err:
            typer.echo(text, err=True)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def add(self, rec: dict[str, Any]) -> None:
        if "video" in rec:  # a whole video's prediction, after its clips
            if self.as_json:
                from hookviz.run.pipeline import to_json

                self.say(to_json(rec))
            elif not self.quiet and self.lines:
                v = rec["video"]
                self.say(
                    f"{rec['input']}: whole video: predicted {_named(v)} p={v['score']:.3f} "
                    f"({v['clips_agreeing']} of {v['clips']} clips agree)"
                )
            return
        if rec["status"] == "error":
            self.failed += 1
            self.say(f"hookviz: {rec['error']}", err=True)
        else:
            self.ok += 1
        if self.as_json:
            from hookviz.run.pipeline import to_json

            self.say(to_json(rec))
        elif not self.quiet and self.lines and rec["status"] != "error":
            self.say(_describe(rec))
        if rec["status"] == "ok" and rec.get("note") and not self.quiet:  # a shard sample's other images
            self.say(f"hookviz: note: {rec['input']}: {rec['note']}", err=True)
        if self.bar is not None:
            if self.count_from is not None:
                self.bar.update(self._task, completed=max(self.ok + self.failed, self.count_from()))
            else:
                self.bar.advance(self._task)
            if self._inner is not None:
                self.bar.remove_task(self._inner)
                self._inner = None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def warn(text: str) -> None:
    typer.echo(f"hookviz: warning: {text}", err=True)


def _named(d: dict[str, Any]) -> str:
    """``tabby (281)``, or ``class 281`` for a class without a name (not ``class 281 (281)``)."""

    return class_label(d.get("name"), d.get("index"))


def _describe(rec: dict[str, Any]) -> str:
    from hookviz import tasks  # loaded already: records come after the model

    parts = [f"{rec['input']}:"]
    clip = rec.get("clip")
    if clip:
        span = f"frames {clip['frames'][0]}-{clip['frames'][1]}"
        if clip.get("seconds"):
            span += f", {clip['seconds'][0]:.2f}-{clip['seconds'][1]:.2f}s"
        parts = [f"{rec['input']} clip {clip['number']}/{clip['of']} ({span}):"]
    told = tasks.describe(rec)
    if told is not None:  # the task's account (a detector's boxes) replaces the prediction
        parts += told
        rec = {**rec, "predicted": None}
    p, t = rec.get("predicted"), rec.get("target")

    def scored(score: float) -> str:  # a probability, or a segmentation's share of the pixels
        return f"{score:.1%} of pixels" if rec.get("region") else f"p={score:.3f}"

    if p:
        parts.append(f"predicted {_named(p)} {scored(p['score'])};")
        if t and t["index"] != p["index"]:
            parts.append(f"explained {_named(t)} {scored(t['score'])};")
    outs = rec["outputs"]
    verb = "exists" if rec["status"] == "skipped" else "wrote"
    if outs:
        parts.append(f"{verb} {outs[0]}" + (f" (+{len(outs) - 1} more)" if len(outs) > 1 else ""))
    return " ".join(parts)


def _run_job(job_factory: JobFactory, m: ModelOptions, r: RunOptions, command: str | None = None) -> None:
    """The shared body of the per-image commands: inputs → model → job → pipeline → records.

    Under ``torchrun`` every rank runs its shard of the inputs; the ranks then meet, rank 0 merges the
    manifest parts (and prints the records with ``--json``), and each exits with the worst code.
    """

    if r.overwrite and r.skip_existing:
        raise typer.BadParameter(
            "--overwrite (redo everything) and --skip-existing (keep what exists) contradict each other; "
            "pass one",
            param_hint="--skip-existing",
        )
    dist = distributed.from_env()
    if dist is None:
        _run_shard(job_factory, m, r, None, command)
        return
    if "-" in r.inputs:  # said once, by rank 0; every rank stops with the same code
        if dist.rank != 0:
            raise typer.Exit(EXIT_USAGE)
        fail(
            "reading paths from stdin is not supported under torchrun (each rank has its own stdin); "
            "pass files, folders or globs",
            EXIT_USAGE,
        )
    distributed.init(dist)
    m = dataclasses.replace(m, device=distributed.device_and_threads(dist, m.device))
    code = 0
    try:
        _run_shard(job_factory, m, r, dist, command)
    except typer.Exit as exc:
        code = int(exc.exit_code or 0)
    except KeyboardInterrupt:
        typer.echo(f"hookviz[rank {dist.rank}]: interrupted", err=True)
        code = EXIT_INTERRUPTED
    except HookvizError as exc:
        if dist.rank == 0 or exc.exit_code != EXIT_USAGE:  # a usage error is the same on every rank
            typer.echo(f"hookviz[rank {dist.rank}]: error: {exc}", err=True)
        code = exc.exit_code
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        typer.echo(f"hookviz[rank {dist.rank}]: internal error: {type(exc).__name__}: {first}", err=True)
        code = EXIT_INTERNAL
    worst = distributed.finish(dist, code)  # every rank is done writing here
    if dist.rank == 0 and r.out.is_dir():
        from hookviz.run import pipeline

        before = (r.out / pipeline.MANIFEST).read_bytes() if (r.out / pipeline.MANIFEST).exists() else b""
        distributed.merge_parts(r.out, pipeline.MANIFEST, only_dead=False, job=dist.job)
        distributed.clear_progress(r.out, dist)
        if r.as_json:
            added = (r.out / pipeline.MANIFEST).read_bytes()[len(before) :].decode("utf-8", "replace")
            sys.stdout.write(added)
            sys.stdout.flush()
        tracking.log_run(r, len(before), command, quiet=r.quiet)
        if r.report:
            typer.echo(f"hookviz: report: {build_report(r.out, warn=warn)}", err=True)
    # Only rank 0 reports the worst code: a rank that exits non-zero first makes torchrun stop the others,
    # which could cut rank 0's merge short. torchrun exits with rank 0's code.
    if worst and dist.rank == 0:
        raise typer.Exit(worst)


def _setup_notes(job: Job, loaded: LoadedModel) -> list[str]:
    """What the user should know about how the model was set up before the records come."""
    from hookviz import tasks  # loaded already: the model is

    notes = list(job.loaded.notes)  # how the command set the model up (prompts cut to the tokenizer's limit)
    if not loaded.pretrained:
        notes.append(f"{loaded.name} has RANDOM weights (--weights none); maps show mechanics only")
    return notes + tasks.hints(loaded)


def _built(made: Any) -> BuiltJob:
    from hookviz.jobs.build import BuiltJob

    return made if isinstance(made, BuiltJob) else BuiltJob(job=made)


def _said(built: BuiltJob, lead: bool, quiet: bool, reporter: Reporter) -> Job:
    """The built job, once what its building found is said: how ``--layer auto`` chose (a result: said even
    with -q, by rank 0), its notes, and a bar over its slow methods' passes."""
    from hookviz.jobs.build import auto_line

    if built.auto is not None and lead:
        typer.echo(f"hookviz: {auto_line(built.auto)}", err=True)
    if not quiet:
        for note in built.notes:
            typer.echo(f"hookviz: {note}", err=True)
    if built.slow:
        built.job.progress = reporter.inner("extra passes of " + ", ".join(built.slow))
    return built.job


def _check_out(r: RunOptions) -> None:
    """``--out`` may not be one of the input folders (outputs would be read back as inputs); ``--log``
    names a tracker that is installed (both said before any work)."""
    if r.log is not None and (said := trackers.check_log(r.log)) is not None:
        warn(said)
    real_out = r.out.resolve()
    for spec in r.inputs:
        if spec != "-" and Path(spec).is_dir() and Path(spec).resolve() == real_out:
            fail(
                f"--out {str(r.out)!r} is also an input folder; outputs would be read back as inputs. "
                "Choose another --out",
                EXIT_USAGE,
            )


def _run_shard(
    job_factory: JobFactory, m: ModelOptions, r: RunOptions, dist: Dist | None, command: str | None = None
) -> None:
    """One process's run (the whole run, or one torchrun rank's shard of it)."""
    from hookviz import tasks
    from hookviz.io.inputs import table_items
    from hookviz.jobs.build import RunContext
    from hookviz.run import pipeline
    from hookviz.run.kinds import prepared

    _check_out(r)
    lead = dist is None or dist.rank == 0
    output = pipeline.Output(
        r.out,
        overwrite=r.overwrite,
        manifest=dist.part_name if dist is not None else pipeline.MANIFEST,
        pictures=not r.no_pictures,
    )
    quiet = r.quiet or not lead or (r.as_json and dist is not None)
    with stdout_reserved() as stdout:
        loaded = load_warm(m, quiet)
        kind, loaded = prepared(loaded, r.inputs)
        stdin = sys.stdin if "-" in r.inputs else None
        everything = kind.find(loaded, r.inputs, stdin=stdin, exclude=r.out, null=r.null) if r.inputs else []
        if r.inputs_table is not None:
            everything += table_items(r.inputs_table, r.inputs_column)
        # By file: a video's clips stay on one rank.
        items = kind.items(loaded, distributed.shard(everything, dist), r.max_pixels)
        # Under torchrun only rank 0 talks; the records are printed once, merged, at the end.
        reporter = Reporter(stdout, quiet, r.as_json and dist is None)
        reporter.lines = r.lines
        # The first images of the whole input list, not of this rank's shard: every rank sees the same.
        context = RunContext(first_images=lambda n: kind.first_images(everything, loaded, n, r.max_pixels))
        if dist is not None:
            context = dataclasses.replace(context, agree=distributed.agree)
        try:
            if command is not None:
                tasks.refuse(loaded, command)
            job = _said(_built(job_factory(loaded, context)), lead, quiet, reporter)
            tasks.refuse(loaded, job.kind)
            if not quiet:
                for text in _setup_notes(job, loaded):
                    typer.echo(f"hookviz: note: {text}", err=True)
            if lead and r.out.is_dir():  # parts left by a killed torchrun job, before this run's records
                distributed.merge_parts(r.out, pipeline.MANIFEST, only_dead=True)
            output.prepare()
            if dist is not None:
                reporter.count_from = lambda: distributed.global_progress(r.out, dist)
            reporter.start(len(items) if kind.cuts else len(everything))
            _report_records(job, loaded, kind, items, output, r, dist, reporter)
        finally:
            reporter.close()
    if r.report and dist is None:
        typer.echo(f"hookviz: report: {build_report(r.out, warn=warn)}", err=True)
    if reporter.failed:
        where = f"rank {dist.rank}: " if dist is not None else ""
        typer.echo(
            f"hookviz: {where}{reporter.failed} of {len(items)} input(s) failed; "
            f"see {r.out / pipeline.MANIFEST}",
            err=True,
        )
        raise typer.Exit(EXIT_INPUTS_FAILED)


def _report_records(
    job: Job,
    loaded: LoadedModel,
    kind: InputKind,
    items: list[Item],
    output: Output,
    r: RunOptions,
    dist: Dist | None,
    reporter: Reporter,
) -> None:
    """The job run over ``items``, each record said as it comes (and the notes the job takes on the way); the
    raw maps into ``--maps``' Zarr store and each record into ``--records``' Parquet table, when asked."""
    from hookviz.io.sinks import data_sinks
    from hookviz.run import pipeline, runner

    quiet = reporter.quiet
    how = {n: getattr(r, n) for n in ("batch_size", "workers", "skip_existing", "max_pixels", "max_memory")}
    say = None if quiet else lambda text: reporter.say(f"hookviz: note: {text}", err=True)
    output.maps, table = data_sinks(r.out, r.maps, r.records, dist.rank if dist is not None else 0)
    manifest = r.out / pipeline.MANIFEST
    start = manifest.stat().st_size if manifest.is_file() else 0  # --log: what this run adds
    records = runner.run_job(job, loaded, items, output, kind=kind, note=say, **how)
    try:
        for done, rec in enumerate(records, start=1):
            for text in job.take_notes():
                if not quiet:
                    reporter.say(f"hookviz: note: {text}", err=True)
            reporter.add(rec)
            if table is not None:
                table.add(rec)
            if dist is not None:
                distributed.write_progress(r.out, dist, done)
    finally:
        if table is not None:
            table.close()
    if dist is None:  # under torchrun, rank 0 logs the merged manifest
        tracking.log_run(r, start, job.kind, quiet)


def prepared(
    model: ModelOptions,
    run: RunOptions,
    inputs: list[str] | None,
    several: list[str] | None = None,
    sampling: Sampling | None = None,
    **fixed: Any,
) -> tuple[ModelOptions, RunOptions]:
    """The model and run options of a command over ``inputs`` (or ``--input NAME=PATH`` specs, ``several``):
    completed with what the run decides for the model (the device, the inputs' kind and names, the sampling);
    ``fixed`` sets run options a command does not let the user choose."""
    if several:  # a model of several inputs: the NAME=PATH specs are its inputs
        if inputs:
            raise typer.BadParameter("give the inputs as --input NAME=PATH only, not also as arguments")
        inputs = list(several)
    elif not inputs and run.inputs_table is None:
        raise typer.BadParameter("give files, folders, globs or - (stdin); or --input NAME=PATH for a model "
                                 "of several inputs", param_hint="INPUTS")  # fmt: skip
    run = dataclasses.replace(run, inputs=list(inputs or ()), **fixed)
    model = dataclasses.replace(
        model,
        device=run.device,
        volumes=all_volumes(list(inputs or ())),
        inputs=tuple(s.partition("=")[0].strip() for s in several or ()),
        **(dataclasses.asdict(sampling) if sampling is not None else {}),
    )
    return model, run


def all_volumes(inputs: list[str]) -> bool:
    """Whether every input names a volume (a NIfTI or ``.npy`` file, a DICOM folder, a folder of volumes)."""
    from hookviz.io.volume import is_volume, volume_suffix  # loads numpy: only once a command runs

    def one(spec: str) -> bool:
        path = Path(spec).expanduser()
        if is_volume(path):
            return True
        return path.is_dir() and any(volume_suffix(f) for f in path.iterdir())

    return bool(inputs) and "-" not in inputs and all(one(s) for s in inputs)


def run_command(
    job_factory: JobFactory,
    model: ModelOptions,
    run: RunOptions,
    inputs: list[str] | None,
    several: list[str] | None = None,
    sampling: Sampling | None = None,
    *,
    prompts: Prompts | None = None,
    announce: Callable[[Job], None] | None = None,
    summarise: Callable[[Job], None] | None = None,
    **fixed: Any,
) -> None:
    """A per-image command's whole body: its options completed (:func:`prepared`), the job run over inputs.
    The command running (:data:`hookviz.cli.options.RUNNING`) is refused first where the model's task does
    not take it; ``prompts`` replace the model's classes; ``announce(job)`` speaks before the run (unless
    quiet), and ``summarise(job)`` after it, even when some inputs failed (on rank 0 under torchrun)."""
    m, r = prepared(model, run, inputs, several, sampling, **fixed)
    built: list[Job] = []

    def factory(loaded: LoadedModel, context: RunContext) -> Any:
        made = job_factory(prompts.apply(loaded) if prompts is not None else loaded, context)
        built.append(_built(made).job)
        if announce is not None and not r.quiet:
            announce(built[-1])
        return made

    command = RUNNING.get()
    if summarise is None:
        _run_job(factory, m, r, command)
    else:
        _run_then(factory, m, r, lambda: summarise(built[0]) if built else None, command)


def _run_then(
    job_factory: JobFactory,
    m: ModelOptions,
    r: RunOptions,
    summarise: Callable[[], None],
    command: str | None = None,
) -> None:
    """:func:`_run_job`, then ``summarise()`` over the run's records (on rank 0 under torchrun), even when
    some inputs failed; the run's exit code stands."""

    failed: typer.Exit | None = None
    if r.log is not None and (said := trackers.check_log(r.log)) is not None:
        warn(said)
    # --log after the summary: its files (evaluation.KEY.json, sanity.json, ...) are logged with the maps.
    start, before = tracking.out_state(r.out) if r.log is not None else (0, {})  # a listing only for --log
    try:
        _run_job(job_factory, m, dataclasses.replace(r, log=None), command)
    except typer.Exit as exc:
        failed = exc
    dist = distributed.from_env()
    if dist is None or dist.rank == 0:
        summarise()
        tracking.log_run(r, start, command, r.quiet, summaries=tracking.changed(r.out, before))
    if failed is not None:
        raise failed
