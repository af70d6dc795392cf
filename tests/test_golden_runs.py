"""A full run of every command on one small fixed input: file names, manifest records (less times and paths),
printed tables and the bytes of every file, against tests/golden/runs.json. A reshaping of the code (modules,
registries) must leave all of it exactly as it was; ``pytest --update-golden`` rewrites it on purpose."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import invoke, write_image

MODEL = ["--model", "tests.shapes_net:make", "--weights", "none", "--input-size", "48", "--device", "cpu"]
LABELS = "square\ndisc\ncross\n"


def _mask(text: str, root: Path) -> str:
    text = text.replace(str(root), "<tmp>")
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", "<time>", text)
    return re.sub(r"(-)[0-9a-f]{8}(\.)", r"\1<path hash>\2", text)


def _digest(path: Path, root: Path) -> str:
    data = path.read_bytes()
    if path.suffix in (".jsonl", ".json", ".csv", ".html", ".txt"):
        data = _mask(data.decode("utf-8"), root).encode()
    return hashlib.sha256(data).hexdigest()[:16]


COMMANDS: dict[str, list[str]] = {
    "gradcam": ["gradcam", "{photo}", *MODEL, "--method", "all", "--layer", "body.6", "--layer", "body",
                "--target", "top2", "--save-raw", "--metrics", "--fuse", "mean", "--report"],
    "featuremaps": ["featuremaps", "{photo}", *MODEL, "--layers", "body.*", "--stage", "both"],
    "evaluate": ["evaluate", "{photo}", *MODEL, "--method", "gradcam", "--method", "layercam"],
    "sanity": ["sanity", "{photo}", *MODEL],
    "gradflow": ["gradflow", "{photo}", *MODEL],
    "dropblock": ["dropblock", "{photo}", *MODEL, "--layer", "body.3", "--block-size", "3"],
    "layers": ["layers", *MODEL[:-2]],
    "summary": ["summary", "--model", "tests.shapes_net:make", "--input-size", "3,48,48"],
}  # fmt: skip


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Raw maps' last bits depend on how many threads sum them: the golden bytes are one thread's."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_command_writes_what_it_wrote_before(tmp_path: Path, golden: object, one_thread: None) -> None:
    rng = np.random.default_rng(7)
    photo = write_image(tmp_path / "photo.png", rng.integers(0, 256, (40, 52, 3), dtype=np.uint8))
    labels = tmp_path / "labels.txt"
    labels.write_text(LABELS)
    got: dict[str, dict[str, object]] = {}
    for name, args in COMMANDS.items():
        out = tmp_path / name
        filled = [a.replace("{photo}", str(photo)) for a in args]
        extra = ["--out", str(out), "-q"] if "{photo}" in args else []
        if name in ("gradcam", "evaluate", "sanity"):
            extra += ["--labels", str(labels)]
        r = invoke(*filled, *extra)
        assert r.exit_code == 0, (name, r.stderr)
        files = {}
        if out.is_dir():
            for p in sorted(out.iterdir()):
                files[_mask(p.name, tmp_path)] = _digest(p, tmp_path)
        got[name] = {
            "files": files,
            "stdout": hashlib.sha256(_mask(r.stdout, tmp_path).encode()).hexdigest()[:16],
        }
    golden("runs.json", json.dumps(got, indent=1, sort_keys=True) + "\n")  # type: ignore[operator]
