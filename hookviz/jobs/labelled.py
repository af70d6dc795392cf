"""``--target label``: each input explained for its own labelled class
(:class:`hookviz.core.targets.Labelled`): a table row's target column or a WebDataset sample's ``.cls``, an
index or a class name. A CAM job whose targets are told batch by batch (:meth:`LabelledCamJob.annotate`,
before ``compute``); an input without a usable label fails alone, with one line naming the label and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hookviz.errors import UsageError
from hookviz.io.images import Box
from hookviz.jobs.cam import CamBatch, CamJob
from hookviz.models.classes import label_class
from hookviz.models.loaded import num_classes


@dataclass(kw_only=True)
class LabelledCamJob(CamJob):
    """:class:`CamJob` with each input's label as its one target (see the module)."""

    #: The batch's classes (or why an input has none), told by ``annotate`` before each ``compute``.
    _given: list[int | str] = field(default_factory=list, repr=False)
    _batch: torch.Tensor | None = field(default=None, repr=False)
    _classes: int = field(default=0, repr=False)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "targets": "label"}

    def annotate(self, batch: Sequence[tuple[Any, np.ndarray, Box]], size: tuple[int, int]) -> None:
        """Each input's class (or why it has none), for the ``compute`` that follows (pipeline hook)."""
        if not self._classes:  # once: without class names it costs a forward pass
            self._classes = num_classes(self.loaded)
        self._given = [label_class(item.label, self.loaded, self._classes) for item, _, _ in batch]

    def _explained(self) -> torch.Tensor | None:
        return self._batch

    def compute(self, x: Any) -> CamBatch:
        given = self._given
        self._batch = torch.tensor([[g if isinstance(g, int) else 0] for g in given], device=x.device)
        try:
            result = super().compute(x)
        finally:
            self._batch = None
        result.refused = [g if isinstance(g, str) else None for g in given]
        return result

    def render(
        self, result: CamBatch, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        if result.refused and result.refused[index] is not None:
            raise UsageError(str(result.refused[index]))
        return super().render(result, index, rgb, box, stem)
