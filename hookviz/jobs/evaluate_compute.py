"""The computation of ``evaluate`` for one batch: the maps (for the annotated classes where there are
annotations), then each ``--metric`` family on each map and on the chance baselines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from hookviz import evaluation
from hookviz.core.readout import scorer
from hookviz.engine.explain import explain
from hookviz.evaluation import localisation as loc
from hookviz.evaluation import perturbation as pert
from hookviz.evaluation import ssim
from hookviz.evaluation.robustness import robustness, uniform_noise
from hookviz.methods import MethodOptions
from hookviz.models.loaded import LoadedModel, num_classes


class EvaluateJob(Protocol):
    """What the computation reads of an ``evaluate`` job (:class:`hookviz.jobs.evaluate.EvaluateJob`)."""

    loaded: LoadedModel
    layers: Sequence[str]
    methods: Sequence[str]
    targets: Any
    options: MethodOptions
    metrics: Sequence[str]
    metric_settings: Any
    steps: int
    seed: int
    chunk: int | None


Objects = list[list[tuple[int | None, np.ndarray]] | None] | None
#: Objects as the job hands them over: an image whose annotation was refused has the reason instead.
Given = Sequence[list[tuple[int | None, np.ndarray]] | str | None] | None
#: ``--target label``'s classes, an image's or why it has none.
Labels = Sequence[int | str] | None


def _targets(job: EvaluateJob, x: Tensor, objects: Objects, labels: Labels) -> Any:
    """What to explain: ``--target`` as given, each image's label (``--target label``: a class, or why it has
    none, explained as class 0 and refused), or each image's annotated classes ``(B, T)`` (the largest
    object's first; a binary mask's object is the ``--target`` class; short rows padded with their first)."""
    if labels is not None:
        return torch.tensor([[k if isinstance(k, int) else 0] for k in labels], device=x.device)
    if objects is None:
        return job.targets

    default: list[int] = []
    if any(not objs or any(k is None for k, _ in objs) for objs in objects):
        with torch.no_grad():  # the class of a binary mask's object, or of an image without any
            top = explain(job.loaded.model, x, job.layers[:1], ["eigencam"], job.targets).targets[:, 0]
        default = [int(v) for v in top]
    rows = [
        [default[i] if k is None else k for k, _ in objs or []] or [default[i]]
        for i, objs in enumerate(objects)
    ]
    width = max(len(r) for r in rows)
    return torch.tensor([r + [r[0]] * (width - len(r)) for r in rows], device=x.device)


def _baselines(x: Tensor, maps: Tensor) -> dict[str, Tensor]:

    b, *dims = maps.shape
    steps, h, w = dims if len(dims) == 3 else (1, *dims)  # a video model's maps have time steps
    shape = (b, *dims)
    return {
        "random": evaluation.random_maps(b, steps * h, w, x=x).reshape(shape),
        "center": evaluation.center_maps(b, h, w)[:, None].expand(b, steps, h, w).reshape(shape),
    }


def _similarity(a: Tensor, b: Tensor) -> float:
    """SSIM of two maps; a video model's per time step, averaged."""

    if a.dim() == 3:
        return float(np.mean([ssim(a[k], b[k]) for k in range(a.shape[0])]))
    return ssim(a, b)


def compute(job: EvaluateJob, x: Tensor, given: Given, labels: Labels = None) -> Any:

    refused = [o if isinstance(o, str) else None for o in given] if given is not None else None
    # An image whose annotation was refused is explained as one without any (its record says why).
    objects: Objects = [None if isinstance(o, str) else o for o in given] if given is not None else None
    model, s, families = job.loaded.model, job.metric_settings, set(job.metrics)
    ex = explain(model, x, job.layers, job.methods, _targets(job, x, objects, labels), options=job.options)
    t = ex.targets[:, 0]
    score = scorer(ex.labels, ex.region, ex.score_kind)  # a segmentation's class probability over its region
    size = tuple(int(v) for v in x.shape[2:])
    named = {f"{m}@{layer}": maps[:, 0] for (m, layer), maps in ex.maps.items()}
    first = next(iter(named.values()))
    named |= _baselines(x, first)
    rows: dict[str, dict[str, Tensor]] = {name: {} for name in named}
    passes = 0
    common = {"chunk": job.chunk, "scorer": score}
    for name, maps in named.items():
        r = rows[name]
        if "faithfulness" in families:
            f = evaluation.faithfulness(model, x, maps, t, steps=job.steps, **common)  # type: ignore[arg-type]
            r |= {"deletion_auc": f.deletion_auc, "insertion_auc": f.insertion_auc}
            r |= {"average_drop": f.average_drop, "increase": f.increase}
            passes += f.forward_passes
        if "road" in families:
            rd = pert.road(model, x, maps, t, noise=s.road_noise, seed=job.seed, **common)  # type: ignore[arg-type]
            r |= {"road_morf": rd.morf_mean, "road_lerf": rd.lerf_mean, "road": rd.combined}
            passes += rd.forward_passes
        if "flipping" in families:
            pf = pert.pixel_flipping(model, x, maps, t, steps=job.steps, **common)  # type: ignore[arg-type]
            rp = pert.region_perturbation(model, x, maps, t, patch_size=s.patch, regions=s.regions, **common)  # type: ignore[arg-type]
            r |= {"pixel_flipping_auc": pf.summary, "region_aopc": rp.summary}
            passes += pf.forward_passes + rp.forward_passes
        if "complexity" in families:
            up = evaluation.upsample(maps.to(x.device), size).cpu()
            r |= {"sparseness": loc.sparseness(up).float(), "complexity": loc.complexity(up).float()}
    if "robustness" in families:
        passes += _robustness(job, x, ex, score, rows)
    if "randomisation" in families:
        seeds = evaluation.image_seeds(x, job.seed)
        off = evaluation.off_classes(t.cpu(), num_classes(job.loaded), seeds=seeds).to(x.device)
        other = explain(model, x, job.layers, job.methods, off, options=job.options)
        passes += x.shape[0]
        for name, maps in named.items():
            alt = other.maps[tuple(name.split("@", 1))][:, 0] if "@" in name else maps  # type: ignore[index]
            sims = [_similarity(maps[i].float().cpu(), alt[i].float().cpu()) for i in range(len(maps))]
            rows[name]["random_logit"] = torch.tensor(sims)
    found = None
    if objects is not None:
        found = _localise(job, ex, named, objects, size, x)
        found = [r if r is not None else found[i] for i, r in enumerate(refused or [])]
    return ex, rows, found, passes


def _robustness(job: EvaluateJob, x: Tensor, ex: Any, score: Any, rows: dict[str, dict[str, Tensor]]) -> int:
    """The robustness figures of every map into ``rows``; the forward passes they took."""
    model, s, passes = job.loaded.model, job.metric_settings, 0
    # Each image's noise from its own generator: the figures do not change with --batch-size.
    gens = evaluation.image_generators(x, job.seed)
    per_image = [
        [uniform_noise(x[i], s.radius, g) for _ in range(s.robust_samples)] for i, g in enumerate(gens)
    ]
    draws = [torch.stack([copies[k] for copies in per_image]) for k in range(s.robust_samples)]
    # Each noisy copy explained once, for every method and layer at once.
    noisy = []
    for xp in draws:
        e = explain(model, xp, job.layers, job.methods, ex.targets, options=job.options)
        noisy.append({key: maps[:, 0].detach() for key, maps in e.maps.items()})
        passes += x.shape[0]

    def explainer(key: tuple[str, str]) -> Any:
        return lambda _xp, k: noisy[k][key]

    for (m, layer), maps in ex.maps.items():
        rb = robustness(
            model,
            explainer((m, layer)),
            x,
            maps[:, 0],
            samples=s.robust_samples,
            perturb=lambda _x, k: draws[k],
            scorer=score,
        )
        rows[f"{m}@{layer}"] |= {
            "max_sensitivity": rb.max_sensitivity,
            "avg_sensitivity": rb.avg_sensitivity,
            "relative_input_stability": rb.relative_input_stability,
            "relative_output_stability": rb.relative_output_stability,
        }
        passes += rb.forward_passes
    return passes


def _localise(
    job: EvaluateJob, ex: Any, named: dict[str, Tensor], objects: Objects, size: tuple[int, ...], x: Tensor
) -> list[Any]:
    """Per image and annotated object: the five localisation figures of each map for the object's class."""

    s = job.metric_settings
    out: list[Any] = []
    assert objects is not None
    for i, objs in enumerate(objects):
        if objs is None:
            out.append(None)
            continue
        mine = []
        for j, (_, mask) in enumerate(objs):
            k = int(ex.targets[i, j])
            m = torch.from_numpy(mask)[None]
            figures: dict[str, dict[str, float]] = {}
            for name, maps in named.items():
                cam = ex.maps[tuple(name.split("@", 1))][i : i + 1, j] if "@" in name else maps[i : i + 1]
                up = evaluation.upsample(cam.to(x.device), size[-2:]).cpu()
                figures[name] = {
                    "pointing_game": float(loc.pointing_game(up, m, s.tolerance)),
                    "energy_pointing_game": float(loc.energy_pointing_game(up, m)),
                    "relevance_mass": float(loc.relevance_mass(up, m)),
                    "relevance_rank": float(loc.relevance_rank(up, m)),
                    "top_k_intersection": float(loc.top_k_intersection(up, m, s.top_k)),
                }
            mine.append((k, int(mask.sum()), figures))
        out.append(mine)
    return out
