"""Where a batch run's time goes: per-stage totals, on when ``HOOKVIZ_TIMINGS`` names a file.

``HOOKVIZ_TIMINGS=stages.json hookviz gradcam photos/`` writes ``{"decode": s, "preprocess": s, "compute": s,
"render": s, "encode": s, "write": s, "images": n}`` at the end of the run (seconds summed over threads;
``render`` excludes ``encode``). Off, each stage costs one dictionary lookup.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_TOTALS: dict[str, float] = {}
_LOCK = threading.Lock()
ENABLED = bool(os.environ.get("HOOKVIZ_TIMINGS"))


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Add the time spent inside to stage ``name`` (when enabled)."""
    if not ENABLED:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - start)


def add(name: str, seconds: float) -> None:
    with _LOCK:
        _TOTALS[name] = _TOTALS.get(name, 0.0) + seconds


def dump(images: int) -> None:
    """Write the totals to the file ``HOOKVIZ_TIMINGS`` names (when enabled)."""
    target = os.environ.get("HOOKVIZ_TIMINGS")
    if not target:
        return
    with _LOCK:
        totals = dict(_TOTALS)
    if "encode" in totals and "render" in totals:
        totals["render"] -= totals["encode"]
    Path(target).write_text(json.dumps({**{k: round(v, 4) for k, v in totals.items()}, "images": images}))
