"""A module that runs another and shows that one's modules under their own names."""

from __future__ import annotations

from torch import nn


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
