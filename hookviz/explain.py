"""Running a model to explain it: Grad-CAM maps with the predictions they explain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hookviz import cams
from hookviz.errors import LayerError, TargetError
from hookviz.hooks import capture, preserved


@dataclass(frozen=True)
class CamResult:
    """Grad-CAM maps for a batch and the predictions behind them (all tensors on the CPU).

    Attributes:
        layer: the module the maps were taken at.
        maps: ``(B, h, w)`` raw maps at the layer's resolution (not normalised).
        probs: ``(B, num_classes)`` softmax probabilities.
        predicted: ``(B,)`` top-1 class per image; ``predicted_score`` its probability.
        target: ``(B,)`` the class each map explains; ``target_score`` its probability.
    """

    layer: str
    maps: Tensor
    probs: Tensor
    predicted: Tensor
    predicted_score: Tensor
    target: Tensor
    target_score: Tensor


def _targets(target: int | Sequence[int] | Tensor | None, logits: Tensor) -> Tensor:
    n, num_classes = logits.shape
    if target is None:
        t = logits.argmax(dim=1)
    elif isinstance(target, int):
        t = torch.full((n,), target, dtype=torch.long, device=logits.device)
    else:
        t = torch.as_tensor(list(target) if not isinstance(target, Tensor) else target, device=logits.device)
        if t.shape != (n,):
            raise TargetError(f"got {t.numel()} targets for a batch of {n}")
    if bool(((t < 0) | (t >= num_classes)).any()):
        raise TargetError(f"target class out of range 0..{num_classes - 1}: {t.tolist()}")
    return t.long()


def grad_cam(
    model: nn.Module,
    x: Tensor,
    layer: str,
    target: int | Sequence[int] | Tensor | None = None,
    *,
    relu: bool = True,
) -> CamResult:
    """Grad-CAM of ``model`` at ``layer`` for the batch ``x``.

    The forward pass runs under ``torch.no_grad()`` up to ``layer``; from there autograd records
    only the head, and the gradient of the target logits is taken w.r.t. the layer's output alone,
    so no parameter gradient is computed. In eval mode the images of a batch are independent, so the
    gradient of the *sum* of per-image target logits gives every image's own gradient in one call.
    The model is left as found (mode, ``requires_grad``, ``.grad``, hooks).

    Args:
        model: a classifier returning logits ``(B, num_classes)``.
        x: the preprocessed batch ``(B, 3, H, W)`` on the model's device.
        layer: the module name (``layer4``, ``features.28``), whose output must be ``(B, K, h, w)``.
        target: ``None`` for each image's predicted class, a class index, or one index per image.
        relu: ``False`` keeps negative evidence (signed map).

    Raises:
        LayerError: the layer does not run, runs twice, or is not spatial.
        TargetError: a target out of range.

    Example:
        >>> res = grad_cam(model, x, "layer4")
        >>> res.maps.shape  # (B, 7, 7) for a 224x224 resnet input
    """
    with preserved(model), capture(model, grad_layers=[layer]) as cap:
        model.eval()
        with torch.no_grad():
            logits = model(x)
        taps = cap.captured.taps.get(layer)
        if not taps:
            raise LayerError(f"layer {layer!r} did not run in the forward pass; pick another layer")
        tap = taps[0]
        if tap.dim() != 4:
            raise LayerError(
                f"layer {layer!r} outputs shape {tuple(tap.shape)}, not a (B, C, H, W) feature map, "
                "so it has no spatial map to show; pick a convolutional layer or block"
            )
        if not isinstance(logits, Tensor) or logits.dim() != 2:
            raise LayerError("the model must return class logits of shape (B, num_classes)")
        t = _targets(target, logits.detach())
        score = logits.gather(1, t[:, None]).sum()
        torch.autograd.grad(score, tap)
        grads = cap.captured.grads[layer][-1]
        with torch.no_grad():
            maps = cams.grad_cam(tap.detach(), grads, relu=relu)
            probs = torch.softmax(logits.detach().float(), dim=1)
            top_score, top = probs.max(dim=1)
            t_score = probs.gather(1, t[:, None])[:, 0]
    return CamResult(
        layer=layer,
        maps=maps.float().cpu(),
        probs=probs.cpu(),
        predicted=top.cpu(),
        predicted_score=top_score.cpu(),
        target=t.cpu(),
        target_score=t_score.cpu(),
    )
