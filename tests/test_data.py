"""Data where it lives: photos read from WebDataset shards, object-store URLs and tables through a real S3 API
(moto's server on 127.0.0.1, started here; hookviz's calls are not mocked), results written as a Parquet
table and a Zarr store (at S3 URLs too), equal to a local folder run's manifest and ``--save-raw`` arrays; a
corrupt shard, a missing object, a table without a path column and an unreachable store are one line each,
the rest done."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.io.shapes import draw_shape
from hookviz.ray import Explainer
from tests.conftest import PATIENCE, invoke, records, write_image

pytest.importorskip("s3fs")
pytest.importorskip("pyarrow")
pytest.importorskip("zarr")
pytest.importorskip("webdataset")
pytest.importorskip("moto")

BUCKET = "photos"
N = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """moto's S3 server on a free loopback port, named as boto3 reads it (AWS_ENDPOINT_URL)."""
    from moto.server import ThreadedMotoServer

    from hookviz.io import stores

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        stores.forget_filesystems()
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=env["AWS_ENDPOINT_URL"])
        fs.mkdir(BUCKET)
        yield fs
        # s3fs keeps its file systems (and their open HTTP sessions) for the process: dropping them here would
        # leave their sessions to be collected, unclosed, in some later test.
        stores.forget_filesystems()
    server.stop()


@pytest.fixture(scope="module")
def data(trained: Any, s3: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """N shape photos: in a local folder, in two WebDataset shards (webdataset's own writer) at s3://, each
    also as its own object, and a Parquet table of their URLs; the trained CNN's weights."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset as wds

    folder = tmp_path_factory.mktemp("data")
    (folder / "photos").mkdir()
    rng = np.random.default_rng(4)
    photos = []
    for i in range(N):
        img, _ = draw_shape(i % 3, 48, rng)
        photos.append(write_image(folder / "photos" / f"p{i:03d}.png", (img * 255).round().astype(np.uint8)))
    for s in range(2):
        with wds.TarWriter(str(folder / f"{s:03d}.tar")) as sink:
            for p in photos[s * N // 2 : (s + 1) * N // 2]:
                sink.write(
                    {"__key__": p.stem, "png": p.read_bytes(), "cls": str(int(p.stem[1:]) % 3).encode()}
                )
        s3.put(str(folder / f"{s:03d}.tar"), f"{BUCKET}/shards/{s:03d}.tar")
    for p in photos:
        s3.put(str(p), f"{BUCKET}/objects/{p.name}")
    urls = [f"s3://{BUCKET}/objects/{p.name}" for p in photos]
    with s3.open(f"{BUCKET}/table.parquet", "wb") as f:
        pq.write_table(pa.table({"url": urls, "label": [i % 3 for i in range(N)]}), f)
    torch.save(trained.model.eval().state_dict(), folder / "shapes.pth")
    model = [
        "--model",
        "tests.conftest:TinyCNN",
        "--weights",
        str(folder / "shapes.pth"),
        "--input-size",
        "48",
        *("--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1"),  # as the CNN was trained
    ]
    return {"folder": folder, "photos": photos, "model": model}


METHODS = ["--method", "gradcam,layercam", "--layer", "features.6"]


def _by_stem(name: str) -> str:
    return Path(name.rsplit("#", 1)[-1]).stem


def test_shards_in_s3_give_the_folder_run_s_records_as_parquet_and_raw_maps_as_zarr(
    data: dict[str, Any], s3: Any, tmp_path: Path
) -> None:
    import zarr

    local = tmp_path / "local"
    r = invoke("gradcam", str(data["folder"] / "photos"), *data["model"], *METHODS, "--save-raw", "--out",
               str(local))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    want = {_by_stem(rec["input"]): rec for rec in records(local)}
    assert len(want) == N
    shards = f"s3://{BUCKET}/shards/{{000..001}}.tar"
    table_url, maps_url = f"s3://{BUCKET}/run/records.parquet", f"s3://{BUCKET}/run/maps.zarr"
    r = invoke("gradcam", shards, *data["model"], *METHODS, "--records", table_url, "--maps", maps_url,
               "--out", str(tmp_path / "cloud"))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    rows = _table(table_url).to_pylist()
    assert len(rows) == N * 2  # a row per photo x method (one layer, one target)
    endpoint = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
    group = zarr.open_group(store=maps_url, mode="r", storage_options=endpoint)
    for row in rows:
        theirs = want[_by_stem(row["input"])]
        entry = next(m for m in theirs["maps"] if m["method"] == row["method"])
        assert row["status"] == "ok" and row["layer"] == "features.6"
        assert row["predicted_index"] == theirs["predicted"]["index"]
        assert row["target_score"] == pytest.approx(entry["target"]["score"], abs=1e-6)
        assert (row["map_min"], row["map_max"]) == pytest.approx((entry["min"], entry["max"]), abs=1e-6)
        assert row["box"] == theirs["box"]
        prefix, array = row["raw"].split("/maps.zarr/")[1].split("/")
        stored = group[f"{prefix}/{array}"]
        assert stored.dtype == np.float16 and stored.attrs["complete"] and stored.attrs["box"] == row["box"]
        npy = local / Path(entry["file"]).name.replace(".png", ".npy")
        np.testing.assert_allclose(stored[...].astype(np.float32), np.load(npy), rtol=2e-3, atol=1e-4)
    # A second run resumes: every photo is skipped, the store's arrays are kept.
    r = invoke("gradcam", shards, *data["model"], *METHODS, "--records", table_url, "--maps", maps_url,
               "--out", str(tmp_path / "cloud"), "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert [json.loads(line)["status"] for line in r.stdout.splitlines()] == ["skipped"] * N
    assert len(_table(table_url)) == N * 2  # the skipped photos' rows are there: none added twice


def _table(where: str) -> Any:
    """The Parquet table at ``where`` (a folder or an s3:// URL), every part, as pyarrow.dataset reads it."""
    import pyarrow.dataset as ds

    if not where.startswith("s3://"):
        return ds.dataset(where, format="parquet").to_table()
    import s3fs
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    fs = s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    return ds.dataset(where[5:], format="parquet", filesystem=PyFileSystem(FSSpecHandler(fs))).to_table()


def _rows_of(manifest: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The rows the manifest's records give (input, status, method); a skipped record of an input x settings
    already recorded gives none (a rerun repeats its results)."""
    from hookviz.io.sinks import record_rows

    seen: set[str] = set()
    rows = []
    for rec in manifest:
        if rec["status"] == "skipped" and rec["prefix"] in seen:
            continue
        seen.add(rec.get("prefix") or "")
        rows += [(r["input"], r["status"], r["method"]) for r in record_rows(rec)]
    return sorted(rows)


def test_a_second_run_into_one_out_adds_its_rows_to_the_parquet_table(
    data: dict[str, Any], s3: Any, tmp_path: Path
) -> None:
    """Two folders of photos run one after the other into one --out, then again (all skipped), then one
    folder with another method: the table (every part) holds each run's rows, as the manifest does, none
    twice; the same at an s3:// URL."""
    folders = []
    for k in range(2):
        folder = tmp_path / f"in{k}"
        folder.mkdir()
        for p in data["photos"][k * 3 : k * 3 + 3]:
            (folder / p.name).write_bytes(p.read_bytes())
        folders.append(str(folder))
    for records_at in ("parquet", f"s3://{BUCKET}/grown/records.parquet"):
        out = tmp_path / ("local" if records_at == "parquet" else "cloud")
        where = str(out / "records.parquet") if records_at == "parquet" else records_at
        run = [*data["model"], "--layer", "features.6", "--records", records_at, "--out", str(out)]
        for folder in (*folders, *folders):
            r = invoke("gradcam", folder, *run)
            assert r.exit_code == 0, r.stderr
        r = invoke("gradcam", folders[0], *run, "--method", "layercam")
        assert r.exit_code == 0, r.stderr
        manifest = records(out)
        assert [m["status"] for m in manifest] == ["ok"] * 6 + ["skipped"] * 6 + ["ok"] * 3
        got = sorted((r["input"], r["status"], r["method"]) for r in _table(where).to_pylist())
        assert got == _rows_of(manifest) and len(got) == 9
        assert len({(r[0], r[2]) for r in got}) == 9  # no row twice


def test_a_table_of_urls_and_a_local_table_read_each_row(
    data: dict[str, Any], s3: Any, tmp_path: Path
) -> None:
    """A Parquet table at s3:// (its url column) and a local CSV of relative paths: the same predictions as
    the folder; a row naming a missing object fails alone."""
    s3.pipe(
        f"{BUCKET}/broken.csv",
        b"url\n" + f"s3://{BUCKET}/objects/p000.png\ns3://{BUCKET}/nope.png\n".encode(),
    )
    with (data["folder"] / "table.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["path"], *[[f"photos/{p.name}"] for p in data["photos"]]])
    runs = {}
    for name, table in (("s3", f"s3://{BUCKET}/table.parquet"), ("csv", str(data["folder"] / "table.csv"))):
        r = invoke("gradcam", "--inputs-table", table, *data["model"], "--out", str(tmp_path / name))
        assert r.exit_code == 0, r.stderr
        runs[name] = {_by_stem(rec["input"]): rec["predicted"] for rec in records(tmp_path / name)}
    assert runs["s3"] == runs["csv"] and len(runs["s3"]) == N
    r = invoke("gradcam", "--inputs-table", f"s3://{BUCKET}/broken.csv", *data["model"], "--out",
               str(tmp_path / "broken"))  # fmt: skip
    assert r.exit_code == 1, r.stderr
    got = {rec["input"]: rec for rec in records(tmp_path / "broken")}
    assert got[f"s3://{BUCKET}/objects/p000.png"]["status"] == "ok"
    assert "no such object" in got[f"s3://{BUCKET}/nope.png"]["error"]


def test_a_corrupt_shard_a_table_without_paths_and_an_unreachable_store_are_one_line_each(
    data: dict[str, Any], s3: Any, tmp_path: Path
) -> None:
    good = data["folder"] / "000.tar"
    cut = tmp_path / "001.tar"
    blob = good.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        members = tar.getmembers()
    cut.write_bytes(blob[: members[2].offset_data + 100])  # the first sample whole, the second's photo cut
    (tmp_path / "002.tar").write_bytes(b"not a tar archive at all" * 40)
    r = invoke("gradcam", str(good), str(cut), str(tmp_path / "002.tar"), *data["model"], "--json", "--out",
               str(tmp_path / "out"))  # fmt: skip
    assert r.exit_code == 1
    got = [json.loads(line) for line in r.stdout.splitlines()]
    ok = [g for g in got if g["status"] == "ok"]
    errors = [g["error"] for g in got if g["status"] == "error"]
    assert len(ok) == N // 2 + 1, got  # the whole shard, and the cut one's sample before the cut
    assert any("001.tar" in e and "after 1 sample" in e for e in errors), errors
    assert any("002.tar" in e and "not a readable tar shard" in e for e in errors), errors
    (tmp_path / "t.csv").write_text("name,label\na.png,1\n")
    r = invoke(
        "gradcam", "--inputs-table", str(tmp_path / "t.csv"), *data["model"], "--out", str(tmp_path / "o")
    )
    assert r.exit_code == 2 and "no path column" in r.stderr and "--inputs-column" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    table = ["--inputs-table", str(tmp_path / "t.csv")]
    r = invoke("gradcam", *table, "--inputs-column", "nope", *data["model"], "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "no column 'nope'" in r.stderr, r.stderr
    with pytest.MonkeyPatch.context() as mp:
        from hookviz.io import stores

        mp.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
        mp.setenv("AWS_MAX_ATTEMPTS", "1")
        stores.forget_filesystems()
        r = invoke("gradcam", f"s3://{BUCKET}/objects/p000.png", str(data["photos"][1]), *data["model"],
                   "--json", "--out", str(tmp_path / "u"))  # fmt: skip
        stores.forget_filesystems()
    assert r.exit_code == 1
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [g["status"] for g in got] == ["error", "ok"], got
    assert "cannot read it" in got[0]["error"]


def patient_ray(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Ray, set to start a local node on a busy machine: its processes' timeouts (read from the
    environment when they start) raised to :data:`PATIENCE`, and its wait for the new node to register
    (30 s, fixed in ``ray._private.node``; it timed out beside two CPU-heavy processes) made a wait on that
    condition: ``services.get_node`` asks again until the node is there or PATIENCE has passed."""
    seconds = str(int(PATIENCE))
    for name, value in {
        "RAY_gcs_server_request_timeout_seconds": seconds,
        "RAY_gcs_rpc_server_connect_timeout_s": seconds,
        "RAY_gcs_rpc_server_reconnect_timeout_s": seconds,
        "RAY_worker_register_timeout_seconds": seconds,
        "RAY_health_check_timeout_ms": str(60_000),
        "RAY_health_check_failure_threshold": "30",
        "RAY_USAGE_STATS_ENABLED": "0",
    }.items():
        monkeypatch.setenv(name, value)
    ray = pytest.importorskip("ray")
    services = getattr(getattr(ray, "_private", None), "services", None)
    real = getattr(services, "get_node", None)
    if real is not None:

        def get_node(*args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + PATIENCE
            while True:
                try:
                    return real(*args, **kwargs)
                except RuntimeError:  # not registered yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

        monkeypatch.setattr(services, "get_node", get_node)
    return ray


@pytest.mark.slow  # a local Ray cluster starts (about 20 s): make test runs it
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's own, on its settings
def test_ray_data_workers_give_the_cli_s_rows(
    data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two actors of hookviz.ray.Explainer on a local two-CPU Ray cluster: the rows equal those
    ``--records parquet`` writes for the same photos (but for the time)."""
    ray = patient_ray(monkeypatch)
    import pyarrow.parquet as pq

    photos = [str(p) for p in data["photos"]]
    r = invoke(
        "gradcam", *photos, *data["model"], *METHODS, "--records", "parquet", "--out", str(tmp_path / "cli")
    )
    assert r.exit_code == 0, r.stderr
    want = pq.read_table(tmp_path / "cli" / "records.parquet").to_pylist()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        ds = ray.data.from_items([{"path": p} for p in photos])
        kwargs = {"model": "tests.conftest:TinyCNN", "out": str(tmp_path / "ray"), "input_size": 48,
                  "resize": "squash", "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0),
                  "weights": data["model"][3], "methods": ("gradcam", "layercam"),
                  "layers": ("features.6",)}  # fmt: skip
        got = ds.map_batches(Explainer, fn_constructor_kwargs=kwargs, concurrency=2, batch_size=3, num_cpus=1)
        rows = got.take_all()
    finally:
        ray.shutdown()
    key = lambda row: (row["input"], row["method"])  # noqa: E731
    assert len(rows) == len(want) == N * 2
    for mine, theirs in zip(sorted(rows, key=key), sorted(want, key=key), strict=True):
        for column in theirs:
            if column == "time":
                continue
            if isinstance(theirs[column], float):
                assert mine[column] == pytest.approx(theirs[column], abs=1e-6), column
            else:
                value = list(mine[column]) if column == "box" else mine[column]
                assert value == theirs[column], column


def test_target_label_explains_each_input_s_own_class(data: dict[str, Any], s3: Any, tmp_path: Path) -> None:
    """``--target label``: a shard sample's ``.cls`` and a table row's ``label`` are each input's target (its
    map equals the folder run's ``--target K`` for that class); an input without a label fails alone."""
    shards = f"s3://{BUCKET}/shards/{{000..001}}.tar"
    r = invoke("gradcam", shards, *data["model"], *METHODS, "--target", "label", "--save-raw", "--out",
               str(tmp_path / "shards"))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    got = {_by_stem(rec["input"]): rec for rec in records(tmp_path / "shards")}
    assert len(got) == N and all(rec["settings"]["targets"] == "label" for rec in got.values())
    for stem, rec in got.items():
        assert rec["target"]["index"] == int(stem[1:]) % 3
    assert all(rec["predicted"]["index"] == rec["target"]["index"] for rec in got.values())  # it sees them
    r = invoke("gradcam", str(data["photos"][4]), *data["model"], *METHODS, "--target", "1", "--save-raw",
               "--out", str(tmp_path / "one"))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (one,) = records(tmp_path / "one")
    for mine, theirs in zip(got["p004"]["maps"], one["maps"], strict=True):
        raw = [np.load(Path(out) / Path(m["file"]).name.replace(".png", ".npy"))
               for out, m in ((tmp_path / "shards", mine), (tmp_path / "one", theirs))]  # fmt: skip
        np.testing.assert_allclose(raw[0], raw[1], rtol=1e-5, atol=1e-6)
    table = data["folder"] / "labels.csv"
    table.write_text("path,label\nphotos/p000.png,square\nphotos/p001.png,\nphotos/p002.png,2\n")
    r = invoke("gradcam", "--inputs-table", str(table), *data["model"], "--target", "label", "--labels",
               str(_names(data)), "--json", "--out", str(tmp_path / "table"))  # fmt: skip
    assert r.exit_code == 1
    by = {_by_stem(g["input"]): g for g in map(json.loads, r.stdout.splitlines())}
    assert by["p000"]["target"]["index"] == 0 and by["p002"]["target"]["index"] == 2
    assert by["p001"]["status"] == "error" and "no label" in by["p001"]["error"]
    assert by["p001"]["error"].count("p001.png") == 1, by["p001"]["error"]  # the input named once
    # evaluate likewise: each row's metrics for its own class, those of --target K on that photo alone.
    r = invoke("evaluate", "--inputs-table", str(table), *data["model"], "--target", "label", "--labels",
               str(_names(data)), "--json", "--out", str(tmp_path / "ev"))  # fmt: skip
    assert r.exit_code == 1, r.stderr
    by = {_by_stem(g["input"]): g for g in map(json.loads, r.stdout.splitlines())}
    assert by["p000"]["target"]["index"] == 0 and by["p002"]["target"]["index"] == 2
    assert by["p001"]["status"] == "error" and "no label" in by["p001"]["error"]
    assert by["p001"]["error"].count("p001.png") == 1, by["p001"]["error"]
    r = invoke("evaluate", str(data["photos"][2]), *data["model"], "--target", "2", "--json", "--out",
               str(tmp_path / "ev2"))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    alone = json.loads(r.stdout.splitlines()[-1])
    (cam,) = [name for name in alone["metrics"] if name.startswith("gradcam@")]
    assert alone["metrics"].keys() == by["p002"]["metrics"].keys() == {cam, "random", "center"}
    assert 0 < alone["metrics"][cam]["deletion_auc"] < 1
    for name, figures in alone["metrics"].items():
        for figure, value in figures.items():
            assert by["p002"]["metrics"][name][figure] == pytest.approx(value, rel=1e-4, abs=1e-5), figure


def _names(data: dict[str, Any]) -> Path:
    path = data["folder"] / "names.txt"
    path.write_text("square\ndisc\ncross\n")
    return path


def test_no_pictures_writes_the_store_and_table_only_and_resumes(
    data: dict[str, Any], tmp_path: Path
) -> None:
    folder, out = str(data["folder"] / "photos"), tmp_path / "out"
    run = [
        "gradcam",
        folder,
        *data["model"],
        "--maps",
        "zarr",
        "--records",
        "parquet",
        "--no-pictures",
        "--json",
    ]
    r = invoke(*run, "--out", str(out))
    assert r.exit_code == 0, r.stderr
    assert not list(out.glob("*.png")) and not list(out.glob("*.npy"))
    assert [json.loads(line)["status"] for line in r.stdout.splitlines()] == ["ok"] * N
    # Records and rows name what was written: no picture, the raw map's array in the store.
    import zarr

    store = zarr.open_group(str(out / "maps.zarr"), mode="r")
    maps = [m for rec in records(out) for m in rec["maps"]]
    assert len(maps) == N and all(m["file"] is None for m in maps)
    assert all(store[m["raw"].split("/maps.zarr/")[1]].attrs["complete"] for m in maps)
    rows = _table(str(out / "records.parquet")).to_pylist()
    assert sorted((r["file"], r["raw"]) for r in rows) == sorted((None, m["raw"]) for m in maps)
    r = invoke(*run, "--out", str(out))
    assert [json.loads(line)["status"] for line in r.stdout.splitlines()] == ["skipped"] * N
    assert all(m["file"] is None for line in r.stdout.splitlines() for m in json.loads(line)["maps"])
    r = invoke("gradcam", folder, *data["model"], "--no-pictures", "--save-raw", "--json", "--out",
               str(tmp_path / "raw"))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    for rec in map(json.loads, r.stdout.splitlines()):
        (m,) = rec["maps"]
        assert m["file"] is None and m["raw"] in rec["outputs"] and np.load(m["raw"]).ndim == 2
    r = invoke("gradcam", folder, *data["model"], "--no-pictures", "--out", str(tmp_path / "none"))
    assert r.exit_code == 2 and r.stderr.count("error") == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith("would write no file; add --save-raw or --maps zarr")


def _open_and_write(where: str, start: float, rank: int) -> str:
    from hookviz.io.sinks import ZarrMaps

    buffer = io.BytesIO()
    np.save(buffer, np.full((4, 4), rank, np.float32))
    while time.time() < start:  # both processes open the new store at once
        pass
    try:
        ZarrMaps(where).write(f"p{rank}-0a1b.net.0123abcd.gradcam.layer4.npy", buffer.getvalue(), {})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


@pytest.mark.slow  # 150 races, about 8 s
def test_two_processes_opening_one_new_zarr_store_at_once_both_write(tmp_path: Path) -> None:
    """Two ranks open a store none has made yet: one finds no group, then the other's where it goes to make
    one (Zarr's ContainsGroupError, about 1 pair in 30), or reads its metadata half written (under load:
    a JSON error). Either lost a rank before the store was opened again."""
    import multiprocessing

    import zarr

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        for k in range(150):
            where, start = str(tmp_path / f"{k}.zarr"), time.time() + 0.05
            assert pool.starmap(_open_and_write, [(where, start, 0), (where, start, 1)]) == ["ok", "ok"]
            group = zarr.open_group(where, mode="r")
            assert sorted(group.keys()) == ["p0-0a1b.net.0123abcd", "p1-0a1b.net.0123abcd"]


def test_shard_samples_with_dotted_extensions_are_read_and_a_second_image_is_said(
    data: dict[str, Any], tmp_path: Path
) -> None:
    """WebDataset keys a member by its basename up to the first dot and decodes an image by the extension's
    last component: ``h.multi.dot.png`` is sample ``h``'s photo, ``k.seg.png`` a second image of sample ``k``
    (the first explained, the other named in the record's note and on stderr), and a sample without an image
    fails alone."""
    import webdataset as wds

    photos = [p.read_bytes() for p in data["photos"][:3]]
    shard = tmp_path / "dots.tar"
    with wds.TarWriter(str(shard)) as sink:
        sink.write({"__key__": "a", "png": photos[0], "cls": b"0"})
        sink.write({"__key__": "h", "multi.dot.png": photos[1], "cls": b"1"})
        sink.write({"__key__": "k", "png": photos[2], "seg.png": photos[0]})
        sink.write({"__key__": "m", "json": b"{}"})
    r = invoke("gradcam", str(shard), *data["model"], "--json", "--out", str(tmp_path / "out"))
    assert r.exit_code == 1, r.stderr
    got = {g["input"].rsplit("#", 1)[1]: g for g in map(json.loads, r.stdout.splitlines())}
    assert sorted(got) == ["a.png", "h.multi.dot.png", "k.png", "m"]
    assert [got[n]["status"] for n in ("a.png", "h.multi.dot.png", "k.png")] == ["ok"] * 3
    assert got["k.png"]["note"] == "this sample has 2 images: k.png is explained, k.seg.png left out"
    assert "note" not in got["a.png"] and "note" not in got["h.multi.dot.png"]
    assert got["m"]["status"] == "error"
    assert "no image in this sample (its members: m.json)" in got["m"]["error"]
    assert "k.seg.png left out" in r.stderr
    one = invoke("gradcam", str(data["photos"][1]), *data["model"], "--json", "--out", str(tmp_path / "one"))
    assert json.loads(one.stdout)["predicted"] == got["h.multi.dot.png"]["predicted"]  # its photo was read


def test_a_table_s_duplicate_row_is_done_once_and_recorded_after_the_first(
    data: dict[str, Any], tmp_path: Path
) -> None:
    """A photo listed twice in a table: its first row is computed (``ok``), its second row ``skipped``,
    repeating the first's results, in input order; the Parquet table holds its rows once."""
    table = data["folder"] / "twice.csv"
    table.write_text("path\nphotos/p000.png\nphotos/p001.png\nphotos/p000.png\n")
    out = tmp_path / "out"
    r = invoke("gradcam", "--inputs-table", str(table), *data["model"], "--records", "parquet", "--json",
               "--out", str(out))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(g["input"], g["status"]) for g in got] == [
        ("photos/p000.png", "ok"), ("photos/p001.png", "ok"), ("photos/p000.png", "skipped")
    ]  # fmt: skip
    assert got[2]["note"] == "listed twice in this run: done once, for its first listing"
    assert got[2]["predicted"] == got[0]["predicted"] and got[2]["outputs"] == got[0]["outputs"]
    assert [rec["status"] for rec in records(out)] == ["ok", "ok", "skipped"]
    rows = _table(str(out / "records.parquet")).to_pylist()
    assert sorted((row["input"], row["status"]) for row in rows) == [
        ("photos/p000.png", "ok"), ("photos/p001.png", "ok")
    ]  # fmt: skip
