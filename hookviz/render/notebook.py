"""What a notebook shows of hookviz's results: figures of maps with their captions, as PNG bytes and HTML.

Arrays in, bytes and text out (no torch): :class:`hookviz.engine.explain.Explanation`, :class:`CamResult` and
the records :func:`hookviz.explain_inputs` returns call these from their ``_repr_png_``/``_repr_html_``, so
Jupyter, VS Code and Colab display them as pictures.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hookviz.core.arrays import to_numpy
from hookviz.io.images import encode_png
from hookviz.render import colormap_lut, normalize

#: The most images, and cells, a displayed result draws (a notebook is not a report: ``hookviz report``).
MAX_IMAGES = 8
MAX_CELLS = 32
#: The side a heatmap of a layer's few cells is drawn at (nearest: the cells stay visible).
SIDE = 112
#: The width a cell shows a picture at.
THUMB = 260


def heatmap(cam: np.ndarray, colormap: str = "jet", side: int = SIDE) -> np.ndarray:
    """A map ``(h, w)`` as an RGB picture ``side`` px wide, normalised to its own range (nearest)."""
    values = np.nan_to_num(np.asarray(cam, dtype=np.float32))
    if values.ndim > 2:  # a video layer's (t, h, w): its mean over time
        values = values.reshape(-1, *values.shape[-2:]).mean(0)
    lut = colormap_lut(colormap)
    rgb = lut[(normalize(values) * 255).round().astype(np.uint8)]
    h, w = rgb.shape[:2]
    scale = max(1, side // max(h, w, 1))
    return np.ascontiguousarray(rgb.repeat(scale, 0).repeat(scale, 1))


def png(rgb: np.ndarray) -> bytes:
    """RGB ``uint8`` → PNG bytes."""
    return encode_png(np.ascontiguousarray(rgb, dtype=np.uint8))


def row(pictures: Sequence[np.ndarray], gap: int = 4) -> np.ndarray:
    """Pictures side by side on white, top-aligned."""
    height = max(p.shape[0] for p in pictures)
    width = sum(p.shape[1] for p in pictures) + gap * (len(pictures) - 1)
    out = np.full((height, width, 3), 255, np.uint8)
    x = 0
    for p in pictures:
        out[: p.shape[0], x : x + p.shape[1]] = p
        x += p.shape[1] + gap
    return out


def figure(cells: Sequence[tuple[bytes, str]], title: str = "") -> str:
    """HTML: a title, then each cell's PNG with its caption under it, wrapping as the page is wide."""
    parts = [
        '<div class="hookviz" style="font-family:sans-serif;font-size:12px">',
        f"<div style='font-weight:600;margin:4px 0'>{html.escape(title)}</div>" if title else "",
        "<div style='display:flex;flex-wrap:wrap;gap:8px'>",
    ]
    for data, text in cells[:MAX_CELLS]:
        src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        parts.append(
            "<figure style='margin:0;max-width:260px'>"
            f"<img src='{src}' style='max-width:260px;image-rendering:pixelated' alt='{html.escape(text)}'>"
            f"<figcaption>{html.escape(text)}</figcaption></figure>"
        )
    if len(cells) > MAX_CELLS:
        parts.append(
            f"<div>the first {MAX_CELLS} of {len(cells)} maps (hookviz report shows a whole run)</div>"
        )
    parts.append("</div></div>")
    return "".join(parts)


def thumbnail(data: bytes, width: int = 2 * THUMB) -> bytes:
    """A PNG no wider than ``width`` px (twice what a cell shows, for sharp screens): a notebook keeps what
    it displays, and a phone photo's overlay is megabytes."""
    import cv2

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None or image.shape[1] <= width:
        return data
    height = max(1, round(image.shape[0] * width / image.shape[1]))
    small = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    return encode_png(np.ascontiguousarray(small[:, :, ::-1]))


def scored(name: str | None, index: int, score: float) -> str:
    """``tabby (281) 0.734``."""
    return f"{name} ({index}) {score:.3f}" if name else f"class {index} {score:.3f}"


def records_html(records: Sequence[dict[str, Any]]) -> str:
    """The overlays a run wrote, each with its input, method, layer and class (what ``explain_inputs``
    returns, displayed); an input that failed shows its error line."""
    cells: list[tuple[bytes, str]] = []
    failed: list[str] = []
    for rec in records:
        if rec.get("status") == "error":
            failed.append(f"{rec.get('input')}: {rec.get('error')}")
            continue
        written = {Path(str(o)).name: Path(str(o)) for o in rec.get("outputs") or []}
        for entry in rec.get("maps") or []:
            path = written.get(Path(str(entry.get("file") or "")).name)
            if path is None or not path.is_file():
                continue
            target = entry.get("target") or {}
            words = f"{rec.get('input')} | {entry.get('method')} @ {entry.get('layer')}"
            if "index" in target:
                words += " | " + scored(
                    target.get("name"), int(target["index"]), float(target.get("score", 0))
                )
            cells.append((thumbnail(path.read_bytes()), words))
    title = f"{len(records)} record(s)" + (f", {len(failed)} failed" if failed else "")
    text = figure(cells, title)
    if failed:
        text += "<pre style='color:#a00'>" + html.escape("\n".join(failed)) + "</pre>"
    return text


def explanation_html(ex: Any) -> str:
    """An :class:`hookviz.engine.explain.Explanation`: each image's map per method and layer (its first
    target), captioned with the class and its score."""
    cells = []
    n = min(int(ex.targets.shape[0]), MAX_IMAGES)
    for i in range(n):
        for method, layer in ex.maps:
            cam = to_numpy(ex.maps[(method, layer)][i, 0])
            target = scored(None, int(ex.targets[i, 0]), float(ex.target_scores[i, 0]))
            cells.append((png(heatmap(cam)), f"#{i} {method} @ {layer} | {target}"))
    return figure(
        cells, f"Explanation: {len(ex.methods)} method(s) x {len(ex.layers)} layer(s), {n} image(s)"
    )


def cam_pictures(result: Any) -> tuple[list[np.ndarray], list[str]]:
    """A :class:`hookviz.engine.explain.CamResult`'s maps as pictures, and their captions."""
    n = min(int(result.maps.shape[0]), MAX_IMAGES)
    pictures = [heatmap(to_numpy(result.maps[i])) for i in range(n)]
    words = [
        f"#{i} {result.layer} | " + scored(None, int(result.target[i]), float(result.target_score[i]))
        for i in range(n)
    ]
    return pictures, words


class ExplanationDisplay:
    """Displays an explanation in a notebook (mixed into the result dataclasses)."""

    def _repr_html_(self) -> str:
        return explanation_html(self)


class CamDisplay:
    """Displays a :func:`hookviz.grad_cam` result in a notebook: the maps, one per image."""

    def _repr_png_(self) -> bytes:
        return png(row(cam_pictures(self)[0]))

    def _repr_html_(self) -> str:
        pictures, words = cam_pictures(self)
        layer = getattr(self, "layer", "")
        total = int(self.maps.shape[0])  # type: ignore[attr-defined]
        shown = "" if len(pictures) == total else f" (the first {len(pictures)} of {total} images)"
        return figure([(png(p), w) for p, w in zip(pictures, words, strict=True)], f"map at {layer}{shown}")


class Records(list[dict[str, Any]]):
    """The records of a run (a ``list`` of dicts, as before), displayed in a notebook as their overlays."""

    def _repr_html_(self) -> str:
        return records_html(self)
