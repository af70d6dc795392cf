"""Images with other than three bands load as they are when the model's first layer says so: a 16-bit
greyscale scan keeps its 16 bits, a 4-band image keeps its fourth band; ``--mean``/``--std`` per band."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from hookviz.engine.explain import explain
from hookviz.io.images import load_bands
from hookviz.io.inputs import Item, read_input
from hookviz.tasks import load_model
from tests.conftest import ROOT, invoke, picture, records, write_image

GREY = f"{ROOT / 'tests' / 'bands_net.py'}:make_grey"
FOUR = f"{ROOT / 'tests' / 'bands_net.py'}:make_four"


def _scan(path: Path, seed: int = 0) -> np.ndarray:
    """A 16-bit greyscale PNG with values up to 60,000 (what an 8-bit reading would crush), returned."""
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 60_000, (40, 56), dtype=np.uint16)
    arr[10:20, 15:30] = 60_000
    Image.fromarray(arr).save(path)
    return arr


def test_a_16_bit_scan_keeps_its_bits(tmp_path: Path) -> None:
    arr = _scan(tmp_path / "scan.png")
    loaded = load_model(GREY, weights="DEFAULT", input_size=28, resize="squash")
    assert loaded.preprocess.channels == 1 and loaded.input_shape == (1, 28, 28)
    assert loaded.preprocess.mean == (0.0,) and loaded.preprocess.std == (1.0,)
    bands, shown = load_bands(tmp_path / "scan.png", 1)
    assert bands.shape == (40, 56, 1) and shown.shape == (40, 56, 3) and shown.dtype == np.uint8
    assert np.allclose(bands[:, :, 0], arr / 65535.0)
    _, x, _ = read_input(Item(name="scan.png", path=tmp_path / "scan.png"), loaded.preprocess, 10**8)
    want = cv2.resize(arr.astype(np.float32) / 65535.0, (28, 28), interpolation=cv2.INTER_AREA)
    assert x.shape == (1, 28, 28) and np.allclose(x[0], want, atol=1e-6)
    assert len(np.unique(x)) > 256  # more levels than 8 bits could hold
    ex = explain(loaded.model, torch.from_numpy(x)[None], ["conv2"], ["gradcam"])
    assert torch.isfinite(ex.maps[("gradcam", "conv2")]).all()


def test_greyscale_from_the_cli_and_an_rgb_photo_fails_alone(tmp_path: Path) -> None:
    (folder := tmp_path / "in").mkdir()
    _scan(folder / "a_scan.png")
    write_image(folder / "b_photo.png", np.zeros((30, 30, 3), np.uint8))
    r = invoke("gradcam", str(folder), "--model", GREY, "--weights", "DEFAULT", "--input-size", "28",
               "--out", str(tmp_path / "out"))  # fmt: skip
    assert r.exit_code == 1, r.output  # one input failed, the other was done
    assert "takes 1 band(s): images are read as they are" in r.stderr
    recs = {Path(str(rec["input"])).name: rec for rec in records(tmp_path / "out")}
    assert recs["a_scan.png"]["status"] == "ok"
    picture(recs["a_scan.png"]["outputs"][0], min_size=(28, 28))
    assert "3 band(s)" in recs["b_photo.png"]["error"] and "takes 1" in recs["b_photo.png"]["error"]
    r = invoke("layers", "--model", GREY, "--weights", "DEFAULT", "--input-size", "28")
    assert r.exit_code == 0 and "1x8x28x28" in r.stdout, r.output  # traced with a 1-band input


def test_four_bands_with_their_own_mean_and_std(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (36, 48, 4), dtype=np.uint8)
    Image.fromarray(rgba, mode="RGBA").save(tmp_path / "four.png")
    mean, std = (0.5, 0.4, 0.3, 0.2), (0.25, 0.2, 0.3, 0.1)
    loaded = load_model(FOUR, weights="DEFAULT", input_size=24, resize="squash", mean=mean, std=std)
    _, x, _ = read_input(Item(name="four.png", path=tmp_path / "four.png"), loaded.preprocess, 10**8)
    resized = cv2.resize(rgba.astype(np.float32) / 255.0, (24, 24), interpolation=cv2.INTER_AREA)
    want = ((resized - np.array(mean, np.float32)) / np.array(std, np.float32)).transpose(2, 0, 1)
    assert np.allclose(x, want, atol=1e-5)  # the alpha band is a band, not composited away
    spec = ["--model", FOUR, "--weights", "DEFAULT", "--input-size", "24"]
    r = invoke("gradcam", str(tmp_path / "four.png"), *spec, "--mean", "0.5,0.4,0.3,0.2", "--std",
               "0.25,0.2,0.3,0.1", "--out", str(tmp_path / "out"))  # fmt: skip
    assert r.exit_code == 0, r.output
    [rec] = records(tmp_path / "out")
    assert rec["settings"]["input"]["mean"] == list(mean)
    r = invoke(
        "gradcam", str(tmp_path / "four.png"), *spec, "--mean", "0.5,0.5,0.5", "--out", str(tmp_path / "bad")
    )
    assert r.exit_code == 2 and "4 value(s)" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_rgb_models_are_unchanged(tmp_path: Path) -> None:
    loaded = load_model(f"{ROOT / 'tests' / 'heads_net.py'}:make_multilabel", weights="DEFAULT")
    assert loaded.preprocess.channels == 3 and loaded.input_shape[0] == 3
    with pytest.raises(Exception, match=r"takes 3 value\(s\) \(R,G,B\)"):
        load_model(f"{ROOT / 'tests' / 'heads_net.py'}:make_multilabel", weights="DEFAULT", mean=(0.5,))
