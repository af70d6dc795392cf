"""The jobs of the per-image commands, one module each behind one protocol (:class:`~.common.Job`:
``settings``, ``planned``, ``compute``, ``render``), with what they share in :mod:`.common`."""

from __future__ import annotations

from hookviz.jobs.cam import CamBatch, CamJob
from hookviz.jobs.common import FUSED, Job, predicted
from hookviz.jobs.detection import DetectionJob
from hookviz.jobs.evaluate import EvaluateJob
from hookviz.jobs.features import FeatureMapJob
from hookviz.jobs.sanity import SanityJob
from hookviz.jobs.training import DropBlockJob, GradFlowJob
from hookviz.models.settings import model_settings

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
