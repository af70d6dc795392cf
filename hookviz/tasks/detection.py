"""Detection: boxes, each with a class and a score; each box is explained on its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from torch import nn
from torchvision.models import detection

from hookviz.core.detections import Detects
from hookviz.core.hooks import ModuleCall
from hookviz.core.targets import Target
from hookviz.errors import UsageError
from hookviz.io.images import Preprocess
from hookviz.jobs.build import BuiltJob, RunContext
from hookviz.jobs.detection import detection_job
from hookviz.jobs.settings import CamSettings
from hookviz.models.loaded import LoadedModel
from hookviz.models.torchvision import dense_classes, task_preprocess
from hookviz.tasks.registry import Task, register_task

if TYPE_CHECKING:
    pass

#: torchvision's detector classes (and the user's models built from them).
DETECTORS = (
    detection.generalized_rcnn.GeneralizedRCNN,
    detection.retinanet.RetinaNet,
    detection.fcos.FCOS,
    detection.ssd.SSD,
)


class Detection(Task):
    name = "detection"
    noun = "a detector"
    plural = "detectors"
    refuses = frozenset({"gradflow", "evaluate", "sanity", "channels"})

    def claims(self, model: nn.Module) -> bool:
        return isinstance(model, (*DETECTORS, Detects))

    def default_preprocess(self) -> Preprocess:
        return task_preprocess(self.name)

    def head_classes(self, model: nn.Module) -> int | None:
        if isinstance(model, Detects):  # another library's detector: it says
            return getattr(model, "num_classes", None)
        return dense_classes(model)

    def known_classes(self, model: nn.Module) -> int | None:
        return self.head_classes(model) or 1

    def set_input_size(self, model: nn.Module, size: int, name: str) -> None:
        """The shorter side the detector's transform resizes photos to (the longer one capped at the same
        1333/800 ratio as torchvision's default); another library's detector sets its own."""
        if isinstance(model, Detects) and hasattr(model, "set_input_size"):
            cast(Any, model).set_input_size(size)
            return
        transform = getattr(model, "transform", None)
        if transform is None or not hasattr(transform, "min_size"):
            raise UsageError(f"--input-size: {name} has no resizing transform to set; leave it out")
        if getattr(transform, "fixed_size", None) is not None:
            h, w = transform.fixed_size
            raise UsageError(f"--input-size: {name} resizes every photo to {w}x{h}; leave it out")
        transform.min_size = (size,)
        transform.max_size = round(size * 1333 / 800)

    def cam_job(
        self,
        loaded: LoadedModel,
        settings: CamSettings,
        calls: list[ModuleCall],
        targets: Target,
        context: RunContext,
    ) -> BuiltJob:
        return detection_job(loaded, settings, calls, targets)

    def describe(self, record: dict[str, Any]) -> list[str] | None:
        if "detections" not in record:  # featuremaps, dropblock: no boxes were asked for
            return None
        found = record["detections"] or []
        if not found:
            threshold = record.get("settings", {}).get("score_threshold")
            return [f"nothing detected with score >= {threshold} (lower --score-threshold to see more);"]
        shown = ", ".join(f"{d['name']} {d['score']:.2f}" for d in found[:5])
        return [f"{len(found)} detection(s): {shown}{' ...' if len(found) > 5 else ''};"]


DETECTION = register_task(Detection())
