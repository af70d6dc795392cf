"""A full run of every command on one small fixed input against the files it wrote before
(tests/golden/runs/): file names, printed text, JSON structure and integers exactly; floats, raw maps and
pictures within a tolerance (tests/golden_compare.py), so that the goldens hold on any CPU. A reshaping
of the code (modules, registries) must leave all of it as it was; ``pytest --update-golden`` rewrites it
on purpose."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz import render
from tests.conftest import PATIENCE, ROOT, invoke, run_cli, write_image
from tests.golden_compare import TEXT_SUFFIXES, compare_file

GOLDEN = Path(__file__).parent / "golden" / "runs"

MODEL = ["--model", "tests.shapes_net:make", "--weights", "none", "--input-size", "48", "--device", "cpu"]
LABELS = "square\ndisc\ncross\n"


def _mask(text: str, root: Path) -> str:
    text = text.replace(str(root), "<tmp>")
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", "<time>", text)
    text = re.sub(r"(evaluation(?:_by_class)?\.)[0-9a-f]{8}\.", r"\1KEY.", text)  # keyed by its settings
    return re.sub(r"(-)[0-9a-f]{8}(\.)", r"\1PATHHASH\2", text)


#: The methods of the golden gradcam run, named (what ``--method all`` gave when the files were made): a
#: method added to ``all`` changes no golden file.
GOLDEN_METHODS = (
    "gradcam,gradcampp,xgradcam,layercam,hirescam,eigencam,scorecam,guidedbackprop,guidedgradcam,"
    "gradcamelementwise,eigengradcam,segeigencam,kpcacam,fem,finercam,shapleycam,refinecam,saliency,"
    "inputxgradient,fullgrad"
)

COMMANDS: dict[str, list[str]] = {
    "gradcam": ["gradcam", "{photo}", *MODEL, "--method", GOLDEN_METHODS, "--layer", "body.6", "--layer",
                "body", "--target", "top2", "--save-raw", "--metrics", "--fuse", "mean", "--report"],
    "featuremaps": ["featuremaps", "{photo}", *MODEL, "--layers", "body.*", "--stage", "both"],
    "evaluate": ["evaluate", "{photo}", *MODEL, "--method", "gradcam", "--method", "layercam"],
    "sanity": ["sanity", "{photo}", *MODEL],
    "gradflow": ["gradflow", "{photo}", *MODEL],
    "dropblock": ["dropblock", "{photo}", *MODEL, "--layer", "body.3", "--block-size", "3"],
    "layers": ["layers", *MODEL[:-2]],
    "summary": ["summary", "--model", "tests.shapes_net:make", "--input-size", "3,48,48"],
}  # fmt: skip


def _threads() -> int:
    return int(os.environ.get("HOOKVIZ_GOLDEN_THREADS", "1"))


@pytest.fixture
def threads() -> Iterator[None]:
    """One thread by default (as make test's workers run); the subprocess test below asks for another."""
    before = torch.get_num_threads()
    torch.set_num_threads(_threads())
    yield
    torch.set_num_threads(before)


def _run_everything(tmp_path: Path, run: Callable[..., Any] = invoke) -> dict[str, bytes]:
    """Every command on one photo: ``{command/file name: content}``, times, paths and path hashes masked;
    ``run(*args)`` runs one command (in process by default) and returns its exit code, stdout and stderr."""
    with _text_as_codes():
        return _run_all(tmp_path, run)


@contextlib.contextmanager
def _text_as_codes() -> Iterator[None]:
    """Captions and labels drawn as their characters' codes (``hookviz.render.TEST_TEXT``): the pictures are
    compared by their text, whatever OpenCV's fonts (5.1 draws and wraps otherwise than 5.0). A served run
    gets it through the client's environment."""
    before = os.environ.get(render.TEST_TEXT)
    os.environ[render.TEST_TEXT] = "codes"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(render.TEST_TEXT, None)
        else:
            os.environ[render.TEST_TEXT] = before


def _run_all(tmp_path: Path, run: Callable[..., Any]) -> dict[str, bytes]:
    rng = np.random.default_rng(7)
    photo = write_image(tmp_path / "photo.png", rng.integers(0, 256, (40, 52, 3), dtype=np.uint8))
    labels = tmp_path / "labels.txt"
    labels.write_text(LABELS)
    got: dict[str, bytes] = {}
    for name, args in COMMANDS.items():
        out = tmp_path / name
        filled = [a.replace("{photo}", str(photo)) for a in args]
        extra = ["--out", str(out), "-q"] if "{photo}" in args else []
        if name in ("gradcam", "evaluate", "sanity"):
            extra += ["--labels", str(labels)]
        r = run(*filled, *extra)
        assert r.exit_code == 0, (name, r.stderr)
        got[f"{name}/stdout"] = _mask(r.stdout, tmp_path).encode()
        if out.is_dir():
            for p in sorted(out.iterdir()):
                data = p.read_bytes()
                if p.suffix in TEXT_SUFFIXES:
                    data = _mask(data.decode("utf-8"), tmp_path).encode()
                got[f"{name}/{_mask(p.name, tmp_path)}"] = data
    return got


def test_every_command_writes_what_it_wrote_before(
    tmp_path: Path, request: pytest.FixtureRequest, threads: None
) -> None:
    got = _run_everything(tmp_path)
    if request.config.getoption("--update-golden"):
        shutil.rmtree(GOLDEN, ignore_errors=True)
        for name, data in got.items():
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_bytes(data)
    assert_golden(got)


def assert_golden(got: dict[str, bytes]) -> None:
    """``got`` (from :func:`_run_everything`) reads as the stored golden files."""
    stored = {str(p.relative_to(GOLDEN)): p.read_bytes() for p in sorted(GOLDEN.rglob("*")) if p.is_file()}
    assert sorted(got) == sorted(stored), "the set of output files changed"
    problems = [f"{name}: {why}" for name in got if (why := compare_file(name, stored[name], got[name]))]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_the_golden_run_holds_on_other_kernels_and_thread_counts() -> None:
    """The same comparison in a fresh process whose ATen kernels are the portable ones (no AVX: other
    reduction orders, other last bits) and which sums with two threads: what another CPU would compute."""
    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": "default",
        "HOOKVIZ_GOLDEN_THREADS": "2",
        "OMP_NUM_THREADS": "2",
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    test = f"{Path(__file__).relative_to(ROOT)}::test_every_command_writes_what_it_wrote_before"
    r = run_cli([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", test],
                cwd=ROOT, env=env, timeout=2 * PATIENCE)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
