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
maps, the randomised model's, the far class's and each noisy copy's); the deletion and insertion curves'
ends (the photo, the baseline, the blurred photo: the same whatever the map) run once a round, the edge
control's curves are the baseline's, and the perturbed photos go through the model in batches of as many
pixels as ``evaluate``'s; stability needs no pass beyond the noisy copies' maps (max-sensitivity compares
maps only). With 8 photos or more the candidates run on the first half, and one that clearly fails there (a
test's interval wholly on the failing side) is dropped before the rest (successive halving, said in its
``dropped``). The photos go through the tests ``BATCH`` at a time, and ``budget`` seconds are read before each
batch of work (:mod:`hookviz.evaluation.trust_clock`): once they are spent, the step under way stops, each
candidate keeps the figures of the batches of photos it finished, and the report says what was cut. The
verdicts and the pass rules live in :mod:`hookviz.evaluation.trust_report`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.conventions import score_kind
from hookviz.core.hooks import logits_of, preserved
from hookviz.core.readout import Readout, read
from hookviz.engine.explain import explain
from hookviz.evaluation.faithfulness import (
    auc,
    blurred,
    center_maps,
    chunk_size,
    probabilities,
    random_maps,
    upsample,
)
from hookviz.evaluation.localisation import energy_pointing_game, pointing_game
from hookviz.evaluation.randomisation import randomised_models
from hookviz.evaluation.robustness import uniform_noise
from hookviz.evaluation.stats import spearman, ssim
from hookviz.evaluation.trust_clock import Clock, Spent
from hookviz.evaluation.trust_report import (
    EDGES,
    NOT_APPLICABLE,
    TESTS_RUN,
    VERDICTS,
    Candidate,
    ModelCheck,
    Test,
    TrustReport,
    answered,
    judge,
    not_applicable,
    verdict_of,
)
from hookviz.methods import REGISTRY

__all__ = [
    "EDGES", "NOT_APPLICABLE", "TESTS_RUN", "VERDICTS", "Candidate", "ModelCheck", "Test", "TrustReport",
    "answered", "check_model", "edge_maps", "explainer", "judge", "localised", "not_applicable", "trust",
    "verdict_of",
]  # fmt: skip

#: Points on the deletion and insertion curves (``evaluate``'s 50 halved: the verdict needs the ranking).
STEPS = 20
#: Stability: noisy copies of each photo, and their noise (uniform, within this of each input value).
SAMPLES, RADIUS = 3, 0.02
#: Successive halving: with this many photos or more, the first half is a first round.
HALVING_FROM = 8
#: Photos tested at once: a candidate the budget cuts short keeps the figures of the batches it finished.
BATCH = 4
#: The maps of every method at one layer: ``(net, x, targets) -> {method: (B, h, w)}``.
Maps = Callable[[nn.Module, Tensor, Tensor], dict[str, Tensor]]
Progress = Callable[[str], None]


def edge_maps(x: Tensor) -> Tensor:
    """``(B, H, W)``: each photo's gradient magnitude (Sobel over the channels' mean): no model in it."""
    grey = F.pad(x.detach().float().mean(1, keepdim=True), (1, 1, 1, 1), mode="replicate")  # no frame edge
    kx = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]], device=x.device)[None, None]
    gx = F.conv2d(grey, kx)
    gy = F.conv2d(grey, kx.transpose(2, 3))
    return (gx**2 + gy**2).sqrt()[:, 0].cpu()


#: The most photos whose top class small noise may flip for the model check to call the model stable (above
#: it the check says how many flip; above half, on 8 photos or more, the model is at chance).
STABLE_FLIPS = 0.1


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
    only = f" of only {x.shape[0]} photos (8 tell)" if few and flips > 0.5 else " of the photos"
    shaky = f", not stable: its top class flips under small noise on {flips:.0%}{only}"
    stable = f" and stable (small noise flips its top class on at most {STABLE_FLIPS:.0%} of the photos)"
    reason = "; ".join(reasons) or "its predictions are confident" + (
        stable if flips <= STABLE_FLIPS else shaky
    )
    return ModelCheck(entropy, flips, same, bool(reasons), reason)


def _chunk(x: Tensor) -> int:
    """Perturbed photos a forward pass: as many pixels as :func:`chunk_size`'s photos at 224 x 224, at most 16
    times as many photos (the tests' CNN at 48 px on 2 busy cores ran 3x faster an image 128 at a time than 8
    at a time; at 224 px nothing changes)."""
    base = chunk_size(x)
    return max(base, min(16 * base, base * 224 * 224 // math.prod(x.shape[2:])))


@dataclass(frozen=True)
class _Stage:
    """One round's photos and what every candidate shares on them: the explained and the far classes, the
    readout (a segmenter's scorer), the blurred photos and the curves' ends (the target's probability on the
    photo, on the baseline and on the blurred photo: ``(3, B)``), the noisy copies, and each photo's
    insertion - deletion for a random and an edge map (``base``)."""

    x: Tensor
    targets: Tensor
    far: Tensor
    readout: Readout
    start: Tensor
    ends: Tensor
    noisy: list[Tensor]
    masks: Tensor | None
    base: dict[str, Tensor] = field(default_factory=dict)


def _probabilities(
    model: nn.Module, images: Tensor, stage: _Stage | Readout, targets: Tensor, clock: Clock
) -> Tensor:
    """The target's probability on ``images``: copies of the batch's photos, one after the other; the clock
    read before each chunk."""
    readout = stage if isinstance(stage, Readout) else stage.readout
    copies = images.shape[0] // targets.shape[0]
    rows = torch.arange(targets.shape[0], device=images.device).repeat(copies)
    step, out = _chunk(images), []
    with torch.no_grad(), preserved(model):
        model.eval()
        reps = targets.to(images.device).repeat(copies)
        for i in range(0, images.shape[0], step):
            clock.check()
            part = slice(i, i + step)
            out.append(
                probabilities(model, images[part], reps[part], step, [0], readout.scorer(), rows[part])
            )
    return torch.cat(out).cpu()


def _stage(
    model: nn.Module, x: Tensor, masks: Tensor | None, noisy: list[Tensor], seed: int, clock: Clock
) -> _Stage:
    """A batch's photos ``x`` and what every candidate shares on them (``noisy``: their noisy copies)."""
    clock.check()
    with torch.no_grad():
        r = read(logits_of(model(x)), kind=score_kind(model))
    targets, far = r.order[:, 0].cpu(), r.order[:, -1].cpu()
    b, _, h, w = x.shape
    start = blurred(x)
    ends = _probabilities(model, torch.cat([x, torch.zeros_like(x), start]), r, targets, clock).reshape(3, b)
    stage = _Stage(x, targets, far, r, start, ends, noisy, masks)
    for name, m in (("random", random_maps(b, h, w, seed=seed, x=x)), (EDGES, edge_maps(x))):
        stage.base[name] = _faithful(model, stage, m, clock)
    return stage


def _faithful(model: nn.Module, stage: _Stage, maps: Tensor, clock: Clock) -> Tensor:
    """Each photo's insertion minus deletion AUC for ``maps``: the curves of
    :func:`~hookviz.evaluation.faithfulness.faithfulness` (``STEPS`` points, pixels most important first, ties
    in a fixed order; deleted to zeros, inserted on the blurred photo), their ends the stage's."""
    x = stage.x
    b, size = x.shape[0], tuple(int(s) for s in x.shape[2:])
    importance = upsample(maps.to(x.device), size).flatten(1)
    order = torch.sort(importance, dim=1, descending=True, stable=True).indices
    n = importance.shape[1]
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(n, device=x.device).expand(b, n))
    deleted, inserted = [], []
    for c in [round(n * k / STEPS) for k in range(1, STEPS)]:
        keep = (rank >= c).reshape(b, 1, *size).to(x.dtype)  # pixels not yet changed
        deleted.append(x * keep)
        inserted.append(stage.start * keep + x * (1 - keep))
    p = _probabilities(model, torch.cat([*deleted, *inserted]), stage, stage.targets, clock)
    p = p.reshape(2, STEPS - 1, b)
    photo, zero, blur = stage.ends
    deletion = torch.cat([photo[None], p[0], zero[None]]).T
    insertion = torch.cat([blur[None], p[1], photo[None]]).T
    return auc(insertion) - auc(deletion)


def _max_sensitivity(maps: Tensor, noisy: Sequence[Tensor]) -> Tensor:
    """``robustness``'s max-sensitivity: the largest ``||e(x) - e(x')|| / ||e(x)||`` over the noisy copies."""
    e = maps.detach().double().cpu().flatten(1)
    changes = [(e - p.detach().double().cpu().flatten(1)).norm(dim=1) / e.norm(dim=1) for p in noisy]
    return torch.stack(changes, dim=1).amax(dim=1)


def explainer(layer: str, methods: Sequence[str], clock: Clock | None = None) -> Maps:
    """The maps of ``methods`` at ``layer`` from one :func:`~hookviz.engine.explain.explain` call (the
    methods share its forward and backward passes; ``clock`` read after each pass of a method's own)."""
    tick = None if clock is None else clock.ticking()

    def maps_of(net: nn.Module, xs: Tensor, t: Tensor) -> dict[str, Tensor]:
        ex = explain(net, xs, [layer], list(methods), t, progress=tick)
        return {m: ex.maps[(m, layer)][:, 0].detach().float().cpu() for m in methods}

    return maps_of


def _edges_of(_net: nn.Module, xs: Tensor, _t: Tensor) -> dict[str, Tensor]:
    return {EDGES: edge_maps(xs)}


def localised(maps: Tensor, masks: Tensor) -> dict[str, list[float]]:
    """The localisation figures of ``maps`` against ``masks`` ``(B, H, W)`` (maps upsampled to them): the
    pointing game's hits, less the centre map's (``localisation``), each beside, and the energy inside."""
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
    model: nn.Module, stage: _Stage, maps_of: Maps, randomised: nn.Module, clock: Clock
) -> dict[str, dict[str, list[float]]]:
    """Each method's per-photo figures at one layer on a batch; the methods share every explanation's
    passes. The clock is read before each explanation and each chunk of perturbed photos."""

    def timed(net: nn.Module, xs: Tensor, t: Tensor) -> dict[str, Tensor]:
        clock.check()
        return maps_of(net, xs, t)

    x, t = stage.x, stage.targets
    own, after, other = timed(model, x, t), timed(randomised, x, t), timed(model, x, stage.far)
    noisy = [timed(model, xp, t) for xp in stage.noisy]
    out = {}
    for m, maps in own.items():
        n = maps.shape[0]
        # The control's figure is the edge baseline's: the same maps.
        score = stage.base[EDGES] if m == EDGES else _faithful(model, stage, maps, clock)
        raw = {
            "randomisation": [abs(spearman(maps[i], after[m][i])) for i in range(n)],
            "class": [ssim(maps[i], other[m][i]) for i in range(n)],
            "faithfulness": (score - stage.base["random"]).tolist(),
            "edges": (score - stage.base[EDGES]).tolist(),
            "stability": _max_sensitivity(maps, [e[m] for e in noisy]).tolist(),
            "cells": [float(maps[0].numel())],
        }
        if stage.masks is not None:
            raw.update(localised(maps, stage.masks))
        out[m] = raw
    return out


#: A layer, its methods, and how their maps are made (None: :func:`explainer`).
_Unit = tuple[str, Sequence[str], Maps | None]


@dataclass
class _Run:
    """The battery's inputs, and its bookkeeping: each candidate's per-photo figures so far (over the first
    photos, a batch at a time), and why one stopped."""

    model: nn.Module
    x: Tensor
    masks: Tensor | None
    randomised: nn.Module
    seed: int
    clock: Clock
    progress: Progress
    raw: dict[tuple[str, str], dict[str, list[float]]] = field(default_factory=dict)
    dropped: dict[tuple[str, str], str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _round(run: _Run, units: Sequence[_Unit], lo: int, hi: int) -> None:
    """One round of successive halving: every candidate still in, on the photos ``lo:hi``, ``BATCH`` at a
    time. Once the budget is spent, the batch under way stops: each candidate keeps the batches it finished
    (``dropped`` says over how many photos), and one that finished none is left out."""
    first = lo == 0
    alive = [
        (la, [m for m in methods if (m, la) not in run.dropped and (first or (m, la) in run.raw)], maps_of)
        for la, methods, maps_of in units
    ]
    gen = torch.Generator().manual_seed(run.seed)  # robustness()'s draws: the same copies for every method
    noisy = [uniform_noise(run.x[lo:hi], RADIUS, gen) for _ in range(SAMPLES)]
    try:
        for a in range(lo, hi, BATCH):
            _batch(run, alive, a, min(hi, a + BATCH), [copy[a - lo : a - lo + BATCH] for copy in noisy])
    except Spent:
        n, said = run.x.shape[0], run.clock.said()
        for la, methods, _ in alive:
            for m in methods:
                done = len(run.raw.get((m, la), {}).get("class", []))
                if not done:
                    run.left_out.append(f"{m} at {la}: not tested ({said})")
                elif done < hi:
                    run.dropped[(m, la)] = (
                        f"budget: its figures are over the first {done} of {n} photos only ({said})"
                    )


def _batch(run: _Run, alive: Sequence[_Unit], a: int, b: int, noisy: list[Tensor]) -> None:
    """Every candidate still in on the photos ``a:b`` (``noisy``: their noisy copies); the clock read before
    each unit of work (:class:`Spent` once the budget is spent)."""
    stage: _Stage | None = None
    for layer, methods, maps_of in alive:
        if not methods:
            continue
        run.clock.check()
        which = f"photos {a + 1}-{b}" if b > a + 1 else f"photo {b}"
        run.progress(f"{which} of {run.x.shape[0]}: {', '.join(methods)} at {layer}")
        masks = None if run.masks is None else run.masks[a:b]
        stage = stage or _stage(run.model, run.x[a:b], masks, noisy, run.seed, run.clock)
        got = _layer_raw(run.model, stage, maps_of or explainer(layer, methods, run.clock), run.randomised,
                         run.clock)  # fmt: skip
        for m, figures in got.items():
            mine = run.raw.setdefault((m, layer), {})
            for k, v in figures.items():
                if k != "cells":
                    mine[k] = mine.get(k, []) + v
        cells = int(next(iter(got.values()))["cells"][0])
        if a == 0 and maps_of is None and cells < 16:
            run.notes.append(f"{', '.join(methods)} at {layer}: a map of {cells} cells; its rank tests are "
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
    started: float | None = None,
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
        budget: seconds from ``started`` (a :func:`time.monotonic` reading: the command's, its process's
            start; default now), read before each batch of work (a chunk of perturbed photos, an
            explanation, a pass of a method's own): once they are spent the run stops within that batch,
            keeps each candidate's figures over the photos it finished and says what it cut.
        progress: called with a line before each step (a layer's methods on a batch of photos).
    """
    clock = Clock(budget, started)
    check = check_model(model, x, seed=seed)
    # The classifier re-initialised, on a copy (the first step: the generator's copy changes at each step).
    _, randomised = next(iter(randomised_models(model, seed=seed)))
    n = x.shape[0]
    cut = n // 2 if n >= HALVING_FROM else n
    pixel = {m for m in methods if m in REGISTRY and REGISTRY[m].resolution == "input"}  # once, first layer
    units: list[_Unit] = [
        (la, [m for m in methods if i == 0 or m not in pixel], None) for i, la in enumerate(layers)
    ]
    units.append(("-", [EDGES], _edges_of))
    state = _Run(model, x, masks, randomised, seed, clock, progress or (lambda _line: None))
    _round(state, units, 0, cut)
    if cut < n:
        for key, figures in state.raw.items():
            if key not in state.dropped and verdict_of(judge(figures))[0] == "fails":
                state.dropped[key] = (
                    f"failed clearly on the first {cut} of {n} photos; not tested on the rest"
                )
        _round(state, units, cut, n)
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
