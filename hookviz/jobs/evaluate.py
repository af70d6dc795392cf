"""``evaluate``: every map's metrics per image, in families (``--metric``), and the summary over images."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz.core.memory import Estimate
from hookviz.errors import InputError, UsageError
from hookviz.io.annotation import input_mask, resolve
from hookviz.io.images import Box
from hookviz.jobs.common import Notes, _check_finite, model_settings, parse_methods
from hookviz.methods import MethodOptions
from hookviz.methods.footprint import explain_estimate
from hookviz.models.loaded import LoadedModel, num_classes

#: ``--metric`` families, in the order their columns appear.
FAMILIES = ("faithfulness", "road", "flipping", "localisation", "complexity", "robustness", "randomisation")
#: Each figure: its family, what it is called in a table, whether lower or higher is better, and whether it
#: is a proportion (a Wilson interval) or a mean (Student's t).
FIGURES: dict[str, tuple[str, str, str, bool]] = {
    "deletion_auc": ("faithfulness", "deletion AUC", "↓", False),
    "insertion_auc": ("faithfulness", "insertion AUC", "↑", False),
    "average_drop": ("faithfulness", "avg drop %", "↓", False),
    "increase": ("faithfulness", "increase %", "↑", True),
    "road_morf": ("road", "ROAD MoRF", "↓", False),
    "road_lerf": ("road", "ROAD LeRF", "↑", False),
    "road": ("road", "ROAD LeRF-MoRF", "↑", False),
    "pixel_flipping_auc": ("flipping", "pixel flipping AUC", "↓", False),
    "region_aopc": ("flipping", "region AOPC", "↑", False),
    "pointing_game": ("localisation", "pointing %", "↑", True),
    "energy_pointing_game": ("localisation", "energy pointing", "↑", False),
    "relevance_mass": ("localisation", "relevance mass", "↑", False),
    "relevance_rank": ("localisation", "relevance rank", "↑", False),
    "top_k_intersection": ("localisation", "top-k", "↑", False),
    "sparseness": ("complexity", "sparseness", "↑", False),
    "complexity": ("complexity", "complexity", "↓", False),
    "max_sensitivity": ("robustness", "max sensitivity", "↓", False),
    "avg_sensitivity": ("robustness", "avg sensitivity", "↓", False),
    "relative_input_stability": ("robustness", "RIS", "↓", False),
    "relative_output_stability": ("robustness", "ROS", "↓", False),
    "random_logit": ("randomisation", "random-logit SSIM", "↓", False),
}
#: A figure's name in the summary where it differs from the per-image one (a per-image yes/no there).
SUMMARY_NAMES = {"increase": "increase_in_confidence"}


def summary_name(figure: str) -> str:
    return SUMMARY_NAMES.get(figure, figure)


#: Families that perturb an image's pixels, or need its annotations: not for a video model's clips.
PIXEL_FAMILIES = ("road", "flipping", "localisation")


def parse_metrics(spec: Sequence[str] | None, annotated: bool = False) -> tuple[str, ...]:
    """``--metric`` values (repeatable, comma-separated; ``all``) as families in table order. Default: the
    faithfulness set, with ``localisation`` too when annotations are given."""
    asked = [p.strip().lower() for s in spec or () for p in s.split(",") if p.strip()]
    if not asked:
        return ("faithfulness", "localisation") if annotated else ("faithfulness",)
    if "all" in asked:
        return tuple(f for f in FAMILIES if f != "localisation" or annotated)
    aliases = {"localization": "localisation", "randomization": "randomisation", "pixel-flipping": "flipping"}
    unknown = [a for a in asked if aliases.get(a, a) not in FAMILIES]
    if unknown:
        raise UsageError(f"--metric {unknown[0]!r}: one of {', '.join(FAMILIES)}, or all")
    chosen = {aliases.get(a, a) for a in asked}
    if "localisation" in chosen and not annotated:
        raise UsageError("--metric localisation needs where the objects are: --boxes FILE|DIR or --masks DIR")
    return tuple(f for f in FAMILIES if f in chosen)


@dataclass(frozen=True)
class MetricSettings:
    """The settings of the metrics that take any (recorded with every evaluation)."""

    tolerance: float = 15.0  # pointing game, pixels of the input
    top_k: int = 1000  # top-k intersection
    radius: float = 0.2  # robustness: uniform noise in [-radius, radius] of the model's input
    robust_samples: int = 10
    patch: int = 8  # region perturbation
    regions: int = 100
    road_noise: float = 0.01

    def record(self, families: Sequence[str]) -> dict[str, Any]:
        used: dict[str, dict[str, Any]] = {
            "localisation": {"tolerance": self.tolerance, "top_k": self.top_k},
            "robustness": {"radius": self.radius, "samples": self.robust_samples},
            "flipping": {"patch": self.patch, "regions": self.regions},
            "road": {"percentages": [10, 20, 30, 40, 50, 60, 70, 80, 90], "noise": self.road_noise},
        }
        return {k: v for f in families for k, v in used.get(f, {}).items()}


@dataclass(kw_only=True)
class EvaluateJob(Notes):
    """The metrics of every method x layer per image with the ``random`` and ``center`` chance baselines;
    no pictures, only records. With annotations (:mod:`hookviz.io.annotation`) each image is explained for its
    annotated classes, the first (the largest object's) for every family, each for the localisation."""

    loaded: LoadedModel
    layers: Sequence[str]
    methods: Sequence[str] = ("gradcam",)
    #: The settings of the methods that take any (``--seed``, ``--samples``, ...).
    options: MethodOptions = field(default_factory=MethodOptions)
    targets: str | list[int] | None = None
    steps: int = 16
    chunk: int | None = None  # perturbed images a pass: 64 on a GPU, 8 on the CPU
    metrics: Sequence[str] = ("faithfulness",)
    metric_settings: MetricSettings = field(default_factory=MetricSettings)
    annotations: Any = None  # hookviz.io.annotation.Annotations
    seed: int = 0
    kind: str = "evaluate"
    _pending: Any = field(default=None, init=False, repr=False)
    _classes: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.methods = parse_methods(self.methods)
        if self.annotations is not None:  # every class resolved before the first image, not midway
            self._classes = num_classes(self.loaded)  # once: without class names it costs a forward pass
            self.annotations.check(self.loaded.categories, self._classes)
            self.notes.extend(self.annotations.warnings)
        if self.loaded.video is not None and (bad := [f for f in self.metrics if f in PIXEL_FAMILIES]):
            raise UsageError(
                f"--metric {bad[0]} perturbs or annotates an image's pixels; on a video model's clips use "
                "faithfulness, complexity, robustness or randomisation"
            )

    def settings(self) -> dict[str, Any]:
        return {
            **model_settings(self.loaded),
            "command": self.kind,
            "layers": list(self.layers),
            "methods": list(self.methods),
            **({"options": used} if (used := self.options.record(self.methods)) else {}),
            "targets": "annotated" if self.annotations is not None else self.targets or "top1",
            "steps": self.steps,
            "baseline": "zeros (the data set's mean colour after normalisation)",
            "metrics": list(self.metrics),
            **({"metric_settings": s} if (s := self.metric_settings.record(self.metrics)) else {}),
            **({"annotations": self.annotations.source} if self.annotations is not None else {}),
            **({"seed": self.seed} if {"robustness", "randomisation"} & set(self.metrics) else {}),
        }

    def planned(self, stem: str) -> list[str]:
        return []

    def passes_per_image(self, maps: int, size: tuple[int, ...]) -> dict[str, int]:
        """Forward passes of the model per image that each family costs beyond the explanation, for
        ``maps`` maps (method x layer, plus the two chance baselines); robustness and randomisation also
        explain noisy copies and another class (one forward pass each here, their backward passes besides)."""
        h, w = size[-2:]
        s = self.metric_settings
        regions = min(s.regions, math.ceil(h / s.patch) * math.ceil(w / s.patch))
        cost = {
            "faithfulness": (2 * (self.steps + 1) + 1) * maps,
            "road": 2 * 9 * maps,
            "flipping": (self.steps + regions + 1) * maps,
            "robustness": (s.robust_samples + 1) * (maps - 2) + s.robust_samples,
            "randomisation": 1,
        }
        return {f: cost[f] for f in self.metrics if f in cost}

    def annotate(self, batch: Sequence[tuple[Any, np.ndarray, Box]], size: tuple[int, int]) -> None:
        """Before a batch: each image's annotated objects, as ``(label, mask)`` in the input's frame, the
        largest first (pipeline hook); an image whose annotation cannot be used gets its reason instead (it
        fails alone)."""
        if self.annotations is None:
            return
        objects: list[list[tuple[int | None, np.ndarray]] | str | None] = []
        for item, rgb, box in batch:
            try:
                objects.append(self._objects(item, rgb, box, size))
            except UsageError as exc:
                objects.append(str(exc))
        self._pending = objects

    def _objects(
        self, item: Any, rgb: np.ndarray, box: Box, size: tuple[int, int]
    ) -> list[tuple[int | None, np.ndarray]] | None:
        regions = self.annotations.regions(item.path or item.name)
        if regions is None:  # this image fails alone (render says why); the others go on
            return None
        h, w = rgb.shape[:2]
        merged: dict[int | None, np.ndarray] = {}
        for r in regions:
            if r.mask is not None and r.mask.shape != (h, w):
                mh, mw = r.mask.shape
                if abs(mh * w / mw - h) > 1.0:  # more than a pixel of rounding: another picture's mask
                    raise UsageError(
                        f"its mask is {mw}x{mh} and the photo {w}x{h}, another aspect: the mask of another "
                        "photo? Give a mask of the photo's size"
                    )
                self._note_once("resize", f"masks of another size than their photo are resized (nearest), "
                                f"e.g. {item.name}'s {mw}x{mh} to {w}x{h}")  # fmt: skip
            k = resolve(r.label, self.loaded.categories, self._classes)
            merged[k] = merged.get(k, np.zeros((h, w), bool)) | r.draw(h, w)
        masks = {k: input_mask(m, box, size) for k, m in merged.items()}
        lost = [k for k, m in masks.items() if not m.any() and merged[k].any()]
        if lost:
            self._note_once(
                "lost",
                f"an annotated object lies wholly outside the region the model saw and is left out, e.g. "
                f"{item.name}: class {lost[0]} (--resize squash shows the model the whole photo)",
            )
        return sorted(((k, m) for k, m in masks.items() if m.any()), key=lambda kv: -int(kv[1].sum()))

    def memory(self, shape: tuple[int, ...]) -> Estimate:
        """What a batch of inputs of ``shape`` holds: the explanation, and the perturbed copies its families
        run (a chunk at a time, whatever the batch)."""
        k = 1 if not isinstance(self.targets, list) else len(self.targets)
        est = explain_estimate(self.loaded.model, tuple(shape[1:]), self.loaded.device, self.layers,
                               self.methods, k, self.options)  # fmt: skip
        copies = (self.chunk or 64) * est.per_image // 4  # a perturbed copy holds no gradient and no map
        # Robustness explains each noisy copy of the batch in turn, keeping the first explanation meanwhile.
        twice = 2 if "robustness" in self.metrics else 1
        return Estimate(est.per_image * twice, est.fixed + copies)

    def compute(self, x: Any) -> Any:
        from hookviz.jobs.evaluate_compute import compute

        objects, self._pending = self._pending, None
        return compute(self, x, objects)

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        ex, rows, objects, passes = result
        if objects is not None and (objects[index] is None or isinstance(objects[index], str)):
            if isinstance(objects[index], str):
                raise InputError(f"annotation refused: {objects[index]}")
            raise InputError(f"not in the annotations ({self.annotations.source}): no object to localise")
        _check_finite(ex, index)
        lm = self.loaded
        pred, tgt = int(ex.predicted[index]), int(ex.targets[index, 0])
        metrics = {
            name: {k: _value(k, v[index]) for k, v in figures.items() if k in FIGURES}
            for name, figures in rows.items()
        }
        fields: dict[str, Any] = {
            "predicted": {
                "index": pred,
                "name": lm.class_name(pred),
                "score": round(float(ex.predicted_score[index]), 6),
            },
            "target": {
                "index": tgt,
                "name": lm.class_name(tgt),
                "score": round(float(ex.target_scores[index, 0]), 6),
            },
            "metrics": metrics,
            "forward_passes": passes // max(1, int(ex.targets.shape[0])),
        }
        if objects is not None:
            fields["objects"] = [
                {
                    "class": {"index": k, "name": lm.class_name(k)},
                    "pixels": pixels,
                    "metrics": {n: {f: _value(f, v) for f, v in m.items()} for n, m in found.items()},
                }
                for k, pixels, found in objects[index]
            ]
        return [], fields


def _value(name: str, v: Any) -> Any:
    f = float(v)
    if name == "increase":
        return bool(f > 0)
    return None if math.isnan(f) else round(f, 6)


def tables(rows: Sequence[dict[str, Any]], families: Sequence[str]) -> list[dict[str, Any]]:
    """The summary as tables, one a family: ``{"family", "count" (images or objects), "columns" (each
    figure's name and its better direction), "rows" [{"method", "layer", "name", "n", "cells"}]}``, each
    cell the figure and its interval as text (``0.372 ±0.041``, a proportion ``100.0 [89, 100]``)."""
    out = []
    for family in families:
        figs = [(summary_name(f), spec) for f, spec in FIGURES.items() if spec[0] == family]
        figs = [(f, spec) for f, spec in figs if any(f in r for r in rows)]
        if not figs:
            continue
        count = "objects" if family == "localisation" else "images"
        body = [
            {
                "method": r["method"],
                "layer": r["layer"],
                "name": str(r.get("name", "")),
                "n": int(r.get(count, 0)),
                "cells": [_cell(r, f, spec[3]) for f, spec in figs],
            }
            for r in rows
            if any(f in r for f, _ in figs)
        ]
        columns = [f"{spec[1]} {spec[2]}" for _, spec in figs]
        out.append({"family": family, "count": count, "columns": columns, "rows": body})
    return out


def _cell(row: dict[str, Any], fig: str, proportion: bool) -> str:
    if row.get(fig) is None:
        return "-"
    if proportion:
        low, high = row[f"{fig}_ci95"]
        return f"{row[fig]:.1f} [{low:.0f}, {high:.0f}]"
    half = row.get(f"{fig}_ci95")
    if half is None or half != half:  # one value: no interval
        return f"{row[fig]:.3f} (n/a)"
    return f"{row[fig]:.3f} ±{half:.3f}"


def summarise_evaluation(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method@layer (and per chance baseline): each figure's mean and 95 % interval over the
    images (localisation: over the annotated objects)."""
    return _summarise(records, by_class=False)


def summarise_by_class(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The localisation figures per method@layer and annotated class."""
    return _summarise(records, by_class=True)


def _summarise(records: Sequence[dict[str, Any]], by_class: bool) -> list[dict[str, Any]]:
    from hookviz.evaluation import mean_ci, wilson

    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    names: dict[tuple[str, ...], str] = {}
    for rec in records:
        if not by_class:
            for name, figures in rec.get("metrics", {}).items():
                groups.setdefault((name,), []).append(figures)
        for obj in rec.get("objects", []):
            for name, figures in obj.get("metrics", {}).items():
                key: tuple[str, ...] = (name, str(obj["class"]["index"])) if by_class else (name,)
                names[key] = obj["class"]["name"]
                groups.setdefault(key, []).append(figures)
    rows = []
    for key, values in groups.items():
        method, _, layer = key[0].partition("@")
        row: dict[str, Any] = {"method": method, "layer": layer or "-"}
        if by_class:
            row |= {"class": int(key[1]), "name": names[key]}
        for fig, (family, _, _, proportion) in FIGURES.items():
            got = [v[fig] for v in values if v.get(fig) is not None]
            if not got:
                continue
            row.setdefault("objects" if family == "localisation" else "images", len(got))
            out = summary_name(fig)
            if proportion:  # the Wilson interval stays inside 0..100 % for small n (a t interval does not)
                hits = sum(bool(g) for g in got)
                low, high = wilson(hits, len(got))
                row[out] = round(100.0 * hits / len(got), 2)
                row[f"{out}_ci95"] = [round(100.0 * low, 2), round(100.0 * high, 2)]
            else:
                mean, half = mean_ci([float(g) for g in got])
                row[out], row[f"{out}_ci95"] = round(mean, 4), round(half, 4)
        rows.append(row)
    return rows


def evaluate(
    loaded: LoadedModel,
    x: Any,
    layers: Sequence[str],
    methods: Sequence[str] = ("gradcam",),
    *,
    metrics: Sequence[str] | None = None,
    targets: str | list[int] | None = None,
    masks: Sequence[Sequence[tuple[int | None, np.ndarray]]] | None = None,
    settings: MetricSettings | None = None,
    options: MethodOptions | None = None,
    steps: int = 16,
    seed: int = 0,
) -> dict[str, Any]:
    """The library's ``evaluate``: every figure of the ``metrics`` families for each method@layer's maps of
    the preprocessed batch ``x`` and for the ``random`` and ``center`` baselines.

    ``masks``: per image, ``(class, mask)`` pairs in the input's frame (``(H, W)`` booleans; class None: the
    ``targets`` class), the largest object first; they make ``localisation`` available. Returns
    ``{"figures": {map name: {figure: (B,) tensor}}, "objects": per image [(class, pixels, {map name:
    {figure: value}})] or None, "forward_passes": int, "explanation": the Explanation}``.
    """
    from hookviz.jobs.evaluate_compute import compute

    job = EvaluateJob(
        loaded=loaded,
        layers=list(layers),
        methods=list(methods),
        targets=targets,
        steps=steps,
        metrics=parse_metrics(metrics, annotated=masks is not None),
        metric_settings=settings or MetricSettings(),
        options=options or MethodOptions(),
        annotations=None,
        seed=seed,
    )
    objects: list[list[tuple[int | None, np.ndarray]] | None] | None = (
        [list(m) for m in masks] if masks is not None else None
    )
    ex, rows, found, passes = compute(job, x, objects)
    return {"figures": rows, "objects": found, "forward_passes": passes, "explanation": ex}
