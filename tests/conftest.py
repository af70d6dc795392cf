"""Shared fixtures: tiny models, a model trained on synthetic shapes, images made on the fly."""

from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")
# No test reaches the network: the Hugging Face hub (timm, transformers) answers from the cache or fails.
os.environ["HF_HUB_OFFLINE"] = "1"
# A developer's running `hookviz serve` must not take the tests' subprocesses (test_serve.py starts its own).
os.environ["HOOKVIZ_SERVER"] = "none"
# Under pytest-xdist (make test: two workers on two cores) each worker keeps to one core.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hookviz.io.images import Preprocess
from hookviz.io.shapes import SHAPES, draw_shape, shapes_batch
from hookviz.methods import cams
from hookviz.models.loaded import LoadedModel

__all__ = ["SHAPES", "draw_shape", "shapes_batch"]  # re-exported for the tests

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_images"


#: The longest test files, longest first (``make test``'s durations): handed out first, so that the rest
#: fills in around them (last, the sweep of every classifier would run alone for six minutes at the end).
LONGEST = (
    "test_torchvision_sweep.py",
    "test_dense.py",
    "test_real_models.py",
    "test_sources.py",
    "test_video_sweep.py",
    "test_distributed.py",
    "test_evaluation_sweep.py",
    "test_hardening.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow model sweeps first, the longest files first among them. The Makefile runs xdist with
    ``--no-loadscope-reorder``: by default it orders the files by their number of tests, which puts a file
    of one long sweep last whatever the order here."""
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, rank.get(item.path.name, 99)))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite tests/golden/ from the current output"
    )


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> object:
    """``golden(name, text)``: compare with tests/golden/name, or rewrite it under --update-golden."""

    def check(name: str, text: str) -> None:
        path = Path(__file__).parent / "golden" / name
        if request.config.getoption("--update-golden"):
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
        assert path.exists(), f"no golden file {path}; run pytest --update-golden"
        from tests.golden_compare import compare_text

        # Words and integers exactly, floats within a tolerance: another CPU gives other last bits.
        why = compare_text(path.read_text(), text)
        assert why is None, f"{name}: {why}"

    return check


if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
    np.random.seed(0)


#: The gradient-weighted CAMs by name, their formulas in the same order, and the built-in CAMs a sheet shows.
GRADIENT_METHODS = ("gradcam", "gradcampp", "xgradcam", "layercam", "hirescam")
GRADIENT_FORMULAS = (cams.grad_cam, cams.grad_cam_pp, cams.xgrad_cam, cams.layer_cam, cams.hires_cam)
BUILT_IN_CAMS = (*GRADIENT_METHODS, "eigencam", "scorecam", "guidedbackprop", "guidedgradcam")


class TinyCNN(nn.Module):
    """conv-bn-relu x3 with in-place ReLUs, global pooling and a linear head."""

    def __init__(self, classes: int = 3, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1),
            nn.BatchNorm2d(4 * width),
            nn.ReLU(inplace=True),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


@pytest.fixture
def tiny() -> TinyCNN:
    model = TinyCNN()
    model.train()
    return model


@dataclass
class Trained:
    model: TinyCNN
    accuracy: float


#: Where trained shapes models are kept for this run: the folder the xdist workers share, so that a model two
#: test files (or both workers) train is trained once. Set by the session fixture below; None outside pytest.
_TRAINED_CACHE: Path | None = None


@pytest.fixture(scope="session", autouse=True)
def _training_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    global _TRAINED_CACHE
    root = tmp_path_factory.getbasetemp()
    _TRAINED_CACHE = (root.parent if root.name.startswith("popen-gw") else root) / "trained-shapes"
    _TRAINED_CACHE.mkdir(exist_ok=True)


def _training_key(model: nn.Module, steps: int, seed: int, shift: float) -> str:
    """What the trained weights depend on: the model's code and structure, the training code and data,
    the settings and the torch version."""
    import hashlib
    import inspect

    import hookviz.io.shapes

    try:
        code = inspect.getsource(type(model))
    except (OSError, TypeError):  # a class without source: its name and structure stand for it
        code = type(model).__qualname__
    settings = repr((steps, seed, shift, torch.__version__))
    parts = [
        code,
        repr(model),
        inspect.getsource(train_on_shapes),
        inspect.getsource(hookviz.io.shapes),
        settings,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def train_on_shapes(model: nn.Module, steps: int = 400, *, seed: int = 0, shift: float = 0.0) -> nn.Module:
    """Train ``model`` on synthetic shapes (batches of 32, Adam with a one-cycle schedule); eval mode after.

    ``shift`` is subtracted from every input (0.5 centres them on the data's mean grey). A model trained
    earlier in this run with the same code and settings (and the same initial weights) is loaded instead of
    trained again, with the random state the training would have left.
    """
    cached = None
    if _TRAINED_CACHE is not None:
        start = hashlib_of(model)
        cached = _TRAINED_CACHE / f"{_training_key(model, steps, seed, shift)}-{start}.pt"
        if cached.exists():
            saved = torch.load(cached, weights_only=True)
            model.load_state_dict(saved["state"])
            torch.set_rng_state(saved["rng"])
            return model.eval()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=steps)
    model.train()
    for _ in range(steps):
        x, y, _ = shapes_batch(32, rng)
        loss = nn.functional.cross_entropy(model(x - shift), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    for p in model.parameters():
        p.grad = None
    if cached is not None:
        part = cached.with_suffix(f".{os.getpid()}.part")
        torch.save({"state": model.state_dict(), "rng": torch.get_rng_state()}, part)
        part.replace(cached)  # atomic: a worker reading it sees all of it or none
    return model.eval()


def hashlib_of(model: nn.Module) -> str:
    """A digest of the model's initial weights (training starts from them)."""
    import hashlib

    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


@pytest.fixture(scope="session")
def trained() -> Trained:
    """TinyCNN trained for a few seconds to tell squares, discs and crosses apart."""
    torch.manual_seed(0)
    model = train_on_shapes(TinyCNN())
    x, y, _ = shapes_batch(300, np.random.default_rng(99))
    with torch.no_grad():
        acc = float((model(x).argmax(1) == y).float().mean())
    return Trained(model, acc)  # type: ignore[arg-type]


def tiny_loaded(model: nn.Module, size: int = 48) -> LoadedModel:
    """Wrap a test model like ``load_model`` does (identity normalisation, no crop)."""
    return LoadedModel(
        model=model,
        name="tiny",
        weights="none (random init)",
        pretrained=False,
        categories=SHAPES,
        preprocess=Preprocess(crop_size=size, resize_size=size, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)),
        device=torch.device("cpu"),
    )


def hook_counts(model: nn.Module) -> int:
    """Every hook on the model: module hooks, and tensor and post-accumulate-grad hooks on its parameters."""
    modules = sum(
        len(m._forward_hooks)
        + len(m._forward_pre_hooks)
        + len(m._backward_hooks)
        + len(m._backward_pre_hooks)
        for m in model.modules()
    )
    tensors = sum(
        len(p._backward_hooks or {}) + len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
        for p in [*model.parameters(), *model.buffers()]
    )
    return modules + tensors


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """Four 40 x 40 noise photos in ``tmp_path/in``."""
    d = tmp_path / "in"
    d.mkdir()
    rng = np.random.default_rng(3)
    for i in range(4):
        write_image(d / f"p{i}.png", rng.integers(0, 256, (40, 40, 3), dtype=np.uint8))
    return d


def write_image(path: Path, rgb: np.ndarray) -> Path:
    from PIL import Image

    Image.fromarray(rgb).save(path)
    return path


def picture(path: str | Path, min_size: tuple[int, int] = (100, 100), min_colours: int = 20) -> np.ndarray:
    """Decode a written image completely and check that it is a picture: large enough, not blank."""
    from PIL import Image

    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"))
    assert rgb.shape[1] >= min_size[0] and rgb.shape[0] >= min_size[1], rgb.shape
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) >= min_colours
    return rgb


def invoke(*args: str, input: str | bytes | None = None) -> Any:
    """Run the ``hookviz`` CLI in process (stdout and stderr kept apart)."""
    from typer.testing import CliRunner

    from hookviz.cli import app

    return CliRunner().invoke(app, list(args), input=input)


def records(out: Path) -> list[dict[str, Any]]:
    """Every line of ``out/manifest.jsonl``, parsed."""
    import json

    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


@pytest.fixture
def built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision builds each random-init model once in a sweep: the commands that follow get a copy of it
    (the same seed-0 weights they would build themselves, without paying for the initialisation again, or
    for tracing its shapes again)."""
    import copy

    import torchvision

    from hookviz.core.trace import _TRACES

    build = torchvision.models.get_model
    last: dict[str, Any] = {}

    def get_model(name: str, **kwargs: Any) -> nn.Module:
        key = repr((name, sorted(kwargs.items())))
        if kwargs.get("weights") is not None:
            return build(name, **kwargs)
        if last.get("key") != key or torch.initial_seed() != last.get("seed"):
            last.update(key=key, seed=torch.initial_seed(), model=build(name, **kwargs))
        twin = copy.deepcopy(last["model"])
        # The copies share one cache of traced shapes (hooks.traced): identical modules give identical
        # shapes, so the commands that follow do not trace the architecture again.
        _TRACES[twin] = _TRACES.setdefault(last["model"], {})
        return twin

    monkeypatch.setattr(torchvision.models, "get_model", get_model)


def ball_video(path: Path, frames: int = 20, size: tuple[int, int] = (96, 72), grey: int = 50) -> Path:
    """An mp4 (15 fps) of a yellow ball crossing a grey ``size`` = (width, height) picture, left to right."""
    import cv2

    w, h = size
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), 15.0, (w, h))
    for k in range(frames):
        frame = np.full((h, w, 3), grey, np.uint8)
        cv2.circle(frame, (4 + (w - 8) * k // max(1, frames - 1), h // 2), max(3, h // 8), (0, 200, 255), -1)
        writer.write(frame)
    writer.release()
    return path


def evaluation_file(out: Path, kind: str = "evaluation", ext: str = "json") -> Path:
    """The one ``evaluate`` file of ``kind`` in ``out``: ``evaluation.KEY.json`` (keyed by its settings)."""
    (found,) = out.glob(f"{kind}.*.{ext}")
    return found


# -- subprocesses --------------------------------------------------------------------------------------

#: How long a test's subprocess may run before it is called hung: the margin a busy laptop needs. A command
#: that takes seconds on a quiet machine took over two minutes beside two CPU-heavy processes (``make test``
#: in a fresh clone); a hung one is still caught, later.
PATIENCE = 900.0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed its user: still there
        return True
    return True


def stop_group(proc: subprocess.Popen[Any], grace: float = 15.0) -> None:
    """End ``proc`` and every process of its group (it was started in a session of its own, by
    :func:`started`): SIGTERM first, which torchrun passes on to its ranks (they run in sessions of their
    own), then, whatever is left after ``grace`` seconds, SIGKILL. The leader is reaped and its pipes
    closed: nothing of it outlives the test, to fail the next one on the worker with a ResourceWarning."""
    pgid = proc.pid
    if proc.poll() is None or _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        # a zombie leader is still a member: poll() reaps it, so that an empty group reads as gone
        while (proc.poll() is None or _group_alive(pgid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@contextlib.contextmanager
def started(cmd: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """``subprocess.Popen(cmd, **popen)`` in a session (and process group) of its own; on the way out,
    however the test ends (an assertion, a ``TimeoutExpired``), the whole group is ended by
    :func:`stop_group`: a process the test left running cannot break a later test."""
    proc = subprocess.Popen(list(cmd), start_new_session=True, **popen)
    try:
        yield proc
    finally:
        stop_group(proc)


def run_cli(
    cmd: Sequence[str],
    *,
    timeout: float = PATIENCE,
    input: str | bytes | None = None,
    check: bool = False,
    capture_output: bool = True,
    text: bool = True,
    **popen: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` for the tests: the command in a process group of its own, a timeout with the
    margin a loaded machine needs (:data:`PATIENCE`), and on that timeout the whole group killed (children
    and torchrun's ranks too) before ``TimeoutExpired`` is raised."""
    if capture_output:
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stderr", subprocess.PIPE)
    if input is not None:
        popen["stdin"] = subprocess.PIPE
    with started(cmd, text=text, **popen) as proc:
        out, err = proc.communicate(input, timeout=timeout)
    res = subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
    if check:
        res.check_returncode()
    return res


@pytest.fixture
def labelled_photos(photos: Path) -> Path:
    """The four noise photos of :func:`photos`, and the shapes' class names beside them (``labels.txt``)."""
    (photos.parent / "labels.txt").write_text("square\ndisc\ncross\n")
    return photos


@pytest.fixture
def two_photos(tmp_path: Path) -> Path:
    """Two 60 x 50 noise photos (``a.png``, ``b.png``) in ``tmp_path/in``."""
    d = tmp_path / "in"
    d.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        write_image(d / name, rng.integers(0, 256, (50, 60, 3), dtype=np.uint8))
    return d
