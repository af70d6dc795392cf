"""Video: a clip of frames in (``(B, 3, T, H, W)``), one score per class out; a video is cut into clips."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

from hookviz.core.hooks import ModuleCall
from hookviz.io.video import VideoPreprocess
from hookviz.jobs.build import BuiltJob, CamSettings, classifier_job
from hookviz.jobs.video import VideoCamJob
from hookviz.models.loaded import LoadedModel
from hookviz.models.sources import Built
from hookviz.tasks.registry import Task, register_task

if TYPE_CHECKING:
    from torch import Tensor


class Video(Task):
    name = "video"
    noun = "a video model"
    plural = "video models"

    def claims(self, model: nn.Module) -> bool:
        """A clip classifier: its first layer is a ``Conv3d``."""
        first = next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Linear))), None)
        return isinstance(first, nn.Conv3d)

    def clips(self, built: Built) -> VideoPreprocess | None:
        return built.video or VideoPreprocess()

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
            loaded, settings, calls, targets, first_images=first_images, agree=agree, job_class=VideoCamJob
        )


VIDEO = register_task(Video())
