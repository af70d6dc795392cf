"""Video: a clip of frames in (``(B, 3, T, H, W)``), one score per class out; a video is cut into clips."""

from __future__ import annotations

from torch import nn

from hookviz.io.video import VideoPreprocess
from hookviz.jobs.video import VideoCamJob
from hookviz.models.sources import Built
from hookviz.tasks.registry import Task, register_task


class Video(Task):
    name = "video"
    noun = "a video model"
    plural = "video models"
    job_class = VideoCamJob
    refuses = frozenset({"channels"})  # a clip's (C, T, H, W) maps: dataset examples are per photo

    def claims(self, model: nn.Module) -> bool:
        """A clip classifier: its first layer is a ``Conv3d``."""
        first = next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Linear))), None)
        return isinstance(first, nn.Conv3d)

    def clips(self, built: Built) -> VideoPreprocess | None:
        return built.video or VideoPreprocess()


VIDEO = register_task(Video())
