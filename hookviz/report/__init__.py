"""``hookviz report OUT``: one static HTML page over a run's manifest and outputs, to browse a batch.

The page is a single file (CSS and JS inline) beside the outputs, which it shows by relative path: it
opens from ``file://`` with no server, CDN or web font. Every value read from files reaches the page as
JSON data (Jinja2's ``tojson``, which escapes ``<``, ``>``, ``&`` and quotes) and is put into the document
with ``textContent``: a photo named ``<img src=x onerror=alert(1)>.jpg`` shows as text. Cards are
rendered a page at a time and images load lazily, so 10,000 inputs stay responsive.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hookviz.errors import OutputError, UsageError
from hookviz.files import atomic_write

MANIFEST = "manifest.jsonl"
REPORT = "index.html"


def latest_records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The latest record per (input, settings key), in first-seen order; unreadable lines are skipped."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "input" in rec:
            latest[(str(rec["input"]), str(rec.get("key", "")))] = rec
    return list(latest.values())


def _card(rec: dict[str, Any]) -> dict[str, Any]:
    """What the page needs of one record: names, status, prediction, and its pictures by file name."""
    pictures = []
    named = set()
    for m in rec.get("maps") or []:
        if m.get("file"):
            target = m.get("target") or {}
            label = m.get("method") or m.get("stage") or "map"
            pictures.append(
                {
                    "file": str(m["file"]),
                    "method": label if "method" in m else "featuremap",
                    "layer": m.get("layer"),
                    "target": target.get("name"),
                    "metrics": m.get("metrics"),
                }
            )
            named.add(str(m["file"]))
    for out in rec.get("outputs") or []:  # the sheet, gradflow and dropblock pictures
        name = Path(str(out)).name
        if name.endswith(".png") and name not in named:
            sheet = name.endswith(".sheet.png")
            kind = "sheet" if sheet else str(rec.get("command") or "picture")
            layer = None if sheet else rec.get("layer")
            pictures.append({"file": name, "method": kind, "layer": layer, "target": None})
    predicted = rec.get("predicted") or {}
    targets = [m["target"] for m in rec.get("maps") or [] if isinstance(m.get("target"), dict)]
    return {
        "input": str(rec.get("input", "")),
        "status": str(rec.get("status", "")),
        "error": rec.get("error"),
        "note": rec.get("note"),
        "command": rec.get("command"),
        "model": rec.get("model"),
        "key": rec.get("key"),
        "predicted": predicted.get("name"),
        "predicted_index": predicted.get("index"),
        "score": predicted.get("score"),
        "targets": list({t.get("index"): t for t in targets}.values()),
        "pictures": pictures,
    }


def _runs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for rec in records:
        key = str(rec.get("key", ""))
        if key and key not in runs:
            runs[key] = {
                "key": key,
                "command": rec.get("command"),
                "model": rec.get("model"),
                "weights": rec.get("weights"),
                "pretrained": bool(rec.get("pretrained", True)),
                "settings": rec.get("settings") or {},
            }
    return list(runs.values())


def build_report(out: str | Path, *, title: str | None = None) -> Path:
    """Write ``out/index.html`` for the manifest in ``out``; return its path.

    Raises:
        UsageError: ``out`` holds no manifest. OutputError: the page cannot be written.
    """
    from jinja2 import Environment, PackageLoader, select_autoescape

    out = Path(out)
    manifest = out / MANIFEST
    if not manifest.is_file():
        raise UsageError(f"{str(out)!r} holds no {MANIFEST}; give the --out folder of a hookviz run")
    records = latest_records(manifest.read_text(encoding="utf-8", errors="replace").splitlines())
    env = Environment(loader=PackageLoader("hookviz", "report"), autoescape=select_autoescape(["html"]))
    page = env.get_template("template.html").render(
        title=title or f"hookviz report: {out.resolve().name}",
        runs=_runs(records),
        cards=[_card(r) for r in records],
        counts={s: sum(r.get("status") == s for r in records) for s in ("ok", "skipped", "error")},
    )
    final = out / REPORT
    try:
        atomic_write(final, page)
    except OSError as exc:
        raise OutputError(f"cannot write {final} ({exc.strerror or exc})") from None
    return final
