# ruff: noqa: RUF002
"""The built-in methods' functions over one layer of an explain pass (the math itself is in
:mod:`hookviz.methods.cams`): each takes a :class:`LayerPass` and returns maps ``(B, T, h, w)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.layout import NCHW, Layout
from hookviz.errors import UsageError
from hookviz.methods import MethodOptions, cams


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
        options: the methods' settings (``--seed``, ``--samples``, ...).
        layout: how the layer's raw tensor holds its map (``nchw``, tokens); ``score_of(output)``: the
            differentiable ``(B, C)`` class scores of a model output (what a gradient explains);
            ``scorer(output, rows)``: their probabilities; ``advance(n)``: counts ``n`` extra passes done
            (the progress bar); ``shared``: work shared by every layer of the pass (pixel maps);
            ``methods``: every method this pass computes (a pass shared by several computes what they need).
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
    options: MethodOptions = field(default_factory=MethodOptions)
    layout: Layout = NCHW
    score_of: Callable[[Any], Tensor] = field(default=lambda output: output)
    scorer: Callable[[Tensor, Tensor], Tensor] = field(default=lambda output, rows: output.softmax(1))
    advance: Callable[[int], None] = field(default=lambda n: None)
    shared: dict[str, Any] = field(default_factory=dict)
    methods: frozenset[str] = frozenset()

    @property
    def size(self) -> tuple[int, int]:
        return (int(self.x.shape[2]), int(self.x.shape[3]))

    def per_target(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """``(B, T, h, w)`` from ``fn(gradient_j) -> (B, h, w)`` for each target's layer gradient."""
        return torch.stack([fn(g) for g in self.grads], dim=1)

    def same_for_targets(self, m: Tensor) -> Tensor:
        """A class-agnostic ``(B, h, w)`` map as ``(B, T, h, w)``."""
        return m[:, None].expand(-1, self.targets.shape[1], -1, -1)

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` computed once per explain pass (a pixel map is the same at every layer)."""
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]

    @property
    def grads(self) -> list[Tensor]:
        if self.gradients is None:
            raise RuntimeError(f"no layer gradients in this pass (layer {self.layer})")
        return self.gradients


def _gradient_method(name: str, fn: Callable[..., Tensor]) -> Callable[[LayerPass], Tensor]:
    def compute(p: LayerPass) -> Tensor:
        a = p.activations
        if p.eigen_smooth:
            return torch.stack([cams.eigen_smooth(name, a, g, relu=p.relu) for g in p.grads], dim=1)
        return torch.stack([fn(a, g, relu=p.relu) for g in p.grads], dim=1)

    compute.__name__ = name
    return compute


gradcam = _gradient_method("gradcam", cams.grad_cam)
gradcampp = _gradient_method("gradcampp", cams.grad_cam_pp)
xgradcam = _gradient_method("xgradcam", cams.xgrad_cam)
layercam = _gradient_method("layercam", cams.layer_cam)
hirescam = _gradient_method("hirescam", cams.hires_cam)


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


# -- more of the CAM family (each as pytorch-grad-cam 1.5.7 computes it; tests/test_references.py) ---------


def gradcamelementwise(p: LayerPass) -> Tensor:
    return p.per_target(lambda g: torch.relu(g * p.activations).sum(1))


def eigengradcam(p: LayerPass) -> Tensor:
    """The first principal component of ``G ⊙ A``; its sign set as Eigen-CAM's (correlating with the channel
    sum; an SVD's sign is arbitrary, the reference keeps LAPACK's)."""
    return p.per_target(lambda g: cams.eigen_cam(g * p.activations, relu=p.relu))


def segeigencam(p: LayerPass) -> Tensor:
    """``|G| ⊙ A`` projected on its first principal component, flipped when its most negative value is
    larger in magnitude than its most positive one (the paper's sign correction, eq. 13)."""

    def one(g: Tensor) -> Tensor:
        proj = _projection(g.abs() * p.activations)
        lo, hi = proj.flatten(1).amin(1), proj.flatten(1).amax(1)
        flip = torch.where(lo.abs() > hi.abs(), -1.0, 1.0).to(proj.dtype)
        return rectify(proj * flip[:, None, None], p.relu)

    return p.per_target(one)


def _projection(a: Tensor) -> Tensor:
    """Per image, the positions of ``a`` ``(B, K, h, w)`` centred and projected on the first right singular
    vector of the ``(hw, K)`` matrix (its sign arbitrary)."""
    b, k, h, w = a.shape
    flat = torch.nan_to_num(a.double()).reshape(b, k, h * w).transpose(1, 2)
    centred = flat - flat.mean(dim=1, keepdim=True)
    return cams.first_component(centred).reshape(b, h, w).to(a.dtype)


def rectify(m: Tensor, relu: bool) -> Tensor:
    return torch.relu(m) if relu else m


def kpcacam(p: LayerPass) -> Tensor:
    """KPCA-CAM: the positions' first kernel principal component, with scikit-learn's defaults as the
    reference uses them (sigmoid kernel ``tanh(γ x·y + 1)``, ``γ = 1/K``, on centred positions; the
    component scaled by √eigenvalue; its sign making its largest entry positive)."""
    a = torch.nan_to_num(p.activations.double())
    b, k, h, w = a.shape
    x = a.reshape(b, k, h * w).transpose(1, 2)
    x = x - x.mean(dim=1, keepdim=True)
    kern = torch.tanh(x @ x.transpose(1, 2) / k + 1.0)
    n = kern.shape[1]
    one = torch.full((n, n), 1.0 / n, dtype=kern.dtype, device=kern.device)
    centred = kern - one @ kern - kern @ one + one @ kern @ one
    values, vectors = torch.linalg.eigh((centred + centred.transpose(1, 2)) / 2)
    top, vec = values[:, -1].clamp_min(0), vectors[:, :, -1]
    biggest = vec.gather(1, vec.abs().argmax(dim=1, keepdim=True))
    vec = vec * torch.sign(biggest).where(biggest != 0, torch.ones_like(biggest))
    proj = (vec * top.sqrt()[:, None]).reshape(b, h, w).to(p.activations.dtype)
    return p.same_for_targets(rectify(proj, p.relu))


def fem(p: LayerPass, k: float = 2.0) -> Tensor:
    """FEM: each channel weighted by the share of its positions above its mean + ``k`` standard deviations
    (population), the weighted channels summed."""
    a = p.activations
    mean = a.mean(dim=(2, 3), keepdim=True)
    std = a.std(dim=(2, 3), keepdim=True, correction=0)
    weights = (a > mean + k * std).to(a.dtype).mean(dim=(2, 3), keepdim=True)
    return p.same_for_targets(rectify((weights * a).sum(1), p.relu))


def cam(p: LayerPass) -> Tensor:
    """The original CAM: ``Σ_k W_ck A^k`` with ``W`` the linear classifier that follows global average
    pooling. Under such a head the gradient of the class score at ``A`` is ``W_ck / hw`` at every position, so
    the weights are read from the gradient, exactly, whatever code builds the head; a gradient that varies
    over positions means another head, and the method is refused."""

    def one(g: Tensor) -> Tensor:
        flat = g.flatten(2)
        spread = (flat.amax(2) - flat.amin(2)).abs().max()
        scale = flat.abs().amax().clamp_min(1e-30)
        if float(spread / scale) > 1e-4:
            raise UsageError(
                f"--method cam needs global average pooling then a linear classifier after {p.layer}: the "
                "class score's gradient there varies over positions, so there are no class weights to read; "
                "use gradcam (its generalisation) or the tensor entering the pooling (the default layer)"
            )
        hw = g.shape[2] * g.shape[3]
        return rectify((flat.mean(2)[:, :, None, None] * hw * p.activations).sum(1), p.relu)

    return p.per_target(one)


def randomcam(p: LayerPass) -> Tensor:
    """Random weights, uniform in ``[-1, 1]`` per channel, from ``--seed`` (each image's the same stream,
    numpy's ``RandomState``, as the reference draws them), times the activations: the control."""
    import numpy as np

    b, k = p.activations.shape[:2]
    w = np.random.RandomState(p.options.seed).uniform(-1, 1, size=(1, k)).repeat(b, 0)
    weights = torch.as_tensor(w, dtype=p.activations.dtype, device=p.activations.device)
    return p.same_for_targets(rectify((weights[:, :, None, None] * p.activations).sum(1), p.relu))


def refinecam(p: LayerPass) -> Tensor:
    """Refine-CAM over the layers of the pass so far: the product of each layer's Grad-CAM++ map, min-max
    normalised, upsampled to the input and normalised again (as the reference). ``p.shared["refine"]``
    collects the product; the explain pass gives the product of all the requested layers to every layer."""
    m = p.maps["gradcampp"].float()
    b, t, h, w = m.shape
    flat = m.reshape(b * t, 1, h * w)
    lo, hi = flat.amin(2, keepdim=True), flat.amax(2, keepdim=True)
    norm = ((flat - lo) / (hi - lo + 1e-7)).reshape(b * t, 1, h, w)
    up = F.interpolate(norm, size=p.size, mode="bilinear", align_corners=False).reshape(b, t, -1)
    lo, hi = up.amin(2, keepdim=True), up.amax(2, keepdim=True)  # the upsampled map rescaled to [0, 1] too
    scaled = ((up - lo) / (hi - lo + 1e-7)).reshape(b, t, *p.size)
    product = p.shared.get("refine")
    p.shared["refine"] = scaled if product is None else product * scaled
    return p.shared["refine"]
