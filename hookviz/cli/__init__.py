"""The ``hookviz`` command line: the app and shared options (:mod:`.app`), the runner (:mod:`.runner`), and
one module per command family. Commands are registered here, in the order ``hookviz --help`` lists them."""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

from hookviz.cli import concepts, explain, explore, inspect, report, sae, serve, training, trust, visual, vlm
from hookviz.cli.app import (
    EXIT_BROKEN_PIPE,
    EXIT_INPUTS_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_SETUP,
    EXIT_USAGE,
    AutoMethodCommand,
    MethodCommand,
    app,
    flowing,
    main,
)


def _command(fn: Any, cls: type[TyperCommand] | None = None) -> None:
    """Register a command, its docstring as flowing help (one paragraph a line, rewrapped by the terminal)."""
    app.command(cls=cls, help=flowing(fn.__doc__))(fn)


_command(explain.gradcam, AutoMethodCommand)
_command(inspect.featuremaps)
_command(concepts.channels)
_command(concepts.tcav)
sae.register(app, flowing)
_command(visual.visualize)
_command(trust.evaluate, MethodCommand)
_command(trust.sanity, MethodCommand)
_command(trust.trust)
_command(inspect.layers)
_command(training.gradflow)
_command(training.dropblock)
_command(inspect.summary)
_command(report.report)
_command(inspect.models)
_command(serve.serve)
_command(explore.explore)
_command(vlm.vlm)

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_INPUTS_FAILED",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_SETUP",
    "EXIT_USAGE",
    "app",
    "main",
]
