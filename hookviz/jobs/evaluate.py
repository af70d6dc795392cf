"""``evaluate``: faithfulness of every map per image, and the summary over images."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz.images import Box
from hookviz.jobs.common import _check_finite, model_settings, parse_methods
from hookviz.methods import MethodOptions
from hookviz.models import LoadedModel


@dataclass(kw_only=True)
class EvaluateJob:
    """Faithfulness of every method x layer per image (deletion/insertion AUC, average drop, increase in
    confidence), with the ``random`` and ``center`` chance baselines; no pictures, only records."""

    loaded: LoadedModel
    layers: Sequence[str]
    methods: Sequence[str] = ("gradcam",)
    #: The settings of the methods that take any (``--seed``, ``--samples``, ...).
    options: MethodOptions = field(default_factory=MethodOptions)
    targets: str | list[int] | None = None
    steps: int = 16
    chunk: int = 64
    kind: str = "evaluate"

    def __post_init__(self) -> None:
        self.methods = parse_methods(self.methods)

    def settings(self) -> dict[str, Any]:
        return {
            **model_settings(self.loaded),
            "command": self.kind,
            "layers": list(self.layers),
            "methods": list(self.methods),
            **({"options": used} if (used := self.options.record(self.methods)) else {}),
            "targets": "top1" if self.targets is None else self.targets,
            "steps": self.steps,
            "baseline": "zeros (the data set's mean colour after normalisation)",
        }

    def planned(self, stem: str) -> list[str]:
        return []

    def compute(self, x: Any) -> Any:
        from hookviz import evaluation
        from hookviz.attribution import explain
        from hookviz.readout import scorer

        ex = explain(self.loaded.model, x, self.layers, self.methods, self.targets, options=self.options)
        t = ex.targets[:, 0]
        score = scorer(
            ex.labels, ex.region, ex.score_kind
        )  # a segmentation's class probability over its region
        rows: dict[str, Any] = {}
        passes = 0
        for (method, layer), maps in ex.maps.items():
            f = evaluation.faithfulness(
                self.loaded.model, x, maps[:, 0], t, steps=self.steps, chunk=self.chunk, scorer=score
            )
            rows[f"{method}@{layer}"] = f
            passes += f.forward_passes
        b, *dims = x.shape[0], *ex.maps[(self.methods[0], self.layers[0])].shape[2:]
        steps, h, w = dims if len(dims) == 3 else (1, *dims)  # a video model's maps have time steps
        shape = (b, *dims)
        for name, maps in (
            ("random", evaluation.random_maps(b, steps * h, w, x=x).reshape(shape)),
            ("center", evaluation.center_maps(b, h, w)[:, None].expand(b, steps, h, w).reshape(shape)),
        ):
            f = evaluation.faithfulness(
                self.loaded.model, x, maps, t, steps=self.steps, chunk=self.chunk, scorer=score
            )
            rows[name] = f
            passes += f.forward_passes
        return ex, rows, passes

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        ex, rows, passes = result
        _check_finite(ex, index)
        lm = self.loaded
        pred, tgt = int(ex.predicted[index]), int(ex.targets[index, 0])
        metrics = {
            name: {
                "deletion_auc": round(float(f.deletion_auc[index]), 6),
                "insertion_auc": round(float(f.insertion_auc[index]), 6),
                "average_drop": round(float(f.average_drop[index]), 4),
                "increase": bool(f.increase[index] > 0),
            }
            for name, f in rows.items()
        }
        fields = {
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
        return [], fields


def summarise_evaluation(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method@layer (and per chance baseline): mean and 95 % CI of each metric over the images."""
    from hookviz.evaluation import mean_ci, wilson

    names: list[str] = []
    for rec in records:
        names += [n for n in rec.get("metrics", {}) if n not in names]
    rows = []
    for name in names:
        values = [rec["metrics"][name] for rec in records if name in rec.get("metrics", {})]
        method, _, layer = name.partition("@")
        row: dict[str, Any] = {"method": method, "layer": layer or "-", "images": len(values)}
        for metric in ("deletion_auc", "insertion_auc", "average_drop"):
            mean, half = mean_ci([float(v[metric]) for v in values])
            row[metric], row[f"{metric}_ci95"] = round(mean, 4), round(half, 4)
        # A proportion: the Wilson interval stays inside 0..100 % for small n (a t interval does not).
        hits = sum(bool(v["increase"]) for v in values)
        low, high = wilson(hits, len(values))
        row["increase_in_confidence"] = round(100.0 * hits / max(1, len(values)), 2)
        row["increase_in_confidence_ci95"] = [round(100.0 * low, 2), round(100.0 * high, 2)]
        rows.append(row)
    return rows
