"""Class activation map methods: pure tensor math, one function per method.

Every function takes activations ``A`` of shape ``(B, K, H, W)`` (and, for gradient methods, the
gradients ``dS/dA`` of the same shape) and returns maps of shape ``(B, H, W)``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def grad_cam(activations: Tensor, gradients: Tensor, *, relu: bool = True) -> Tensor:
    """Grad-CAM (Selvaraju et al., ICCV 2017, eq. 1-2).

    ``alpha_k = mean_{i,j} dS/dA^k_{ij}`` and ``L = ReLU(sum_k alpha_k A^k)``.

    Args:
        activations: ``(B, K, H, W)``.
        gradients: ``(B, K, H, W)``, the gradient of the class score w.r.t. ``activations``.
        relu: keep only positive evidence (the paper); ``False`` returns the signed map.
    """
    _check(activations, gradients)
    alpha = gradients.mean(dim=(2, 3), keepdim=True)
    cam = (alpha * activations).sum(dim=1)
    return torch.relu(cam) if relu else cam


def _check(activations: Tensor, gradients: Tensor) -> None:
    if activations.dim() != 4:
        raise ValueError(f"activations must be (B, K, H, W), got shape {tuple(activations.shape)}")
    if gradients.shape != activations.shape:
        raise ValueError(
            f"gradients {tuple(gradients.shape)} and activations {tuple(activations.shape)} differ in shape"
        )
