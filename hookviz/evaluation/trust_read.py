"""``trust.json`` read back: the :class:`~hookviz.evaluation.trust.TrustReport` that
:meth:`~hookviz.evaluation.trust.TrustReport.as_dict` wrote (a ``null`` figure read as NaN)."""

from __future__ import annotations

from typing import Any

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
    )  # fmt: skip
