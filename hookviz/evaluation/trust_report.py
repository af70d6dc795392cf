"""What ``hookviz trust`` answers, as data: each test's figure, interval and outcome under its pass rule
(:func:`judge`), a candidate's verdict (:func:`verdict_of`), the model check, and the report with its one-line
answer (:func:`answered`). :mod:`hookviz.evaluation.trust` computes the figures (a classifier's and a
segmenter's), :mod:`hookviz.run.trust_detection` a detector's; both are judged here by the same rules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from hookviz.evaluation.stats import mean_ci

__all__ = [
    "EDGES", "NOT_APPLICABLE", "TESTS_RUN", "VERDICTS", "Candidate", "ModelCheck", "Test", "TrustReport",
    "answered", "judge", "not_applicable", "verdict_of",
]  # fmt: skip

#: The control's name: the photo's own gradient magnitude (Sobel), the same whatever the model.
EDGES = "edges"
VERDICTS = ("recommended", "care", "fails")
#: A test's outcome where it does not apply to the task (its ``rule`` says why); the verdict ignores it.
NOT_APPLICABLE = "n/a"
#: The tests every classifier's and segmenter's candidate goes through.
TESTS_RUN = ("randomisation", "class", "faithfulness", "stability")


@dataclass(frozen=True)
class Test:
    """One test of one candidate: its figure (mean over the photos) and the half-width of the 95 % interval,
    the rule, and the outcome (``pass``, ``care``, ``fail``, or ``n/a`` where the test does not apply)."""

    name: str
    value: float
    ci: float
    outcome: str
    rule: str
    per_photo: list[float] = field(default_factory=list)
    #: Figures given beside the one judged (localisation: the pointing game, the energy, the centre map's).
    extra: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        ci = "" if math.isnan(self.ci) else f" +- {self.ci:.2f}"
        return f"{self.name} {self.value:.2f}{ci} ({self.rule})"


def not_applicable(name: str, why: str) -> Test:
    """A test that does not apply to the task: no figure, the reason as its rule."""
    return Test(name, float("nan"), float("nan"), NOT_APPLICABLE, why)


@dataclass(frozen=True)
class Candidate:
    """A method at a layer, its tests and its verdict (``recommended``, ``care`` or ``fails``) and why.
    ``dropped``: why its tests stopped before the last photo (failed clearly on the first ones, or the
    budget ran out), None when it saw them all; ``photos``: how many its figures are over (a detector's:
    how many boxes)."""

    method: str
    layer: str
    tests: dict[str, Test]
    verdict: str
    reason: str
    control: bool = False
    dropped: str | None = None
    photos: int = 0


@dataclass(frozen=True)
class ModelCheck:
    """Whether the model's predictions mean anything: near-uniform probabilities (their entropy over the
    largest possible), a top class that flips under small noise, or one class for every photo."""

    entropy: float
    flips: float
    same_class: bool
    at_chance: bool
    reason: str


@dataclass(frozen=True)
class TrustReport:
    """The verdicts for one model on a set of photos, with the evidence, as ``hookviz trust`` writes them."""

    model: str
    photos: list[str]
    seed: int
    model_check: ModelCheck
    candidates: list[Candidate]
    default: tuple[str, str] | None
    answer: str
    #: What the figures cannot say (a map of so few cells that its rank tests are coarse).
    notes: list[str] = field(default_factory=list)
    task: str = "classification"
    #: What the budget left out (``method at layer``: why); empty for a whole answer.
    left_out: list[str] = field(default_factory=list)
    #: The tests run, in order (those that do not apply to the task among them, as ``n/a``).
    tests: list[str] = field(default_factory=list)
    #: What the run is of: the model's name and weights' fingerprint (`gradcam --method auto` finds it so).
    key: dict[str, str] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return bool(self.left_out) or any(
            c.dropped and c.dropped.startswith("budget") for c in self.candidates
        )

    def recommended(self) -> Candidate | None:
        """The best candidate recommended (the most faithful, else the best localised), or None."""
        good = [c for c in self.candidates if c.verdict == "recommended" and not c.control]
        return max(good, key=_merit) if good else None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["default"] = list(self.default) if self.default else None
        data["partial"] = self.partial
        return data


def _merit(c: Candidate) -> float:
    for name in ("faithfulness", "localisation"):
        t = c.tests.get(name)
        if t is not None and not math.isnan(t.value):
            return t.value
    return 0.0


def _test(name: str, values: Sequence[float], low: float, high: float, rule: str, lower: bool = True) -> Test:
    """``lower``: pass when the interval lies below ``low``, fail when it lies above ``high`` (or the other
    way round), care in between."""
    mean, ci = mean_ci(values)
    half = 0.0 if math.isnan(ci) else ci
    if lower:
        outcome = "pass" if mean + half < low else "fail" if mean - half > high else "care"
    else:
        outcome = "pass" if mean - half > high else "fail" if mean + half < low else "care"
    return Test(name, mean, ci, outcome, rule, [round(float(v), 6) for v in values])


def judge(raw: dict[str, list[float]]) -> dict[str, Test]:
    """The tests from the per-photo figures (``raw``: ``randomisation``, ``class``, ``faithfulness`` and
    ``edges`` (insertion - deletion above a random map's and an edge detector's), ``stability``, and with
    masks ``localisation``, ``pointing``, ``energy``, ``centre_pointing``, ``centre_energy``)."""
    faith = _test("faithfulness", raw["faithfulness"], 0.0, 0.0, "insertion - deletion above a random map's",
                  lower=False)  # fmt: skip
    edges_mean, edges_ci = mean_ci(raw["edges"])
    if faith.outcome == "pass" and edges_mean - (0.0 if math.isnan(edges_ci) else edges_ci) <= 0:
        faith = replace(faith, outcome="care", rule="no better than an edge detector's")
    tests = {
        "randomisation": _test(
            "randomisation", raw["randomisation"], 0.5, 0.5, "|Spearman| with the classifier re-initialised"
        ),
        "class": _test("class", raw["class"], 0.6, 0.8, "SSIM with the least likely class's map"),
        "faithfulness": faith,
        "stability": _test("stability", raw["stability"], 0.5, 1.0, "max-sensitivity, noise 0.02"),
    }
    if "localisation" in raw:
        loc = _test("localisation", raw["localisation"], 0.0, 0.0, "pointing game above the centre map's",
                    lower=False)  # fmt: skip
        extra = {k: mean_ci(raw[k])[0] for k in ("pointing", "energy", "centre_pointing", "centre_energy")}
        tests["localisation"] = replace(loc, extra=extra)
    return tests


def verdict_of(tests: dict[str, Test]) -> tuple[str, str]:
    """``fails`` naming each failed test, ``care`` naming each weak one, else ``recommended``."""
    failed = [t for t in tests.values() if t.outcome == "fail"]
    if failed:
        return "fails", "; ".join(f"fails {t.line()}" for t in failed)
    weak = [t for t in tests.values() if t.outcome == "care"]
    if weak:
        return "care", "; ".join(f"weak on {t.line()}" for t in weak)
    return "recommended", "passes every test"


def answered(report: TrustReport) -> TrustReport:
    """The report with its one-line answer (and every candidate failed when the model is at chance)."""
    check = report.model_check
    best = report.recommended()
    tested = [c for c in report.candidates if not c.control]
    if check.at_chance:
        answer = f"no map here can be trusted: the model's predictions are at chance ({check.reason})"
        demoted = [
            replace(c, verdict="fails", reason=f"the model is at chance ({check.reason})")
            if not c.control
            else c
            for c in report.candidates
        ]
        report = replace(report, candidates=demoted)
    elif not tested:
        answer = "no answer: no candidate was tested within the budget"
    elif best is None:
        usable = [c for c in tested if c.verdict == "care"]
        answer = (
            "no map here can be trusted: every candidate fails a test"
            if not usable
            else f"nothing passes every test; {usable[0].method} at {usable[0].layer} is usable with care "
            f"({usable[0].reason})"
        )
    else:
        answer = f"recommended: {best.method} at {best.layer}"
    if report.default is not None:
        found = next((c for c in report.candidates if (c.method, c.layer) == tuple(report.default)), None)
        if found is not None and found.verdict == "fails":
            answer += f"; the default ({found.method} at {found.layer}) fails: {found.reason}"
    if report.partial:
        cut = sum(1 for c in report.candidates if c.dropped and c.dropped.startswith("budget"))
        answer += (f" (partial: {len(report.left_out)} candidate(s) not tested and {cut} tested on part "
                   "of the photos within the budget)")  # fmt: skip
    return replace(report, answer=answer)
