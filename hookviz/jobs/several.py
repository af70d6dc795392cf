"""``gradcam`` on a model of several inputs (RGB + depth, two views): each layer's map drawn over the input
its branch sees (found by changing one input at a time, :func:`hookviz.models.several.branches`); a layer
after the branches meet is drawn over the first input it sees, and its record says which it sees. Records
name every file of the sample. A method at the input's pixels (saliency, occlusion) is drawn over the
first input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz.io.images import Box
from hookviz.io.samples import Sample
from hookviz.jobs.cam import CamBatch, CamJob
from hookviz.methods import REGISTRY
from hookviz.models.several import Several, branches


@dataclass(kw_only=True)
class SeveralCamJob(CamJob):
    """:class:`CamJob` for a :class:`~hookviz.models.several.Several` model: ``render`` takes a
    :class:`~hookviz.io.samples.Sample`."""

    #: The inputs each layer sees (found on the first batch).
    seen: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def compute(self, x: Any) -> CamBatch:
        model = self.loaded.model
        assert isinstance(model, Several)
        if not self.seen:
            self.seen = branches(model, x, list(self.layers))
        return super().compute(x)

    def _drawn_on(self, method: str, layer: str) -> str:
        model = self.loaded.model
        assert isinstance(model, Several)
        spec = REGISTRY.get(method)
        if spec is not None and spec.resolution == "input":
            return model.names[0]
        return self.seen.get(layer, (model.names[0],))[0]

    def _canvas(self, rgb: Any, box: Box, method: str, layer: str) -> tuple[np.ndarray, Box, dict[str, Any]]:
        sample: Sample = rgb
        name = self._drawn_on(method, layer)
        said = {"drawn_on": name, "sees": list(self.seen.get(layer, (name,)))}
        return sample.pictures[name], sample.boxes[name], said
