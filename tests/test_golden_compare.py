"""The golden comparison fails where a user would see a change, and holds across last bits."""

from __future__ import annotations

import cv2
import numpy as np

from tests.golden_compare import compare_array, compare_file, compare_picture, compare_text


def test_text_numbers_within_tolerance_words_and_integers_exactly() -> None:
    assert compare_text('{"score": 0.123456789, "n": 3}', '{"score": 0.12345679, "n": 3}') is None
    assert compare_text('{"score": 0.1234, "n": 3}', '{"score": 0.1334, "n": 3}') is not None
    assert compare_text('{"score": 0.1234, "n": 3}', '{"score": 0.1234, "n": 4}') == "integer 3 became 4"
    assert compare_text('{"score": 0.1234}', '{"scorf": 0.1234}') is not None
    assert compare_text("0.372 ±0.041", "0.373 ±0.041") is None  # one unit of the last printed digit
    assert compare_text("0.372 ±0.041", "0.375 ±0.041") is not None
    assert compare_text("a-1b2c3d4.png", "a-1b2c3d5.png") is not None  # a hash is a word, not a number


def test_arrays_within_their_own_scale() -> None:
    a = np.linspace(0, 5, 20, dtype=np.float32).reshape(4, 5)
    assert compare_array(a, a + 1e-6) is None
    assert compare_array(a, a + 1e-2) is not None
    assert compare_array(a, a[:, :4]) is not None
    nan = a.copy()
    nan[0, 0] = np.nan
    assert compare_array(nan, nan.copy()) is None and compare_array(nan, a) is not None


def test_pictures_by_decoded_pixels() -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(10, 240, (30, 40, 3), dtype=np.uint8)

    def png(x: np.ndarray) -> bytes:
        return cv2.imencode(".png", x)[1].tobytes()

    near = img.copy()
    near[::2] += 1
    assert compare_picture(png(img), png(near)) is None
    far = img.copy()
    far[:5] += 5
    assert compare_picture(png(img), png(far)) is not None
    assert compare_file("x.png", png(img), png(img[:20])) is not None
