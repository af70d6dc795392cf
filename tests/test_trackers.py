"""`--log mlflow[:URI]` and `--log wandb`: a run read back through the tracker's own client (MLflow) or from
its offline files (W&B), equal to what the run wrote under --out."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import invoke, records


def _run(photos: Path, out: Path, *extra: str) -> object:
    return invoke(
        "gradcam", str(photos), "--model", "resnet18", "--weights", "none", "--input-size", "48",
        "--out", str(out), "--save-raw", "-q", *extra,
    )  # fmt: skip


def _rows(out: Path) -> dict[tuple[str, str], float]:
    """(input, method) -> target score, from the manifest."""
    return {(r["input"], m["method"]): m["target"]["score"] for r in records(out) for m in r["maps"]}


def test_mlflow_run_reads_back_equal_to_the_files(photos: Path, tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store, out = tmp_path / "mlruns", tmp_path / "out"
    result = _run(photos, out, "--method", "gradcam,layercam", "--log", f"mlflow:{store}")
    assert result.exit_code == 0, result.stderr
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name("hookviz")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "hookviz gradcam"
    (said,) = [json.loads(line) for line in (out / "tracker.jsonl").read_text().splitlines()]
    assert said["status"] == "ok" and said["run"] == run.info.run_id and said["records"] == 4
    first = records(out)[0]
    assert run.data.params["model"] == "resnet18"
    assert run.data.params["methods"] == "gradcam,layercam"
    assert run.data.params["input.crop_size"] == str(first["settings"]["input"]["crop_size"])
    fetched = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "back")))
    # Every overlay and raw map written is there, byte for byte (the same files).
    written = sorted(p.name for p in out.glob("*.png"))
    assert len(written) >= 8 and sorted(p.name for p in (fetched / "overlays").glob("*.png")) == written
    for raw in out.glob("*.npy"):
        np.testing.assert_allclose(np.load(fetched / "maps" / raw.name), np.load(raw))
    table = json.loads((fetched / "records.json").read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    got = {(r["input"], r["method"]): r["target_score"] for r in rows}
    want = _rows(out)
    assert got.keys() == want.keys() and len(rows) == 8
    for key, score in want.items():
        assert got[key] == pytest.approx(score, rel=1e-6)


def test_mlflow_nested_under_the_callers_run(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    parent = client.create_run(client.create_experiment("mine")).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", parent)
    result = _run(photos, tmp_path / "out", "--tracker", f"mlflow:{store}")  # --log's other spelling
    assert result.exit_code == 0, result.stderr
    experiment = client.get_experiment_by_name("mine").experiment_id
    children = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert len(children) == 1 and children[0].info.status == "FINISHED"


def test_wandb_offline_run_reads_back_equal_to_the_files(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wb").mkdir()
    out = tmp_path / "out"
    result = _run(photos, out, "--log", "wandb:hookviz-test")
    assert result.exit_code == 0, result.stderr
    said = json.loads((out / "tracker.jsonl").read_text().splitlines()[-1])
    assert said["status"] == "ok", said  # else: W&B's own reason, kept in the record
    (run,) = (tmp_path / "wb" / "wandb").glob("offline-run-*")
    files = run / "files"
    # Offline, the settings live in the run's record log (protobuf strings, stored as they are).
    (log,) = run.glob("run-*.wandb")
    data, end = log.read_bytes(), time.monotonic() + 30
    while b"resnet18" not in data and time.monotonic() < end:  # W&B's writer may flush after finish() returns
        time.sleep(0.2)  # (make test once read its 8-byte header alone)
        data = log.read_bytes()
    assert b"input.crop_size" in data and b"resnet18" in data and b"hookviz gradcam" in data
    images = sorted((files / "media" / "images").glob("*.png"))
    assert len(images) == 4
    written = {p.read_bytes() for p in out.glob("*.png")}
    assert {p.read_bytes() for p in images} == written
    (table_file,) = (files / "media" / "table").glob("records_*.table.json")
    table = json.loads(table_file.read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    got = {(r["input"], r["method"]): r["target_score"] for r in rows}
    want = _rows(out)
    assert got.keys() == want.keys()
    for key, score in want.items():
        assert got[key] == pytest.approx(score, rel=1e-6)


def test_an_unreachable_tracker_loses_nothing(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    result = _run(photos, out, "--log", f"mlflow:http://127.0.0.1:{port}")
    assert result.exit_code == 0
    assert "warning: --log mlflow:" in result.stderr and "nothing was logged" in result.stderr
    assert len(records(out)) == 4 and len(list(out.glob("*.png"))) == 4
    (said,) = [json.loads(line) for line in (out / "tracker.jsonl").read_text().splitlines()]
    assert said["status"] == "failed" and said["records"] == 4 and str(port) in said["error"]


def test_a_bad_or_missing_tracker_is_one_line_before_any_work(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    result = _run(photos, out, "--log", "comet")
    assert result.exit_code == 2 and "use mlflow[:TRACKING_URI] or wandb[:PROJECT]" in result.stderr
    import sys

    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    result = _run(photos, out, "--log", "mlflow:./mlruns")
    assert result.exit_code == 3
    assert "pip install 'hookviz[mlflow]'" in result.stderr
    assert not (out / "manifest.jsonl").exists()


def test_a_spec_that_cannot_log_is_refused_before_any_work(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "out"
    for spec, words in (("mlflow", "needs where to log"), ("mlflow:", "needs where to log"),
                        ("wandb:a/b", "may not hold")):  # fmt: skip
        result = _run(photos, out, "--log", spec)
        assert result.exit_code == 2 and words in result.stderr, (spec, result.stderr)
        assert not (out / "manifest.jsonl").exists()


def test_a_closed_tracking_server_is_said_at_the_start_and_not_waited_for(
    photos: Path, tmp_path: Path
) -> None:
    import time

    pytest.importorskip("mlflow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    began = time.monotonic()
    result = _run(photos, out, "--log", f"mlflow:http://127.0.0.1:{port}")
    took = time.monotonic() - began
    assert result.exit_code == 0 and "does not answer; the run goes on" in result.stderr
    lines = result.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "does not answer" in line)
    assert start < next(i for i, line in enumerate(lines) if "nothing was logged" in line)
    assert len(records(out)) == 4
    assert took < 120  # MLflow's own retries took minutes (256 s seen)


def test_evaluate_logs_its_summary_files(photos: Path, tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store, out = tmp_path / "mlruns", tmp_path / "out"
    result = invoke(
        "evaluate", str(photos), "--model", "resnet18", "--weights", "none", "--input-size", "48",
        "--out", str(out), "-q", "--steps", "4", "--log", f"mlflow:{store}",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("hookviz").experiment_id])
    logged = sorted(a.path for a in client.list_artifacts(run.info.run_id, "summaries"))
    written = sorted(f"summaries/{p.name}" for p in out.glob("evaluation*.*"))
    assert written and logged == written


def test_under_torchrun_the_option_is_spelled_tracker() -> None:
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(
        ["--standalone", "-m", "hookviz", "gradcam", "p.png", "--tracker", "mlflow:./mlruns"]
    )
    assert args.training_script_args[-2:] == ["--tracker", "mlflow:./mlruns"]
    from hookviz.cli.options import RunOptions

    assert "log" in {f.name for f in __import__("dataclasses").fields(RunOptions)}
