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

from hookviz.errors import HookvizError, UsageError
from hookviz.io.images import Box
from hookviz.io.inputs import Item
from hookviz.jobs.cam import CamBatch, CamJob
from hookviz.models.classes import parse_target
from hookviz.models.loaded import num_classes


@dataclass(kw_only=True)
class LabelledCamJob(CamJob):
    """:class:`CamJob` with each input's label as its one target (see the module)."""

    #: The batch's classes (or why an input has none), told by ``annotate`` before each ``compute``.
    _given: list[int | str] = field(default_factory=list, repr=False)
    _batch: torch.Tensor | None = field(default=None, repr=False)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "targets": "label"}

    def annotate(self, batch: Sequence[tuple[Any, np.ndarray, Box]], size: tuple[int, int]) -> None:
        """Each input's class (or why it has none), for the ``compute`` that follows (pipeline hook)."""
        self._given = [self._class_of(item) for item, _, _ in batch]

    def _class_of(self, item: Item) -> int | str:
        label = item.label
        if label is None or not label.strip():
            return f"{item.name!r}: no label to explain (a table's target column or a shard sample's .cls)"
        try:
            found = parse_target(str(label).strip(), self.loaded, num_classes(self.loaded), "label")
        except HookvizError as exc:
            return f"{item.name!r}: {exc}"
        return found if found is not None else f"{item.name!r}: label {label!r} names no class"

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
