"""Experiment trackers: a run's maps where people look (``--log mlflow[:URI]``, ``--log wandb[:PROJECT]``).

One tracker run per command (nested under the run named by ``MLFLOW_RUN_ID``, or W&B's group): the overlays
as images, the raw maps (``.npy``, when written) as artifacts, a row per input, method, layer and target as a
table (``records``), the run's settings as parameters. What is logged is read from what the run wrote: the
files under ``--out`` are the truth and stay, whatever happens to the tracker. Neither package is imported
unless asked; a missing one is a :class:`hookviz.errors.SetupError` naming the extra.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookviz.errors import SetupError, UsageError

__all__ = [
    "TRACKERS", "Logged", "TrackerError", "check_log", "log_run", "parse_log", "settings_params",
    "table_rows",
]  # fmt: skip

#: The trackers ``--log`` takes, and the extra that installs each.
TRACKERS = {"mlflow": "hookviz[mlflow]", "wandb": "hookviz[wandb]"}


class TrackerError(Exception):
    """The tracker could not take the run (unreachable, refused): the files under ``--out`` are complete."""


@dataclass(frozen=True)
class Logged:
    """What a tracker took: its run, and how many images, artifacts and table rows."""

    tracker: str
    run: str
    images: int
    artifacts: int
    rows: int

    def line(self) -> str:
        return (
            f"logged to {self.tracker} run {self.run}: {self.images} image(s), "
            f"{self.artifacts} raw map(s), a table of {self.rows} row(s)"
        )


def parse_log(spec: str) -> tuple[str, str | None]:
    """``mlflow``, ``mlflow:URI``, ``wandb`` or ``wandb:PROJECT`` → (tracker, where)."""
    name, _, where = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in TRACKERS:
        raise UsageError(
            f"--log {spec!r}: use mlflow[:TRACKING_URI] or wandb[:PROJECT] (trackers: {', '.join(TRACKERS)})"
        )
    return name, (where.strip() or None)


def check_log(spec: str) -> str:
    """``spec`` checked before any work: a known tracker whose package is installed (its name returned).

    Raises:
        UsageError: an unknown tracker.  SetupError: its package is missing (naming the extra)."""
    import importlib.util

    name, _ = parse_log(spec)
    if importlib.util.find_spec(name) is None:
        raise SetupError(f"--log {name} needs the {name} package: pip install '{TRACKERS[name]}'")
    return name


def _need(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise SetupError(f"--log {name} needs the {name} package: pip install '{TRACKERS[name]}'") from None


def settings_params(records: Sequence[Mapping[str, Any]], command: str) -> dict[str, str]:
    """The run's settings, flattened to ``a.b`` keys, as tracker parameters (the first record's: one job)."""
    out: dict[str, str] = {"command": command}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)

    for rec in records:
        if isinstance(rec.get("settings"), Mapping):
            walk("", rec["settings"])
            for field in ("model", "weights"):
                if field in rec:
                    out[field] = str(rec[field])
            break
    return {k: v[:500] for k, v in out.items()}


def _numbers(prefix: str, value: Any, into: dict[str, float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        into[prefix] = float(value)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _numbers(f"{prefix}.{k}" if prefix else str(k), v, into)


def table_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``records`` table: ``--records``' Parquet rows (one per input, target, method and layer), with
    a record's numeric metrics (``evaluate``'s) as further columns."""
    from hookviz.io.sinks import record_rows

    rows: list[dict[str, Any]] = []
    for rec in records:
        metrics: dict[str, float] = {}
        _numbers("", rec.get("metrics"), metrics)
        rows += [{**row, **metrics} for row in record_rows(dict(rec))]
    return rows


def _files(records: Iterable[Mapping[str, Any]], out: Path) -> tuple[list[Path], list[Path]]:
    """The pictures and the raw maps the records name that exist under ``out`` (never outside it)."""
    pictures: list[Path] = []
    raws: list[Path] = []
    root = out.resolve()
    for rec in records:
        for name in rec.get("outputs") or []:
            path = Path(str(name)).resolve()  # as written: relative to the working directory, or absolute
            if root not in path.parents:
                path = (out / str(name)).resolve()
            if root not in path.parents or not path.is_file():
                continue
            if path.suffix.lower() == ".png" and path not in pictures:
                pictures.append(path)
            elif path.suffix.lower() == ".npy" and path not in raws:
                raws.append(path)
    return pictures, raws


def log_run(
    spec: str, records: Sequence[Mapping[str, Any]], out: Path, *, command: str, name: str | None = None
) -> Logged:
    """Log a finished run's records and files to the tracker ``spec`` names.

    Raises:
        UsageError: an unknown tracker.  SetupError: its package is not installed.
        TrackerError: the tracker could not take the run (the files under ``out`` are untouched).
    """
    tracker, where = parse_log(spec)
    module = _need(tracker)
    pictures, raws = _files(records, out)
    rows = table_rows(records)
    params = settings_params(records, command)
    title = name or f"hookviz {command}"
    try:
        if tracker == "mlflow":
            run = _mlflow(module, where, title, params, pictures, raws, rows, out)
        else:
            run = _wandb(module, where, title, params, pictures, raws, rows, out)
    except (SetupError, UsageError):
        raise
    except Exception as exc:  # the tracker's own failure, whatever its type: the files are complete
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrackerError(f"--log {tracker}: {first}") from exc
    return Logged(tracker, run, len(pictures), len(raws), len(rows))


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from hookviz.io.sinks import COLUMNS

    known = [name for name, _ in COLUMNS]
    return known + sorted({k for r in rows for k in r} - set(known))


def _mlflow(
    mlflow: Any,
    uri: str | None,
    title: str,
    params: dict[str, str],
    pictures: list[Path],
    raws: list[Path],
    rows: list[dict[str, Any]],
    out: Path,
) -> str:
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    # A folder the user named: MLflow 3 keeps file stores behind this switch.
    if uri is not None and ("://" not in uri or uri.startswith("file:")):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if "://" not in uri:
            uri = Path(uri).resolve().as_uri()
    client = MlflowClient(tracking_uri=uri)
    parent = os.environ.get("MLFLOW_RUN_ID")
    if parent:  # nested under the run a caller started (``mlflow run``, a notebook's active run)
        experiment = client.get_run(parent).info.experiment_id
    else:
        wanted = os.environ.get("MLFLOW_EXPERIMENT_NAME", "hookviz")
        found = client.get_experiment_by_name(wanted)
        experiment = found.experiment_id if found is not None else client.create_experiment(wanted)
    tags = {"hookviz.out": str(out.resolve())}
    if parent:
        tags["mlflow.parentRunId"] = parent
    run = client.create_run(experiment, run_name=title, tags=tags)
    run_id = run.info.run_id
    status = "FAILED"
    try:
        items = list(params.items())
        for start in range(0, len(items), 100):
            client.log_batch(run_id, params=[Param(k, v) for k, v in items[start : start + 100]])
        for path in pictures:
            client.log_artifact(run_id, str(path), artifact_path=_folder("overlays", path, out))
        for path in raws:
            client.log_artifact(run_id, str(path), artifact_path=_folder("maps", path, out))
        columns = _columns(rows)
        client.log_table(run_id, {c: [r.get(c) for r in rows] for c in columns}, artifact_file="records.json")
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
    return run_id


def _folder(kind: str, path: Path, out: Path) -> str:
    parent = path.resolve().parent.relative_to(out.resolve()).as_posix()
    return kind if parent in ("", ".") else f"{kind}/{parent}"


def _wandb(
    wandb: Any,
    project: str | None,
    title: str,
    params: dict[str, str],
    pictures: list[Path],
    raws: list[Path],
    rows: list[dict[str, Any]],
    out: Path,
) -> str:
    group = os.environ.get("WANDB_RUN_GROUP")
    run = wandb.init(
        project=project or os.environ.get("WANDB_PROJECT") or "hookviz",
        name=title,
        group=group,
        config=params,
        dir=os.environ.get("WANDB_DIR") or str(out),
        reinit="create_new",
        settings=wandb.Settings(quiet=True, console="off"),
    )
    code = 1
    try:
        if pictures:
            run.log({"overlays": [wandb.Image(str(p), caption=p.name) for p in pictures]})
        if raws:
            artifact = wandb.Artifact(f"maps-{run.id}", type="maps")
            for path in raws:
                artifact.add_file(str(path), name=path.resolve().relative_to(out.resolve()).as_posix())
            run.log_artifact(artifact)
        columns = _columns(rows)
        run.log({"records": wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])})
        code = 0
    finally:
        run.finish(exit_code=code)
    return str(run.id)
