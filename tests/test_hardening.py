"""Hardening: every bad input gets one clear line and its exit code, nothing is lost, nothing leaks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from hookviz.core.hooks import trace_shapes
from hookviz.engine.explain import explain, grad_cam
from hookviz.engine.features import feature_maps
from hookviz.io.images import Preprocess, load_rgb
from hookviz.methods import cams
from hookviz.render import overlay
from hookviz.summary import summarize
from hookviz.training.gradients import gradient_flow
from tests.conftest import (
    BUILT_IN_CAMS,
    GRADIENT_FORMULAS,
    PATIENCE,
    ROOT,
    SAMPLES,
    TinyCNN,
    hook_counts,
    invoke,
    run_cli,
    started,
    write_image,
)

FAST = ["--weights", "none", "--input-size", "64", "--device", "cpu"]
HOOKVIZ = [sys.executable, "-m", "hookviz"]


def checksums(folder: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture
def zoo(tmp_path: Path) -> Path:
    """Every kind of awkward input, made here."""
    d = tmp_path / "zoo"
    (d / "a").mkdir(parents=True)
    (d / "b").mkdir()
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    write_image(d / "a" / "cat.jpg", rgb)
    write_image(d / "b" / "cat.jpg", rgb[::-1].copy())  # same name, other folder
    write_image(d / "my cat.png", rgb)
    write_image(d / "ünïcødé 猫.png", rgb)
    write_image(d / "-rf --overwrite.png", rgb)
    write_image(d / "one.png", rgb[:1, :1].copy())  # 1x1
    Image.fromarray(rgb).convert("L").save(d / "gray.png")
    Image.fromarray(rgb).convert("LA").save(d / "gray_alpha.png")
    Image.fromarray(rgb).convert("RGBA").save(d / "rgba.png")
    Image.fromarray(rgb).convert("P").save(d / "palette.png")
    Image.fromarray(rgb).convert("CMYK").save(d / "cmyk.jpg")
    Image.fromarray((rng.integers(0, 65535, (30, 30))).astype(np.uint16)).save(d / "sixteen.png")
    (d / "zero.jpg").write_bytes(b"")
    (d / "text.png").write_text("this is not a png")
    data = (d / "a" / "cat.jpg").read_bytes()
    (d / "truncated.jpg").write_bytes(data[: len(data) // 2])
    os.symlink(d, d / "a" / "loop")
    return d


def test_the_zoo_in_one_batch_run(zoo: Path, tmp_path: Path) -> None:
    before = checksums(zoo)
    out = tmp_path / "out"
    r = invoke("gradcam", str(zoo), *FAST, "--out", str(out), "-q", "--batch-size", "4")
    assert r.exit_code == 1
    recs = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    status = {Path(x["input"]).relative_to(zoo).as_posix(): x["status"] for x in recs}
    bad = {"zero.jpg", "text.png", "truncated.jpg"}
    assert {k for k, v in status.items() if v == "error"} == bad
    assert len([v for v in status.values() if v == "ok"]) == 12
    errors = [line for line in r.stderr.splitlines() if line.startswith("hookviz: ") and "failed" not in line]
    assert len(errors) == 3 and all(any(b in e for b in bad) for e in errors)
    assert "Traceback" not in r.stderr
    assert checksums(zoo) == before  # inputs never modified
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == 12 and all(p[0].isalnum() for p in pngs)  # no leading dash, no hidden file
    assert (
        len({p.split("-")[0] for p in pngs if p.startswith("cat-")}) == 1
        and sum(p.startswith("cat-") for p in pngs) == 2
    )
    for p in out.glob("*.png"):
        assert p.resolve().parent == out.resolve()
        with Image.open(p) as im:
            im.load()


def test_a_directory_of_non_images_and_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    r = invoke(
        "gradcam", str(tmp_path / "docs"), str(tmp_path / "empty"), *FAST, "--out", str(tmp_path / "o")
    )
    assert r.exit_code == 1
    assert r.stderr.count("no images found in this folder") == 2


def test_a_huge_image_is_refused_with_a_clear_limit(tmp_path: Path) -> None:
    Image.new("L", (12000, 12000)).save(tmp_path / "huge.png", compress_level=1)
    write_image(tmp_path / "ok.png", np.zeros((20, 20, 3), np.uint8))
    r = invoke("gradcam", str(tmp_path), *FAST, "--out", str(tmp_path / "o"), "-q")
    assert r.exit_code == 1
    assert "huge.png': image is 12000x12000 = 144,000,000 px, over the limit of 80,000,000 px" in r.stderr
    assert "--max-pixels" in r.stderr


def test_exif_rotated_photo_is_explained_upright(tmp_path: Path) -> None:
    img = Image.fromarray(np.zeros((30, 50, 3), np.uint8))
    exif = img.getexif()
    exif[0x0112] = 6
    img.save(tmp_path / "r.jpg", exif=exif)
    r = invoke("gradcam", str(tmp_path / "r.jpg"), *FAST, "--out", str(tmp_path / "o"), "-q")
    assert r.exit_code == 0
    (rec,) = [json.loads(line) for line in (tmp_path / "o" / "manifest.jsonl").read_text().splitlines()]
    x0, y0, x1, y1 = rec["box"]
    assert (x1 - x0, y1 - y0) == (26, 26)  # the 224/256 centre crop of a 30 x 50 (upright) photo
    assert (x0, y0) == (2, 12)  # 2 px in from the 30 px sides, 12 from the 50 px top and bottom


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b"\x00" * 100), "not a readable PyTorch weights file"),
        (
            lambda p: torch.save(torchvision.models.resnet34(weights=None).state_dict(), p),
            "does not fit resnet18",
        ),
        (lambda p: torch.save({"x": _Evil()}, p), "could run code"),
    ],
)
def test_bad_weights_files_exit_3(tmp_path: Path, make: object, message: str) -> None:
    path = tmp_path / "w.pth"
    make(path)  # type: ignore[operator]
    write_image(tmp_path / "x.png", np.zeros((8, 8, 3), np.uint8))
    r = invoke("gradcam", str(tmp_path / "x.png"), "--weights", str(path), "--out", str(tmp_path / "o"))
    assert r.exit_code == 3 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


def test_unwritable_output_folder_exit_3(tmp_path: Path) -> None:
    write_image(tmp_path / "x.png", np.zeros((8, 8, 3), np.uint8))
    r = invoke("gradcam", str(tmp_path / "x.png"), *FAST, "--out", "/proc/hookviz-cannot-be-here")
    assert r.exit_code == 3 and "--out /proc/hookviz-cannot-be-here: cannot create the folder" in r.stderr


def test_a_model_failure_is_one_line_and_the_batch_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookviz import jobs

    calls = {"n": 0}
    real = jobs.CamJob.compute

    def flaky(self: object, x: torch.Tensor) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(self, x)  # type: ignore[arg-type]

    monkeypatch.setattr(jobs.CamJob, "compute", flaky)
    for i in range(4):
        write_image(tmp_path / f"{i}.png", np.full((8, 8, 3), i * 40, np.uint8))
    out = tmp_path / "o"
    r = invoke("gradcam", str(tmp_path), *FAST, "--out", str(out), "--batch-size", "2", "-q")
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("the model failed on this batch: RuntimeError: CUDA out of memory (simulated)") == 2
    statuses = [json.loads(line)["status"] for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert statuses == ["error", "error", "ok", "ok"]


def _raising(model: torch.nn.Module, layer: str) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected")

    dict(model.named_modules())[layer].forward = boom  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "run",
    [
        lambda m, x: explain(m, x, ["features.4", "features.8"], list(BUILT_IN_CAMS), "top2"),
        lambda m, x: grad_cam(m, x, "features.8"),
        lambda m, x: feature_maps(m, x, ["features.0", "features.8"], "both"),
        lambda m, x: summarize(m, (3, 16, 16)),
        lambda m, x: gradient_flow(m, x, lambda z: z.sum()),
        lambda m, x: trace_shapes(m, x),
    ],
    ids=["explain", "grad_cam", "feature_maps", "summarize", "gradient_flow", "trace_shapes"],
)
def test_an_exception_mid_forward_leaves_the_model_as_found(run: object) -> None:
    model = TinyCNN()
    model.train()
    model.fc.weight.grad = torch.zeros_like(model.fc.weight)
    grads = [p.grad for p in model.parameters()]
    keys = list(model.state_dict())
    _raising(model, "features.9")
    with pytest.raises(RuntimeError, match="injected"):
        run(model, torch.randn(2, 3, 16, 16))  # type: ignore[operator]
    del model.features[9].forward
    assert hook_counts(model) == 0 and all(m.training for m in model.modules())
    assert [p.grad for p in model.parameters()] == grads and list(model.state_dict()) == keys
    assert torch.is_grad_enabled()


@pytest.mark.slow
def test_a_thousand_grad_cams_do_not_grow_memory() -> None:
    import psutil

    model = TinyCNN().eval()
    x = torch.randn(2, 3, 32, 32)
    proc = psutil.Process()
    for _ in range(100):
        grad_cam(model, x, "features.8")
    start = proc.memory_info().rss
    for _ in range(1000):
        grad_cam(model, x, "features.8")
    growth = proc.memory_info().rss - start
    assert growth < 8 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 1000 calls"
    assert hook_counts(model) == 0


def _gradcam_cmd(src: Path, out: Path, *extra: str) -> list[str]:
    """The run the kill tests interrupt and resume: two methods, raw maps and a sheet per input."""
    return [
        *HOOKVIZ, "gradcam", str(src), "--weights", "none", "--device", "cpu", "--out", str(out),
        "--method", "gradcam", "--method", "layercam", "--save-raw", *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def _slow_run(tmp_path: Path, n: int = 48) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        write_image(
            src / f"img{i:03d}.png", np.random.default_rng(i).integers(0, 256, (300, 400, 3), dtype=np.uint8)
        )
    out = tmp_path / "out"
    cmd = _gradcam_cmd(src, out, "--batch-size", "2")
    # A shell that ignores SIGINT (nohup, `cmd &`, some CI runners) passes that on to its children, and
    # Python then never turns SIGINT into KeyboardInterrupt: pretend to be such a parent, and give the
    # child the default handler back, as a user's terminal would.
    with contextlib.ExitStack() as stack:  # the run's whole process group ends with the test
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc = stack.enter_context(
                started(
                    cmd,
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                )
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        deadline = time.monotonic() + PATIENCE
        manifest = out / "manifest.jsonl"
        # mid-run: pictures written (by the pool's threads, ahead of their records) and some inputs recorded
        while time.monotonic() < deadline and (
            len(list(out.glob("*.png"))) < 6 or not manifest.exists() or not manifest.read_bytes().strip()
        ):
            assert proc.poll() is None, "the run ended before it could be interrupted"
            time.sleep(0.05)
        yield proc, src, out


def _check_complete(out: Path) -> int:
    for png in out.glob("*.png"):
        with Image.open(png) as im:
            im.load()  # raises on a half-written file
    for npy in out.glob("*.npy"):
        np.load(npy)
    lines = (out / "manifest.jsonl").read_text().splitlines() if (out / "manifest.jsonl").exists() else []
    for line in lines:
        json.loads(line)  # every line complete
    return len(lines)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_a_killed_run_leaves_only_complete_files_and_resumes(tmp_path: Path, sig: signal.Signals) -> None:
    with _slow_run(tmp_path) as (proc, src, out):
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=PATIENCE)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
        assert not list(out.glob(".*.tmp"))
    else:
        assert proc.returncode == -signal.SIGKILL
    done = _check_complete(out)
    assert 0 < done < 48
    before = checksums(src)
    res = run_cli(_gradcam_cmd(src, out, "--batch-size", "8", "--skip-existing", "-q"), cwd=ROOT)
    assert res.returncode == 0, res.stderr
    recs = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()][done:]
    assert len(recs) == 48
    assert sum(r["status"] == "skipped" for r in recs) >= 1
    # An image whose outputs were only partly written is redone; everything ends complete.
    assert all(r["status"] in ("ok", "skipped") for r in recs)
    _check_complete(out)
    assert not list(out.glob(".*.tmp"))  # stale temp files of the killed run are gone
    assert len(list(out.glob("*.gradcam.*.png"))) == 48 and checksums(src) == before


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    h=st.integers(1, 70),
    w=st.integers(1, 70),
    mode=st.sampled_from(["L", "LA", "RGB", "RGBA", "P", "I;16", "1", "CMYK", "F"]),
    fmt=st.sampled_from(["png", "tiff", "jpeg", "bmp", "webp"]),
    seed=st.integers(0, 2**16),
)
def test_any_image_loads_and_renders(tmp_path: Path, h: int, w: int, mode: str, fmt: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65535, (h, w)).astype(np.uint16))
    elif mode == "F":
        img = Image.fromarray(rng.normal(size=(h, w)).astype(np.float32))
    else:
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).convert(mode)
    path = tmp_path / f"x.{fmt}"
    try:
        img.save(path)
    except (OSError, ValueError, KeyError):
        return  # the format cannot hold this mode: nothing to read
    rgb = load_rgb(path)
    assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3 and rgb.shape[:2] == (h, w)
    x, box = Preprocess(crop_size=32, resize_size=36)(rgb)
    assert x.shape == (3, 32, 32) and np.isfinite(x).all()
    assert 0 <= box.x0 < box.x1 <= w and 0 <= box.y0 < box.y1 <= h
    out = overlay(rgb, rng.normal(size=(4, 4)).astype(np.float32), box)
    assert out.shape == rgb.shape and out.dtype == np.uint8


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    b=st.integers(1, 3),
    k=st.integers(1, 5),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    special=st.sampled_from(["none", "zero_grads", "nan_acts", "inf_acts", "zero_acts", "huge"]),
    seed=st.integers(0, 2**16),
)
def test_cam_math_never_crashes_and_renders_finite(
    b: int, k: int, h: int, w: int, special: str, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(b, k, h, w, generator=g)
    grads = torch.randn(b, k, h, w, generator=g)
    if special == "zero_grads":
        grads.zero_()
    elif special == "nan_acts":
        a[0, 0, 0, 0] = float("nan")
    elif special == "inf_acts":
        a[0, 0, 0, 0] = float("inf")
    elif special == "zero_acts":
        a.zero_()
    elif special == "huge":
        a *= 1e30
    maps = [fn(a, grads) for fn in GRADIENT_FORMULAS]
    maps.append(cams.eigen_cam(a))
    maps.append(cams.score_cam(a, torch.randn(b, k, generator=g)))
    rgb = np.zeros((10, 12, 3), np.uint8)
    from hookviz.io.images import Box

    for m in maps:
        assert m.shape == (b, h, w)
        if special in ("none", "zero_grads", "zero_acts"):
            assert torch.isfinite(m).all()
        pic = overlay(rgb, m[0].numpy(), Box(0, 0, 12, 10))
        assert pic.dtype == np.uint8 and pic.shape == rgb.shape  # never NaN pixels: uint8 by construction
    assert torch.isfinite(cams.eigen_cam(a)).all() or special == "huge"


def test_help_lists_every_command_with_help_text() -> None:
    r = invoke("--help")
    for command in ("gradcam", "featuremaps", "layers", "models", "summary", "gradflow", "dropblock"):
        assert command in r.stdout
        sub = invoke(command, "--help")
        assert sub.exit_code == 0 and "Usage" in sub.stdout
    assert SAMPLES.exists()
