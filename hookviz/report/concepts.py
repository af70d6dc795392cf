"""What the report shows of the concept commands' files in a folder: each channel's sheet of best inputs
(``channels.KEY.json``), the TCAV table (``tcav.KEY.json``), the feature visualisations
(``visualize.*.json``). Only files inside the folder are linked; a file that cannot be read is left out, and
``warn`` is told."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

Warn = Callable[[str], None] | None


def _inside(out: Path, name: Any) -> str | None:
    """``name`` as a link relative to ``out`` when it names a file inside it, else None."""
    if not isinstance(name, str):
        return None
    path = PurePosixPath(Path(name).as_posix())
    if path.is_absolute():
        try:
            path = PurePosixPath(Path(name).resolve().relative_to(out.resolve()).as_posix())
        except ValueError:
            return None
    if ".." in path.parts or not (out / path).is_file():
        return None
    return str(path)


def _read(path: Path, warn: Warn) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        if warn is not None:
            warn(f"{path}: left out of the page ({type(exc).__name__})")
        return None


def _newest(out: Path, kind: str, warn: Warn) -> Any:
    """The newest ``KIND.KEY.json`` in ``out`` (one per run's settings; an older version's ``KIND.json``)."""
    found = [p for p in (*out.glob(f"{kind}.*.json"), out / f"{kind}.json") if p.is_file()]
    return _read(max(found, key=lambda p: p.stat().st_mtime_ns), warn) if found else None


def channels(out: Path, warn: Warn) -> list[dict[str, Any]]:
    """Per layer of the newest ``channels.KEY.json``: its sheets (channel, link) and, with a target, its top
    channels."""
    data = _newest(out, "channels", warn)
    if not isinstance(data, dict) or not isinstance(data.get("layers"), dict):
        return []
    shown = []
    for name, layer in data["layers"].items():
        if not isinstance(layer, dict):
            continue
        sheets = [
            {"channel": c.get("channel"), "sheet": link, "contribution": c.get("contribution")}
            for c in layer.get("channels", [])
            if isinstance(c, dict) and (link := _inside(out, c.get("sheet")))
        ]
        top = [a for a in layer.get("attribution", [])[:10] if isinstance(a, dict)]
        shown.append({"layer": str(name), "inputs": data.get("inputs"), "field": layer.get("field"),
                      "sheets": sheets, "attribution": top})  # fmt: skip
    return shown


def tcav(out: Path, warn: Warn) -> dict[str, Any] | None:
    data = _newest(out, "tcav", warn)
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        return None
    rows = []
    for layer in data["layers"]:
        for c in [*layer.get("concepts", []), layer.get("null", {})]:
            rows.append({"layer": layer.get("layer"), "concept": c.get("concept"),
                         "score": c.get("sign_count"), "std": c.get("sign_count_std"),
                         "magnitude": c.get("magnitude"), "p": c.get("p_value"),
                         "significant": c.get("significant")})  # fmt: skip
    return {"target": (data.get("target") or {}).get("name"), "rows": rows}


def visualisations(out: Path, warn: Warn) -> list[dict[str, Any]]:
    shown = []
    for path in sorted(out.glob("visualize.*.json")):
        data = _read(path, warn)
        if not isinstance(data, dict):
            continue
        link = _inside(out, path.with_suffix(".png").name)
        if link is None:
            continue
        what = (
            f"channel {data.get('channel')}"
            if data.get("direction") is None
            else f"direction {data['direction']}"
        )
        shown.append({"picture": link, "layer": data.get("layer"), "what": what, "model": data.get("model"),
                      "objective": data.get("objective"), "steps": data.get("steps")})  # fmt: skip
    return shown
