"""The ``hookviz`` command line: the app and shared options (:mod:`.app`), the runner (:mod:`.runner`), and
one module per command family. Commands are registered here, in the order ``hookviz --help`` lists them."""

from __future__ import annotations

from hookviz.cli import concepts, explain, explore, inspect, report, serve, training, trust, visual, vlm
from hookviz.cli.app import (
    EXIT_BROKEN_PIPE,
    EXIT_INPUTS_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_SETUP,
    EXIT_USAGE,
    MethodCommand,
    app,
    main,
)

app.command(cls=MethodCommand)(explain.gradcam)
app.command()(inspect.featuremaps)
app.command()(concepts.channels)
app.command()(concepts.tcav)
app.command()(visual.visualize)
app.command(cls=MethodCommand)(trust.evaluate)
app.command(cls=MethodCommand)(trust.sanity)
app.command()(inspect.layers)
app.command()(training.gradflow)
app.command()(training.dropblock)
app.command()(inspect.summary)
app.command()(report.report)
app.command()(inspect.models)
app.command()(serve.serve)
app.command()(explore.explore)
app.command()(vlm.vlm)

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
