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

from hookviz.errors import SetupError, UsageError, first_line

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
    summaries: int = 0

    def line(self) -> str:
        more = f", {self.summaries} summary file(s)" if self.summaries else ""
        return (
            f"logged to {self.tracker} run {self.run}: {self.images} image(s), "
            f"{self.artifacts} raw map(s), a table of {self.rows} row(s){more}"
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


#: Tracking servers found unreachable before the run (their log is skipped at the end, not waited for).
_UNREACHABLE: set[str] = set()
#: What W&B refuses in a project name.
_WANDB_FORBIDDEN = set("/\\#?%:")


def mlflow_uri(where: str | None) -> str | None:
    """The tracking URI ``--log mlflow[:URI]`` names, else ``MLFLOW_TRACKING_URI``'s (None: neither)."""
    return where or os.environ.get("MLFLOW_TRACKING_URI") or None


def check_log(spec: str) -> str | None:
    """``spec`` checked before any work; a warning to say when its tracking server does not answer now
    (the run goes on, its log is skipped at the end rather than waited for).

    Raises:
        UsageError: an unknown tracker, no MLflow URI, a W&B project name W&B refuses.
        SetupError: its package is missing or does not import (naming the extra).
    """
    name, where = parse_log(spec)
    _need(name)  # imported now: a broken install is found before the work, not after it
    if name == "wandb":
        if where is not None and _WANDB_FORBIDDEN & set(where):
            raise UsageError(f"--log wandb:{where}: a W&B project name may not hold any of / \\ # ? % :")
        return None
    uri = mlflow_uri(where)
    if uri is None:
        raise UsageError(
            "--log mlflow needs where to log: mlflow:./mlruns (a folder), mlflow:http://HOST:PORT (a "
            "tracking server), or MLFLOW_TRACKING_URI set"
        )
    if uri.startswith(("http://", "https://")) and not _answers(uri):
        _UNREACHABLE.add(uri)
        return f"--log mlflow: {uri} does not answer; the run goes on and nothing will be logged to it"
    return None


def _answers(uri: str, timeout: float = 5.0) -> bool:
    """Whether an MLflow tracking server answers at ``uri`` (its ``/health``) within ``timeout`` s."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as r:
            return bool(200 <= r.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code < 500  # it answered (a proxy's 401/404 still says a server is there)
    except (OSError, ValueError):
        return False


def _need(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except Exception as exc:  # absent, or installed but broken: either way it cannot log
        why = "" if isinstance(exc, ModuleNotFoundError) and exc.name == name else f" ({first_line(exc)})"
        raise SetupError(
            f"--log {name} needs the {name} package{why}: pip install '{TRACKERS[name]}'"
        ) from None


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
    spec: str,
    records: Sequence[Mapping[str, Any]],
    out: Path,
    *,
    command: str,
    name: str | None = None,
    summaries: Sequence[Path] = (),
) -> Logged:
    """Log a finished run's records and files to the tracker ``spec`` names.

    Raises:
        UsageError: an unknown tracker.  SetupError: its package is not installed.
        TrackerError: the tracker could not take the run (the files under ``out`` are untouched).
    """
    tracker, where = parse_log(spec)
    module = _need(tracker)
    pictures, raws = _files(records, out)
    extras = [p for p in summaries if p.is_file()]  # a command's summary (evaluation.KEY.json, ...)
    rows = table_rows(records)
    params = settings_params(records, command)
    title = name or f"hookviz {command}"
    try:
        if tracker == "mlflow":
            run = _mlflow(module, where, _Payload(title, params, pictures, raws, rows, out, extras))
        else:
            run = _wandb(module, where, _Payload(title, params, pictures, raws, rows, out, extras))
    except (SetupError, UsageError):
        raise
    except Exception as exc:  # the tracker's own failure, whatever its type: the files are complete
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrackerError(f"--log {tracker}: {first}") from exc
    return Logged(tracker, run, len(pictures), len(raws), len(rows), len(extras))


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from hookviz.io.sinks import COLUMNS

    known = [name for name, _ in COLUMNS]
    return known + sorted({k for r in rows for k in r} - set(known))


@dataclass(frozen=True)
class _Payload:
    """What a run gives its tracker: its title and settings, its files under ``out`` and its table."""

    title: str
    params: dict[str, str]
    pictures: list[Path]
    raws: list[Path]
    rows: list[dict[str, Any]]
    out: Path
    extras: list[Path]


def mlflow_client(where: str | None) -> tuple[Any, str | None]:
    """An MLflow client for ``--log mlflow[:URI]``'s store (``MLFLOW_TRACKING_URI``'s when none is named),
    and its URI: a folder as a ``file:`` URI, and let through MLflow 3's switch for file stores."""
    from mlflow.tracking import MlflowClient

    uri = mlflow_uri(where)
    if uri is not None and ("://" not in uri or uri.startswith("file:")):  # a folder the user named
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if "://" not in uri:
            uri = Path(uri).resolve().as_uri()
    return MlflowClient(tracking_uri=uri), uri


def experiment(client: Any) -> str:
    """The experiment's id (``MLFLOW_EXPERIMENT_NAME``, default ``hookviz``), made when it is not there."""
    wanted = os.environ.get("MLFLOW_EXPERIMENT_NAME", "hookviz")
    found = client.get_experiment_by_name(wanted)
    return str(found.experiment_id) if found is not None else str(client.create_experiment(wanted))


def _mlflow(mlflow: Any, uri: str | None, load: _Payload) -> str:
    from mlflow.entities import Param

    if mlflow_uri(uri) in _UNREACHABLE:
        raise TrackerError(f"{mlflow_uri(uri)} did not answer when the run started")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # a server gone mid-run: not minutes
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    client, _ = mlflow_client(uri)
    parent = os.environ.get("MLFLOW_RUN_ID")
    # Nested under the run a caller started (``mlflow run``, a notebook's active run).
    experiment_id = client.get_run(parent).info.experiment_id if parent else experiment(client)
    tags = {"hookviz.out": str(load.out.resolve())}
    if parent:
        tags["mlflow.parentRunId"] = parent
    run = client.create_run(experiment_id, run_name=load.title, tags=tags)
    run_id = run.info.run_id
    status = "FAILED"
    try:
        items = list(load.params.items())
        for start in range(0, len(items), 100):
            client.log_batch(run_id, params=[Param(k, v) for k, v in items[start : start + 100]])
        for path in load.pictures:
            client.log_artifact(run_id, str(path), artifact_path=_folder("overlays", path, load.out))
        for path in load.raws:
            client.log_artifact(run_id, str(path), artifact_path=_folder("maps", path, load.out))
        for path in load.extras:
            client.log_artifact(run_id, str(path), artifact_path="summaries")
        columns = _columns(load.rows)
        client.log_table(
            run_id, {c: [r.get(c) for r in load.rows] for c in columns}, artifact_file="records.json"
        )
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
    return run_id


def _folder(kind: str, path: Path, out: Path) -> str:
    parent = path.resolve().parent.relative_to(out.resolve()).as_posix()
    return kind if parent in ("", ".") else f"{kind}/{parent}"


def _wandb(wandb: Any, project: str | None, load: _Payload) -> str:
    group = os.environ.get("WANDB_RUN_GROUP")
    run = wandb.init(
        project=project or os.environ.get("WANDB_PROJECT") or "hookviz",
        name=load.title,
        group=group,
        config=load.params,
        dir=os.environ.get("WANDB_DIR") or str(load.out),
        reinit="create_new",
        # W&B's service starts with the run: on a loaded machine its default waits (30 s) run out.
        settings=wandb.Settings(quiet=True, silent=True, console="off", init_timeout=180, x_service_wait=180),
    )
    code = 1
    try:
        if load.pictures:
            run.log({"overlays": [wandb.Image(str(p), caption=p.name) for p in load.pictures]})
        if load.raws or load.extras:
            artifact = wandb.Artifact(f"maps-{run.id}", type="maps")
            for path in load.raws:
                artifact.add_file(str(path), name=path.resolve().relative_to(load.out.resolve()).as_posix())
            for path in load.extras:
                artifact.add_file(str(path), name=f"summaries/{path.name}")
            run.log_artifact(artifact)
        columns = _columns(load.rows)
        run.log(
            {"records": wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in load.rows])}
        )
        code = 0
    finally:
        run.finish(exit_code=code)
    return str(run.id)
