"""``evaluate``: every map's metrics per image, in families (``--metric``), and the summary over images."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hookviz.core.memory import Estimate
from hookviz.core.targets import Classes, Labelled, Positive, Target, Top, said
from hookviz.errors import InputError, UsageError
from hookviz.evaluation.families import FIGURES, PIXEL_FAMILIES, MetricSettings, parse_metrics
from hookviz.io.annotation import input_mask, resolve
from hookviz.io.annotation import load as load_annotations
from hookviz.io.images import Box
from hookviz.jobs.build import chosen_layers, method_options
from hookviz.jobs.common import BaseJob, check_finite, job_settings, scored_class
from hookviz.jobs.evaluate_compute import compute
from hookviz.methods import MethodOptions
from hookviz.methods import parse as parse_methods
from hookviz.methods.footprint import explain_estimate
from hookviz.models.classes import label_class, parse_targets
from hookviz.models.loaded import LoadedModel, num_classes, probe


@dataclass(kw_only=True)
class EvaluateJob(BaseJob):
    """The metrics of every method x layer per image with the ``random`` and ``center`` chance baselines;
    no pictures, only records. With annotations (:mod:`hookviz.io.annotation`) each image is explained for its
    annotated classes, the first (the largest object's) for every family, each for the localisation."""

    loaded: LoadedModel
    layers: Sequence[str]
    methods: Sequence[str] = ("gradcam",)
    #: The settings of the methods that take any (``--seed``, ``--samples``, ...).
    options: MethodOptions = field(default_factory=MethodOptions)
    #: ``Labelled``: each image's own class (``--target label``), told batch by batch by ``annotate``.
    targets: Target = field(default_factory=Top)
    steps: int = 16
    chunk: int | None = None  # perturbed images a pass: 64 on a GPU, 8 on the CPU
    metrics: Sequence[str] = ("faithfulness",)
    metric_settings: MetricSettings = field(default_factory=MetricSettings)
    annotations: Any = None  # hookviz.io.annotation.Annotations
    seed: int = 0
    kind: str = "evaluate"
    _pending: Any = field(default=None, init=False, repr=False)
    _labels: list[int | str] | None = field(default=None, init=False, repr=False)
    _classes: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.methods = parse_methods(self.methods)
        if self.annotations is not None:  # every class resolved before the first image, not midway
            self._classes = num_classes(self.loaded)  # once: without class names it costs a forward pass
            self.annotations.check(self.loaded.categories, self._classes)
            self.notes.extend(self.annotations.warnings)
        if self.loaded.inputs.kind == "video" and (bad := [f for f in self.metrics if f in PIXEL_FAMILIES]):
            raise UsageError(
                f"--metric {bad[0]} perturbs or annotates an image's pixels; on a video model's clips use "
                "faithfulness, complexity, robustness or randomisation"
            )

    def settings(self) -> dict[str, Any]:
        return job_settings(
            self,
            layers=list(self.layers),
            methods=list(self.methods),
            **({"options": used} if (used := self.options.record(self.methods)) else {}),
            targets="annotated" if self.annotations is not None else _targets_said(self.targets),
            steps=self.steps,
            baseline="zeros (the data set's mean colour after normalisation)",
            metrics=list(self.metrics),
            **({"metric_settings": s} if (s := self.metric_settings.record(self.metrics)) else {}),
            **({"annotations": self.annotations.source} if self.annotations is not None else {}),
            **({"seed": self.seed} if {"robustness", "randomisation"} & set(self.metrics) else {}),
        )

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
        fails alone); with ``--target label``, each image's own class (or why it has none)."""
        if isinstance(self.targets, Labelled):
            self._classes = self._classes or num_classes(self.loaded)
            self._labels = [label_class(item.label, self.loaded, self._classes) for item, _, _ in batch]
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
            drawn = r.draw(h, w)
            if r.box is not None and not r.polygons and not drawn.any():  # beyond the right or bottom edge
                where = ",".join(f"{v:g}" for v in r.box)
                self._note_once("beyond", f"a box lies wholly outside its photo and is left out, e.g. "
                                f"{item.name}: {r.label} at {where} (the photo is {w}x{h})")  # fmt: skip
                continue
            merged[k] = merged.get(k, np.zeros((h, w), bool)) | drawn
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
        k = len(self.targets.ids) if isinstance(self.targets, Classes) else 1
        est = explain_estimate(self.loaded.model, tuple(shape[1:]), self.loaded.device, self.layers,
                               self.methods, k, self.options)  # fmt: skip
        copies = (self.chunk or 64) * est.per_image // 4  # a perturbed copy holds no gradient and no map
        # Robustness explains each noisy copy of the batch in turn, keeping the first explanation meanwhile.
        twice = 2 if "robustness" in self.metrics else 1
        return replace(est, per_image=est.per_image * twice, fixed=est.fixed + copies)

    def compute(self, x: Any) -> Any:

        objects, self._pending = self._pending, None
        labels, self._labels = self._labels, None
        return (*compute(self, x, objects, labels), labels)

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        ex, rows, objects, passes, labels = result
        if labels is not None and isinstance(labels[index], str):
            raise InputError(labels[index])
        if objects is not None and (objects[index] is None or isinstance(objects[index], str)):
            if isinstance(objects[index], str):
                raise InputError(f"annotation refused: {objects[index]}")
            raise InputError(f"not in the annotations ({self.annotations.source}): no object to localise")
        check_finite(ex, index)
        lm = self.loaded
        pred, tgt = int(ex.predicted[index]), int(ex.targets[index, 0])
        metrics = {
            name: {k: _value(k, v[index]) for k, v in figures.items() if k in FIGURES}
            for name, figures in rows.items()
        }
        fields: dict[str, Any] = {
            "predicted": scored_class(lm, pred, float(ex.predicted_score[index])),
            "target": scored_class(lm, tgt, float(ex.target_scores[index, 0])),
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


def _targets_said(targets: Target) -> Any:
    return said(targets)


def _target(loaded: LoadedModel, given: Target | str | list[int] | None) -> Target:
    """The library's ``targets`` as a :data:`~hookviz.core.targets.Target` (words parsed as ``--target``)."""
    if given is None:
        return Top()
    if isinstance(given, str):
        return parse_targets(given, loaded, num_classes(loaded))
    return Classes(tuple(given)) if isinstance(given, list) else given


def _value(name: str, v: Any) -> Any:
    f = float(v)
    if name == "increase":
        return bool(f > 0)
    return None if math.isnan(f) else round(f, 6)


def evaluate(
    loaded: LoadedModel,
    x: Any,
    layers: Sequence[str],
    methods: Sequence[str] = ("gradcam",),
    *,
    metrics: Sequence[str] | None = None,
    targets: Target | str | list[int] | None = None,
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

    job = EvaluateJob(
        loaded=loaded,
        layers=list(layers),
        methods=list(methods),
        targets=_target(loaded, targets),
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


def evaluate_job(
    loaded: LoadedModel,
    *,
    layers: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    target: str = "top1",
    options: MethodOptions | None = None,
    metric: Sequence[str] | None = None,
    boxes: Path | None = None,
    mask_dir: Path | None = None,
    mask_kind: str = "auto",
    **fields: Any,
) -> EvaluateJob:
    """The ``evaluate`` job: ``layers`` (default: the CAM default), one class per image (``target``: top1, a
    class, or ``label``: each input's own), the metric families ``metric`` as ``--metric`` names them
    (default: faithfulness, and localisation where ``boxes`` or ``mask_dir`` say where the objects are),
    ``fields`` as :class:`EvaluateJob` takes them (steps, metric_settings, seed...).

    Raises:
        UsageError: a ``topK`` target, an unknown family; LayerError, TargetError: a bad layer or class;
        AnnotationError: boxes or masks that cannot be read.
    """
    annotations = fields.pop("annotations", None)
    if boxes is not None or mask_dir is not None:
        annotations = load_annotations(boxes, mask_dir, mask_kind)
    if "metrics" not in fields:
        fields["metrics"] = parse_metrics(metric, annotated=annotations is not None)
    calls = probe(loaded)
    chosen = chosen_layers(loaded, layers, calls)
    targets = parse_targets(target, loaded, num_classes(loaded))
    if isinstance(targets, Labelled) and annotations is not None:
        raise UsageError("--target label with --boxes/--masks: the annotations name each image's classes; "
                         "leave --target out")  # fmt: skip
    if isinstance(targets, Positive) or (isinstance(targets, Top) and targets.k > 1):
        raise UsageError(f"--target {target}: evaluate explains one class per image: top1 or a class")
    return EvaluateJob(
        loaded=loaded,
        layers=chosen,
        methods=[str(m) for m in (methods or ["gradcam"])],
        targets=targets,
        options=method_options(loaded, options or MethodOptions()),
        annotations=annotations,
        **fields,
    )
