"""hookviz on a GPU (``make test-cuda``): every command and the library's front doors (the Python API, the
warm server, the explorer's JSON API, ``vlm``) on ``--device cuda`` write what they write on the CPU, within
a tolerance; the peak GPU memory of each is recorded. Skipped, with the reason, where CUDA is not available.

``HOOKVIZ_TEST_DEVICE=cpu`` runs the same tests with the CPU in CUDA's place: a dry run of this file on a
machine without a GPU (it compares the CPU with itself). The peaks go to ``HOOKVIZ_CUDA_RESULTS`` (a JSON
file, default ``$OUT/cuda-results.json`` when ``OUT`` is set, else ``out/cuda-results.json``).

And, on any machine: :func:`hookviz.core.arrays.to_numpy`, the one way a tensor becomes an array, whatever
its device.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# TF32 (cuDNN's default for convolutions on Ampere and later) rounds products to 10 bits of mantissa: the
# maps would differ from the CPU's by about 1e-3. Set before CUDA starts, here and in every subprocess.
os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")

import numpy as np
import pytest
import torch

from hookviz.core.arrays import to_numpy
from tests.conftest import ROOT, Trained, invoke, records, run_cli, write_image
from tests.golden_compare import TEXT_SUFFIXES, Tolerance, compare_array, compare_file

DEVICE = os.environ.get("HOOKVIZ_TEST_DEVICE", "cuda")
#: A GPU sums in other orders than a CPU (and its transcendental functions round otherwise): looser than
#: the goldens' CPU-to-CPU tolerance, far tighter than any real difference between two maps.
GPU = Tolerance(rtol=2e-3, atol=1e-5, pixel=2, pixel_share=0.01, pixel_max=40)

cuda = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(
    DEVICE.startswith("cuda") and not torch.cuda.is_available(),
    reason="no CUDA device here (torch.cuda.is_available() is False): make test-cuda on a machine with a GPU",
)


def _results_path() -> Path:
    named = os.environ.get("HOOKVIZ_CUDA_RESULTS")
    if named:
        return Path(named)
    return Path(os.environ.get("OUT") or ROOT / "out") / "cuda-results.json"


@pytest.fixture(autouse=True)
def _peak_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each GPU test's peak GPU memory (``torch.cuda.max_memory_allocated``), in MiB, in the results file
    (the tests run in process; the warm server's child reports its own in its stderr only)."""
    on_gpu = request.node.get_closest_marker("cuda") is not None and DEVICE.startswith("cuda")
    if on_gpu and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    yield
    if not (on_gpu and torch.cuda.is_available()):
        return
    torch.cuda.synchronize()
    path = _results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    found = json.loads(path.read_text()) if path.exists() else {}
    found.setdefault("device", torch.cuda.get_device_name())
    found.setdefault("torch", torch.__version__)
    found.setdefault("peak_mib", {})[request.node.name] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    part = path.with_suffix(f".{os.getpid()}.part")
    part.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    part.replace(path)


# -- the one move to NumPy (any machine) ---------------------------------------------------------------------


def test_to_numpy_detaches_moves_and_widens() -> None:
    x = torch.arange(6.0, requires_grad=True).reshape(2, 3) * 2  # a graph: .numpy() would refuse it
    a = to_numpy(x)
    assert a.dtype == np.float32 and a.tolist() == [[0, 2, 4], [6, 8, 10]]
    assert to_numpy(x.to(torch.bfloat16)).dtype == np.float32  # NumPy has no bfloat16
    assert to_numpy(x, torch.float64).dtype == np.float64
    assert to_numpy(torch.tensor([True, False])).tolist() == [True, False]
    plain = torch.zeros(3)
    to_numpy(plain)[0] = 1.0  # a CPU tensor of its dtype: no copy, as .numpy()
    assert plain[0] == 1.0
    if torch.cuda.is_available():
        assert to_numpy(torch.ones(2, device="cuda")).tolist() == [1.0, 1.0]


# -- the commands ------------------------------------------------------------------------------------------


def _on(device: str, args: list[str]) -> list[str]:
    """``args`` with ``--device cpu`` made ``--device DEVICE`` (added where the command takes it)."""
    out = list(args)
    if "--device" in out:
        out[out.index("--device") + 1] = device
    return out


def _mask(text: str, out: Path) -> str:
    text = text.replace(str(out), "<out>")
    text = re.sub(r"\bcuda(:\d+)?\b", "cpu", text)  # where a record names its device
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d{4}|Z)?", "<time>", text)
    return re.sub(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", "<hash>", text)  # a key, not a number


def _files(out: Path) -> dict[str, bytes]:
    got: dict[str, bytes] = {}
    for p in sorted(q for q in out.rglob("*") if q.is_file()):
        data = p.read_bytes()
        if p.suffix in TEXT_SUFFIXES:
            data = _mask(data.decode("utf-8"), out).encode()
        got[_mask(str(p.relative_to(out)), out)] = data
    return got


def _compare(name: str, cpu: bytes, gpu: bytes) -> str | None:
    if not name.endswith(".npz"):
        return compare_file(name, cpu, gpu, GPU)
    a, b = np.load(io.BytesIO(cpu)), np.load(io.BytesIO(gpu))
    if sorted(a.files) != sorted(b.files):
        return f"arrays {sorted(a.files)} became {sorted(b.files)}"
    return next((f"{k}: {why}" for k in a.files if (why := compare_array(a[k], b[k], GPU))), None)


def _same(cpu: dict[str, bytes], gpu: dict[str, bytes]) -> None:
    assert sorted(cpu) == sorted(gpu), "the GPU run wrote other files"
    problems = [f"{name}: {why}" for name in cpu if (why := _compare(name, cpu[name], gpu[name]))]
    assert not problems, "\n".join(problems)


def _both(tmp_path: Path, args: list[str], **kw: Any) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Run the command on the CPU and on DEVICE, each into its own ``--out``; their files, masked."""
    found = []
    for i, device in enumerate(("cpu", DEVICE)):
        out = tmp_path / f"out{i}"
        r = invoke(*_on(device, args), "--out", str(out), **kw)
        assert r.exit_code == 0, (device, r.stderr)
        found.append({"stdout": _mask(r.stdout, out).encode(), **_files(out)})
    return found[0], found[1]


@cuda
@needs_gpu
def test_every_golden_command_writes_on_the_gpu_what_it_writes_on_the_cpu(tmp_path: Path) -> None:
    """gradcam (every method, raw maps, metrics, a report), featuremaps, evaluate, sanity, gradflow,
    dropblock, layers and summary, as the golden run has them."""
    from tests.test_golden_runs import _run_everything

    for side in ("cpu", "gpu"):
        (tmp_path / side).mkdir()
    cpu = _run_everything(tmp_path / "cpu")

    def on_gpu(*args: str) -> Any:
        return invoke(*_on(DEVICE, list(args)))

    gpu = _run_everything(tmp_path / "gpu", on_gpu)
    cpu = {k: _mask(v.decode(), tmp_path / "cpu").encode() if _text(k) else v for k, v in cpu.items()}
    gpu = {k: _mask(v.decode(), tmp_path / "gpu").encode() if _text(k) else v for k, v in gpu.items()}
    _same(cpu, gpu)


def _text(name: str) -> bool:
    return name.endswith("stdout") or name.endswith(TEXT_SUFFIXES)


@pytest.fixture
def shapes_weights(trained: Trained, tmp_path: Path) -> list[str]:
    """The trained shapes CNN as model options (on the CPU: ``_on`` moves them)."""
    weights = tmp_path / "w.pt"
    torch.save(trained.model.state_dict(), weights)
    labels = tmp_path / "labels.txt"
    labels.write_text("square\ndisc\ncross\n")
    return ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--labels", str(labels),
            "--input-size", "48", "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1",
            "--device", "cpu"]  # fmt: skip


def _shapes_folder(folder: Path, shape: int | None, n: int, seed: int) -> str:
    from hookviz.io.shapes import draw_shape

    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        img, _ = draw_shape(shape if shape is not None else i % 3, 48, rng)
        write_image(folder / f"{i:02d}.png", (img * 255).round().astype(np.uint8))
    return str(folder)


@cuda
@needs_gpu
def test_channels_and_tcav_on_the_gpu(tmp_path: Path, shapes_weights: list[str]) -> None:
    photos = _shapes_folder(tmp_path / "in", None, 12, 0)
    cpu, gpu = _both(tmp_path / "channels", ["channels", photos, *shapes_weights, "--layer", "features.6",
                                             "--top", "4", "-q"])  # fmt: skip
    _same(cpu, gpu)
    concept = _shapes_folder(tmp_path / "concept", 1, 12, 2)
    randoms = [_shapes_folder(tmp_path / f"random{i}", None, 12, 20 + i) for i in range(3)]
    rand = [a for r in randoms for a in ("--random", r)]
    discs = _shapes_folder(tmp_path / "discs", 1, 12, 1)
    cpu, gpu = _both(tmp_path / "tcav", ["tcav", discs, *shapes_weights, "--layer", "features.6", "--target",
                                         "disc", "--concept", f"disc={concept}", *rand])  # fmt: skip
    _same(cpu, gpu)


@cuda
@needs_gpu
def test_visualize_on_the_gpu(tmp_path: Path) -> None:
    """The optimisation starts from random numbers drawn on the device (CUDA's generator is not the CPU's):
    the same files and record fields, and a picture that drives the channel up as on the CPU."""
    args = ["visualize", "--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48",
            "--device", "cpu", "--layer", "features.4", "--channel", "3", "--steps", "8",
            "--size", "32"]  # fmt: skip
    cpu, gpu = _both(tmp_path, args)
    assert sorted(cpu) == sorted(gpu)
    for name in cpu:
        if name.endswith(".json"):
            a, b = json.loads(cpu[name]), json.loads(gpu[name])
            assert sorted(a) == sorted(b) and np.isfinite(np.asarray(b["objective"], dtype=float)).all()


@cuda
@needs_gpu
def test_vlm_on_the_gpu(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.vlm_models import PROMPTS, save

    folder = save("llava", tmp_path / "llava")
    photo = write_image(tmp_path / "p.png", np.random.default_rng(0).integers(0, 256, (57, 95, 3), np.uint8))
    args = ["vlm", str(photo), "--model", f"hf:{folder}", "--prompt", PROMPTS["llava"], "--answer", "a disc",
            "--save-raw", "--device", "cpu", "--json"]  # fmt: skip
    cpu, gpu = _both(tmp_path / "runs", args)
    _same(cpu, gpu)


# -- the front doors ---------------------------------------------------------------------------------------


@cuda
@needs_gpu
def test_the_python_api_on_the_gpu(trained: Trained) -> None:
    from hookviz import explain, feature_maps, grad_cam, summarize
    from hookviz.io.shapes import shapes_batch

    x, _, _ = shapes_batch(6, np.random.default_rng(5))
    cpu_model = trained.model.eval()
    import copy

    gpu_model = copy.deepcopy(cpu_model).to(DEVICE)
    a = grad_cam(cpu_model, x, "features.6")
    b = grad_cam(gpu_model, x.to(DEVICE), "features.6")
    assert b.maps.device.type == torch.device(DEVICE).type
    np.testing.assert_allclose(to_numpy(b.maps), to_numpy(a.maps), rtol=2e-3, atol=1e-5)
    np.testing.assert_allclose(to_numpy(b.probs), to_numpy(a.probs), rtol=1e-4, atol=1e-6)
    assert to_numpy(b.predicted).tolist() == to_numpy(a.predicted).tolist()
    ea = explain(cpu_model, x, ["features.6"], methods=("gradcam", "layercam", "scorecam"))
    eb = explain(gpu_model, x.to(DEVICE), ["features.6"], methods=("gradcam", "layercam", "scorecam"))
    assert sorted(ea.maps) == sorted(eb.maps)
    for key in ea.maps:
        np.testing.assert_allclose(to_numpy(eb.maps[key]), to_numpy(ea.maps[key]), rtol=2e-3, atol=1e-5)
    fa = feature_maps(cpu_model, x, ["features.2", "features.6"])
    fb = feature_maps(gpu_model, x.to(DEVICE), ["features.2", "features.6"])
    for p, q in zip(fa, fb, strict=True):
        np.testing.assert_allclose(to_numpy(q.tensor), to_numpy(p.tensor), rtol=1e-3, atol=1e-5)
    sa = summarize(cpu_model, (3, 48, 48), device="cpu")
    sb = summarize(gpu_model, (3, 48, 48), device=DEVICE)
    a, b = (_mask(str(s), ROOT).encode() for s in (sa, sb))
    assert compare_file("summary.txt", a, b, GPU) is None


@cuda
@needs_gpu
@pytest.mark.skipif(not hasattr(__import__("socket"), "AF_UNIX"), reason="Unix sockets only")
def test_the_warm_server_on_the_gpu(tmp_path: Path) -> None:
    """A client's ``--device cuda`` command in the server's forked child (CUDA must start in the child: a
    parent that had started it could not fork a working one) writes what a CPU run writes."""
    from tests.test_serve import _env, running_server

    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    sock = folder / "s.sock"
    photo = write_image(tmp_path / "p.png", np.random.default_rng(1).integers(0, 256, (40, 52, 3), np.uint8))
    args = ["gradcam", str(photo), "--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size",
            "32", "--device", "cpu", "--method", "gradcam", "--method", "scorecam", "--save-raw",
            "-q"]  # fmt: skip
    found = []
    with running_server(sock, ["-m", "hookviz"]):
        for device in ("cpu", DEVICE, DEVICE):  # twice: the second finds the model warm
            out = tmp_path / f"o-{len(found)}"
            r = run_cli([sys.executable, "-m", "hookviz", *_on(device, args), "--out", str(out)], cwd=ROOT,
                        env=_env(sock))  # fmt: skip
            assert r.returncode == 0 and "went away" not in r.stderr, (device, r.stderr)
            found.append(_files(out))
    _same(found[0], found[1])
    _same(found[0], found[2])


@cuda
@needs_gpu
def test_the_explorers_json_api_on_the_gpu(tmp_path: Path) -> None:
    import threading

    from hookviz.explore.server import Explorer
    from hookviz.explore.session import Session
    from hookviz.tasks import load_model
    from tests.test_explore import get

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        write_image(folder / f"p{i}.png", np.random.default_rng(i).integers(0, 256, (48, 64, 3), np.uint8))
    answers: list[dict[str, Any]] = []
    for device in ("cpu", DEVICE):
        torch.manual_seed(0)  # the same random weights on both
        loaded = load_model("tests.conftest:TinyCNN", "none", input_size=48, device=device)
        session = Session(loaded, [str(folder)])
        explorer = Explorer(session)
        thread = threading.Thread(target=explorer.serve_forever, daemon=True)
        thread.start()
        try:
            got: dict[str, Any] = {}
            for view in ("input=1&layer=features.4&method=layercam&target=2", "input=0&method=scorecam"):
                status, raw = get(explorer, f"/api/map?{view}&format=npy")
                assert status == 200, raw[:300]
                got[view] = np.load(io.BytesIO(raw), allow_pickle=False)
                status, data = get(explorer, f"/api/map?{view}&format=json")
                assert status == 200
                got[view + " record"] = json.loads(data)["record"]
            status, data = get(explorer, "/api/predict?input=0")
            assert status == 200
            got["predict"] = json.loads(data)
            status, data = get(explorer, "/api/channels?input=0&layer=features.4")
            assert status == 200
            got["channels"] = json.loads(data)
        finally:
            explorer.shutdown()
            explorer.server_close()
        answers.append(got)
    cpu, gpu = answers
    for key in cpu:
        if isinstance(cpu[key], np.ndarray):
            np.testing.assert_allclose(gpu[key], cpu[key], rtol=2e-3, atol=1e-5, err_msg=key)
        else:
            a = _mask(json.dumps(cpu[key], sort_keys=True), tmp_path)
            b = _mask(json.dumps(gpu[key], sort_keys=True), tmp_path)
            assert compare_file(f"{key}.json", a.encode(), b.encode(), GPU) is None, key


@cuda
@needs_gpu
def test_a_gpu_run_records_ok_for_every_input(tmp_path: Path) -> None:
    """A folder with a broken file: one bad item never stops the batch on the GPU either."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(3):
        write_image(folder / f"p{i}.png", np.random.default_rng(i).integers(0, 256, (40, 40, 3), np.uint8))
    (folder / "broken.png").write_text("not a picture")
    out = tmp_path / "out"
    r = invoke("gradcam", str(folder), "--model", "resnet18", "--weights", "none", "--input-size", "64",
               "--device", DEVICE, "--batch-size", "2", "--out", str(out), "-q")  # fmt: skip
    assert r.exit_code == 1, r.stderr
    assert sorted(x["status"] for x in records(out)) == ["error", "ok", "ok", "ok"]
