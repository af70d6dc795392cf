"""A vision-language model's word maps drawn: a captioned overlay per answer token and method, a sheet with
the answer's words under their maps (a row per method), and the record that lists them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hookviz import render
from hookviz.io.images import encode_png
from hookviz.io.outputs import safe_name
from hookviz.jobs.common import npy_bytes
from hookviz.methods.registry import token_method
from hookviz.vlm.words import TITLES, WordMaps


def chosen_tokens(wm: WordMaps, words: Sequence[str] | None) -> list[int]:
    """The answer tokens to draw: all, or those whose text (stripped, any case) is one of ``words``."""
    if not words:
        return list(range(len(wm.answer.tokens)))
    wanted = {w.strip().lower() for w in words}
    return [k for k, t in enumerate(wm.answer.tokens) if t.strip().lower() in wanted]


def render_words(
    wm: WordMaps,
    rgb: np.ndarray,
    stem: str,
    model: str,
    *,
    tokens: list[int],
    alpha: float = 0.5,
    colormap: str = "jet",
    save_raw: bool = False,
) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
    """The files (name, bytes) of one photo's word maps, and its record."""
    place, answer = wm.placement, wm.answer
    box = place.box()
    said = answer.text
    files: list[tuple[str, bytes]] = []
    maps: list[dict[str, Any]] = []
    rows: list[tuple[str, list[np.ndarray]]] = []
    empty: dict[str, list[str]] = {}
    for method, stack in wm.maps.items():
        cells = []
        for k in tokens:
            scores = stack[k]
            over = place.picture(scores)[box.y0 : box.y1, box.x0 : box.x1]
            unit = render.normalize(np.nan_to_num(over, nan=float(np.nanmin(over))))
            picture = render.overlay(rgb, unit, box, alpha=alpha, colormap=colormap, scaled=True)
            cells.append(picture[box.y0 : box.y1, box.x0 : box.x1])
            word = answer.tokens[k].strip() or repr(answer.tokens[k])
            head = [
                f"{model} | {TITLES[method]} | {wm.prompt}",
                f"answer: {said}",
                f"token {k + 1}/{len(answer.tokens)} {word!r} p={answer.probs[k]:.3f}",
            ]
            name = f"{stem}.{method}.t{k + 1:02d}-{safe_name(word)[:24]}"
            files.append((f"{name}.png", encode_png(render.caption(render.enlarge_small(picture), head))))
            if save_raw:
                files.append((f"{name}.npy", npy_bytes(place.raw(scores).astype(np.float32))))
            flat = flat_value(scores[place.placed()])
            if flat is not None:
                empty.setdefault(_said(flat), []).append(f"{method} of {word!r}")
            maps.append(
                {
                    "method": method,
                    "token": k,
                    "text": answer.tokens[k],
                    "file": f"{name}.png",
                    "peak": None if flat is not None else place.peak(scores),
                    "max": float(scores[place.placed()].max()),
                    "prob": round(answer.probs[k], 6),  # the token's probability: the table's target_score
                    **({"layer": wm.layer} if token_method(method).reads_layer else {}),
                }
            )
        rows.append((TITLES[method], cells))
    if tokens:
        columns = [f"{answer.tokens[k].strip()!r} p={answer.probs[k]:.2f}" for k in tokens]
        sheet = render.sheet(rows, columns, title=f"{model} | {wm.prompt} -> {said}", cell=160)
        files.append((f"{stem}.words.png", encode_png(sheet)))
    record = {
        "prompt": wm.prompt,
        "answer": said,
        "generated": answer.generated,
        "tokens": [
            {"index": k, "text": t, "id": i, "prob": round(p, 6)}
            for k, (t, i, p) in enumerate(zip(answer.tokens, answer.token_ids, answer.probs, strict=True))
        ],
        "grids": [list(g) for g in place.grids],
        "box": [box.x0, box.y0, box.x1, box.y1],
        "maps": maps,
        **({"note": empty_note(empty)} if empty else {}),
    }
    return files, record


def flat_value(scores: np.ndarray) -> float | None:
    """The one value of a map with nothing in it (every image token's finite score the same, to float
    noise; NaN where none is finite), else None: such a map has no peak to point at."""
    finite = scores[np.isfinite(scores)]
    if not finite.size:
        return float("nan")
    lo, hi = float(finite.min()), float(finite.max())
    return lo if hi - lo <= 1e-7 * max(abs(lo), abs(hi)) else None


def _said(value: float) -> str:
    if value != value:
        return "no finite value"
    return "zero everywhere" if value == 0 else f"flat (every image token {value:.4g})"


def empty_note(empty: dict[str, list[str]]) -> str:
    """The record's note on its maps with nothing in them (their peak is null): which, and what they hold."""
    said = "; ".join(
        f"{', '.join(maps)} {'is' if len(maps) == 1 else 'are'} {how}" for how, maps in empty.items()
    )
    return f"{said}: a map with nothing in it points nowhere, so its peak is null"
