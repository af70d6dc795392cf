"""The run: :class:`Run` (a job over inputs, for the command line and Python alike, in
:mod:`hookviz.run.runner`), the batched pipeline, torchrun, the input kinds. ``Run`` loads on first use, so
that ``hookviz.run.distributed`` stays light for ``--help``."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hookviz.run.runner import Run

__all__ = ["Run"]


def __getattr__(name: str) -> Any:
    if name == "Run":
        return importlib.import_module("hookviz.run.runner").Run
    raise AttributeError(f"module 'hookviz.run' has no attribute {name!r}")
