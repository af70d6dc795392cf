"""Data-set scale: hookviz under ``torchrun --standalone`` (gloo, CPU), for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hookviz.io.images import decode_png
from hookviz.run.distributed import Dist, from_env, merge_parts, shard
from hookviz.run.pipeline import Item
from tests.conftest import ROOT, ball_video, invoke, records, run_cli, write_image

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
ARGS = ["--weights", "none", "--input-size", "64", "--device", "cpu", "-q"]


def _photos(folder: Path, n: int = 12) -> Path:
    folder.mkdir(parents=True)
    for i in range(n):
        rgb = np.random.default_rng(i).integers(0, 256, (50 + 3 * i, 70, 3), dtype=np.uint8)
        write_image(folder / f"p{i:02d}.png", rgb)
    (folder / "broken.png").write_text("not a picture")
    return folder


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return run_cli(cmd, cwd=cwd, env=env)


def _records(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_ranks_write_what_one_process_writes(tmp_path: Path) -> None:
    photos = _photos(tmp_path / "in")
    cam = [
        "-m",
        "hookviz",
        "gradcam",
        "in",
        *ARGS,
        "--save-raw",
        "--method",
        "gradcam",
        "--method",
        "layercam",
    ]
    one = _run([sys.executable, *cam, "--out", "one"], tmp_path)
    two = _run([*TORCHRUN, "--nproc-per-node", "2", *cam, "--out", "two", "--json"], tmp_path)
    assert one.returncode == two.returncode == 1, two.stderr  # broken.png failed; the others were done
    recs = _records(tmp_path / "two")
    inputs = [str(r["input"]) for r in recs]
    assert sorted(inputs) == sorted(str(p.relative_to(tmp_path)) for p in photos.iterdir())  # each once
    assert {r["status"] for r in recs if "broken" not in str(r["input"])} == {"ok"}
    assert [json.loads(line)["input"] for line in two.stdout.splitlines()] == inputs  # --json: records only
    assert not list((tmp_path / "two").glob(".manifest.rank*")) and not list(
        (tmp_path / "two").glob(".hookviz-*")
    )
    ones = sorted(p.name for p in (tmp_path / "one").iterdir() if p.suffix in (".png", ".npy"))
    twos = sorted(p.name for p in (tmp_path / "two").iterdir() if p.suffix in (".png", ".npy"))
    assert ones == twos and len(ones) == 12 * 7  # 2 methods x (png + 2 npy) + the sheet
    for name in ones:
        a, b = tmp_path / "one" / name, tmp_path / "two" / name
        if name.endswith(".npy"):
            np.testing.assert_allclose(np.load(a), np.load(b), rtol=1e-5, atol=1e-6)
        else:
            assert np.abs(decode_png(a.read_bytes()).astype(int) - decode_png(b.read_bytes())).max() <= 1


@pytest.mark.slow
def test_a_partial_run_is_completed_by_three_ranks(tmp_path: Path) -> None:
    _photos(tmp_path / "in")
    cam = [
        "-m",
        "hookviz",
        "gradcam",
        "in",
        *ARGS,
        "--method",
        "gradcam",
        "--method",
        "layercam",
        "--out",
        "o",
    ]
    assert _run([*TORCHRUN, "--nproc-per-node", "2", *cam], tmp_path).returncode == 1
    out = tmp_path / "o"
    first = len(_records(out))
    for i in (0, 1, 2):  # partial: one of three files gone
        next(out.glob(f"p{i:02d}-*.layercam.*.png")).unlink()
    for i in (3, 4):  # never made
        for f in out.glob(f"p{i:02d}-*"):
            f.unlink()
    # A killed rank's manifest part from an earlier run is merged, not lost.
    (out / ".manifest.rank1.999999.jsonl").write_text(
        json.dumps({"input": "ghost.png", "status": "error"}) + "\n"
    )
    res = _run([*TORCHRUN, "--nproc-per-node", "3", *cam, "--skip-existing"], tmp_path)
    assert res.returncode == 1, res.stderr  # broken.png again
    recs = _records(out)
    assert any(r["input"] == "ghost.png" for r in recs[first:])
    second = [r for r in recs[first:] if r["input"] != "ghost.png"]
    assert sorted(str(r["input"]) for r in second) == sorted(
        f"in/{p.name}" for p in (tmp_path / "in").iterdir()
    )
    status = {Path(str(r["input"])).stem: r["status"] for r in second}
    assert [status[f"p{i:02d}"] for i in range(12)] == ["ok"] * 5 + ["skipped"] * 7
    assert len(list(out.glob("p*.png"))) == 12 * 3


def test_stdin_is_refused_under_torchrun(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    res = run_cli(
        [sys.executable, "-m", "hookviz", "gradcam", "-", *ARGS, "--out", str(tmp_path / "o")],
        input="x.png\n",
        cwd=ROOT,
        env=env,
    )
    assert res.returncode == 2
    assert "reading paths from stdin is not supported under torchrun" in res.stderr


def test_sharding_is_disjoint_complete_and_the_same_on_every_rank() -> None:
    items = [Item(f"img{i:03d}.png", Path(f"img{i:03d}.png")) for i in (5, 3, 9, 1, 7, 2, 8)]
    shards = [shard(list(reversed(items)) if r % 2 else items, Dist(r, 3, r, 3)) for r in range(3)]
    names = [i.name for s in shards for i in s]
    assert sorted(names) == sorted(i.name for i in items) and len(set(names)) == len(names)
    assert [i.name for i in shards[0]] == ["img001.png", "img005.png", "img009.png"]
    assert shard(items, None) == items


def test_the_environment_decides() -> None:
    assert from_env({}) is None and from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    d = from_env({**env, "TORCHELASTIC_RUN_ID": "run-a"})
    assert d is not None and (d.rank, d.world, d.local_rank, d.local_world) == (3, 4, 1, 2)
    # Each torchrun job has its own identity, named in its manifest parts.
    other = from_env({**env, "TORCHELASTIC_RUN_ID": "run-b"})
    assert other is not None and d.job != other.job and d.job in d.part_name


def test_the_merged_manifest_is_in_the_order_one_process_writes(tmp_path: Path) -> None:
    """shard() deals the inputs sorted by name round robin; the merge deals each rank's lines back so (an
    input's lines together, a rank with fewer inputs simply done), not rank 0's inputs first."""
    names = ["astronaut", "cat", "coffee", "dog", "rocket"]
    items = [Item(n, Path(n)) for n in reversed(names)]
    dealt = [shard(items, Dist(r, 2, r, 2, "j")) for r in range(2)]
    for rank, mine in enumerate(dealt):
        lines = [json.dumps({"input": i.name, "method": m}) for i in mine for m in ("gradcam", "layercam")]
        (tmp_path / f".manifest.rank{rank}.999999.jsonl").write_text("\n".join(lines) + "\n")
    assert merge_parts(tmp_path, "manifest.jsonl", only_dead=True) == 10
    got = [json.loads(x) for x in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    methods = ("gradcam", "layercam")
    assert [(r["input"], r["method"]) for r in got] == [(n, m) for n in names for m in methods]


def test_merge_leaves_parts_of_live_processes(tmp_path: Path) -> None:
    live = tmp_path / f".manifest.rank0.{os.getpid()}.jsonl"
    dead = tmp_path / ".manifest.rank2.999999.jsonl"
    live.write_text('{"input": "a"}\n')
    dead.write_text('{"input": "b"}\n{"input": "c"}')
    assert merge_parts(tmp_path, "manifest.jsonl", only_dead=True) == 2
    assert live.exists() and not dead.exists()
    assert merge_parts(tmp_path, "manifest.jsonl", only_dead=False) == 1
    assert [json.loads(x)["input"] for x in (tmp_path / "manifest.jsonl").read_text().splitlines()] == [
        "b",
        "c",
        "a",
    ]


@pytest.mark.slow
def test_two_ranks_share_videos_by_file(tmp_path: Path) -> None:
    """Videos under torchrun: sharded by file, so each video's clips are done by one rank and followed by its
    whole-video record; every clip once, every output recorded."""
    (folder := tmp_path / "in").mkdir()
    for n in range(5):
        ball_video(folder / f"v{n}.mp4", frames=12, size=(40, 32), grey=40 * n)
    net = str(ROOT / "tests" / "video_net.py") + ":ShapesVideoNet"
    cam = ["-m", "hookviz", "gradcam", "in", "--model", net, "--weights", "none", "--input-size", "32",
           "--resize", "squash", "--clip-len", "8", "--clips", "2", "-q"]  # fmt: skip
    two = _run([*TORCHRUN, "--nproc-per-node", "2", *cam, "--out", "two"], tmp_path)
    assert two.returncode == 0, two.stderr
    recs = _records(tmp_path / "two")
    clips = sorted((str(r["input"]), r["clip"]["number"]) for r in recs if "clip" in r)  # type: ignore[index]
    assert clips == sorted((f"in/v{n}.mp4", c) for n in range(5) for c in (1, 2))  # each clip once
    assert sorted(str(r["input"]) for r in recs if "video" in r) == [f"in/v{n}.mp4" for n in range(5)]
    written = sorted(Path(str(o)).name for r in recs for o in r["outputs"])  # type: ignore[attr-defined]
    assert written == sorted(p.name for p in (tmp_path / "two").iterdir() if p.suffix in (".png", ".webm"))
    assert len(written) == 5 * 2 * 2  # per clip: its WebM and its contact sheet


@pytest.mark.slow
def test_two_ranks_share_one_zarr_store_and_one_parquet_table(tmp_path: Path) -> None:
    """Under torchrun each rank writes its own Parquet part and its own inputs' arrays in one Zarr store: the
    table (read as one) and the store equal one process's."""
    pq = pytest.importorskip("pyarrow.parquet")
    zarr = pytest.importorskip("zarr")
    _photos(tmp_path / "in", n=8)
    cam = ["-m", "hookviz", "gradcam", "in", *ARGS, "--method", "gradcam,layercam", "--records", "parquet",
           "--maps", "zarr", "--no-pictures"]  # fmt: skip
    one = _run([sys.executable, *cam, "--out", "one"], tmp_path)
    two = _run([*TORCHRUN, "--nproc-per-node", "2", *cam, "--out", "two"], tmp_path)
    assert one.returncode == two.returncode == 1, two.stderr  # broken.png failed; the others were done
    parts = sorted(p.name for p in (tmp_path / "two" / "records.parquet").iterdir())
    assert sorted(p.rsplit("-", 1)[1] for p in parts) == ["0.parquet", "1.parquet"], parts  # a part per rank

    def rows(out: str) -> list[tuple[object, ...]]:
        table = pq.read_table(tmp_path / out / "records.parquet").to_pylist()
        return sorted((r["input"], r["method"], r["status"], r["predicted_index"]) for r in table)

    assert rows("one") == rows("two") and len(rows("one")) == 8 * 2 + 1
    stores = {out: zarr.open_group(str(tmp_path / out / "maps.zarr"), mode="r") for out in ("one", "two")}
    prefixes = sorted(stores["one"].keys())
    assert prefixes == sorted(stores["two"].keys()) and len(prefixes) == 8
    for prefix in prefixes:
        for name in ("gradcam.layer4", "layercam.layer4", "gradcam.layer4.full"):
            a, b = (stores[out][prefix][name] for out in ("one", "two"))
            assert a.attrs["complete"] and b.attrs["complete"] and a.attrs["box"] == b.attrs["box"]
            np.testing.assert_allclose(a[...].astype(np.float32), b[...].astype(np.float32), atol=2e-3)


@pytest.mark.slow
def test_two_torchrun_jobs_and_a_rerun_with_fewer_ranks_keep_every_row(tmp_path: Path) -> None:
    """Two torchrun jobs of two ranks, each over its own folder, into one --out, then one process over both
    folders (every photo skipped): the Parquet table (every part, as pyarrow.dataset reads the folder) holds
    each photo's rows once, as the manifest does, and the Zarr store each photo's arrays."""
    ds = pytest.importorskip("pyarrow.dataset")
    zarr = pytest.importorskip("zarr")
    for k in range(2):
        (tmp_path / f"in{k}").mkdir()
        for i in range(3):
            rgb = np.random.default_rng(10 * k + i).integers(0, 256, (40, 52, 3), dtype=np.uint8)
            write_image(tmp_path / f"in{k}" / f"p{k}{i}.png", rgb)
    cam = [*ARGS, "--records", "parquet", "--maps", "zarr", "--no-pictures", "--out", "o"]
    for k in range(2):
        job = _run([*TORCHRUN, "--nproc-per-node", "2", "-m", "hookviz", "gradcam", f"in{k}", *cam], tmp_path)
        assert job.returncode == 0, job.stderr
    again = _run([sys.executable, "-m", "hookviz", "gradcam", "in0", "in1", *cam], tmp_path)
    assert again.returncode == 0, again.stderr
    recs = _records(tmp_path / "o")
    assert [r["status"] for r in recs] == ["ok"] * 6 + ["skipped"] * 6
    rows = ds.dataset(tmp_path / "o" / "records.parquet", format="parquet").to_table().to_pylist()
    assert sorted((r["input"], r["status"], r["prefix"]) for r in rows) == sorted(
        (r["input"], r["status"], r["prefix"]) for r in recs[:6]
    )
    assert len(zarr.open_group(str(tmp_path / "o" / "maps.zarr"), mode="r")) == 6


RANDOM_64 = ["--weights", "none", "--input-size", "64", "--device", "cpu"]


def test_two_jobs_in_one_folder_merge_only_their_own_parts(tmp_path: Path) -> None:
    from hookviz.run.distributed import merge_parts

    mine = tmp_path / f".manifest.jobA.rank1.{os.getpid()}.jsonl"
    theirs = tmp_path / f".manifest.jobB.rank0.{os.getpid()}.jsonl"
    mine.write_text('{"input": "a"}\n')
    theirs.write_text('{"input": "b"}\n')
    assert merge_parts(tmp_path, "manifest.jsonl", only_dead=False, job="jobA") == 1
    assert not mine.exists() and theirs.exists()  # the other job's live part is left alone


def test_a_killed_jobs_parts_are_merged_before_a_one_process_resume(two_photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke("gradcam", str(two_photos), *RANDOM_64, "--out", str(out), "-q")
    assert r.exit_code == 0
    stale = out / ".manifest.jobZ.rank1.999999.jsonl"  # a dead process's part
    stale.write_text(json.dumps({"input": "old.png", "status": "error", "error": "killed"}) + "\n")
    r = invoke("gradcam", str(two_photos), *RANDOM_64, "--out", str(out), "-q")
    assert r.exit_code == 0 and not stale.exists()
    inputs = [x["input"] for x in records(out)]
    assert inputs.index("old.png") < len(inputs) - 2  # before this run's records, not after them


def test_a_usage_error_under_torchrun_is_said_once(tmp_path: Path) -> None:
    said = []
    for rank in ("0", "1"):
        env = {**os.environ, "RANK": rank, "WORLD_SIZE": "2", "LOCAL_RANK": rank}
        res = run_cli([sys.executable, "-m", "hookviz", "gradcam", "-", *RANDOM_64, "--out",
                       str(tmp_path / "o")], input="x.png\n", cwd=ROOT, env=env)  # fmt: skip
        assert res.returncode == 2 and "Traceback" not in res.stderr
        said.append(res.stderr.strip())
    assert "not supported under torchrun" in said[0] and said[1] == ""


@pytest.mark.slow
def test_layer_auto_is_one_choice_per_torchrun_job(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    for i in range(4):
        write_image(d / f"p{i}.png", np.random.default_rng(i).integers(0, 256, (50, 60, 3), np.uint8))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "hookviz", "gradcam", "in", *RANDOM_64, "--layer", "auto", "--probe", "2",
           "--out", "o", "-q"]  # fmt: skip
    res = run_cli(cmd, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    recs = records(tmp_path / "o")
    assert len(recs) == 4 and len({r["key"] for r in recs}) == 1 and len({r["layer"] for r in recs}) == 1
    assert res.stderr.count("--layer auto chose") == 1
