"""``hookviz serve``: start, ask about or stop the user's server (see :mod:`hookviz.serve`)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.cli.app import EXIT_SETUP, app, fail, run_line
from hookviz.cli.flags import memory_size
from hookviz.cli.loading import USED, WARM, load_options, warm_key
from hookviz.serve.paths import claim, private_dir, server_socket, socket_dir
from hookviz.serve.server import Server
from hookviz.serve.wire import ask
from hookviz.startup import release_collector

#: Modules a command would import, imported once by the server (its children inherit them).
PRELOAD = (
    "torch",
    "torchvision",
    "cv2",
    "numpy",
    "PIL.Image",
    "matplotlib",
    "scipy.stats",
    "hookviz.engine.explain",
    "hookviz.run.pipeline",
    "hookviz.render",
    "hookviz.jobs.cam_build",
    "hookviz.jobs.detection",
    "hookviz.engine.features",
    "hookviz.summary",
    "hookviz.report",
    "hookviz.evaluation",
    "hookviz.models.build",
    "hookviz.models.torchvision",
    "hookviz.models.loaded",
    "hookviz.tasks",
    "hookviz.run.runner",
)


class CliHost:
    """hookviz's command line as the server's host: its commands run in the children, the models they load
    kept warm in the server (:data:`hookviz.cli.WARM`, which a forked child inherits)."""

    def __init__(self) -> None:
        self.command: Any = None

    def prepare(self) -> None:
        for name in PRELOAD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        os.environ.setdefault("MPLBACKEND", "Agg")
        self.command = typer.main.get_command(app)  # built once: typer builds it anew on every app() call
        release_collector()  # the server's start is over (hookviz.startup)

    def run(self, argv: list[str]) -> int:
        return run_line(self.command, argv)

    def used(self) -> list[Any]:
        return list(USED)

    def warm(self, used: Any) -> tuple[Any, int] | None:
        key = warm_key(used)
        if key is None:  # the user's own code: loaded afresh by every call
            return None
        loaded = WARM.get(key)
        if loaded is None:
            from hookviz.models.loaded import probe  # torch: loaded by the server, not for --help

            loaded = load_options(used, quiet=True)
            with contextlib.suppress(Exception):  # the layer probe's traced pass, cached with the model
                probe(loaded)
            WARM[key] = loaded
        model = loaded.model
        return key, sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))

    def drop(self, key: Any) -> None:
        WARM.pop(key, None)

    def describe(self, key: Any) -> str:
        options = key[0]
        return str(options.model) + (f" ({options.weights})" if options.weights else "")


def serve(
    stop: Annotated[
        bool, typer.Option("--stop", help="stop the running server (its requests finish first).")
    ] = False,
    status: Annotated[
        bool, typer.Option("--status", help="print the running server's state as JSON.")
    ] = False,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach", "-d", help="run in the background (log beside the socket); return once it listens."
        ),
    ] = False,
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout", min=0, help="exit after this many seconds without a request (0: never)."
        ),
    ] = 900.0,
    max_memory: Annotated[
        str | None,
        typer.Option(
            "--max-memory",
            help="warm models kept (parameters and buffers), least recently used dropped first (default 4G).",
        ),
    ] = None,
    socket_path: Annotated[
        Path | None,
        typer.Option(
            "--socket",
            help="the socket (default $XDG_RUNTIME_DIR/hookviz/server.sock; HOOKVIZ_SERVER names one too).",
        ),
    ] = None,
) -> None:
    """Keep torch imported and models warm: every command runs in a fork of this.

    Listens on a Unix socket in a folder only you can open (0700, socket 0600),
    never on the network. While it runs, each `hookviz gradcam cat.jpg` of a
    shell loop costs a fork instead of Python's start and torch's import.
    --no-server (or HOOKVIZ_SERVER=none) runs a command here instead.
    """
    path = socket_path or server_socket() or socket_dir() / "server.sock"
    if stop or status:
        answer = ask(path, {"op": "stop" if stop else "status"})
        if answer is None:
            typer.echo(f"hookviz: no server at {path}", err=True)
            raise typer.Exit(1)
        typer.echo(
            json.dumps(answer, indent=1) if status else f"hookviz: server {answer.get('pid')} stopping"
        )
        return
    running = ask(path, {"op": "status"}, timeout=2.0)
    if running is not None:
        typer.echo(f"hookviz: a server is already running at {path} (pid {running.get('pid')})", err=True)
        return
    try:
        private_dir(path.parent)
        claim(path)
    except PermissionError as exc:
        fail(str(exc), EXIT_SETUP)
    budget = memory_size(max_memory) or 4 * 2**30
    if detach:
        _detach(path, idle_timeout, budget)
        return

    def listening() -> None:  # said once it listens: a script may call at once
        typer.echo(f"hookviz: serving on {path} (Ctrl-C stops it)", err=True)

    server = Server(path, CliHost(), idle_timeout=idle_timeout, max_memory=budget, log=sys.stderr)  # type: ignore[arg-type]
    server.on_listen = listening
    with contextlib.suppress(KeyboardInterrupt):
        server.serve()


def _detach(path: Path, idle_timeout: float, budget: int) -> None:
    """Start the server in a new session (its log beside the socket) and wait until it answers."""
    log = path.parent / "server.log"
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork():
            os._exit(0)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = 0
        try:
            with open(log, "a", encoding="utf-8") as f:
                Server(path, CliHost(), idle_timeout=idle_timeout, max_memory=budget, log=f).serve()
        except BaseException:
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        answer = ask(path, {"op": "status"}, timeout=2.0)
        if answer is not None:
            typer.echo(f"hookviz: server {answer.get('pid')} listening on {path} (log: {log})", err=True)
            return
        time.sleep(0.1)
    fail(f"the server did not start; see {log}", EXIT_SETUP)
