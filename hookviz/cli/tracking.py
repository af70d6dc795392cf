"""``--log``: what a run added to ``--out`` (its records, pictures, raw maps and summary files) logged to an
experiment tracker once the run is done (:mod:`hookviz.io.trackers`); a tracker that fails is one warning."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from hookviz.cli.options import RunOptions
from hookviz.io import trackers
from hookviz.io.outputs import MANIFEST

#: Each --log's outcome, a line per run (the tracker's run id, or the error).
TRACKER_LOG = "tracker.jsonl"


def warn(text: str) -> None:
    typer.echo(f"hookviz: warning: {text}", err=True)


def log_run(
    r: RunOptions, start: int, command: str | None, quiet: bool, summaries: Sequence[Path] = ()
) -> None:
    """``--log``: the records this run added to the manifest (from byte ``start``) and their files, to the
    tracker. A tracker that fails is one warning: the files under ``--out`` are complete either way."""
    if r.log is None:
        return
    manifest = r.out / MANIFEST
    lines = (
        manifest.read_bytes()[start:].decode("utf-8", "replace").splitlines() if manifest.is_file() else []
    )
    records = [json.loads(line) for line in lines if line.strip()]
    entry: dict[str, Any] = {"log": r.log, "command": command, "records": len(records)}
    try:
        logged = trackers.log_run(r.log, records, r.out, command=command or "run", summaries=summaries)
    except trackers.TrackerError as exc:
        warn(f"{exc}; nothing was logged, the maps and the manifest are in {r.out}")
        _record(r.out, {**entry, "status": "failed", "error": str(exc)})
        return
    _record(r.out, {**entry, "status": "ok", "run": logged.run, "tracker": logged.tracker})
    if not quiet:
        typer.echo(f"hookviz: {logged.line()}", err=True)


def _record(out: Path, entry: dict[str, Any]) -> None:
    """A line in ``OUT/tracker.jsonl`` per ``--log``: what went where, or why nothing did."""
    import time

    with contextlib.suppress(OSError), (out / TRACKER_LOG).open("a", encoding="utf-8") as f:
        f.write(json.dumps({**entry, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")


def out_state(out: Path) -> tuple[int, dict[str, int]]:
    """The manifest's size and the times of the files at the top of ``out`` (what a run adds is after)."""
    manifest = out / MANIFEST
    files = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()} if out.is_dir() else {}
    return (manifest.stat().st_size if manifest.is_file() else 0), files


def changed(out: Path, before: dict[str, int]) -> list[Path]:
    """The summary files at the top of ``out`` written since ``before`` (not the manifest, not a picture)."""
    _, now = out_state(out)
    skip = {".png", ".npy", ".jsonl", ".html", ".part"}
    return [out / n for n, t in sorted(now.items()) if before.get(n) != t and Path(n).suffix not in skip]
