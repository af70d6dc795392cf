"""A command's start: importing torch and building the model make a few hundred thousand objects, nearly all
of them alive to the end, yet Python's collector passes over them again and again (0.6-0.9 s of a
``hookviz channels`` start on this project's machine, six full collections among them). The console entry
point holds the collector back until the model is loaded (:func:`hookviz.cli.loading.load_options`, or the
server's start); then what exists is frozen out of its passes (:func:`gc.freeze`) and it runs as usual."""

from __future__ import annotations

import gc

_held = False


def hold_collector() -> None:
    """From the entry point: no collection until :func:`release_collector` (nothing changes if the collector
    was off already)."""
    global _held
    if gc.isenabled() and not _held:
        gc.disable()
        _held = True


def release_collector() -> None:
    """Once the start is over: the objects made so far frozen (kept out of later passes), the collector on
    again. A no-op unless held."""
    global _held
    if _held:
        gc.freeze()
        gc.enable()
        _held = False
