"""The jobs of the per-image commands, one module each behind one protocol (:class:`~.common.Job`:
``settings``, ``planned``, ``compute``, ``render``), each with its builder beside it, what they share in
:mod:`.common` and :mod:`.build`, and their settings in :mod:`.settings`.

The jobs load torch; they are imported when first named (``from hookviz.jobs import CamJob``), so that
:mod:`hookviz.jobs.settings` stays light enough for ``hookviz --help``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hookviz.jobs.cam import CamBatch, CamJob
    from hookviz.jobs.common import FUSED, Job, predicted
    from hookviz.jobs.detection import DetectionJob
    from hookviz.jobs.evaluate import EvaluateJob
    from hookviz.jobs.features import FeatureMapJob
    from hookviz.jobs.sanity import SanityJob
    from hookviz.jobs.training import DropBlockJob, GradFlowJob
    from hookviz.models.settings import model_settings

#: Where each name lives.
_WHERE = {
    "FUSED": "hookviz.jobs.common",
    "CamBatch": "hookviz.jobs.cam",
    "CamJob": "hookviz.jobs.cam",
    "DetectionJob": "hookviz.jobs.detection",
    "DropBlockJob": "hookviz.jobs.training",
    "EvaluateJob": "hookviz.jobs.evaluate",
    "FeatureMapJob": "hookviz.jobs.features",
    "GradFlowJob": "hookviz.jobs.training",
    "Job": "hookviz.jobs.common",
    "SanityJob": "hookviz.jobs.sanity",
    "model_settings": "hookviz.models.settings",
    "predicted": "hookviz.jobs.common",
}

__all__ = [
    "FUSED",
    "CamBatch",
    "CamJob",
    "DetectionJob",
    "DropBlockJob",
    "EvaluateJob",
    "FeatureMapJob",
    "GradFlowJob",
    "Job",
    "SanityJob",
    "model_settings",
    "predicted",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hookviz.jobs' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
