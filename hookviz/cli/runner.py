"""The command line's side of a run (:class:`hookviz.run.Run` does the run): the options completed, the run's
events printed (progress on stderr, records on stdout), its end an exit code, a command's summary after it."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import typer

from hookviz.cli import tracking
from hookviz.cli.app import EXIT_USAGE, fail, stdout_reserved
from hookviz.cli.loading import load_warm
from hookviz.cli.options import RUNNING, ModelOptions, Prompts, RunOptions, Sampling
from hookviz.io import trackers
from hookviz.io.outputs import to_json
from hookviz.run import distributed

if TYPE_CHECKING:  # names for annotations only: importing them here would load torch for --help
    from hookviz.jobs import Job
    from hookviz.jobs.build import JobFactory, RunContext
    from hookviz.models.loaded import LoadedModel
    from hookviz.run.events import Event

#: The run options :class:`hookviz.run.Run` takes as they are.
RUN_SETTINGS = ("out", "records", "maps", "overwrite", "skip_existing", "report", "batch_size", "workers",
                "max_pixels", "max_memory", "null", "inputs_table", "inputs_column")  # fmt: skip
#: How the command line starts a note's line, by its kind (:data:`hookviz.run.events.NoteKind`).
LEADS = {"auto": "hookviz: ", "built": "hookviz: ", "failed": "hookviz: ", "rank": "hookviz",
         "report": "hookviz: report: ", "warning": "hookviz: warning: "}  # fmt: skip


class Reporter:
    """Progress on stderr (a bar on a terminal), result lines on ``out``.

    Lines bound for the same terminal as the bar are printed through the bar's console, so they scroll
    above it instead of tearing it.
    """

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

    def add(self, rec: dict[str, Any], line: str) -> None:
        """One record: ``line`` (or its JSON) on ``out``, an error on stderr; the bar moved on."""
        video = "video" in rec  # a whole video's prediction, after its clips: no input of its own
        if not video and rec["status"] == "error":
            self.say(f"hookviz: {rec['error']}", err=True)
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


def _said(event: Event, reporter: Reporter, r: RunOptions, stdout: IO[str]) -> int | None:
    """``event`` printed; the exit code, at the end."""
    from hookviz.run import events

    if isinstance(event, events.Note) and (
        event.kind not in ("built", "setup", "note") or not reporter.quiet
    ):
        reporter.say(LEADS.get(event.kind, "hookviz: note: ") + event.text, err=True)
    elif isinstance(event, events.Started):
        reporter.count_from = event.done
        reporter.start(event.total)
    elif isinstance(event, events.Record):
        reporter.add(event.record, event.line() if not (reporter.quiet or reporter.as_json) else "")
    elif isinstance(event, events.Written):
        reporter.close()
        if event.merged is not None and r.as_json:
            stdout.write(event.merged)
            stdout.flush()
        tracking.log_run(r, event.start, event.command, r.quiet)
    elif isinstance(event, events.Finished):
        return event.code
    return None


def _run(factory: JobFactory, m: ModelOptions, r: RunOptions, command: str | None) -> int:
    """The run of ``factory``'s job over ``r.inputs`` (one process, or one torchrun rank's shard), its events
    printed; returns the exit code."""
    from hookviz.run.runner import Run

    dist = distributed.from_env()
    if dist is not None and "-" in r.inputs:  # said once, by rank 0; every rank stops with the same code
        if dist.rank != 0:
            raise typer.Exit(EXIT_USAGE)
        fail("reading paths from stdin is not supported under torchrun (each rank has its own stdin); "
             "pass files, folders or globs", EXIT_USAGE)  # fmt: skip
    # Under torchrun only rank 0 talks; the records are printed once, merged, at the end.
    quiet = r.quiet or (dist is not None and (dist.rank != 0 or r.as_json))
    settings = {name: getattr(r, name) for name in RUN_SETTINGS}
    code = 0
    with stdout_reserved() as stdout:
        reporter = Reporter(stdout, quiet, r.as_json and dist is None, r.lines)
        run = Run(lambda device: load_warm(dataclasses.replace(m, device=device), quiet), r.inputs, factory,
                  pictures=not r.no_pictures, command=command, device=m.device, progress=reporter.inner,
                  **settings)  # fmt: skip
        try:
            for event in run:
                code = _said(event, reporter, r, stdout) or code
        finally:
            reporter.close()
    return code


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
    quiet), and ``summarise(job)`` after it, even when some inputs failed (on rank 0 under torchrun); the
    run's exit code stands."""
    if run.overwrite and run.skip_existing:
        raise typer.BadParameter("--overwrite (redo everything) and --skip-existing (keep what exists) "
                                 "contradict each other; pass one", param_hint="--skip-existing")  # fmt: skip
    m, r = prepared(model, run, inputs, several, sampling, **fixed)
    built: list[Job] = []

    def factory(loaded: LoadedModel, context: RunContext) -> Any:
        from hookviz.jobs.build import BuiltJob

        made = job_factory(prompts.apply(loaded) if prompts is not None else loaded, context)
        built.append(made.job if isinstance(made, BuiltJob) else made)
        if announce is not None and not r.quiet:
            announce(built[-1])
        return made

    if r.log is not None and (said := trackers.check_log(r.log)) is not None:
        warn(said)
    # --log after the summary: its files (evaluation.KEY.json, sanity.json, ...) are logged with the maps.
    start, before = tracking.out_state(r.out) if summarise and r.log else (0, {})  # a listing only for --log
    code = _run(factory, m, dataclasses.replace(r, log=None) if summarise else r, RUNNING.get())
    dist = distributed.from_env()
    if summarise is not None and (dist is None or dist.rank == 0):
        if built:
            summarise(built[0])
        tracking.log_run(r, start, RUNNING.get(), r.quiet, summaries=tracking.changed(r.out, before))
    if code:
        raise typer.Exit(code)
