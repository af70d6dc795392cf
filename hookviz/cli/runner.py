"""The command line's side of a run (:class:`hookviz.run.Run` does the run): the options completed, the run's
events printed (progress on stderr, records on stdout), its end an exit code, a command's summary after it."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import typer

from hookviz.cli import tracking
from hookviz.cli.app import EXIT_USAGE, fail, stdout_reserved
from hookviz.cli.loading import load_warm, prepared
from hookviz.cli.options import RUNNING, ModelOptions, Prompts, RunOptions, Sampling
from hookviz.errors import one_line
from hookviz.io import trackers
from hookviz.io.outputs import to_json
from hookviz.run import distributed

if TYPE_CHECKING:  # names for annotations only: importing them here would load torch for --help
    from hookviz.jobs import Job
    from hookviz.jobs.build import JobFactory, RunContext
    from hookviz.models.loaded import LoadedModel
    from hookviz.run.events import Event
    from hookviz.run.runner import Run

#: How a command says one record on a line (default: :meth:`hookviz.run.events.Record.line`).
Line = Callable[[dict[str, Any]], str]

#: The run options :class:`hookviz.run.Run` takes as they are.
RUN_SETTINGS = ("out", "records", "maps", "overwrite", "skip_existing", "report", "batch_size", "workers",
                "max_pixels", "max_memory", "null", "inputs_table", "inputs_column")  # fmt: skip


class Reporter:
    """Progress on stderr (a bar on a terminal), result lines on ``out``. Lines bound for the bar's terminal
    are printed through the bar's console, so they scroll above it instead of tearing it."""

    def __init__(self, out: IO[str], quiet: bool, as_json: bool, lines: bool = True) -> None:
        self.out, self.quiet, self.as_json, self.lines = out, quiet, as_json, lines
        self.bar: Any = None
        self._inner: Any = None
        self.done = 0
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
            if self.bar is not None and self._inner is None:
                self._inner = self.bar.add_task(label, total=total)
            if self.bar is not None:
                self.bar.update(self._inner, completed=done, total=total)

        return update

    def say(self, text: str, err: bool = False) -> None:
        if self.bar is not None and (err or (hasattr(self.out, "isatty") and self.out.isatty())):
            self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        elif err:
            typer.echo(text, err=True)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def add(self, rec: dict[str, Any], line: str) -> None:
        """One record: ``line`` (or its JSON) on ``out``, an error on stderr; the bar moved on."""
        video = "video" in rec  # a whole video's prediction, after its clips: no input of its own
        if not video and rec["status"] == "error":
            self.say(f"hookviz: {one_line(str(rec['error']))}", err=True)
        if self.as_json:
            self.say(to_json(rec))
        elif not self.quiet and self.lines and (video or rec["status"] != "error"):
            self.say(line)
        if self.bar is not None and not video:
            self.done += 1
            every = self.count_from() if self.count_from is not None else 0
            self.bar.update(self._task, completed=max(self.done, every))
            if self._inner is not None:
                self.bar.remove_task(self._inner)
                self._inner = None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def warn(text: str) -> None:
    typer.echo(f"hookviz: warning: {text}", err=True)


def _said(event: Event, reporter: Reporter, r: RunOptions, announce: Any, line: Line | None) -> int | None:
    """``event`` printed (``announce(job)`` once the job is built; a record as ``line`` says it, default its
    :meth:`~hookviz.run.events.Record.line`); the exit code, at the end."""
    from hookviz.run import events  # loads torch: only once a command runs

    if isinstance(event, events.Note) and (event.loud or not reporter.quiet):
        reporter.say(event.line(), err=True)
    elif isinstance(event, events.Built) and announce is not None and not r.quiet:
        announce(event.job)
    elif isinstance(event, events.Started):
        reporter.count_from = event.done
        reporter.start(event.total)
    elif isinstance(event, events.Record):
        said = "" if reporter.quiet or reporter.as_json else line(event.record) if line else event.line()
        reporter.add(event.record, said)
    elif isinstance(event, events.Written):
        reporter.close()
        if event.merged is not None and r.as_json:  # under torchrun: the merged records, once
            reporter.out.write(event.merged)
            reporter.out.flush()
        tracking.log_run(r, event.start, event.command, r.quiet)
    return event.code if isinstance(event, events.Finished) else None


def run_said(
    make: Callable[[bool, Reporter], Run], r: RunOptions, announce: Any = None, line: Line | None = None
) -> tuple[Run, int]:
    """The run ``make(quiet, reporter)`` builds over ``r.inputs`` (or a torchrun rank's shard), said; its exit
    code."""
    dist = distributed.from_env()
    if dist is not None and "-" in r.inputs:  # said once, by rank 0; every rank stops with the same code
        if dist.rank != 0:
            raise typer.Exit(EXIT_USAGE)
        fail("reading paths from stdin is not supported under torchrun (each rank has its own stdin); "
             "pass files, folders or globs", EXIT_USAGE)  # fmt: skip
    # Under torchrun only rank 0 talks; the records are printed once, merged, at the end.
    quiet = r.quiet or (dist is not None and (dist.rank != 0 or r.as_json))
    with stdout_reserved() as stdout:
        reporter = Reporter(stdout, quiet, r.as_json and dist is None, r.lines)
        run = make(quiet, reporter)
        code = 0
        try:
            for event in run:
                code = _said(event, reporter, r, announce, line) or code
        finally:
            reporter.close()
    return run, code


def _run(factory: JobFactory, m: ModelOptions, r: RunOptions, announce: Any) -> tuple[Run, int]:
    """The run of ``factory``'s job over ``r.inputs`` (or a torchrun rank's shard), said; its exit code."""
    from hookviz.run.runner import Run

    def make(quiet: bool, reporter: Reporter) -> Run:
        return Run(lambda device: load_warm(dataclasses.replace(m, device=device), quiet), r.inputs, factory,
                   pictures=not r.no_pictures, command=RUNNING.get(), device=m.device,
                   progress=reporter.inner, **{name: getattr(r, name) for name in RUN_SETTINGS})  # fmt: skip

    return run_said(make, r, announce)


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
    """A per-image command's body: its options completed (:func:`prepared`), the job run over the inputs (the
    command refused where the model's task does not take it); ``prompts`` replace the model's classes;
    ``announce(job)`` speaks before the run, ``summarise(job)`` after it (rank 0's), even if inputs failed."""
    if run.overwrite and run.skip_existing:
        raise typer.BadParameter("--overwrite (redo everything) and --skip-existing (keep what exists) "
                                 "contradict each other; pass one", param_hint="--skip-existing")  # fmt: skip
    m, r = prepared(model, run, inputs, several, sampling, **fixed)

    def factory(loaded: LoadedModel, context: RunContext) -> Any:
        return job_factory(prompts.apply(loaded) if prompts is not None else loaded, context)

    if r.log is not None and (said := trackers.check_log(r.log)) is not None:
        warn(said)
    # --log after the summary: its files (evaluation.KEY.json, sanity.json, ...) are logged with the maps.
    start, before = tracking.out_state(r.out) if summarise and r.log else (0, {})  # a listing only for --log
    done, code = _run(factory, m, dataclasses.replace(r, log=None) if summarise else r, announce)
    if summarise is not None and done.lead:
        if done.job is not None:
            summarise(done.job)
        tracking.log_run(r, start, RUNNING.get(), r.quiet, summaries=tracking.changed(r.out, before))
    if code:
        raise typer.Exit(code)
