"""``hookviz report OUT``: one static HTML page over a run's manifest and outputs, to browse a batch.

The page is a single file (CSS and JS inline) beside the outputs, which it shows by relative path: it
opens from ``file://`` with no server, CDN or web font. Every value read from files reaches the page as
JSON data (Jinja2's ``tojson``, which escapes ``<``, ``>``, ``&`` and quotes) and is put into the document
with ``textContent``: a photo named ``<img src=x onerror=alert(1)>.jpg`` shows as text. Cards are
rendered a page at a time and images load lazily, so 10,000 inputs stay responsive.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from hookviz.errors import OutputError, UsageError
from hookviz.io.files import atomic_write
from hookviz.io.outputs import finite  # NaN is not JSON: JSON.parse would blank the page
from hookviz.report import concepts, features

MANIFEST = "manifest.jsonl"
REPORT = "index.html"


def latest_records(lines: Iterable[str], warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The latest record per (input, settings key, clip), in first-seen order (a video's clips and its
    whole-video record each count); unreadable lines are skipped (and, with ``warn``, named by their line
    number)."""
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict) and isinstance(rec.get("input"), str):
            part = "video" if "video" in rec else str(_dict(rec.get("clip")).get("number", ""))
            latest[(rec["input"], str(rec.get("key", "")), part)] = rec
        elif warn is not None:
            warn(f"manifest line {number} is not a hookviz record; left out")
    return list(latest.values())


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _num(value: Any) -> float | None:
    """A finite number, else None (a hand-edited ``"0.9"``, a ``null``, a NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _card(rec: dict[str, Any]) -> dict[str, Any]:
    """What the page needs of one record: names, status, prediction, and its pictures by file name.

    Every field is read by its type (a record from another tool or edited by hand may hold anything): a
    value of the wrong type counts as absent; a metric that is not a finite number is left out."""
    pictures = []
    named = set()
    for m in _list(rec.get("maps")):
        if not isinstance(m, dict) or not isinstance(m.get("file"), str):
            continue
        target = _dict(m.get("target"))
        label = _text(m.get("method")) or _text(m.get("stage")) or "map"
        metrics = {k: v for k, v in _dict(m.get("metrics")).items() if _num(v) is not None}
        pictures.append(
            {
                "file": Path(m["file"]).name,
                "method": label if "method" in m else "featuremap",
                "layer": _text(m.get("layer")),
                "target": _text(target.get("name")),
                "metrics": metrics if {"deletion_auc", "insertion_auc"} <= set(metrics) else None,
                "token": _int(m.get("token")),  # a vision-language model's answer token
            }
        )
        named.add(Path(m["file"]).name)
    for out in _list(rec.get("outputs")):  # the sheet, gradflow and dropblock pictures
        if not isinstance(out, str):
            continue
        name = Path(out).name
        if name.endswith((".png", ".webm")) and name not in named:
            sheet = name.endswith((".sheet.png", ".frames.png"))
            kind = "sheet" if sheet else str(rec.get("command") or "picture")
            layer = None if sheet else _text(rec.get("layer"))
            pictures.append({"file": name, "method": kind, "layer": layer, "target": None})
    predicted = _dict(rec.get("predicted")) or _dict(rec.get("video"))
    targets = [_dict(m.get("target")) for m in _list(rec.get("maps")) if isinstance(m, dict)]
    targets = [{"index": _int(t.get("index")), "name": _text(t.get("name"))} for t in targets if t]
    return {
        "input": str(rec.get("input", "")),
        "status": str(rec.get("status", "")),
        "error": _text(rec.get("error")),
        "note": _text(rec.get("note")),
        "command": _text(rec.get("command")),
        "model": _text(rec.get("model")),
        "key": _text(rec.get("key")),
        "predicted": _text(predicted.get("name")),
        "predicted_index": _int(predicted.get("index")),
        "score": _num(predicted.get("score")),
        # A segmentation's scores are shares of the pixels, not probabilities.
        "share": rec.get("score") == "share of pixels",
        "targets": list({t["index"]: t for t in targets}.values()),
        "pictures": pictures,
        "part": _part(rec),
        "answer": _answer(rec),
    }


def _answer(rec: dict[str, Any]) -> dict[str, Any] | None:
    """A vision-language model's record (``hookviz vlm``): the prompt and the answer's tokens, as text."""
    tokens = [t for t in _list(rec.get("tokens")) if isinstance(t, dict) and _text(t.get("text")) is not None]
    if _text(rec.get("answer")) is None or not tokens:
        return None
    words = [
        {"token": _int(t.get("index")), "text": _text(t.get("text")), "prob": _num(t.get("prob"))}
        for t in tokens
    ]
    return {"prompt": _text(rec.get("prompt")), "words": words}


def _part(rec: dict[str, Any]) -> str | None:
    """Which part of a video a record is: ``clip 2/5 · frames 30-60 · 1.00-2.00 s``, or the whole video."""
    video = _dict(rec.get("video"))
    if video:
        clips, agree = _int(video.get("clips")), _int(video.get("clips_agreeing"))
        return f"whole video: mean of {clips} clips, {agree} agree"
    clip = _dict(rec.get("clip"))
    if not clip:
        return None
    frames, seconds = _list(clip.get("frames")), _list(clip.get("seconds"))
    text = f"clip {_int(clip.get('number'))}/{_int(clip.get('of'))}"
    if len(frames) == 2:
        text += f" · frames {_int(frames[0])}-{_int(frames[1])}"
    if len(seconds) == 2 and _num(seconds[0]) is not None and _num(seconds[1]) is not None:
        text += f" · {seconds[0]:.2f}-{seconds[1]:.2f} s"
    return text


def _runs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for rec in records:
        key = str(rec.get("key", ""))
        if key and key not in runs:
            runs[key] = {
                "key": key,
                "command": _text(rec.get("command")),
                "model": _text(rec.get("model")),
                "weights": _text(rec.get("weights")),
                "pretrained": bool(rec.get("pretrained", True)),
                "settings": _dict(rec.get("settings")),
            }
    return list(runs.values())


def _evaluation(out: Path, warn: Callable[[str], None] | None) -> dict[str, Any] | None:
    """The folder's latest evaluation (``evaluation.KEY.json``, one per settings; ``evaluation.json`` of an
    older hookviz) as tables for the page (None when no evaluation ran)."""
    from hookviz.evaluation.families import FAMILIES
    from hookviz.evaluation.summary import tables

    found = [p for p in (*out.glob("evaluation.*.json"), out / "evaluation.json") if p.is_file()]
    if not found:
        return None
    path = max(found, key=lambda p: p.stat().st_mtime_ns)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = [r for r in _list(data.get("rows")) if isinstance(r, dict)]
        by_class = [r for r in _list(data.get("by_class")) if isinstance(r, dict)]
        asked = _list(_dict(data.get("settings")).get("metrics")) or ["faithfulness"]
        return {
            "images": _int(data.get("images")),
            "forward_passes": _int(data.get("forward_passes")),
            "tables": tables(rows, [f for f in FAMILIES if f in asked]),
            "by_class": tables(by_class, ["localisation"])
            if len({r.get("class") for r in by_class}) > 1
            else [],
        }
    except (ValueError, TypeError, KeyError) as exc:
        if warn is not None:
            warn(f"{path}: left out of the page ({type(exc).__name__}: {exc})")
        return None


def _verdicts(
    out: Path, records: list[dict[str, Any]], cards: list[dict[str, Any]], trust: Sequence[Path], warn: Any
) -> list[dict[str, Any]]:
    """Each picture's verdict (``picture["verdict"]``) from a trust run of its record's model and weights, in
    ``trust`` or ``out`` (or their subfolders); the runs used, for the header."""
    from hookviz.evaluation.trust_read import badge_for, trust_runs  # loads torch: only once a page is built

    runs: dict[tuple[str, str], Any] = {}
    for r in trust_runs([*trust, out], warn):  # the newest of a model and weights wins
        runs.setdefault((str(r.key.get("model")), str(r.key.get("weights"))), r)
    if not runs:
        return []
    settings = {str(r.get("key")): _dict(r.get("settings")) for r in records}
    found = {k: runs.get((str(s.get("model")), str(s.get("weights")))) for k, s in settings.items()}
    for card in cards:
        if (run := found.get(str(card.get("key")))) is not None:
            for p in card["pictures"]:
                p["verdict"] = badge_for(run, p["method"], p["layer"])
    used = {str(r.folder): r for r in found.values() if r is not None}
    return [{"folder": f, "model": r.key["model"], "photos": len(r.report.photos), "answer": r.report.answer}
            for f, r in used.items()]  # fmt: skip


def build_report(
    out: str | Path,
    *,
    title: str | None = None,
    warn: Callable[[str], None] | None = None,
    trust: Sequence[str | Path] = (),
) -> Path:
    """Write ``out/index.html`` for the manifest in ``out``; return its path.

    A line that is not a record (not JSON, not an object, a field of an impossible type) is left out, and
    ``warn`` is told which line it was. Each map shows its method's verdict when a ``hookviz trust`` run of
    its model and weights is in ``out`` (or a subfolder) or in a folder of ``trust``.

    Raises:
        UsageError: ``out`` holds no manifest. OutputError: the page cannot be written.
    """
    from jinja2 import Environment, PackageLoader, select_autoescape

    out = Path(out)
    manifest = out / MANIFEST
    found = {"channels": concepts.channels(out, warn), "tcav": concepts.tcav(out, warn),
             "visualisations": concepts.visualisations(out, warn),
             "features": features.dictionaries(out, warn)}  # fmt: skip
    if not manifest.is_file() and not any(found.values()):
        raise UsageError(f"{str(out)!r} holds no {MANIFEST}; give the --out folder of a hookviz run")
    lines = manifest.read_text(encoding="utf-8", errors="replace").splitlines() if manifest.is_file() else []
    cards = []
    for rec in latest_records(lines, warn):
        try:
            cards.append(_card(rec))
        except Exception as exc:  # a foreign record must not stop the page
            if warn is not None:
                warn(f"{manifest}: record for {str(rec.get('input'))[:80]!r} left out ({type(exc).__name__})")
    records = latest_records(lines)
    trusted = _verdicts(out, records, cards, [Path(t) for t in trust], warn)

    env = Environment(loader=PackageLoader("hookviz", "report"), autoescape=select_autoescape(["html"]))
    page = env.get_template("template.html").render(
        title=title or f"hookviz report: {out.resolve().name}",
        runs=finite(_runs(records)),
        cards=finite(cards),
        evaluation=_evaluation(out, warn),
        concepts=finite(found),
        trusted=trusted,
        counts={s: sum(r.get("status") == s for r in records) for s in ("ok", "skipped", "error")},
    )
    final = out / REPORT
    try:
        atomic_write(final, page)
    except OSError as exc:
        raise OutputError(f"cannot write {final} ({exc.strerror or exc})") from None
    return final
