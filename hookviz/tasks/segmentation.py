"""Segmentation: a score per class for each pixel (``(B, C, H, W)``); a class's score sums its pixels."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn
from torchvision.models import segmentation

from hookviz.core.hooks import ModuleCall
from hookviz.io.images import Preprocess
from hookviz.jobs.build import BuiltJob, CamSettings, classifier_job
from hookviz.models.loaded import LoadedModel
from hookviz.models.torchvision import dense_classes, task_preprocess
from hookviz.tasks.registry import COMMANDS, Task, register_task

if TYPE_CHECKING:
    from torch import Tensor


class Segmentation(Task):
    name = "segmentation"
    noun = "a segmentation model"
    plural = "segmentation models"
    commands = COMMANDS - {"gradflow"}

    def claims(self, model: nn.Module) -> bool:
        return isinstance(model, (segmentation.FCN, segmentation.DeepLabV3, segmentation.LRASPP))

    def default_preprocess(self) -> Preprocess:
        return task_preprocess(self.name)

    def head_classes(self, model: nn.Module) -> int | None:
        return dense_classes(model)

    def cam_job(
        self,
        loaded: LoadedModel,
        settings: CamSettings,
        calls: list[ModuleCall],
        targets: str | list[int] | None,
        *,
        first_images: Callable[[int], Tensor | None] | None = None,
        agree: Callable[[Any], Any] | None = None,
    ) -> BuiltJob:
        return classifier_job(
            loaded, settings, calls, targets, first_images=first_images, agree=agree, dense=True
        )


SEGMENTATION = register_task(Segmentation())
