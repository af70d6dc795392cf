"""The built-in methods' functions over one layer of an explain pass (the math itself is in
:mod:`hookviz.cams`): each takes a :class:`LayerPass` and returns maps ``(B, T, h, w)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz import cams


@dataclass
class LayerPass:
    """What a method may use at one layer of one explain pass.

    Attributes:
        model, x: the network (eval mode) and the batch it explains.
        layer: the CAM tensor's name; ``activations``: it as ``(B, K, h, w)``.
        gradients: per target ``j``, the gradient of the target scores w.r.t. the activations (when a
            requested method needs ``layer_gradients``), else None.
        targets: ``(B, T)`` the classes explained; ``relu``: keep only positive evidence.
        eigen_smooth: gradient methods give the first principal component of their weighted activations.
        masked_scores: ``()`` → ``(B, T, K)`` target scores of the input masked by each channel (Score-CAM).
        input_saliency: ``()`` → ``(B, T, H, W)`` the guided input gradient, computed once per pass.
        maps: this layer's maps made so far, by method (a method that ``uses`` another reads it here).
    """

    model: nn.Module
    x: Tensor
    layer: str
    activations: Tensor
    gradients: list[Tensor] | None
    targets: Tensor
    relu: bool = True
    eigen_smooth: bool = False
    masked_scores: Callable[[], Tensor] = field(default=lambda: torch.empty(0))
    input_saliency: Callable[[], Tensor] = field(default=lambda: torch.empty(0))
    maps: dict[str, Tensor] = field(default_factory=dict)

    @property
    def grads(self) -> list[Tensor]:
        if self.gradients is None:
            raise RuntimeError(f"no layer gradients in this pass (layer {self.layer})")
        return self.gradients


def _gradient_method(name: str) -> Callable[[LayerPass], Tensor]:
    def compute(p: LayerPass) -> Tensor:
        a = p.activations
        if p.eigen_smooth:
            return torch.stack([cams.eigen_smooth(name, a, g, relu=p.relu) for g in p.grads], dim=1)
        fn = cams.GRADIENT_METHODS[name]
        return torch.stack([fn(a, g, relu=p.relu) for g in p.grads], dim=1)

    compute.__name__ = name
    return compute


gradcam = _gradient_method("gradcam")
gradcampp = _gradient_method("gradcampp")
xgradcam = _gradient_method("xgradcam")
layercam = _gradient_method("layercam")
hirescam = _gradient_method("hirescam")


def eigencam(p: LayerPass) -> Tensor:
    """Class-agnostic: the same map for every target."""
    e = cams.eigen_cam(p.activations, relu=p.relu)
    return e[:, None].expand(-1, p.targets.shape[1], -1, -1)


def scorecam(p: LayerPass) -> Tensor:
    masked = p.masked_scores()
    return torch.stack(
        [cams.score_cam(p.activations, masked[:, j], relu=p.relu) for j in range(p.targets.shape[1])], dim=1
    )


def guidedbackprop(p: LayerPass) -> Tensor:
    """At the input's resolution, the same for every layer."""
    return p.input_saliency()


def guidedgradcam(p: LayerPass) -> Tensor:
    saliency = p.input_saliency()
    size = (int(p.x.shape[2]), int(p.x.shape[3]))
    up = F.interpolate(p.maps["gradcam"].float(), size=size, mode="bilinear", align_corners=False)
    return saliency * up.clamp_min(0)
