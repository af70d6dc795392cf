"""A module that runs another and shows that one's modules under their own names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy


class Facade(nn.Module):
    """A module that runs ``model`` and shows its children under their own names (not as ``model.x``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._wrapped = (model,)  # a tuple: not registered as a child, so names stay the model's
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, param in model.named_parameters(recurse=False):  # CLIP's logit_scale
            self.register_parameter(name, param)
        self.training = model.training

    @property
    def wrapped(self) -> nn.Module:
        return self._wrapped[0]


def photos_uint8(images: Tensor | Sequence[Tensor]) -> list[Any]:
    """Photos ``(3, H, W)`` in [0, 1] as the uint8 ``(H, W, 3)`` arrays another library's preprocessing takes
    (exactly the photo as read: hookviz's photos are uint8 / 255)."""
    return [
        to_numpy((t.detach() * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)) for t in images
    ]
