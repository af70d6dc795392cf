"""The ``hookviz`` Typer app: exit codes, the option types every command shares, and the guards that turn
errors into one line and an exit code. Commands live in one module per family (explain, inspect, trust,
training, report); the runner that feeds inputs to a job is :mod:`hookviz.cli.runner`.

Exit codes: 0 all inputs done; 1 one or more inputs failed (the others were done); 2 bad command line
or option value; 3 the run could not start (weights, output folder); 70 an internal error; 130
interrupted (Ctrl-C); 141 stdout closed by its reader. Under torchrun, rank 0 exits with the worst code.
Heavy modules (torch, cv2, matplotlib) are imported inside the commands, so ``--help`` is instant.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import inspect
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

from hookviz import __version__, methods
from hookviz.errors import HookvizError, one_line

#: What hookviz is, the first line of ``hookviz --help`` (and the package's description).
ABOUT = (
    "What a vision network sees and where it looks, with PyTorch hooks: CNNs, ViTs, detectors, segmenters, "
    "video, volumes and vision-language models; CAM maps, feature maps, channels, how far each map can be "
    "trusted, reports and a live explorer."
)

app = typer.Typer(
    name="hookviz",
    help=ABOUT,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

EXIT_INPUTS_FAILED = 1
EXIT_USAGE = 2
EXIT_SETUP = 3
EXIT_INTERNAL = 70  # sysexits' EX_SOFTWARE: a bug in hookviz, not in the inputs or the options
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away


def _method_names() -> list[str]:

    return [*methods.names(), methods.ALL, *methods.SELECTORS]


def _check_methods(ctx: Any, param: Any, value: Any, extra: tuple[str, ...] = ()) -> Any:
    """``--method`` values against the registry, when the command runs (a method registered by the user's
    code is a choice like the built-in ones); a comma list counts as several; ``extra``: the command's own
    words (``gradcam``'s ``auto``)."""
    chosen = [part.strip().lower() for v in value or () for part in str(v).split(",") if part.strip()]
    names = [*_method_names(), *extra]
    for v in chosen:
        if v not in names:
            raise typer.BadParameter(f"{v!r} is not one of {', '.join(names)}", ctx, param)
    return chosen or value


class MethodCommand(TyperCommand):
    """A command whose ``--method`` takes the registry's methods: checked, and listed in its help, when it
    runs rather than when hookviz is imported."""

    #: What its ``--method`` takes beyond the registry's methods and families.
    extra: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = self.extra
        for param in self.params:
            if param.name == "methods":
                param.callback = functools.partial(_check_methods, extra=extra)
                param.display_type = lambda ctx: f"<{'|'.join([*_method_names(), *extra])}>"  # type: ignore[attr-defined]


class AutoMethodCommand(MethodCommand):
    """``gradcam``: its ``--method`` takes ``auto`` too (the method a trust run recommends)."""

    extra = ("auto",)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hookviz {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="print the version and exit."),
    ] = False,
) -> None:
    """What a vision network sees and where it looks, with PyTorch hooks (``ABOUT``, the help shown)."""


def flowing(doc: str | None) -> str:
    """A docstring as help text that flows: the lines of each paragraph joined (Typer's rich help keeps a
    docstring's line breaks, which leave a gap in mid-sentence at any terminal width); paragraphs kept."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"hookviz: error: {one_line(message)}", err=True)
    raise typer.Exit(code)


#: Warnings from dependencies that say nothing a hookviz user can act on.
_HARMLESS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


@contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """No raw Python warning reaches a user: harmless ones are silenced, others become one stderr line."""
    shown: set[str] = set()

    def show(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        text = (str(message).strip().splitlines() or [category.__name__])[0]
        if text not in shown:
            shown.add(text)
            sys.stderr.write(f"hookviz: warning: {text}\n")

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        for category in _HARMLESS:
            warnings.simplefilter("ignore", category)
        warnings.showwarning = show
        yield


@contextmanager
def guarded(debug: bool) -> Iterator[None]:
    """Map hookviz errors and Ctrl-C to one stderr line and an exit code; warnings to lines."""
    try:
        with _warnings_as_lines():
            yield
    except KeyboardInterrupt:
        typer.echo("hookviz: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:
        # The reader of stdout went away (`hookviz ... | head`): stop quietly, as Unix tools do; stdout
        # now goes nowhere, so that Python's flush at exit does not complain about the pipe again.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    except HookvizError as exc:
        if debug:
            raise
        fail(str(exc), exc.exit_code)
    except (typer.Exit, typer.BadParameter):
        raise
    except Exception as exc:
        if debug:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        fail(
            f"internal error: {type(exc).__name__}: {first} (rerun with --debug for the traceback)",
            EXIT_INTERNAL,
        )


@contextmanager
def stdout_reserved() -> Iterator[IO[str]]:
    """Yield the real stdout for results; while open, anything else printed to stdout goes to stderr.

    Dependencies print (torch.hub's ``Downloading: ...``, C extensions writing to fd 1); with
    ``--json`` a script reads stdout as JSON lines, so stdout is kept for hookviz's records alone:
    ``sys.stdout`` and, where there is one, file descriptor 1 point at stderr during the run.
    """
    real = sys.stdout
    real.flush()
    try:
        fd: int | None = real.fileno()
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # not a real file (a test runner's capture)
        fd = None
    saved = None
    stream: IO[str] = real
    if fd is not None:
        saved = os.dup(fd)
        os.dup2(sys.stderr.fileno(), fd)
        stream = os.fdopen(saved, "w", encoding=getattr(real, "encoding", None) or "utf-8", closefd=False)
    sys.stdout = sys.stderr
    try:
        yield stream
    finally:
        try:
            stream.flush()  # may raise BrokenPipeError: restore stdout all the same
        finally:
            sys.stdout = real
            if saved is not None and fd is not None:
                os.dup2(saved, fd)
                os.close(saved)


def _usage(exc: Any, click: Any) -> str:
    """A usage error's words; an unknown option's suggestions only where they are close (click offers any
    option within 0.6 of it: ``--bogus`` got ``--fuse, --log, --out``)."""
    if not isinstance(exc, click.NoSuchOption) or not exc.possibilities:
        return str(exc.format_message())
    close = difflib.get_close_matches(exc.option_name, exc.possibilities, n=3, cutoff=0.75)
    return str(exc.message) + (f"; did you mean {' or '.join(close)}?" if close else "")


def run_line(command: Any, argv: list[str]) -> int:
    """One command line through ``command`` (the app built as a click command), its exit code. A usage error
    (an unknown option, a value out of range) is one line naming the help to read, as every other error is,
    not the option parser's framed box; ``hookviz`` alone shows the help."""
    # click's exceptions, or those of typer's own copy of click (typer 0.2x vendors it as typer._click)
    base = next(k for k in type(command).__mro__ if k.__name__ == "Command")
    click = importlib.import_module(base.__module__.rsplit(".", 1)[0] + ".exceptions")
    try:
        done = command.main(args=argv, prog_name="hookviz", standalone_mode=False)
    except getattr(click, "NoArgsIsHelpError", ()) as exc:  # click 8.2 on; 8.1 exits 0 itself
        exc.show()
        return exc.exit_code
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "hookviz"
        typer.echo(f"hookviz: error: {one_line(_usage(exc, click)).rstrip('.')} (see {where} -h)", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        typer.echo(f"hookviz: error: {one_line(exc.format_message())}", err=True)
        return exc.exit_code
    except (typer.Abort, getattr(click, "Abort", typer.Abort)):  # click's own, in a typer that uses it
        typer.echo("hookviz: interrupted", err=True)
        return EXIT_INTERRUPTED
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return done if isinstance(done, int) else 0  # a typer.Exit's code


def main() -> None:
    """Console-script entry point."""
    sys.exit(run_line(typer.main.get_command(app), sys.argv[1:]))
