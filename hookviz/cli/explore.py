"""``hookviz explore``: look around a model live, in the browser."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.cli.flags import Inputs
from hookviz.cli.loading import from_run, load_warm
from hookviz.cli.options import DATA, ModelOptions, PlainModel, RunOptions, grouped, omit

Port = Annotated[int, typer.Option("--port", min=0, max=65535, help="the port (0: a free one).")]
Host = Annotated[str, typer.Option("--host", help="the address to listen on; anything but 127.0.0.1 or "
    "localhost lets other machines reach it (with the token): 0.0.0.0 at any of this machine's addresses or "
    "its name.")]  # fmt: skip
AllowHost = Annotated[list[str] | None, typer.Option("--allow-host", help="another name a browser may "
    "reach it by (a DNS alias, NAME.local); the Host check refuses names it was not told, against DNS "
    "rebinding. Repeatable.")]  # fmt: skip
ChannelsRunOpt = Annotated[Path | None, typer.Option("--channels-run", help="the --out folder of a "
    "`hookviz channels` run over these photos (same model): the channel view shows each channel's best "
    "photos.")]  # fmt: skip
SaeRunOpt = Annotated[Path | None, typer.Option("--sae", help="the run folder of `hookviz sae train` of a "
    "layer of this model, described by `hookviz sae features`: the features panel shows its features and "
    "each one's code over the photo.")]  # fmt: skip
VlmPrompt = Annotated[str | None, typer.Option("--prompt", help="a vision-language model's question "
    "(--model hf:DIR): the target picker lists its answer's words.")]  # fmt: skip
TrustOpt = Annotated[Path | None, typer.Option("--trust", help="the --out folder of a hookviz trust run of "
    "this model and weights: the method list shows each method's verdict.")]  # fmt: skip
NoBrowser = Annotated[bool, typer.Option("--no-browser", help="print the address only; open no browser.")]
#: What explore takes of the run options: where the model runs, and how large a photo may be.
ExploreRun = Annotated[RunOptions, omit(
    "out", "overwrite", "skip_existing", "as_json", "batch_size", "workers", "max_memory", "report", "null",
    *DATA,
)]  # fmt: skip


@grouped
def explore(
    inputs: Inputs,
    model: PlainModel = ModelOptions(),
    port: Port = 0,
    host: Host = "127.0.0.1",
    allow_host: AllowHost = None,
    no_browser: NoBrowser = False,
    channels_run: ChannelsRunOpt = None,
    prompt: VlmPrompt = None,
    run: ExploreRun = RunOptions(),
    trust: TrustOpt = None,
    sae: SaeRunOpt = None,
) -> None:
    """Look around a model live in the browser: any photo, layer, method and class, each view the PNG
    `hookviz gradcam` writes for it. Serves on 127.0.0.1 with a token; Ctrl-C stops it."""
    from hookviz.explore import uploads
    from hookviz.explore.server import Explorer, check_address

    check_address(host, port)  # a port in use is said before the model loads
    _warn_host(host)
    session = _session(inputs, model, run, channels_run, prompt, trust, sae)
    uploads.sweep()  # the photos a killed explorer left
    try:
        server = Explorer(session, host, port, allow_hosts=allow_host or ())
    except BaseException:
        session.close()
        raise
    atexit.register(session.close)  # its dropped photos go on any way out
    with _stopped_by_signals():
        try:
            typer.echo(f"hookviz: explore at {server.url}", err=True)
            if not no_browser and sys.stderr.isatty():
                import webbrowser

                webbrowser.open(server.url)
            server.serve_forever()
        finally:
            server.server_close()
            session.close()
            atexit.unregister(session.close)


def _warn_host(host: str) -> None:
    """Listening beyond this machine is said, with the names other machines may use."""
    if host in ("0.0.0.0", "::", ""):
        typer.echo(f"hookviz: warning: --host {host}: other machines can reach the explorer (with its token) "
                   f"at this machine's addresses or its name ({socket.gethostname()}); another name needs "
                   "--allow-host NAME", err=True)  # fmt: skip
    elif host not in ("127.0.0.1", "localhost", "::1"):
        typer.echo(f"hookviz: warning: --host {host}: other machines can reach the explorer (with its token)",
                   err=True)  # fmt: skip


def _session(
    inputs: list[str],
    model: ModelOptions,
    run: RunOptions,
    channels_run: Any,
    prompt: Any,
    trust: Path | None = None,
    sae: Path | None = None,
) -> Any:
    """The explorer's session: a vision-language model's (``--prompt``) or a model's over its inputs."""
    from hookviz.explore.features import SaeRun
    from hookviz.explore.looks import ChannelsRun
    from hookviz.explore.session import Session
    from hookviz.run.verdicts import trust_run_of

    if prompt is not None:  # a vision-language model
        from hookviz.explore.words import VlmSession
        from hookviz.vlm.words import load_vlm

        return VlmSession(load_vlm(model.model, run.device), inputs, prompt, max_pixels=run.max_pixels,
                          model_words=["--model", model.model])  # fmt: skip
    best = ChannelsRun(channels_run) if channels_run is not None else None
    sae_run = SaeRun(sae) if sae is not None else None
    if (
        sae is not None
    ):  # the run's model options (its --input-size...), as sae features and explain take them
        model = from_run(model, sae)
    loaded = load_warm(dataclasses.replace(model, device=run.device), run.quiet)
    words = _model_words(model)
    verdicts = trust_run_of(loaded, trust) if trust is not None else None
    return Session(loaded, inputs, max_pixels=run.max_pixels, model_words=words, channels_run=best,
                   trust=verdicts, sae_run=sae_run)  # fmt: skip


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP (an IDE's stop button, systemd, a closed terminal) stop it as Ctrl-C does, through
    the ``finally`` that removes its dropped photos, exiting as a shell reports a process the signal ended."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    wanted = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    if threading.current_thread() is not threading.main_thread():  # only the main thread handles signals
        yield
        return
    before = {s: signal.signal(s, stop) for s in wanted}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _model_words(m: ModelOptions) -> list[str]:
    """The model options as a command line gives them ("copy as command" loads the same model with them)."""
    words = ["--model", m.model, "--weights", m.weights]
    if m.weights_key:
        words += ["--weights-key", m.weights_key]
    if m.labels:
        words += ["--labels", str(m.labels)]
    if m.input_size is not None:
        size = m.input_size if isinstance(m.input_size, int) else ",".join(map(str, m.input_size))
        words += ["--input-size", str(size)]
    if m.resize is not None:
        words += ["--resize", str(m.resize)]
    for flag, values in (("--mean", m.mean), ("--std", m.std)):
        if values is not None and not isinstance(values[0], tuple):  # a photo model's numbers per channel
            words += [flag, ",".join(f"{v:g}" for v in values)]
    return words
