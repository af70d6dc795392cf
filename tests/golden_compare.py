"""Comparing a run's outputs with stored ones the way a user would judge them, so that they hold on any CPU:
names, text, JSON structure and integers exactly; floats within a tolerance; arrays within a tolerance of
their own scale; pictures by their decoded pixels.

Other CPUs (``ATEN_CPU_CAPABILITY``), other thread counts and other BLAS builds sum in other orders and give
other last bits, so bytes of computed floats are never compared.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import numpy as np

#: A number in text: sign, digits, an optional fraction and exponent (not a part of a word or a hex hash).
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")
TEXT_SUFFIXES = (".jsonl", ".json", ".csv", ".html", ".txt", ".md")


@dataclass(frozen=True)
class Tolerance:
    """``rtol``: relative to a value (text) or to an array's largest magnitude; ``pixel``: the largest change
    of a decoded 8-bit value; ``pixel_share``: the share of values that may differ by more (a colour-mapped
    value near a step of the colour map's table moves to the next entry)."""

    rtol: float = 1e-4
    atol: float = 1e-6
    pixel: int = 1
    pixel_share: float = 0.002
    pixel_max: int = 12


def _numbers(text: str) -> tuple[list[str], list[str]]:
    """The text without its numbers (a skeleton), and the numbers in order."""
    tokens = [m.group(0) for m in _NUMBER.finditer(text)]
    return _NUMBER.split(text), tokens


def compare_text(expected: str, got: str, tol: Tolerance = Tolerance()) -> str | None:
    """None when ``got`` reads as ``expected``: the same words and punctuation, the same integers, floats
    within ``tol`` (or one unit of their last printed digit: a printed 0.3725 may round either way); else the
    first difference, described."""
    skel_e, num_e = _numbers(expected)
    skel_g, num_g = _numbers(got)
    if skel_e != skel_g or len(num_e) != len(num_g):
        for i, (a, b) in enumerate(zip(expected.splitlines(), got.splitlines(), strict=False)):
            if _numbers(a)[0] != _numbers(b)[0]:
                at = next(
                    (k for k, (p, q) in enumerate(zip(a, b, strict=False)) if p != q), min(len(a), len(b))
                )
                lo = max(0, at - 80)
                shown = f"\n  expected …{a[lo : at + 120]!r}\n  got      …{b[lo : at + 120]!r}"
                return f"line {i + 1} differs beyond its numbers at character {at}:{shown}"
        return f"the texts differ in length or words ({len(expected)} vs {len(got)} characters)"
    for a, b in zip(num_e, num_g, strict=True):
        if a == b:
            continue
        integer = not re.search(r"[.eE]", a) and not re.search(r"[.eE]", b)
        if integer:
            return f"integer {a} became {b}"
        x, y = float(a), float(b)
        frac = re.search(r"\.(\d+)", a)
        ulp = 10.0 ** -len(frac.group(1)) if frac and not re.search(r"[eE]", a) else 0.0
        if abs(x - y) > max(tol.atol + tol.rtol * abs(x), 1.01 * ulp):
            return f"number {a} became {b} (tolerance rtol {tol.rtol:g}, atol {tol.atol:g})"
    return None


def compare_array(expected: np.ndarray, got: np.ndarray, tol: Tolerance = Tolerance()) -> str | None:
    """None when the arrays have one shape and dtype and agree within ``rtol`` of the expected array's own
    largest magnitude."""
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return f"shape/dtype {expected.shape} {expected.dtype} became {got.shape} {got.dtype}"
    if expected.dtype.kind not in "fc":
        return None if np.array_equal(expected, got) else "integer array values differ"
    e, g = expected.astype(np.float64), got.astype(np.float64)
    if not np.array_equal(np.isfinite(e), np.isfinite(g)):
        return "non-finite values moved"
    fin = np.isfinite(e)
    scale = float(np.abs(e[fin]).max()) if fin.any() else 0.0
    worst = float(np.abs(e[fin] - g[fin]).max()) if fin.any() else 0.0
    if worst > tol.atol + tol.rtol * scale:
        return f"largest difference {worst:.3g} over {tol.rtol:g} of the array's scale {scale:.3g}"
    return None


def compare_picture(expected: bytes, got: bytes, tol: Tolerance = Tolerance()) -> str | None:
    """None when both decode to one size and their 8-bit values differ by at most ``tol.pixel`` (or, for a
    ``tol.pixel_share`` of them, by at most ``tol.pixel_max``)."""
    import cv2

    e = cv2.imdecode(np.frombuffer(expected, np.uint8), cv2.IMREAD_UNCHANGED)
    g = cv2.imdecode(np.frombuffer(got, np.uint8), cv2.IMREAD_UNCHANGED)
    if e is None or g is None:
        return "cannot decode"
    if e.shape != g.shape:
        return f"size {e.shape} became {g.shape}"
    d = np.abs(e.astype(np.int32) - g.astype(np.int32))
    over = float((d > tol.pixel).mean())
    if over > tol.pixel_share or int(d.max()) > tol.pixel_max:
        return f"{over:.2%} of the values differ by more than {tol.pixel} (largest {int(d.max())})"
    return None


def compare_file(name: str, expected: bytes, got: bytes, tol: Tolerance = Tolerance()) -> str | None:
    """Dispatch on the file's kind; None when equal as that kind is judged."""
    if expected == got:
        return None
    lower = name.lower()
    if lower.endswith(TEXT_SUFFIXES) or lower == "stdout":
        return compare_text(expected.decode("utf-8"), got.decode("utf-8"), tol)
    if lower.endswith(".npy"):
        return compare_array(np.load(io.BytesIO(expected)), np.load(io.BytesIO(got)), tol)
    if lower.endswith((".png", ".jpg", ".webp")):
        return compare_picture(expected, got, tol)
    return "the bytes differ"
