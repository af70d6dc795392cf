"""What a CAM job's records say: an input's fields (layers, methods, the prediction, every target and
its map) and each map's own (its file, value range, sign, cost); a mixin of
:class:`hookviz.jobs.cam.CamJob`."""

from __future__ import annotations

from typing import Any

import numpy as np

from hookviz.core.conventions import sign
from hookviz.core.taps import MATERIAL_NEGATIVE
from hookviz.core.targets import Positive, Target
from hookviz.jobs.common import FUSED, finite_stat, scored_class
from hookviz.jobs.settings import CamSettings
from hookviz.methods import REGISTRY, passes
from hookviz.models.loaded import LoadedModel


class CamRecords:
    """The record fields of a CAM job (its settings in ``params``, its parsed ``targets``)."""

    loaded: LoadedModel
    params: CamSettings
    targets: Target
    auto_layer: dict[str, Any] | None

    def _shown(self, ex: Any, index: int) -> list[tuple[int, str]]:
        raise NotImplementedError

    def _fields(self, ex: Any, index: int, records: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        """An input's record fields: layers, methods, the prediction and the first target, the maps' records
        (``more`` goes in after the methods: a video clip's place)."""
        lm, dense = self.loaded, ex.labels is not None
        pred, first_t = int(ex.predicted[index]), int(ex.targets[index, 0])
        return {
            "layers": list(self.params.layers),
            "methods": list(self.params.methods),
            "layer": self.params.layers[0],
            "method": self.params.methods[0],
            **more,
            "predicted": {
                **scored_class(lm, pred, float(ex.predicted_score[index])),
                **self._value(ex, float(ex.predicted_score[index])),
            },
            "target": {
                **scored_class(lm, first_t, float(ex.target_scores[index, 0])),
                **self._value(ex, float(ex.target_scores[index, 0])),
            },
            # Every class explained (--target top3: three), in the order of their maps' suffixes.
            "targets": [
                {
                    **scored_class(lm, t, float(ex.target_scores[index, j])),
                    **self._value(ex, float(ex.target_scores[index, j])),
                    **self._positive(float(ex.target_scores[index, j])),
                }
                for j, t in ((j, int(ex.targets[index, j])) for j, _ in self._shown(ex, index))
            ],
            "normalize": self.params.normalize,
            **({"region": ex.region, "score": "share of pixels"} if dense else {}),
            "maps": records,
            **({"layer_auto": self.auto_layer} if self.auto_layer else {}),
            **({"guided": dict(ex.guided)} if ex.guided is not None else {}),
            **({"options": used} if (used := self.params.options.record(self.params.methods)) else {}),
        }

    def _positive(self, score: float) -> dict[str, bool]:
        """``--target positive``: whether the label reached the threshold (an image with none shows its
        likeliest)."""
        return {"positive": score >= self.targets.threshold} if isinstance(self.targets, Positive) else {}

    def _value(self, ex: Any, score: float) -> dict[str, float]:
        """A regression output's value (the score is the explained quantity: negated with --negate)."""
        if ex.score_kind != "raw":
            return {}
        return {"value": round(score * sign(self.loaded.model), 6)}

    def _map_record(
        self, file: str, method: str, layer: str, target: int, score: float, cam: np.ndarray
    ) -> dict[str, Any]:
        """What every map's record starts with: its file, method, layer, target and value range."""
        return {
            "file": file,
            "method": method,
            "layer": layer,
            "target": scored_class(self.loaded, target, score),
            # NaN/Inf (a diverged model) are reported, and drawn as "no evidence".
            "finite": bool(np.isfinite(cam).all()),
            "min": finite_stat(np.min, cam),
            "max": finite_stat(np.max, cam),
        }

    def _cost_fields(self, method: str, layer: str, targets: int, result: Any) -> dict[str, Any]:
        """The passes per image a method ran beyond the shared one (none: no field)."""

        k = result.channels.get(layer if layer != FUSED else self.params.layers[0], 0)
        fwd, bwd = passes(method, k, targets, self.params.options, result.size)
        return {"passes": {"forward": fwd, "backward": bwd}} if fwd or bwd else {}

    @staticmethod
    def _sign_fields(ex: Any, method: str, layer: str, index: int) -> dict[str, Any]:
        """``negative_mass`` of the CAM tensor, and ``assumption_broken`` where the method assumes none."""

        if layer not in ex.negative_mass:
            return {}
        share = float(ex.negative_mass[layer][index])
        fields: dict[str, Any] = {"negative_mass": round(share, 4)}
        spec = REGISTRY.get(method)
        if spec is not None and spec.assumes_nonnegative and share >= MATERIAL_NEGATIVE:
            fields["assumption_broken"] = "non-negative activations"
        return fields
