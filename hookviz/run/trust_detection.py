"""``hookviz trust`` on a detector: each kept box's map, from the gradient of that box's own score (as
``gradcam`` explains a detector), tested on what a box allows.

What applies: **localisation** against the box itself (the pointing game: the map's peak inside the box it
explains, less a centred Gaussian's; the energy inside beside it), with the edge detector as the control.
What does not, said in the report as ``n/a`` rather than faked: randomisation (a re-initialised head returns
other boxes, so there is no map of the same box to compare), class sensitivity (a box's score is its own
class's: there is no other class's map of the same box), faithfulness (deletion and insertion would need the
box found again in every perturbed photo) and stability (the same, in every noisy copy). When the edge
control points at the boxes as well, localisation cannot tell a map that explains the detector from one that
draws the photo: a candidate is then used with care at best.

The model check: a detector that keeps no box at the score threshold on most photos (its weights never
loaded, most often) gets "no map here can be trusted".

A budget is read before each photo (and between D-RISE's masked passes): once it is spent, every candidate's
figures are over the photos explained so far (``dropped`` says so), or, with none, each is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from hookviz.engine.detection import DetectionExplanation, explain_detections
from hookviz.evaluation.trust import (
    EDGES,
    Candidate,
    ModelCheck,
    Progress,
    Test,
    TrustReport,
    answered,
    edge_maps,
    judge,
    localised,
    not_applicable,
    verdict_of,
)
from hookviz.evaluation.trust_clock import Clock, Spent
from hookviz.models.loaded import LoadedModel

__all__ = ["NOT_FOR_DETECTORS", "trust_detections"]

#: Why each test of a classifier's battery does not apply to a detector's boxes.
NOT_FOR_DETECTORS = {
    "randomisation": "a re-initialised head returns other boxes: no map of the same box to compare",
    "class": "a box's score is its own class's: no other class's map of the same box",
    "faithfulness": "deletion and insertion need the same box found again in every perturbed photo",
    "stability": "the same box would have to be found again in every noisy copy",
}
THRESHOLD = 0.5


def _box_mask(box: Tensor, image: tuple[int, int], resized: tuple[int, int]) -> Tensor:
    """The box (photo pixels) as a mask of the map's ``resized`` frame."""
    (h, w), (rh, rw) = image, resized
    x0, y0, x1, y1 = box.tolist()
    mask = torch.zeros(rh, rw, dtype=torch.bool)
    c0, r0 = int(x0 * rw / w), int(y0 * rh / h)
    c1, r1 = max(c0 + 1, round(x1 * rw / w)), max(r0 + 1, round(y1 * rh / h))
    mask[r0:r1, c0:c1] = True
    return mask


def _tests(figures: dict[str, list[float]]) -> dict[str, Test]:
    others = {k: [0.0] for k in ("randomisation", "class", "faithfulness", "edges", "stability")}
    loc = judge({**others, **figures})["localisation"]
    return {**{k: not_applicable(k, why) for k, why in NOT_FOR_DETECTORS.items()}, "localisation": loc}


def trust_detections(
    loaded: LoadedModel,
    photos: Sequence[Tensor],
    names: Sequence[str],
    layers: Sequence[str],
    methods: Sequence[str],
    *,
    seed: int = 0,
    progress: Progress | None = None,
    budget: float | None = None,
    started: float | None = None,
) -> TrustReport:
    """Every method at every layer on the boxes the detector keeps (score >= 0.5, at most 5 a photo).

    Args:
        photos: ``(3, H, W)`` in [0, 1], each at its own size (as the detector takes them).
        budget: seconds from ``started`` (a :func:`time.monotonic` reading; default now), read before each
            photo: the figures are over the photos explained within it, and the report says so.
    """
    say = progress or (lambda _line: None)
    say(f"{len(photos)} photos: {', '.join(methods)} at {', '.join(layers)} (one backward pass a box)")
    clock = Clock(budget, started)
    found = _explained(loaded, photos, layers, methods, clock)
    photos = photos[: len(found)]
    raw: dict[tuple[str, str], dict[str, list[float]]] = {}
    edges_raw: dict[str, list[float]] = {}
    for photo, ex in zip(photos, found, strict=True):
        if not len(ex.boxes):
            continue
        masks = torch.stack([_box_mask(b, ex.image_size, ex.resized) for b in ex.boxes])
        for layer in layers:
            for m in methods:
                stack = ex.maps[(m, layer)].float()
                stack = stack.expand(len(ex.boxes), *stack.shape[1:]) if stack.shape[0] == 1 else stack
                for k, v in localised(stack, masks).items():
                    raw.setdefault((m, layer), {}).setdefault(k, []).extend(v)
        edges = F.interpolate(edge_maps(photo[None])[None], size=ex.resized, mode="bilinear")[0]
        for k, v in localised(edges.expand(len(ex.boxes), *ex.resized), masks).items():
            edges_raw.setdefault(k, []).extend(v)
    seen = sum(1 for ex in found if len(ex.boxes))
    said = f"it keeps no box with score >= {THRESHOLD} on {len(photos) - seen} of {len(photos)} photos"
    check = ModelCheck(float("nan"), float("nan"), False, bool(photos) and seen * 2 <= len(photos), said)
    candidates = [_candidate(m, layer, figures) for (m, layer), figures in raw.items()]
    if edges_raw:
        control = replace(_candidate(EDGES, "-", edges_raw), control=True)
        candidates.append(control)
        if control.tests["localisation"].outcome == "pass":  # localisation alone cannot tell them apart
            candidates = [_no_better_than_edges(c) for c in candidates]
    tests = ["localisation", *NOT_FOR_DETECTORS]
    tried = [(m, la) for la in layers for m in methods]
    candidates, left_out = _cut(candidates, len(found), len(names), tried, clock)
    report = TrustReport(
        loaded.name, list(names), seed, check, candidates, None, "", [], "detection", left_out, tests
    )
    return answered(report)


def _cut(
    candidates: list[Candidate], done: int, n: int, tried: list[tuple[str, str]], clock: Clock
) -> tuple[list[Candidate], list[str]]:
    """What a budget spent after ``done`` of the ``n`` photos cut: the candidates' figures are over those
    photos (said in ``dropped``); with none, every candidate is left out."""
    if done == n:
        return candidates, []
    if not done:
        return [], [f"{m} at {la}: not tested ({clock.said()})" for m, la in [*tried, (EDGES, "-")]]
    cut = f"budget: its figures are over the first {done} of {n} photos only ({clock.said()})"
    return [replace(c, dropped=cut) for c in candidates], []


def _explained(
    loaded: LoadedModel, photos: Sequence[Tensor], layers: Sequence[str], methods: Sequence[str], clock: Clock
) -> list[DetectionExplanation]:
    """The photos' detections with their maps, one photo at a time until the budget is spent."""
    found: list[DetectionExplanation] = []
    try:
        for photo in photos:
            clock.check()
            found += explain_detections(loaded.model, [photo.to(loaded.device)], list(layers),
                                        list(methods), score_threshold=THRESHOLD, max_boxes=5,
                                        progress=clock.ticking())  # fmt: skip
    except Spent:
        pass
    return found


def _candidate(method: str, layer: str, figures: dict[str, list[float]]) -> Candidate:
    tests = _tests(figures)
    verdict, reason = verdict_of(tests)
    return Candidate(method, layer, tests, verdict, reason, photos=len(figures["pointing"]))


def _no_better_than_edges(c: Candidate) -> Candidate:
    if c.control or c.verdict != "recommended":
        return c
    why = "localisation is its only test here, and the edge control points at the boxes as well"
    return replace(c, verdict="care", reason=why)
