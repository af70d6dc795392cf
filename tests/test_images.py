"""Reading every common kind of image as upright RGB, and the crop geometry the maps are placed with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hookviz.errors import InputError
from hookviz.io.images import Box, Preprocess, decode_png, encode_png, load_rgb
from tests.conftest import SAMPLES, write_image


def _gradient(h: int = 20, w: int = 30) -> np.ndarray:
    yy, xx = np.mgrid[:h, :w]
    return np.stack([xx * 8 % 256, yy * 12 % 256, (xx + yy) * 4 % 256], axis=2).astype(np.uint8)


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "CMYK", "I;16", "1"])
def test_modes_become_rgb_uint8(tmp_path: Path, mode: str) -> None:
    rgb = _gradient()
    img = Image.fromarray(rgb)
    if mode == "I;16":
        gray = np.asarray(img.convert("L")).astype(np.uint16) * 257
        img = Image.fromarray(gray)
    else:
        img = img.convert(mode)
    path = tmp_path / ("x.tif" if mode == "CMYK" else "x.png")
    img.save(path)
    out = load_rgb(path)
    assert out.dtype == np.uint8 and out.shape == (20, 30, 3)
    if mode in ("L", "I;16"):
        expected = np.asarray(Image.fromarray(rgb).convert("L"))
        np.testing.assert_allclose(out[:, :, 0], expected, atol=1)


def test_alpha_is_composited_over_white(tmp_path: Path) -> None:
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 255
    rgba[:2, :, 3] = 255  # top half opaque red, bottom half transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    out = load_rgb(tmp_path / "a.png")
    assert out[0, 0].tolist() == [255, 0, 0]
    assert out[3, 0].tolist() == [255, 255, 255]


def test_exif_rotation_is_applied(tmp_path: Path) -> None:
    rgb = np.zeros((10, 20, 3), np.uint8)
    rgb[:, :5] = 255  # a white band on the left of the stored pixels
    img = Image.fromarray(rgb)
    exif = img.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    img.save(tmp_path / "r.jpg", exif=exif, quality=95)
    out = load_rgb(tmp_path / "r.jpg")
    assert out.shape == (20, 10, 3)  # displayed upright: portrait
    assert out[:5].mean() > 200 and out[-5:].mean() < 50  # the band is now on top


def test_bad_files_are_input_errors(tmp_path: Path) -> None:
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "text.png").write_text("hello")
    Image.fromarray(_gradient(200, 200)).save(tmp_path / "full.jpg")
    data = (tmp_path / "full.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 3])
    for name, message in [
        ("missing.jpg", "no such file"),
        ("empty.jpg", "not an image file"),
        ("text.png", "not an image file"),
        ("cut.jpg", "truncated or corrupt"),
    ]:
        with pytest.raises(InputError, match=message):
            load_rgb(tmp_path / name)
    with pytest.raises(InputError, match=r"200x200 = 40,000 px, over the limit of 100 px.*--max-pixels"):
        load_rgb(tmp_path / "full.jpg", max_pixels=100)


def test_crop_box_matches_torchvision_eval_transform() -> None:
    pre = Preprocess(crop_size=224, resize_size=256)
    # A 451x300 photo: the shorter side 300 → 256, the 224 crop is 262.5 px of the original, centred.
    assert pre.box(300, 451) == Box(94, 19, 357, 281)
    assert Preprocess(crop_size=224, resize_size=224, resize="squash").box(300, 451) == Box(0, 0, 451, 300)
    # DeiT's processor: squashed to 256 x 256, then the centre 224: 16 px of 256 off each side.
    assert Preprocess(resize="squash").box(256, 512) == Box(32, 16, 480, 240)
    x, _ = pre(_gradient(300, 451))
    assert x.shape == (3, 224, 224) and x.dtype == np.float32


def test_crop_agrees_with_torchvision_transforms() -> None:
    from torchvision.models import ResNet18_Weights

    rgb = load_rgb(SAMPLES / "cat.jpg")  # 451x300
    ours, _ = Preprocess()(rgb)
    theirs = ResNet18_Weights.DEFAULT.transforms()(torch.from_numpy(rgb.copy()).permute(2, 0, 1))
    theirs_np = theirs.numpy()
    # Same region, same normalisation; resampling filters differ slightly, a 3-pixel shift far more.
    aligned = np.abs(ours - theirs_np).mean()
    shifted = np.abs(ours[:, :, 3:] - theirs_np[:, :, :-3]).mean()
    assert aligned < 0.08 and shifted > 2 * aligned, (aligned, shifted)


def test_png_round_trip_keeps_rgb_order() -> None:
    rgb = _gradient()
    np.testing.assert_array_equal(decode_png(encode_png(rgb)), rgb)


def test_a_png_cut_short_is_said_to_be_truncated(tmp_path: Path) -> None:
    from hookviz.errors import InputError
    from hookviz.io.images import load_rgb

    whole = write_image(tmp_path / "whole.png", np.zeros((40, 40, 3), np.uint8)).read_bytes()
    for n in (12, 30, len(whole) // 2):
        (tmp_path / "cut.png").write_bytes(whole[:n])
        with pytest.raises(InputError, match="cut short|truncated"):
            load_rgb(tmp_path / "cut.png")
    (tmp_path / "text.png").write_text("not a picture at all")
    with pytest.raises(InputError, match="not an image file"):
        load_rgb(tmp_path / "text.png")


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header says ``width`` x ``height`` (RGB) and whose picture is missing."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_max_pixels_governs_pillows_bomb_limit_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A header of 60000x60000 (far over Pillow's own limit): the documented over-the-limit line under
    --max-pixels; a --max-pixels above it lets it past the size checks (to fail on its missing picture)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)
    path = tmp_path / "huge.png"
    path.write_bytes(_png_header(60000, 60000))
    with pytest.raises(
        InputError, match=r"over the limit of 1,000,000 px; downscale it or raise --max-pixels"
    ):
        load_rgb(path, max_pixels=1_000_000)
    with pytest.raises(InputError) as raised:
        load_rgb(path, max_pixels=9_000_000_000)
    assert "limit" not in str(raised.value) and "bomb" not in str(raised.value), raised.value
