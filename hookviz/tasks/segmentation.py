"""Segmentation: a score per class for each pixel (``(B, C, H, W)``); a class's score sums its pixels."""

from __future__ import annotations

from torch import nn
from torchvision.models import segmentation

from hookviz.io.images import Preprocess
from hookviz.models.torchvision import dense_classes, task_preprocess
from hookviz.tasks.registry import Task, register_task


class Segmentation(Task):
    name = "segmentation"
    noun = "a segmentation model"
    plural = "segmentation models"
    dense = True
    refuses = frozenset({"gradflow"})

    def claims(self, model: nn.Module) -> bool:
        return isinstance(model, (segmentation.FCN, segmentation.DeepLabV3, segmentation.LRASPP))

    def default_preprocess(self) -> Preprocess:
        return task_preprocess(self.name)

    def head_classes(self, model: nn.Module) -> int | None:
        own = getattr(model, "num_classes", None)  # another library's segmenter says (Hugging Face's)
        return int(own) if isinstance(own, int) else dense_classes(model)


SEGMENTATION = register_task(Segmentation())
