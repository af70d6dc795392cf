"""A ``channels`` run gathered: each channel's best inputs over every input of the run
(``channels.KEY.json``), the channels that drive a target class most over the folder, and a sheet of crops per
channel.

Only the run's small per-input ``.channels.npz`` files are read, one at a time, into :class:`TopK` (memory:
channels x K), so a run over any number of photos is gathered in bounded memory, and the same inputs give
the same file whichever order they were run in (a resumed run, torchrun's shards).
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hookviz import render
from hookviz.concepts.examples import Example, TopK
from hookviz.errors import UsageError
from hookviz.io.files import atomic_write
from hookviz.io.images import encode_png, load_rgb_within
from hookviz.io.outputs import finite, safe_name


def gathered_names(key: str) -> tuple[str, str]:
    """The names of a run's gathered outputs in its ``--out``: ``channels.KEY.json`` and the sheets' folder
    ``channels.KEY/``, keyed like every output (a run with other settings writes beside them)."""
    return f"channels.{key}.json", f"channels.{key}"


@dataclass
class LayerExamples:
    """One layer gathered: the best inputs of each channel, and the contributions summed over the inputs."""

    layer: str
    map: tuple[int, int]
    top: TopK
    contributions: np.ndarray | None = None
    inputs: int = 0


@dataclass
class Gathered:
    """Every layer of a ``channels`` run, and the inputs read."""

    layers: list[LayerExamples] = field(default_factory=list)
    inputs: int = 0
    skipped: list[str] = field(default_factory=list)


class Feed:
    """The inputs this process runs, gathered as each is rendered (in the pipeline's pool threads, beside
    the model's work), so that :func:`gather` afterwards reads only the files of inputs run before or
    elsewhere (a resumed run, torchrun's other ranks). Holds a :class:`Gathered` (channels x K) and the
    name of each input fed."""

    def __init__(self, layers: Sequence[str], k: int) -> None:
        TopK(1, k)  # a bad K fails here, before the run
        self.layers, self.k = list(layers), k
        self.gathered = Gathered()
        #: Each input fed, by name: the name of the ``.channels.npz`` it was rendered into.
        self.files: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(
        self, name: str, file: str, arrays: dict[str, np.ndarray], maps: Mapping[str, Sequence[int]]
    ) -> None:
        with self._lock:
            if name not in self.files:
                _add(self.gathered, name, arrays, self.layers, maps, self.k)
                self.files[name] = file


def gather(
    records: Sequence[dict[str, Any]], layers: Sequence[str], k: int, feed: Feed | None = None
) -> Gathered:
    """The best ``k`` inputs of every channel of ``layers`` over ``records`` (``ok`` or ``skipped`` records of
    one ``channels`` run; each names its ``.channels.npz``). An input whose file is gone is left out, by
    name. ``feed``: this process's inputs, already gathered; used when every input in it has an ``ok``
    record naming the file it was fed from (else, a write that failed, everything is read from the files)."""
    out, fed = Gathered(), set()
    if feed is not None and feed.files and feed.k == k and feed.layers == list(layers):
        written = {str(r.get("input")): _npz(r) for r in records if r.get("status") == "ok"}
        if all((f := written.get(n)) is not None and f.name == file for n, file in feed.files.items()):
            out, fed = copy.deepcopy(feed.gathered), set(feed.files)  # the feed is left as it is
    for rec in records:
        if str(rec.get("input")) in fed:
            continue
        path = _npz(rec)
        try:
            if path is None:
                raise OSError("no .channels.npz")
            with np.load(path) as data:
                arrays = {name: data[name] for name in data.files}
        except (OSError, ValueError, KeyError):
            out.skipped.append(str(rec.get("input")))
            continue
        _add(out, str(rec["input"]), arrays, layers, rec.get("maps", {}), k)
    return out


def _npz(record: dict[str, Any]) -> Path | None:
    return next((Path(p) for p in record.get("outputs", []) if str(p).endswith(".channels.npz")), None)


def _add(
    out: Gathered,
    name: str,
    arrays: dict[str, np.ndarray],
    layers: Sequence[str],
    maps: Mapping[str, Sequence[int]],
    k: int,
) -> None:
    """One input's scores, peaks and contributions (its ``.channels.npz`` arrays) into ``out``."""
    for i, layer in enumerate(layers):
        scores, peaks = arrays[f"scores{i}"], arrays[f"peaks{i}"]
        if i >= len(out.layers):
            grid = maps.get(layer, [0, 0])
            out.layers.append(LayerExamples(layer, (int(grid[0]), int(grid[1])), TopK(len(scores), k)))
        entry = out.layers[i]
        entry.top.add(name, scores, peaks)
        entry.inputs += 1
        if f"contributions{i}" in arrays:
            c = arrays[f"contributions{i}"].astype(np.float64)
            entry.contributions = c if entry.contributions is None else entry.contributions + c
    out.inputs += 1


def parse_channels(text: str | None, count: int) -> list[int]:
    """``--channels``: ``0,5,9``, ranges ``0-15``, or every channel (None).

    Raises:
        UsageError: not a list of channel numbers, or one past the layer's ``count``.
    """
    if text is None or not text.strip():
        return list(range(count))
    chosen: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise UsageError(f"--channels {text!r}: give channel numbers like 0,5,9 or a range 0-15")
        chosen += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    bad = [c for c in chosen if c >= count]
    if bad:
        raise UsageError(
            f"--channels: channel {bad[0]} does not exist (the layer has {count}: 0-{count - 1})"
        )
    return list(dict.fromkeys(chosen))


def summary(
    gathered: Gathered, channels: dict[str, list[int]], fields: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    """What ``channels.json`` holds: per layer its map, receptive field and, per chosen channel, its best
    inputs (score, input, peak ``[y, x]`` in the photo's pixels); with a target, the channels ranked by their
    summed contribution."""
    layers: dict[str, Any] = {}
    for entry in gathered.layers:
        chosen = channels[entry.layer]
        shown = []
        for c in chosen:
            item: dict[str, Any] = {"channel": c, "examples": [_example(e) for e in entry.top.best(c)]}
            if entry.contributions is not None:
                item["contribution"] = round(float(entry.contributions[c]), 6)
            shown.append(item)
        layer: dict[str, Any] = {
            "map": list(entry.map),
            "field": list(fields[entry.layer]),
            "channels_in_layer": len(entry.top),
            "channels": shown,
        }
        if entry.contributions is not None:
            order = np.argsort(-entry.contributions, kind="stable")
            layer["attribution"] = [
                {"channel": int(c), "contribution": round(float(entry.contributions[c]), 6)} for c in order
            ]
        layers[entry.layer] = layer
    return {"inputs": gathered.inputs, "left_out": gathered.skipped, "layers": layers}


def _example(e: Example) -> dict[str, Any]:
    return {"input": e.input, "score": round(e.score, 6), "peak": [round(e.peak[0], 2), round(e.peak[1], 2)]}


#: A crop's side on a sheet, in pixels.
TILE = 128


def crop(
    rgb: np.ndarray,
    peak: tuple[float, float],
    side: tuple[int, int],
    whole_tiles: dict[int, np.ndarray] | None = None,
) -> tuple[np.ndarray, bool]:
    """The field of ``side`` (height, width) photo pixels around ``peak``, drawn as a frame in a crop of twice
    its size (at least a third of the photo, kept inside it): the whole photo where that covers most of it.
    ``whole_tiles``: the photo's whole-photo tile, kept there once made (under key 0).
    Returns (a ``TILE``-sized RGB tile, whether it is the whole photo)."""
    import cv2

    h, w = rgb.shape[:2]
    py, px = peak
    short = min(h, w) / 3
    ch, cw = min(h, round(max(2 * side[0], short))), min(w, round(max(2 * side[1], short)))
    whole = ch >= 0.8 * h and cw >= 0.8 * w
    if whole:
        ch, cw = h, w
    y0 = round(min(max(py - ch / 2, 0), h - ch))
    x0 = round(min(max(px - cw / 2, 0), w - cw))
    scale = TILE / max(ch, cw)
    if whole and whole_tiles is not None and 0 in whole_tiles:
        tile = whole_tiles[0]
    else:
        size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
        # area averaging where a pixel of the tile covers more than two of the photo's (no aliasing)
        fast = cv2.INTER_AREA if scale < 0.5 else cv2.INTER_LINEAR
        tile = cv2.resize(np.ascontiguousarray(rgb[y0 : y0 + ch, x0 : x0 + cw]), size, interpolation=fast)
        if whole and whole_tiles is not None:
            whole_tiles[0] = tile
    canvas = np.full((TILE, TILE, 3), 40, np.uint8)
    oy, ox = (TILE - tile.shape[0]) // 2, (TILE - tile.shape[1]) // 2
    canvas[oy : oy + tile.shape[0], ox : ox + tile.shape[1]] = tile

    def at(y: float, x: float) -> tuple[int, int]:
        return round(ox + (x - x0 + 0.5) * scale), round(oy + (y - y0 + 0.5) * scale)

    fy0, fx0 = min(max(py - side[0] / 2, 0), h - side[0]), min(max(px - side[1] / 2, 0), w - side[1])
    corners = at(max(fy0, 0), max(fx0, 0)), at(min(fy0 + side[0], h) - 1, min(fx0 + side[1], w) - 1)
    cv2.rectangle(canvas, corners[0], corners[1], (0, 0, 0), 3, cv2.LINE_AA)
    cv2.rectangle(canvas, corners[0], corners[1], (255, 230, 0), 1, cv2.LINE_AA)
    cv2.circle(canvas, at(py, px), 2, (255, 230, 0), -1, cv2.LINE_AA)
    return canvas, whole


class Photos:
    """Photos read for the sheets, each shrunk so its longer side is at most ``side`` pixels (a crop of a
    third of it fills a tile; a JPEG decoded straight at that size, :func:`load_rgb_within`), the last
    ``keep`` of them kept: a photo among the best of many channels is decoded once, in bounded memory.
    ``read``: a reader of whole photos instead (shrunk here)."""

    def __init__(
        self, read: Callable[[str], np.ndarray] | None = None, side: int = 3 * TILE, keep: int = 256
    ) -> None:
        self._read, self.side, self.keep = read, side, keep
        self._kept: OrderedDict[str, tuple[np.ndarray, float]] = OrderedDict()
        #: Each kept photo's whole-photo tile, once made (see :func:`crop`).
        self.tiles: dict[str, dict[int, np.ndarray]] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str) -> tuple[np.ndarray, float]:
        """The photo (shrunk) and its scale (shrunk pixels per photo pixel)."""
        with self._lock:
            if name in self._kept:
                self._kept.move_to_end(name)
                return self._kept[name]
        if self._read is None:
            rgb, scale = load_rgb_within(name, self.side)
        else:
            import cv2

            rgb = self._read(name)
            scale = min(1.0, self.side / max(rgb.shape[:2]))
            if scale < 1:
                size = (max(1, round(rgb.shape[1] * scale)), max(1, round(rgb.shape[0] * scale)))
                rgb = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)
        with self._lock:
            self._kept[name] = (rgb, scale)
            while len(self._kept) > self.keep:
                self.tiles.pop(self._kept.popitem(last=False)[0], None)
            self.tiles[name] = {}
        return rgb, scale


def channel_sheet(
    examples: Sequence[Example],
    field_px: Callable[[str], tuple[int, int]],
    photos: Photos,
    *,
    title: str,
) -> np.ndarray:
    """One row of the channel's best inputs, each a crop around its peak captioned with its score."""
    tiles = []
    for e in examples:
        try:
            rgb, s = photos(e.input)
        except Exception:  # a photo moved since the run: a grey tile, the others still shown
            tile = np.full((TILE, TILE, 3), 90, np.uint8)
            render.label(tile, "missing", 4, 4)
        else:
            fh, fw = field_px(e.input)
            side = (max(1, round(fh * s)), max(1, round(fw * s)))
            tile, _ = crop(rgb, (e.peak[0] * s, e.peak[1] * s), side, photos.tiles.get(e.input))
        render.label(tile, f"{e.score:.3g}", 2, TILE - 22, scale=0.4)
        tiles.append(tile)
    gap = 4
    row = np.full((TILE + 2 * gap, len(tiles) * (TILE + gap) + gap, 3), 255, np.uint8)
    for i, tile in enumerate(tiles):
        row[gap : gap + TILE, gap + i * (TILE + gap) : gap + i * (TILE + gap) + TILE] = tile
    return render.caption(render.enlarge_small(row), [title], top=True)


def write_sheets(
    gathered: Gathered,
    data: dict[str, Any],
    folder: Path,
    model: str,
    reduce: str,
    field_px: Callable[[str, str], tuple[int, int]],
    photos: Photos,
    workers: int = 2,
) -> None:
    """A sheet per channel that ``data`` (:func:`summary`) shows, written into ``folder`` (``LAYER.cC.png``)
    by ``workers`` threads; each channel's entry in ``data`` gets its ``sheet``."""
    from concurrent.futures import ThreadPoolExecutor

    folder.mkdir(parents=True, exist_ok=True)

    def one(entry: LayerExamples, item: dict[str, Any]) -> None:
        c, info = item["channel"], data["layers"][entry.layer]
        name = f"{safe_name(entry.layer)}.c{c}.png"
        title = (
            f"{model} {entry.layer} channel {c}: its {len(item['examples'])} best of {entry.inputs} inputs "
            f"by the {reduce} of its map; field {info['field'][0]}x{info['field'][1]} input px"
        )
        picture = channel_sheet(entry.top.best(c), lambda n: field_px(n, entry.layer), photos, title=title)
        atomic_write(folder / name, encode_png(picture))
        item["sheet"] = f"{folder.name}/{name}"

    jobs = [(e, item) for e in gathered.layers for item in data["layers"][e.layer]["channels"]]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        list(pool.map(lambda job: one(*job), jobs))


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(finite(data), indent=1, allow_nan=False))
