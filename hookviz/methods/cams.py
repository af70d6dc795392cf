"""Class activation map methods: pure tensor math, one function per method.

Every function takes activations ``A`` of shape ``(B, K, H, W)`` and, for the gradient methods, the
gradients ``G = dY^c/dA`` of the same shape (``Y^c`` the class logit), and returns maps ``(B, H, W)``.
``relu=False`` keeps the signed map (negative evidence) where the paper applies a final ReLU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def grad_cam(activations: Tensor, gradients: Tensor, *, relu: bool = True) -> Tensor:
    """Grad-CAM (Selvaraju et al., ICCV 2017, eq. 1-2).

    ``alpha_k = mean_ij G^k_ij``;  ``L = ReLU(sum_k alpha_k A^k)``.
    """
    return _finish(weighted("gradcam", activations, gradients).sum(dim=1), relu)


def _grad_cam_weights(activations: Tensor, gradients: Tensor) -> Tensor:
    return gradients.mean(dim=(2, 3), keepdim=True)


def grad_cam_pp(activations: Tensor, gradients: Tensor, *, relu: bool = True) -> Tensor:
    """Grad-CAM++ (Chattopadhay et al., WACV 2018, eq. 19 with the exponential score of Sec. 3.3).

    With ``S = exp(Y^c)`` the higher derivatives become powers of ``G``:
    ``a^k_ij = G^2 / (2 G^2 + sum_ab A^k_ab G^3)`` (0 where the denominator is 0),
    ``w_k = sum_ij a^k_ij ReLU(G^k_ij)`` and ``L = ReLU(sum_k w_k A^k)``. The common positive factor
    ``exp(Y^c)`` of ``dS/dA`` is dropped: it scales the map, not its shape.
    """
    return _finish(weighted("gradcampp", activations, gradients).sum(dim=1), relu)


def _grad_cam_pp_weights(activations: Tensor, gradients: Tensor) -> Tensor:
    g2 = gradients.pow(2)
    g3 = gradients.pow(3)
    denom = 2 * g2 + activations.sum(dim=(2, 3), keepdim=True) * g3
    safe = torch.where(denom != 0, denom, torch.ones_like(denom))
    a = torch.where(denom != 0, g2 / safe, torch.zeros_like(denom))
    return (a * torch.relu(gradients)).sum(dim=(2, 3), keepdim=True)


def xgrad_cam(activations: Tensor, gradients: Tensor, *, relu: bool = True) -> Tensor:
    """XGrad-CAM (Fu et al., BMVC 2020, eq. 12): ``w_k = sum_ij (A^k_ij / sum_ab A^k_ab) G^k_ij``."""
    return _finish(weighted("xgradcam", activations, gradients).sum(dim=1), relu)


def _xgrad_cam_weights(activations: Tensor, gradients: Tensor) -> Tensor:
    total = activations.sum(dim=(2, 3), keepdim=True)
    safe = torch.where(total == 0, torch.ones_like(total), total)  # an all-zero channel has weight 0
    return (activations * gradients).sum(dim=(2, 3), keepdim=True) / safe


def layer_cam(activations: Tensor, gradients: Tensor, *, relu: bool = True) -> Tensor:
    """LayerCAM (Jiang et al., IEEE TIP 2021, eq. 5-6): ``L = ReLU(sum_k ReLU(G^k) * A^k)`` element-wise."""
    return _finish(weighted("layercam", activations, gradients).sum(dim=1), relu)


def hires_cam(activations: Tensor, gradients: Tensor, *, relu: bool = True) -> Tensor:
    """HiResCAM (Draelos & Carin, 2020, eq. 4): ``L = ReLU(sum_k G^k * A^k)`` element-wise, no averaging.

    For a head of global average pooling and one linear layer it equals the true contribution of
    each position to the score (up to the constant 1/HW).
    """
    return _finish(weighted("hirescam", activations, gradients).sum(dim=1), relu)


def eigen_cam(activations: Tensor, *, relu: bool = True) -> Tensor:
    """Eigen-CAM (Muhammad & Yeasin, IJCNN 2020): the projection of ``A`` on its first principal component.

    Per image, the ``(HW, K)`` activation matrix is centred over positions and its first right
    singular vector ``v`` gives ``L = (A - mean) v``. The sign of an SVD is arbitrary, so it is fixed
    to correlate positively with the channel sum of ``A``. Gradient-free and class-agnostic;
    non-finite activations are treated as 0.
    """
    if activations.dim() != 4:
        raise ValueError(f"activations must be (B, K, H, W), got shape {tuple(activations.shape)}")
    b, k, h, w = activations.shape
    work = activations if activations.dtype in (torch.float32, torch.float64) else activations.float()
    # SVD cannot take NaN/Inf: non-finite activations count as 0 (the map stays defined).
    work = torch.nan_to_num(work, nan=0.0, posinf=0.0, neginf=0.0)
    flat = work.reshape(b, k, h * w).transpose(1, 2)  # (B, HW, K)
    centred = flat - flat.mean(dim=1, keepdim=True)
    proj = first_component(centred)
    energy = flat.sum(dim=2)
    sign = torch.sign(((energy - energy.mean(dim=1, keepdim=True)) * proj).sum(dim=1, keepdim=True))
    proj = proj * torch.where(sign == 0, torch.ones_like(sign), sign)
    return _finish(proj.reshape(b, h, w).to(activations.dtype), relu)


def first_component(centred: Tensor) -> Tensor:
    """``(B, N)``: the rows of ``centred`` ``(B, N, K)`` projected on its first right singular vector (sign
    arbitrary), from the eigenvectors of the smaller of its two Gram matrices (in float64): the same numbers
    as an SVD, several times faster on the CPU for the tall, thin matrices of a feature map."""
    c = centred.double()
    n, k = c.shape[1:]
    if n <= k:  # proj = C v1 = sigma1 u1, u1 the top eigenvector of C C^T
        values, vectors = torch.linalg.eigh(c @ c.transpose(1, 2))
        proj = vectors[:, :, -1] * values[:, -1:].clamp_min(0).sqrt()
    else:
        _, vectors = torch.linalg.eigh(c.transpose(1, 2) @ c)
        proj = (c @ vectors[:, :, -1:])[..., 0]
    return proj.to(centred.dtype)


def score_cam(activations: Tensor, channel_scores: Tensor, *, relu: bool = True) -> Tensor:
    """Score-CAM's combination step (Wang et al., CVPRW 2020, eq. 6-8).

    ``channel_scores[b, k]`` is the target's score (a classifier's logit) when the input is masked by the
    upsampled, min-max normalised ``A^k`` (see ``hookviz.engine.explain``). ``alpha = softmax_k(scores)``
    (the softmax cancels the baseline term of eq. 6) and ``L = ReLU(sum_k alpha_k A^k)``.
    """
    if channel_scores.shape != activations.shape[:2]:
        raise ValueError(
            f"channel_scores {tuple(channel_scores.shape)} must be (B, K) = {tuple(activations.shape[:2])}"
        )
    alpha = torch.softmax(channel_scores.float(), dim=1).to(activations.dtype)
    return _finish((alpha[:, :, None, None] * activations).sum(dim=1), relu)


#: Each gradient method as the weights it gives the activations: ``map = sum_k (weights * A)_k``.
_WEIGHTS = {
    "gradcam": _grad_cam_weights,
    "gradcampp": _grad_cam_pp_weights,
    "xgradcam": _xgrad_cam_weights,
    "layercam": lambda a, g: torch.relu(g),
    "hirescam": lambda a, g: g,
}


def weighted(method: str, activations: Tensor, gradients: Tensor) -> Tensor:
    """The activations as a gradient method weights them, ``(B, K, H, W)``: summed over ``K`` they give the
    method's map; their first principal component is its ``eigen_smooth`` map."""
    _check(activations, gradients)
    return _WEIGHTS[method](activations, gradients) * activations


def eigen_smooth(method: str, activations: Tensor, gradients: Tensor, *, relu: bool = True) -> Tensor:
    """``--eigen-smooth`` (as pytorch-grad-cam offers): the first principal component of the weighted
    activations instead of their sum, which keeps the dominant pattern and drops noise."""
    return eigen_cam(weighted(method, activations, gradients), relu=relu)


def fuse(maps: Sequence[Tensor], size: tuple[int, int], mode: str = "mean", *, relu: bool = True) -> Tensor:
    """One map from several layers' maps ``(B, T, h_i, w_i)``: each upsampled (bilinear) to ``size``,
    put on its own scale (ReLU maps min-max to [0, 1]; signed maps divided by their largest magnitude),
    so that no layer dominates by magnitude alone, then the ``mean`` or ``max`` across layers.
    """
    import torch.nn.functional as F

    if mode not in ("mean", "max"):
        raise ValueError(f"fuse mode must be mean or max, got {mode!r}")
    scaled = []
    for t in maps:
        b, n = t.shape[:2]
        up = F.interpolate(
            t.reshape(b * n, 1, *t.shape[2:]).float(), size=size, mode="bilinear", align_corners=False
        )
        flat = torch.nan_to_num(up.reshape(b, n, -1), nan=0.0, posinf=0.0, neginf=0.0)
        if relu:
            lo, hi = flat.amin(dim=2)[..., None], flat.amax(dim=2)[..., None]
            flat = (flat - lo) / (hi - lo).clamp_min(1e-12)
        else:
            flat = flat / flat.abs().amax(dim=2)[..., None].clamp_min(1e-12)
        scaled.append(flat.reshape(b, n, *size))
    stacked = torch.stack(scaled)
    return stacked.mean(dim=0) if mode == "mean" else stacked.amax(dim=0)


def colour_scale(
    maps: Tensor, normalize: str, *, relu: bool = True, vmax: float | None = None
) -> tuple[float, float] | None:
    """The value range drawn from the first to the last colour for a set of maps.

    ``image``: ``None`` (each map is scaled on its own when drawn). ``none``: the fixed range
    ``[0, vmax]`` (signed: ``[-vmax, vmax]``), the same for every image of every run. ``batch``: the
    range of these maps (NaN/Inf ignored), so the images of one batch compare with each other.

    Raises:
        ValueError: ``none`` without a positive ``vmax``, or an unknown mode.
    """
    if normalize == "image":
        return None
    if normalize == "none":
        if vmax is None or not vmax > 0:
            raise ValueError("normalize 'none' needs vmax > 0")
        return (0.0 if relu else -float(vmax), float(vmax))
    if normalize != "batch":
        raise ValueError(f"normalize must be image, batch or none, got {normalize!r}")
    finite = torch.nan_to_num(maps.float(), nan=0.0, posinf=0.0, neginf=0.0)
    top = float(finite.abs().max()) if finite.numel() else 0.0
    top = top or 1.0
    if relu:
        return (float(finite.min()), float(finite.max()) or 1.0)
    return (-top, top)


def _finish(cam: Tensor, relu: bool) -> Tensor:
    return torch.relu(cam) if relu else cam


def _check(activations: Tensor, gradients: Tensor) -> None:
    if activations.dim() != 4:
        raise ValueError(f"activations must be (B, K, H, W), got shape {tuple(activations.shape)}")
    if gradients.shape != activations.shape:
        raise ValueError(
            f"gradients {tuple(gradients.shape)} and activations {tuple(activations.shape)} differ in shape"
        )
