"""Which map to believe for this model: every candidate (method x layer) put through one battery of tests,
each with a pass rule, an effect size and its 95 % interval over the photos, and a verdict per candidate.

The tests (all seeded; the figures are the ones ``evaluate`` and ``sanity`` compute):

=================  =========================================================================================
randomisation      the map's |Spearman| with the map after the classifier is re-initialised (Adebayo et
                   al. 2018): a map that stays the same does not explain the decision. Pass below 0.5.
class              SSIM of the map for the explained class with the map for the least likely class
                   (random-logit): a map that does not depend on the class explains the photo. Pass
                   below 0.6.
faithfulness       insertion minus deletion AUC, against a random map's and an edge detector's on the same
                   photo: a map no better than chance fails; one no better than edges is used with care.
stability          max-sensitivity under small noise (the map's change relative to itself). Pass below 0.5.
=================  =========================================================================================

The edge detector (the photo's own gradient, no model in it) runs through the battery as the control that must
fail. Before any map, the model itself is checked: predictions at chance (near-uniform probabilities, or a top
class that flips under small noise) mean that no map can be trusted, whatever its figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.hooks import logits_of
from hookviz.engine.explain import explain
from hookviz.evaluation.faithfulness import faithfulness, random_maps
from hookviz.evaluation.randomisation import randomised_models
from hookviz.evaluation.robustness import robustness
from hookviz.evaluation.stats import mean_ci, spearman, ssim

__all__ = ["EDGES", "Candidate", "ModelCheck", "Test", "TrustReport", "check_model", "edge_maps", "trust"]

#: The control's name: the photo's own gradient magnitude (Sobel), the same whatever the model.
EDGES = "edges"
VERDICTS = ("recommended", "care", "fails")
#: Points on the deletion and insertion curves (``evaluate``'s 50 halved: the verdict needs the ranking).
STEPS = 20


@dataclass(frozen=True)
class Test:
    """One test of one candidate: its figure (mean over the photos) and the half-width of the 95 % interval,
    the rule, and the outcome (``pass``, ``care``, ``fail``)."""

    name: str
    value: float
    ci: float
    outcome: str
    rule: str
    per_photo: list[float] = field(default_factory=list)

    def line(self) -> str:
        ci = "" if math.isnan(self.ci) else f" +- {self.ci:.2f}"
        return f"{self.name} {self.value:.2f}{ci} ({self.rule})"


@dataclass(frozen=True)
class Candidate:
    """A method at a layer, its tests and its verdict (``recommended``, ``care`` or ``fails``) and why."""

    method: str
    layer: str
    tests: dict[str, Test]
    verdict: str
    reason: str
    control: bool = False


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

    def recommended(self) -> Candidate | None:
        """The best candidate recommended (the most faithful), or None."""
        good = [c for c in self.candidates if c.verdict == "recommended" and not c.control]
        return max(good, key=lambda c: c.tests["faithfulness"].value) if good else None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["default"] = list(self.default) if self.default else None
        return data


def edge_maps(x: Tensor) -> Tensor:
    """``(B, H, W)``: each photo's gradient magnitude (Sobel over the channels' mean): no model in it."""
    grey = F.pad(x.detach().float().mean(1, keepdim=True), (1, 1, 1, 1), mode="replicate")  # no frame edge
    kx = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]], device=x.device)[None, None]
    gx = F.conv2d(grey, kx)
    gy = F.conv2d(grey, kx.transpose(2, 3))
    return (gx**2 + gy**2).sqrt()[:, 0].cpu()


def check_model(model: nn.Module, x: Tensor, *, seed: int = 0, noise: float = 0.01) -> ModelCheck:
    """The model check: its probabilities on ``x`` and on ``x`` plus small Gaussian noise (``noise`` x the
    batch's range), seeded."""
    with torch.no_grad():
        probs = torch.softmax(logits_of(model(x)).float(), dim=1).cpu()
        gen = torch.Generator().manual_seed(seed)
        spread = float(x.max() - x.min()) or 1.0
        noisy = x + (torch.randn(x.shape, generator=gen) * noise * spread).to(x)
        flipped = torch.softmax(logits_of(model(noisy)).float(), dim=1).cpu().argmax(1)
    classes = probs.shape[1]
    entropy = float((-(probs * probs.clamp_min(1e-12).log()).sum(1)).mean() / math.log(classes))
    flips = float((flipped != probs.argmax(1)).float().mean())
    same = x.shape[0] >= 8 and bool((probs.argmax(1) == probs.argmax(1)[0]).all())
    reasons = []
    if entropy > 0.9:
        reasons.append(f"its probabilities are near uniform (entropy {entropy:.2f} of the most possible)")
    if flips > 0.5:
        reasons.append(f"its top class flips under small noise on {flips:.0%} of the photos")
    if same and entropy > 0.5:
        reasons.append("it gives every photo the same class")
    reason = "; ".join(reasons) or "its predictions are confident and stable under small noise"
    return ModelCheck(entropy, flips, same, bool(reasons), reason)


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


def _verdict(tests: dict[str, Test]) -> tuple[str, str]:
    failed = [t for t in tests.values() if t.outcome == "fail"]
    if failed:
        return "fails", "; ".join(f"fails {t.line()}" for t in failed)
    weak = [t for t in tests.values() if t.outcome == "care"]
    if weak:
        return "care", "; ".join(f"weak on {t.line()}" for t in weak)
    return "recommended", "passes every test"


def _maps(
    model: nn.Module, x: Tensor, layer: str, methods: Sequence[str], targets: Tensor
) -> dict[str, Tensor]:
    ex = explain(model, x, [layer], list(methods), targets)
    return {m: ex.maps[(m, layer)][:, 0].detach().float().cpu() for m in methods}


def _battery(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    explain_with: Callable[[nn.Module, Tensor, Tensor], Tensor],
    targets: Tensor,
    far: Tensor,
    randomised: nn.Module,
    baselines: dict[str, Any],
    seed: int,
) -> dict[str, Test]:
    n = x.shape[0]
    after = explain_with(randomised, x, targets)
    rho = [abs(spearman(maps[i], after[i])) for i in range(n)]
    other = explain_with(model, x, far)
    sims = [ssim(maps[i], other[i]) for i in range(n)]
    f = faithfulness(model, x, maps, targets, steps=STEPS)
    score = f.insertion_auc - f.deletion_auc
    vs_random = (score - baselines["random"]).tolist()
    vs_edges = (score - baselines["edges"]).tolist()
    r = robustness(model, lambda xp, _k: explain_with(model, xp, targets), x, maps, samples=3, radius=0.02,
                   seed=seed)  # fmt: skip
    faith = _test(
        "faithfulness", vs_random, 0.0, 0.0, "insertion - deletion above a random map's", lower=False
    )
    edges_mean, edges_ci = mean_ci(vs_edges)
    if faith.outcome == "pass" and edges_mean - (0.0 if math.isnan(edges_ci) else edges_ci) <= 0:
        faith = Test(faith.name, faith.value, faith.ci, "care", "no better than an edge detector's",
                     faith.per_photo)  # fmt: skip
    return {
        "randomisation": _test(
            "randomisation", rho, 0.5, 0.5, "|Spearman| with the classifier re-initialised"
        ),
        "class": _test("class", sims, 0.6, 0.8, "SSIM with the least likely class's map"),
        "faithfulness": faith,
        "stability": _test("stability", r.max_sensitivity.tolist(), 0.5, 1.0, "max-sensitivity, noise 0.02"),
    }


def trust(
    model: nn.Module,
    x: Tensor,
    layers: Sequence[str],
    methods: Sequence[str],
    *,
    names: Sequence[str] = (),
    model_name: str = "model",
    default: tuple[str, str] | None = None,
    seed: int = 0,
) -> TrustReport:
    """Put every method at every layer through the battery on the photos ``x`` (preprocessed, a batch),
    with the edge detector as the control, and the model through its check.

    Args:
        model: a classifier (eval mode; left as found: the randomised model is a copy).
        x: ``(B, C, H, W)`` the photos as the model takes them (8 or more for intervals worth the name).
        layers, methods: the candidates (every method at every layer; a method whose map does not depend on
            the layer is tried once, at the first).
        names: the photos' names, for the report; default: their indices.
        default: the model's default (method, layer), flagged when it fails.
    """
    with torch.no_grad():
        probs = torch.softmax(logits_of(model(x)).float(), dim=1)
    targets = probs.argmax(1).cpu()
    far = probs.argmin(1).cpu()
    check = check_model(model, x, seed=seed)
    # The classifier re-initialised, on a copy (the first step: the generator's copy changes at each step).
    _, randomised = next(iter(randomised_models(model, seed=seed)))
    b, _, h, w = x.shape
    chance = random_maps(b, h, w, seed=seed, x=x)
    edges = edge_maps(x)
    base = {}
    for name, m in (("random", chance), ("edges", edges)):
        f = faithfulness(model, x, m, targets, steps=STEPS)
        base[name] = f.insertion_auc - f.deletion_auc
    candidates = []
    notes: list[str] = []
    for layer in layers:
        for method in methods:

            def explain_with(
                net: nn.Module, xs: Tensor, t: Tensor, m: str = method, la: str = layer
            ) -> Tensor:
                return _maps(net, xs, la, [m], t)[m]

            maps = explain_with(model, x, targets)
            cells = int(maps[0].numel())
            if cells < 16:
                notes.append(f"{method} at {layer}: a map of {cells} cells; its rank tests are coarse "
                             "(a larger --input-size or an earlier layer gives more)")  # fmt: skip
            tests = _battery(model, x, maps, explain_with, targets, far, randomised, base, seed)
            verdict, reason = _verdict(tests)
            candidates.append(Candidate(method, layer, tests, verdict, reason))

    def edge_explain(_net: nn.Module, xs: Tensor, _t: Tensor) -> Tensor:
        return edge_maps(xs)

    tests = _battery(model, x, edges, edge_explain, targets, far, randomised, base, seed)
    verdict, reason = _verdict(tests)
    candidates.append(Candidate(EDGES, "-", tests, verdict, reason, control=True))
    report = TrustReport(
        model_name, list(names) or [str(i) for i in range(b)], seed, check, candidates, default, ""
    )
    return _answered(report)


def _answered(report: TrustReport) -> TrustReport:
    check = report.model_check
    best = report.recommended()
    if check.at_chance:
        answer = f"no map here can be trusted: the model's predictions are at chance ({check.reason})"
        demoted = [
            Candidate(c.method, c.layer, c.tests, "fails" if not c.control else c.verdict,
                      f"the model is at chance ({check.reason})" if not c.control else c.reason, c.control)
            for c in report.candidates
        ]  # fmt: skip
        report = TrustReport(**{**report.__dict__, "candidates": demoted})
    elif best is None:
        usable = [c for c in report.candidates if c.verdict == "care" and not c.control]
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
    return TrustReport(**{**report.__dict__, "answer": answer})


def report_from_dict(data: dict[str, Any]) -> TrustReport:
    """A report as :meth:`TrustReport.as_dict` gives it (``trust.json``'s own fields; a ``null`` figure read
    as NaN), read back.

    Raises:
        KeyError, TypeError, ValueError: ``data`` is not such a report.
    """

    def number(value: Any) -> float:
        return float("nan") if value is None else float(value)

    def test(t: dict[str, Any]) -> Test:
        per_photo = [number(v) for v in t.get("per_photo", [])]
        return Test(str(t["name"]), number(t["value"]), number(t["ci"]), str(t["outcome"]), str(t["rule"]),
                    per_photo)  # fmt: skip

    def candidate(c: dict[str, Any]) -> Candidate:
        tests = {k: test(t) for k, t in dict(c["tests"]).items()}
        return Candidate(str(c["method"]), str(c["layer"]), tests, str(c["verdict"]), str(c["reason"]),
                         bool(c.get("control", False)))  # fmt: skip

    candidates = [candidate(c) for c in data["candidates"]]
    m = dict(data["model_check"])
    check = ModelCheck(number(m["entropy"]), number(m["flips"]), bool(m["same_class"]), bool(m["at_chance"]),
                       str(m["reason"]))  # fmt: skip
    default = data.get("default")
    return TrustReport(
        str(data["model"]), [str(p) for p in data["photos"]], int(data["seed"]), check, candidates,
        (str(default[0]), str(default[1])) if default else None, str(data["answer"]),
        [str(n) for n in data.get("notes", [])],
    )  # fmt: skip
