"""``trust.json`` read back: the :class:`~hookviz.evaluation.trust.TrustReport` that
:meth:`~hookviz.evaluation.trust.TrustReport.as_dict` wrote (a ``null`` figure read as NaN), the runs found on
disk by their key, and each verdict as a badge (for the report, the explorer and ``--method auto``)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookviz.errors import UsageError
from hookviz.evaluation.trust import Candidate, ModelCheck, Test, TrustReport


def _number(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _test(t: dict[str, Any]) -> Test:
    per_photo = [_number(v) for v in t.get("per_photo", [])]
    extra = {str(k): _number(v) for k, v in dict(t.get("extra") or {}).items()}
    return Test(str(t["name"]), _number(t["value"]), _number(t["ci"]), str(t["outcome"]), str(t["rule"]),
                per_photo, extra)  # fmt: skip


def _candidate(c: dict[str, Any]) -> Candidate:
    tests = {k: _test(t) for k, t in dict(c["tests"]).items()}
    dropped = c.get("dropped")
    return Candidate(str(c["method"]), str(c["layer"]), tests, str(c["verdict"]), str(c["reason"]),
                     bool(c.get("control", False)), None if dropped is None else str(dropped),
                     int(c.get("photos") or 0))  # fmt: skip


def report_from_dict(data: dict[str, Any]) -> TrustReport:
    """A report as :meth:`TrustReport.as_dict` gives it, read back.

    Raises:
        KeyError, TypeError, ValueError: ``data`` is not such a report.
    """
    m = dict(data["model_check"])
    check = ModelCheck(_number(m["entropy"]), _number(m["flips"]), bool(m["same_class"]),
                       bool(m["at_chance"]), str(m["reason"]))  # fmt: skip
    default = data.get("default")
    return TrustReport(
        str(data["model"]), [str(p) for p in data["photos"]], int(data["seed"]), check,
        [_candidate(c) for c in data["candidates"]],
        (str(default[0]), str(default[1])) if default else None, str(data["answer"]),
        notes=[str(n) for n in data.get("notes", [])], task=str(data.get("task", "classification")),
        left_out=[str(n) for n in data.get("left_out", [])], tests=[str(n) for n in data.get("tests", [])],
        key={str(k): str(v) for k, v in dict(data.get("key") or {}).items()},
    )  # fmt: skip


TRUST_JSON = "trust.json"
#: A verdict's rank: the best first.
RANK = {"recommended": 0, "care": 1, "fails": 2}


@dataclass(frozen=True)
class TrustRun:
    """A trust run on disk: its folder, its key and its report."""

    folder: Path
    key: dict[str, str]
    report: TrustReport

    def __str__(self) -> str:
        return f"the trust run in {self.folder} ({len(self.report.photos)} photo(s), seed {self.report.seed})"


def read_trust(path: Path) -> TrustRun:
    """The trust run in ``path`` (a folder holding ``trust.json``, or the file).

    Raises:
        UsageError: no ``trust.json`` there, or not one ``hookviz trust`` wrote.
    """
    file = path / TRUST_JSON if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        report = report_from_dict(data)
    except FileNotFoundError:
        raise UsageError(f"{str(path)!r} holds no {TRUST_JSON}; give the --out folder of hookviz trust"
                         ) from None  # fmt: skip
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # a write cut short (a full disk, a kill)
        raise UsageError(f"{file} is unreadable, truncated or not JSON ({exc}); run hookviz trust again "
                         f"with --out {file.parent} --overwrite") from None  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise UsageError(f"{file}: not a trust.json hookviz trust wrote ({type(exc).__name__}: {exc}); "
                         "run hookviz trust again") from None  # fmt: skip
    key = data.get("key")
    if not isinstance(key, dict):
        raise UsageError(f"{file} has no key (written by an older hookviz trust); run hookviz trust again")
    return TrustRun(file.parent, {str(k): str(v) for k, v in key.items()}, report)


def trust_runs(places: Iterable[Path], warn: Callable[[str], None] | None = None) -> list[TrustRun]:
    """Every readable trust run in ``places`` (each folder's own ``trust.json`` and its subfolders'), the
    newest first; one that cannot be read is left out (and named to ``warn``). A run found twice is listed
    once, its folder named as the first place that held it was given (relative stays relative: the report's
    header and the lines that name a run read as the command line did)."""
    files: dict[Path, tuple[Path, float]] = {}  # by the file's real path: the path as found, its mtime
    for place in places:
        found = [place] if place.is_file() else [place / TRUST_JSON, *sorted(place.glob(f"*/{TRUST_JSON}"))]
        for f in found:
            if f.is_file():
                files.setdefault(f.resolve(), (f, f.stat().st_mtime))
    runs = []
    for f, _ in sorted(files.values(), key=lambda found: -found[1]):
        try:
            runs.append(read_trust(f))
        except UsageError as exc:
            if warn is not None:
                warn(f"left out: {exc}")
    return runs


def find_trust(
    key: Mapping[str, str], places: Iterable[Path], warn: Callable[[str], None] | None = None
) -> TrustRun | None:
    """The newest trust run in ``places`` of this key's model and weights, or None."""
    wanted = (key.get("model"), key.get("weights"))
    return next((r for r in trust_runs(places, warn) if (r.key.get("model"), r.key.get("weights")) == wanted),
                None)  # fmt: skip


def _figures(c: Candidate) -> str:
    return ", ".join(
        f"{t.name} {t.value:.2f}" + ("" if math.isnan(t.ci) else f" ± {t.ci:.2f}") + f" ({t.outcome})"
        for t in c.tests.values()
    )


def badge(c: Candidate, run: TrustRun) -> dict[str, Any]:
    """A candidate's verdict as the report and the explorer show it: the word, the test that decided it
    (``care: class``, ``fails: randomisation``) and every figure, for the hover."""
    outcome = {"care": "care", "fails": "fail"}.get(c.verdict)
    decided = [t.name for t in c.tests.values() if t.outcome == outcome]
    label = c.verdict if c.verdict == "recommended" or not decided else f"{c.verdict}: {', '.join(decided)}"
    title = f"{c.method} at {c.layer}: {c.reason}. {_figures(c)}. From {run}: {run.report.answer}"
    return {"verdict": c.verdict, "label": label, "layer": c.layer, "title": title}


def badge_for(run: TrustRun, method: str, layer: str | None = None) -> dict[str, Any] | None:
    """``method``'s badge in ``run``: at ``layer`` when it was tested there, else its best verdict over the
    layers tested (the title says which); None when the run did not test it."""
    mine = [c for c in run.report.candidates if c.method == method and not c.control]
    if not mine:
        return None
    exact = [c for c in mine if c.layer == layer]
    return badge(exact[0] if exact else min(mine, key=lambda c: RANK.get(c.verdict, 3)), run)
