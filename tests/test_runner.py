"""The run in the library (:class:`hookviz.run.Run`): from Python it writes what the command line writes
(the manifest, the ``--records`` table, the ``--maps`` store), skips and redoes as the options say, tells its
work as typed events, and takes a sink registered from outside the package (``register_sink``)."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

import hookviz
from hookviz import Run, load_model, register_sink
from hookviz.io.shapes import draw_shape
from hookviz.io.sinks import record_rows, unregister_sink
from hookviz.jobs.build import CamSettings
from hookviz.run import events
from tests.conftest import ROOT, Trained, invoke, records, run_cli, write_image

N = 5
LOOK = {"input_size": 48, "resize": "squash", "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
CLI_LOOK = [
    "--input-size",
    "48",
    "--resize",
    "squash",
    "--mean",
    "0,0,0",
    "--std",
    "1,1,1",
    "--device",
    "cpu",
]
METHODS = ["--method", "gradcam,layercam", "--layer", "features.6", "--target", "top2"]
SETTINGS = CamSettings(methods=("gradcam", "layercam"), layers=("features.6",), target="top2")


@pytest.fixture(scope="module")
def shapes(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """N shape photos and one file that is not a photo; the trained CNN's weights."""
    folder = tmp_path_factory.mktemp("runner")
    photos = folder / "photos"
    photos.mkdir()
    rng = np.random.default_rng(11)
    for i in range(N):
        img, _ = draw_shape(i % 3, 48, rng)
        write_image(photos / f"s{i}.png", (img * 255).round().astype(np.uint8))
    weights = folder / "shapes.pth"
    torch.save(trained.model.eval().state_dict(), weights)
    return {"photos": photos, "weights": weights}


def _cli(shapes: dict[str, Path], *extra: str) -> list[str]:
    model = ["--model", "tests.conftest:TinyCNN", "--weights", str(shapes["weights"]), *CLI_LOOK]
    return ["gradcam", str(shapes["photos"]), *model, *METHODS, *extra]


def _loaded(shapes: dict[str, Path]) -> Any:
    return load_model("tests.conftest:TinyCNN", str(shapes["weights"]), device="cpu", **LOOK)


def _same(got: Any, want: Any, out_got: str, out_want: str, path: str = "") -> None:
    """``got`` equals ``want`` as parsed values: floats within 1e-5, strings with one output folder for the
    other, the time left out."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), path
        for k in want:
            if k != "time":
                _same(got[k], want[k], out_got, out_want, f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, out_got, out_want, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), path
    elif isinstance(want, str):
        assert got.replace(out_got, out_want) == want, path
    else:
        assert got == want, path


def test_a_python_run_writes_the_manifest_table_and_store_the_cli_writes(
    shapes: dict[str, Path], tmp_path: Path
) -> None:
    """``Run(..., records="parquet", maps="zarr")`` and ``hookviz gradcam ... --records parquet --maps zarr``
    with the same settings: the same records, the same rows, the same raw maps (values compared parsed); a
    second Python run with ``skip_existing`` computes nothing, one with ``overwrite`` redoes every input."""
    import pyarrow.parquet as pq
    import zarr

    cli, py = tmp_path / "cli", tmp_path / "py"
    r = invoke(*_cli(shapes, "--records", "parquet", "--maps", "zarr", "--out", str(cli), "-q"))
    assert r.exit_code == 0, r.stderr
    found = list(Run(_loaded(shapes), shapes["photos"], SETTINGS, out=py, records="parquet", maps="zarr"))
    assert isinstance(found[-1], events.Finished) and found[-1].code == 0 and found[-1].ok == N
    want, got = records(cli), records(py)
    assert len(want) == N and [g["status"] for g in got] == ["ok"] * N
    _same(got, want, str(py), str(cli))
    key = lambda row: (row["input"], row["method"], row["target_index"])  # noqa: E731
    rows_want = sorted(pq.read_table(cli / "records.parquet").to_pylist(), key=key)
    rows_got = sorted(pq.read_table(py / "records.parquet").to_pylist(), key=key)
    assert len(rows_want) == N * 2 * 2  # input x method x the two targets
    _same(rows_got, rows_want, str(py), str(cli))
    store_want, store_got = (
        zarr.open_group(str(cli / "maps.zarr"), mode="r"),
        zarr.open_group(str(py / "maps.zarr")),
    )
    raws = [row["raw"].split("/maps.zarr/")[1] for row in rows_want]
    assert len(set(raws)) == N * 2 * 2
    for name in raws:
        a, b = np.asarray(store_got[name]), np.asarray(store_want[name])
        assert a.shape == b.shape and a.std() > 0
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=2e-3)
    again = Run(_loaded(shapes), shapes["photos"], SETTINGS, out=py, records="parquet", maps="zarr",
                skip_existing=True).records()  # fmt: skip
    assert [rec["status"] for rec in again] == ["skipped"] * N
    assert pq.read_table(py / "records.parquet").num_rows == N * 4  # the table holds them: no row added
    redone = Run(_loaded(shapes), shapes["photos"], SETTINGS, out=py, overwrite=True).records()
    assert [rec["status"] for rec in redone] == ["ok"] * N
    _same([rec["maps"] for rec in redone], [rec["maps"] for rec in want], str(py), str(cli))


def test_the_events_come_in_order_and_end_with_the_exit_code(shapes: dict[str, Path], tmp_path: Path) -> None:
    """The job built, notes (the random weights of a model loaded with none), one Started for the inputs, a
    Record per input (a file that is not a photo an error), Written with where this run's records start in the
    manifest, the failed inputs said, then Finished with the command line's exit code (1: an input failed)."""
    photos = tmp_path / "in"
    photos.mkdir()
    for p in sorted(shapes["photos"].iterdir())[:2]:
        (photos / p.name).write_bytes(p.read_bytes())
    (photos / "broken.png").write_text("not a picture")
    loaded = load_model("tests.conftest:TinyCNN", "none", device="cpu", **LOOK)
    found = list(Run(loaded, [str(photos)], SETTINGS, out=tmp_path / "out"))
    kinds = [type(e).__name__ for e in found]
    first = kinds.index("Started")
    assert kinds[first:] == ["Started", "Record", "Record", "Record", "Written", "Note", "Finished"], kinds
    assert sorted(set(kinds[:first])) == ["Built", "Note"] and kinds[:first].index("Built") == 0
    assert isinstance(found[0], events.Built) and list(found[0].job.layers) == ["features.6"]
    setup = [e.text for e in found[:first] if isinstance(e, events.Note) and e.kind == "setup"]
    assert any("RANDOM weights" in text for text in setup)
    started, written, said, finished = found[first], found[-3], found[-2], found[-1]
    assert isinstance(started, events.Started) and started.total == 3 and started.done is None
    recs = [e.record for e in found if isinstance(e, events.Record)]
    assert sorted(r["status"] for r in recs) == ["error", "ok", "ok"]
    ok = next(e for e in found if isinstance(e, events.Record) and e.record["status"] == "ok")
    assert ok.line().startswith(f"{ok.record['input']}: predicted ") and "wrote " in ok.line()
    assert isinstance(written, events.Written) and written.start == 0 and written.command == "gradcam"
    assert isinstance(said, events.Note) and said.kind == "failed" and said.text.startswith("1 of 3 input(s)")
    assert isinstance(finished, events.Finished) and (finished.ok, finished.failed, finished.code) == (
        2,
        1,
        1,
    )
    assert [
        json.loads(line)["input"] for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()
    ] == [r["input"] for r in recs]


class SqliteRecords:
    """A ``--records sqlite`` sink from outside the package: a row per map, as the Parquet table's, in one
    SQLite file (a file per rank under torchrun)."""

    COLUMNS = ("input", "status", "method", "layer", "target_index", "map_min", "map_max", "file")

    def __init__(self, where: str, rank: int) -> None:
        path = Path(where) if rank == 0 else Path(f"{where}.rank{rank}")
        self.db = sqlite3.connect(path)
        self.db.execute(f"CREATE TABLE IF NOT EXISTS maps ({', '.join(self.COLUMNS)})")

    def add(self, record: dict[str, Any]) -> None:
        rows = [tuple(row.get(c) for c in self.COLUMNS) for row in record_rows(record)]
        self.db.executemany(f"INSERT INTO maps VALUES ({', '.join('?' * len(self.COLUMNS))})", rows)

    def close(self) -> None:
        self.db.commit()
        self.db.close()


@pytest.fixture
def sqlite_sink() -> Iterator[None]:
    register_sink("sqlite", SqliteRecords)
    try:
        yield
    finally:
        unregister_sink("sqlite")


def test_a_sink_registered_from_outside_takes_the_records(
    shapes: dict[str, Path], tmp_path: Path, sqlite_sink: None
) -> None:
    """``--records sqlite`` (this file's sink, registered): OUT/records.sqlite holds a row per input, method
    and target, each equal to its record's map; another value names every registered sink."""
    out = tmp_path / "out"
    r = invoke(*_cli(shapes, "--records", "sqlite", "--out", str(out), "-q"))
    assert r.exit_code == 0, r.stderr
    with sqlite3.connect(out / "records.sqlite") as db:
        rows = db.execute("SELECT input, method, target_index, map_min, map_max, file FROM maps").fetchall()
    want = [(rec["input"], m["method"], m["target"]["index"], m["min"], m["max"], m["file"])
            for rec in records(out) for m in rec["maps"]]  # fmt: skip
    assert len(rows) == N * 2 * 2 and sorted(rows) == sorted(want)
    assert all(hi > lo for *_, lo, hi, _ in rows)
    r = invoke(*_cli(shapes, "--records", "table.csv", "--out", str(out), "-q"))
    assert r.exit_code == 2
    assert (
        "--records table.csv: give parquet or sqlite, or a folder or URL ending in .parquet or .sqlite"
        in r.stderr
    )


SCRIPT = """
import sys
from hookviz import explain_inputs, load_model
from hookviz.jobs.build import CamSettings

photos, out, weights = sys.argv[1:]
look = {"input_size": 48, "resize": "squash", "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
loaded = load_model("tests.conftest:TinyCNN", weights, device="cpu", **look)
settings = CamSettings(methods=("gradcam",), layers=("features.6",))
print(len(explain_inputs(loaded, photos, out, settings, records="parquet")))
"""


@pytest.mark.slow  # torchrun starts two ranks (about 20 s)
def test_a_python_run_under_torchrun_merges_one_manifest(shapes: dict[str, Path], tmp_path: Path) -> None:
    """A script calling ``explain_inputs`` under ``torchrun --nproc-per-node 2``: each rank explains its
    shard, rank 0 merges the parts into one manifest with every input once, no part left."""
    script = tmp_path / "explain.py"
    script.write_text(SCRIPT)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = [str(script), str(shapes["photos"]), str(tmp_path / "out"), str(shapes["weights"])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    res = run_cli([*torchrun, *args], cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr
    assert sorted(int(n) for n in res.stdout.split()) == [N // 2, N - N // 2]  # each rank its shard
    recs = records(tmp_path / "out")
    assert sorted(Path(r["input"]).name for r in recs) == sorted(p.name for p in shapes["photos"].iterdir())
    assert {r["status"] for r in recs} == {"ok"}
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out" / "records.parquet")  # a part per rank, read as one table
    assert sorted(table.column("input").to_pylist()) == sorted(r["input"] for r in recs)
    assert not list((tmp_path / "out").glob(".manifest.*")) and not list(
        (tmp_path / "out").glob(".hookviz-*")
    )


def test_a_records_line_is_the_one_line_the_command_prints() -> None:
    """An error record's line is the command line's error line, its message included; a name holding a
    newline stays on one line in an ok line too, escaped as error lines quote it."""
    err = events.Record({"input": "bad/corrupt.jpg", "status": "error", "outputs": [],
                         "error": "'bad/corrupt.jpg': cannot decode image (truncated)"})  # fmt: skip
    assert err.line() == "hookviz: 'bad/corrupt.jpg': cannot decode image (truncated)"
    ok = events.Record({"input": "two\nlines.png", "status": "ok", "outputs": ["out/two\nlines.gradcam.png"],
                        "predicted": {"index": 1, "name": "disc", "score": 0.75}})  # fmt: skip
    assert ok.line() == "'two\\nlines.png': predicted disc (1) p=0.750; wrote 'out/two\\nlines.gradcam.png'"
    assert len(ok.line().splitlines()) == 1
    plain = events.Record({**ok.record, "input": "one.png", "outputs": ["out/one.png"]})
    assert plain.line() == "one.png: predicted disc (1) p=0.750; wrote out/one.png"


class FailingRecords:
    """A records sink that keeps what it is given and raises on its ``FAIL_ON``-th add, or on close."""

    FAIL_ON: int | None = 2
    FAIL_CLOSE = False
    kept: ClassVar[list[str]] = []

    def __init__(self, where: str, rank: int) -> None:
        type(self).kept = []

    def add(self, record: dict[str, Any]) -> None:
        if len(self.kept) + 1 == self.FAIL_ON:
            raise RuntimeError("table locked\nsecond line")
        self.kept.append(record["input"])

    def close(self) -> None:
        if self.FAIL_CLOSE:
            raise RuntimeError("cannot flush")


def test_a_sink_that_raises_stops_the_run_in_one_line_and_the_manifest_matches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """add() raising: one line naming the sink, and the manifest holds exactly the records the sink took (the
    failed one in neither); a rerun with the sink mended completes the set. close() raising: one line naming
    the sink, every record in the manifest."""
    photos = tmp_path / "in"
    photos.mkdir()
    rng = np.random.default_rng(4)
    for i in range(4):
        write_image(photos / f"p{i}.png", rng.integers(0, 256, (40, 40, 3), np.uint8))
    register_sink("failing", FailingRecords)
    try:
        out = tmp_path / "out"
        cli = ["gradcam", str(photos), "--model", "tests.conftest:TinyCNN", "--weights", "none",
               "--input-size", "32", "--layer", "features.6", "--batch-size", "2", "--records", "failing",
               "--out", str(out)]  # fmt: skip
        r = invoke(*cli)
        assert r.exit_code != 0
        said = [line for line in r.stderr.splitlines() if "FailingRecords" in line]
        assert (
            len(said) == 1
            and f"add() failed on '{photos / 'p1.png'}' (RuntimeError: table locked)" in said[0]
        )
        assert [rec["input"] for rec in records(out)] == FailingRecords.kept == [str(photos / "p0.png")]
        monkeypatch.setattr(FailingRecords, "FAIL_ON", None)
        r = invoke(*cli)
        assert r.exit_code == 0, r.stderr
        assert sorted({Path(rec["input"]).name for rec in records(out)}) == [f"p{i}.png" for i in range(4)]
        assert [Path(name).name for name in FailingRecords.kept] == [f"p{i}.png" for i in range(4)]
        monkeypatch.setattr(FailingRecords, "FAIL_CLOSE", True)
        loaded = load_model("tests.conftest:TinyCNN", "none", device="cpu", input_size=32)
        with pytest.raises(hookviz.HookvizError, match=r"FailingRecords's close\(\) failed \(RuntimeError"):
            list(Run(loaded, [str(photos)], CamSettings(layers=("features.6",)), out=tmp_path / "o2",
                     records="failing"))  # fmt: skip
        assert len(records(tmp_path / "o2")) == len(FailingRecords.kept) == 4
    finally:
        unregister_sink("failing")


class SqliteMaps:
    """A ``--maps sqlite`` store from outside the package: each raw map's array in one SQLite file, the
    connection opened in the factory (the run's threads write through it, one call at a time)."""

    FAIL = False

    def __init__(self, where: str, rank: int) -> None:
        self.where = where
        self.db = sqlite3.connect(where, check_same_thread=False)
        self.db.execute("CREATE TABLE IF NOT EXISTS maps (name PRIMARY KEY, shape, data)")

    def exists(self, name: str) -> bool:
        return self.db.execute("SELECT 1 FROM maps WHERE name = ?", (name,)).fetchone() is not None

    def write(self, name: str, data: bytes, attrs: dict[str, Any]) -> None:
        if self.FAIL:
            raise RuntimeError("database is locked")
        arr = np.load(io.BytesIO(data))
        shape = ",".join(map(str, arr.shape))
        self.db.execute(
            "INSERT OR REPLACE INTO maps VALUES (?, ?, ?)", (name, shape, arr.astype("<f4").tobytes())
        )
        self.db.commit()

    def location(self, name: str) -> str:
        return f"{self.where}#{name}"


def test_a_maps_store_from_outside_gets_every_raw_map_and_the_records_say_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each raw map lands in the store (decoded from the ``.npy`` bytes, its extremes the record's), the
    record's outputs say ``location(name)``; a store whose write raises fails each input saying the store."""
    photos = tmp_path / "in"
    photos.mkdir()
    rng = np.random.default_rng(6)
    for i in range(3):
        write_image(photos / f"p{i}.png", rng.integers(0, 256, (40, 40, 3), np.uint8))
    register_sink("sqlite", SqliteMaps, kind="maps")
    try:
        out = tmp_path / "out"
        cli = ["gradcam", str(photos), "--model", "tests.conftest:TinyCNN", "--weights", "none",
               "--input-size", "32", "--layer", "features.6", "--maps", "sqlite",
               "--workers", "2"]  # fmt: skip
        r = invoke(*cli, "--out", str(out))
        assert r.exit_code == 0, r.stderr
        recs = records(out)
        where = str(out / "maps.sqlite")
        with sqlite3.connect(where) as db:
            stored = dict(db.execute("SELECT name, data FROM maps").fetchall())
        for rec in recs:
            raw = [o for o in rec["outputs"] if o.startswith(where + "#")]
            assert raw and "None" not in rec["outputs"]
            for m in rec["maps"]:
                name = next(o.split("#", 1)[1] for o in raw if f"{m['method']}.{m['layer']}" in o)
                arr = np.frombuffer(stored[name], "<f4")
                assert arr.size > 1 and np.isclose(np.nanmin(arr), m["min"], atol=1e-3)
                assert np.isclose(np.nanmax(arr), m["max"], atol=1e-3)
        monkeypatch.setattr(SqliteMaps, "FAIL", True)
        r = invoke(*cli, "--out", str(tmp_path / "o2"))
        assert r.exit_code == 1
        errors = [rec["error"] for rec in records(tmp_path / "o2")]
        assert len(errors) == 3
        assert all(
            "--maps: the store SqliteMaps's write() failed" in e and "database is locked" in e for e in errors
        )
        assert not any("cannot render" in e for e in errors)
    finally:
        unregister_sink("sqlite", kind="maps")
