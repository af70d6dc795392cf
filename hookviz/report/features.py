"""What the report shows of a sparse dictionary's features (``hookviz sae features``): for the run folder
itself, or each run folder one level inside it, ``features/features.json``: per feature how often it fires,
its histogram, its top patches (input and box in the photo's pixels), the classes its ablation lowers, and its
sheet of crops. Only files inside the folder are linked; a file that cannot be read is left out, and ``warn``
is told."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hookviz.report.concepts import Warn, _inside, _read

#: Features shown per dictionary: those given a sheet (the most firing), then the most firing others.
SHOWN = 48
#: Top patches listed per feature.
PATCHES = 8


def _bars(histogram: Any) -> list[float]:
    """The histogram's counts of the bins above zero (a feature that did not fire is the first bin) as
    heights from 0 to 1."""
    counts = histogram.get("counts") if isinstance(histogram, dict) else None
    if not isinstance(counts, list) or len(counts) < 2:
        return []
    fired = [c if isinstance(c, int | float) else 0 for c in counts[1:]]
    top = max(fired) or 1
    return [round(c / top, 3) for c in fired]


def _patch(p: Any) -> dict[str, Any] | None:
    if not isinstance(p, dict) or not isinstance(p.get("input"), str) or not isinstance(p.get("box"), list):
        return None
    box = [int(v) for v in p["box"] if isinstance(v, int | float)]
    score = p.get("score")
    return {"input": Path(p["input"]).name, "box": box, "score": score if isinstance(score, float) else None}


def _feature(out: Path, folder: Path, f: dict[str, Any]) -> dict[str, Any]:
    """One feature as the page shows it; its sheet linked relative to ``out`` (only a file inside it)."""
    classes = _listed(f.get("classes"))
    top = _listed(f.get("top"))
    sheet = f.get("sheet")
    link = _inside(out, (folder.relative_to(out) / sheet).as_posix()) if isinstance(sheet, str) else None
    fired = f.get("fired")
    return {
        "feature": f.get("feature"), "fired": fired if isinstance(fired, float) else 0.0, "sheet": link,
        "top": [p for p in map(_patch, top) if p][:PATCHES], "bars": _bars(f.get("histogram")),
        "classes": [{"name": str(c.get("name")), "drop": c.get("logit_drop")} for c in classes
                    if isinstance(c, dict)],
    }  # fmt: skip


def dictionary(out: Path, folder: Path, warn: Warn) -> dict[str, Any] | None:
    """One run folder's features as the page shows them (links relative to ``out``), or None."""
    data = _read(folder / "features" / "features.json", warn)
    if not isinstance(data, dict) or not isinstance(data.get("features"), list):
        return None
    each = [f for f in data["features"] if isinstance(f, dict)]
    firing = sorted(each, key=lambda f: (0 if "sheet" in f else 1, -_number(f.get("fired"))))
    config = _read(folder / "config.json", None) if (folder / "config.json").is_file() else None
    config = config if isinstance(config, dict) else {}
    return {
        "folder": folder.relative_to(out).as_posix(), "model": data.get("model"), "layer": data.get("layer"),
        "inputs": data.get("inputs"), "field": data.get("field"), "width": len(each),
        "live": sum(1 for f in each if _number(f.get("fired")) > 0), "arch": config.get("arch"),
        "k": config.get("k"), "features": [_feature(out, folder, f) for f in firing[:SHOWN]],
    }  # fmt: skip


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def dictionaries(out: Path, warn: Warn) -> list[dict[str, Any]]:
    """The features of ``out`` (a ``hookviz sae`` run folder) and of each run folder directly inside it."""
    folders = [out, *sorted(p for p in out.iterdir() if p.is_dir())] if out.is_dir() else []
    found = []
    for folder in folders:
        if (folder / "features" / "features.json").is_file():
            shown = dictionary(out, folder, warn)
            if shown is not None:
                found.append(shown)
    return found
