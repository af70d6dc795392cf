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
localisation       with masks (``--boxes``/``--masks``): the pointing game's hit less the centre map's on the
                   same photo (the energy inside the object given beside it). Pass when the interval lies
                   above 0 (it points at the object more often than a centred Gaussian), fail below.
=================  =========================================================================================

The edge detector (the photo's own gradient, no model in it) runs through the battery as the control that must
fail. Before any map, the model itself is checked: predictions at chance (near-uniform probabilities, or a top
class that flips under small noise) mean that no map can be trusted, whatever its figures.

Cost: every method at a layer shares its passes (one :func:`~hookviz.engine.explain.explain` call for the
maps, the randomised model's, the far class's and each noisy copy's); with 8 photos or more the candidates
run on the first half, and one that clearly fails there (a test's interval wholly on the failing side) is
dropped before the rest (successive halving, said in its ``dropped``); ``budget`` seconds stop the run
between steps, and the report says what was left out.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.conventions import score_kind
from hookviz.core.hooks import logits_of
from hookviz.core.readout import Readout, read
from hookviz.engine.explain import explain
from hookviz.evaluation.faithfulness import center_maps, faithfulness, random_maps, upsample
from hookviz.evaluation.localisation import energy_pointing_game, pointing_game
from hookviz.evaluation.randomisation import randomised_models
from hookviz.evaluation.robustness import robustness
from hookviz.evaluation.stats import mean_ci, spearman, ssim
from hookviz.methods import REGISTRY

__all__ = [
    "EDGES", "NOT_APPLICABLE", "TESTS_RUN", "Candidate", "ModelCheck", "Test", "TrustReport", "answered",
    "check_model", "edge_maps", "explainer", "judge", "not_applicable", "trust", "verdict_of",
]  # fmt: skip

#: The control's name: the photo's own gradient magnitude (Sobel), the same whatever the model.
EDGES = "edges"
VERDICTS = ("recommended", "care", "fails")
#: A test's outcome where it does not apply to the task (its ``rule`` says why); the verdict ignores it.
NOT_APPLICABLE = "n/a"
#: Points on the deletion and insertion curves (``evaluate``'s 50 halved: the verdict needs the ranking).
STEPS = 20
#: Successive halving: with this many photos or more, the first half is a first round.
HALVING_FROM = 8
#: The maps of every method at one layer: ``(net, x, targets) -> {method: (B, h, w)}``.
Maps = Callable[[nn.Module, Tensor, Tensor], dict[str, Tensor]]
Progress = Callable[[str], None]


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


def edge_maps(x: Tensor) -> Tensor:
    """``(B, H, W)``: each photo's gradient magnitude (Sobel over the channels' mean): no model in it."""
    grey = F.pad(x.detach().float().mean(1, keepdim=True), (1, 1, 1, 1), mode="replicate")  # no frame edge
    kx = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]], device=x.device)[None, None]
    gx = F.conv2d(grey, kx)
    gy = F.conv2d(grey, kx.transpose(2, 3))
    return (gx**2 + gy**2).sqrt()[:, 0].cpu()


def check_model(model: nn.Module, x: Tensor, *, seed: int = 0, noise: float = 0.01) -> ModelCheck:
    """The model check: its probabilities on ``x`` and on ``x`` plus small Gaussian noise (``noise`` x the
    batch's range), seeded. A segmenter's are per pixel (the entropy their mean, a flip a pixel's)."""
    with torch.no_grad():
        probs = torch.softmax(logits_of(model(x)).float(), dim=1).cpu()
        gen = torch.Generator().manual_seed(seed)
        spread = float(x.max() - x.min()) or 1.0
        noisy = x + (torch.randn(x.shape, generator=gen) * noise * spread).to(x)
        flipped = torch.softmax(logits_of(model(noisy)).float(), dim=1).cpu().argmax(1)
    classes = probs.shape[1]
    entropy = float((-(probs * probs.clamp_min(1e-12).log()).sum(1)).mean() / math.log(classes))
    flips = float((flipped != probs.argmax(1)).float().mean())
    top = probs.argmax(1).flatten(1).mode(1).values if probs.dim() == 4 else probs.argmax(1)
    same = x.shape[0] >= 8 and bool((top == top[0]).all())
    reasons = []
    if entropy > 0.9:
        reasons.append(f"its probabilities are near uniform (entropy {entropy:.2f} of the most possible)")
    few = x.shape[0] < 8  # on fewer photos one flip is too much of the figure to call the model at chance
    if flips > 0.5 and not few:
        reasons.append(f"its top class flips under small noise on {flips:.0%} of the photos")
    if same and entropy > 0.5:
        reasons.append("it gives every photo the same class")
    shaky = f"; its top class flips under small noise on {flips:.0%} of only {x.shape[0]} photos (8 tell)"
    reason = "; ".join(reasons) or "its predictions are confident" + (shaky if flips > 0.5 else " and stable")
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


@dataclass(frozen=True)
class _Stage:
    """One round's photos and what every candidate shares on them: the explained and the far classes, the
    readout (a segmenter's scorer), each photo's insertion - deletion for a random and an edge map."""

    x: Tensor
    targets: Tensor
    far: Tensor
    readout: Readout
    base: dict[str, Tensor]
    masks: Tensor | None


def _stage(model: nn.Module, x: Tensor, masks: Tensor | None, seed: int) -> _Stage:
    with torch.no_grad():
        r = read(logits_of(model(x)), kind=score_kind(model))
    targets, far = r.order[:, 0].cpu(), r.order[:, -1].cpu()
    b, _, h, w = x.shape
    base = {}
    for name, m in (("random", random_maps(b, h, w, seed=seed, x=x)), ("edges", edge_maps(x))):
        f = faithfulness(model, x, m, targets, steps=STEPS, scorer=r.scorer())
        base[name] = f.insertion_auc - f.deletion_auc
    return _Stage(x, targets, far, r, base, masks)


def explainer(layer: str, methods: Sequence[str]) -> Maps:
    """The maps of ``methods`` at ``layer`` from one :func:`~hookviz.engine.explain.explain` call (the
    methods share its forward and backward passes)."""

    def maps_of(net: nn.Module, xs: Tensor, t: Tensor) -> dict[str, Tensor]:
        ex = explain(net, xs, [layer], list(methods), t)
        return {m: ex.maps[(m, layer)][:, 0].detach().float().cpu() for m in methods}

    return maps_of


def _edges_of(_net: nn.Module, xs: Tensor, _t: Tensor) -> dict[str, Tensor]:
    return {EDGES: edge_maps(xs)}


def _localised(maps: Tensor, masks: Tensor) -> dict[str, list[float]]:
    up = upsample(maps, tuple(masks.shape[-2:]))
    centre = center_maps(*masks.shape)
    hit, centre_hit = pointing_game(up, masks, tolerance=0), pointing_game(centre, masks, tolerance=0)
    return {
        "localisation": (hit - centre_hit).tolist(),
        "pointing": hit.tolist(),
        "energy": energy_pointing_game(up, masks).tolist(),
        "centre_pointing": centre_hit.tolist(),
        "centre_energy": energy_pointing_game(centre, masks).tolist(),
    }


def _layer_raw(
    model: nn.Module, stage: _Stage, maps_of: Maps, randomised: nn.Module, seed: int
) -> dict[str, dict[str, list[float]]]:
    """Each method's per-photo figures at one layer; the methods share every explanation's passes."""
    x, t = stage.x, stage.targets
    own, after, other = maps_of(model, x, t), maps_of(randomised, x, t), maps_of(model, x, stage.far)
    noisy: dict[int, tuple[Tensor, dict[str, Tensor]]] = {}

    def on_noisy(xp: Tensor, k: int, m: str) -> Tensor:
        if k not in noisy or not torch.equal(noisy[k][0], xp):  # each method's draw k is the same copy
            noisy[k] = (xp, maps_of(model, xp, t))
        return noisy[k][1][m]

    scorer = stage.readout.scorer()
    out = {}
    for m, maps in own.items():
        n = maps.shape[0]
        f = faithfulness(model, x, maps, t, steps=STEPS, scorer=scorer)
        score = f.insertion_auc - f.deletion_auc
        r = robustness(model, functools.partial(on_noisy, m=m), x, maps, samples=3, radius=0.02, seed=seed,
                       scorer=scorer)  # fmt: skip
        raw = {
            "randomisation": [abs(spearman(maps[i], after[m][i])) for i in range(n)],
            "class": [ssim(maps[i], other[m][i]) for i in range(n)],
            "faithfulness": (score - stage.base["random"]).tolist(),
            "edges": (score - stage.base["edges"]).tolist(),
            "stability": r.max_sensitivity.tolist(),
            "cells": [float(maps[0].numel())],
        }
        if stage.masks is not None:
            raw.update(_localised(maps, stage.masks))
        out[m] = raw
    return out


class _Clock:
    """``budget`` seconds from now (None: no end)."""

    def __init__(self, budget: float | None) -> None:
        self.budget = budget
        self.end = None if budget is None else time.monotonic() + budget

    def out(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    def said(self) -> str:
        return f"the budget of {self.budget:g} s was spent"


@dataclass
class _Run:
    """The rounds' bookkeeping: each candidate's per-photo figures so far, and why one stopped."""

    raw: dict[tuple[str, str], dict[str, list[float]]] = field(default_factory=dict)
    dropped: dict[tuple[str, str], str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _round(
    model: nn.Module,
    x: Tensor,
    masks: Tensor | None,
    units: Sequence[tuple[str, Sequence[str], Maps | None]],
    span: tuple[int, int],
    state: _Run,
    randomised: nn.Module,
    seed: int,
    clock: _Clock,
    progress: Progress,
) -> None:
    """One round of successive halving: every candidate still in, on the photos ``span``."""
    lo, hi = span
    first = lo == 0
    stage: _Stage | None = None
    for layer, methods, maps_of in units:
        alive = [m for m in methods if (m, layer) not in state.dropped and (first or (m, layer) in state.raw)]
        if not alive:
            continue
        if clock.out():
            for m in alive:
                if first:
                    state.left_out.append(f"{m} at {layer}: not tested ({clock.said()})")
                else:
                    state.dropped[(m, layer)] = f"budget: its figures are over the first {lo} photos only " \
                                                f"({clock.said()})"  # fmt: skip
            continue
        progress(f"photos {lo + 1}-{hi} of {x.shape[0]}: {', '.join(alive)} at {layer}")
        stage = stage or _stage(model, x[lo:hi], None if masks is None else masks[lo:hi], seed)
        got = _layer_raw(model, stage, maps_of or explainer(layer, alive), randomised, seed)
        for m, figures in got.items():
            mine = state.raw.setdefault((m, layer), {})
            for k, v in figures.items():
                if k != "cells":
                    mine[k] = mine.get(k, []) + v
        cells = int(next(iter(got.values()))["cells"][0])
        if first and maps_of is None and cells < 16:
            state.notes.append(f"{', '.join(alive)} at {layer}: a map of {cells} cells; its rank tests are "
                               "coarse (a larger --input-size or an earlier layer gives more)")  # fmt: skip


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
    masks: Tensor | None = None,
    budget: float | None = None,
    progress: Progress | None = None,
    task: str = "classification",
) -> TrustReport:
    """Put every method at every layer through the battery on the photos ``x`` (preprocessed, a batch),
    with the edge detector as the control, and the model through its check.

    Args:
        model: a classifier or a segmenter (eval mode; left as found: the randomised model is a copy).
        x: ``(B, C, H, W)`` the photos as the model takes them (8 or more for intervals worth the name;
            from 8 on, the first half is a first round and a candidate failing there clearly is dropped).
        layers, methods: the candidates (every method at every layer; a pixel attribution, whose map is the
            same at every layer, at the first only).
        names: the photos' names, for the report; default: their indices.
        default: the model's default (method, layer), flagged when it fails.
        masks: ``(B, H, W)`` booleans, where the object of each photo lies (in the input's frame): adds the
            localisation test.
        budget: seconds; the run stops between steps when they are spent and says what it left out.
        progress: called with a line before each step.
    """
    clock = _Clock(budget)
    check = check_model(model, x, seed=seed)
    # The classifier re-initialised, on a copy (the first step: the generator's copy changes at each step).
    _, randomised = next(iter(randomised_models(model, seed=seed)))
    n = x.shape[0]
    cut = n // 2 if n >= HALVING_FROM else n
    pixel = {m for m in methods if m in REGISTRY and REGISTRY[m].resolution == "input"}  # once, first layer
    units: list[tuple[str, Sequence[str], Maps | None]] = [
        (la, [m for m in methods if i == 0 or m not in pixel], None) for i, la in enumerate(layers)
    ]
    units.append(("-", [EDGES], _edges_of))
    state = _Run()
    say = progress or (lambda _line: None)
    _round(model, x, masks, units, (0, cut), state, randomised, seed, clock, say)
    if cut < n:
        for key, figures in state.raw.items():
            if verdict_of(judge(figures))[0] == "fails":
                state.dropped[key] = (
                    f"failed clearly on the first {cut} of {n} photos; not tested on the rest"
                )
        _round(model, x, masks, units, (cut, n), state, randomised, seed, clock, say)
    candidates = []
    for (method, layer), figures in state.raw.items():
        tests = judge(figures)
        verdict, reason = verdict_of(tests)
        candidates.append(Candidate(method, layer, tests, verdict, reason, control=method == EDGES,
                                    dropped=state.dropped.get((method, layer)),
                                    photos=len(figures["class"])))  # fmt: skip
    run = [*TESTS_RUN, *(["localisation"] if masks is not None else [])]
    report = TrustReport(model_name, list(names) or [str(i) for i in range(n)], seed, check, candidates,
                         default, "", state.notes, task, state.left_out, run)  # fmt: skip
    return answered(report)


#: The tests every classifier's and segmenter's candidate goes through.
TESTS_RUN = ("randomisation", "class", "faithfulness", "stability")


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
