"""Feature maps of chosen layers: forward-pre hooks give a layer's input, forward hooks its output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import capture, logits_of, preserved
from hookviz.errors import LayerError
from hookviz.options import Stage


@dataclass(frozen=True)
class FeatureMap:
    """One captured tensor.

    Attributes:
        layer: module name.
        stage: ``"input"`` (what the layer received) or ``"output"`` (what it produced).
        call: 1 for the first call of the module in the forward pass, 2 for the second, ...
        tensor: ``(B, C, H, W)`` on the CPU.
    """

    layer: str
    stage: str
    call: int
    tensor: Tensor


@dataclass(frozen=True)
class Features:
    """Feature maps and the model's output for the same batch (what :func:`capture_features` returns)."""

    maps: list[FeatureMap]
    output: Tensor | None  # the model's output when it is a tensor (class logits for a classifier)


def feature_maps(
    model: nn.Module, x: Tensor, layers: Sequence[str], stage: Stage | str = Stage.output
) -> list[FeatureMap]:
    """Capture the inputs and/or outputs of ``layers`` for the batch ``x`` (eval mode, no grad).

    Results come in network order, input before output. A module run several times per forward
    (a shared ``ReLU``) gives one entry per call. The model is left as found.

    Raises:
        LayerError: a layer does not run, or its tensor is not a ``(B, C, H, W)`` feature map.

    Examples:
        >>> maps = feature_maps(model, x, ["layer1.0.conv1"], stage="both")
        >>> [(m.stage, tuple(m.tensor.shape)) for m in maps]
    """
    return capture_features(model, x, layers, stage).maps


def capture_features(
    model: nn.Module, x: Tensor, layers: Sequence[str], stage: Stage | str = Stage.output
) -> Features:
    """:func:`feature_maps`, plus the model's output from the same forward pass (no second pass)."""
    stage = Stage.parse(stage, "stage")
    want_in = stage in (Stage.input, Stage.both)
    want_out = stage in (Stage.output, Stage.both)
    with preserved(model), capture(model, layers, inputs=want_in, outputs=want_out) as cap:
        model.eval()
        with torch.no_grad():
            out = model(x)
    found = cap.captured
    result: list[FeatureMap] = []
    for name in layers:
        sides = [("input", found.inputs.get(name))] if want_in else []
        sides += [("output", found.outputs.get(name))] if want_out else []
        for side, tensors in sides:
            if not tensors:
                raise LayerError(f"layer {name!r} did not run in the forward pass (no {side} captured)")
            for call, t in enumerate(tensors, start=1):
                if t.dim() not in (4, 5):
                    raise LayerError(
                        f"layer {name!r} {side} has shape {tuple(t.shape)}, not a (B, C, H, W) feature map; "
                        "pick a convolutional layer"
                    )
                result.append(FeatureMap(name, side, call, t.float().cpu()))
    try:
        scores: Tensor | None = logits_of(out).detach().float().cpu()
    except LayerError:  # feature maps need no scores; the caller is told there are none
        scores = None
    return Features(result, scores)


def rank_channels(fmap: Tensor, limit: int) -> list[int]:
    """Channels of one ``(C, H, W)`` map ordered by spatial standard deviation, highest first.

    A channel that is flat across the image shows nothing once normalised; the ones that vary most
    carry the most spatial structure, so they are shown first. Ties keep channel order.
    """
    std = (
        fmap.flatten(1).float().std(dim=1, correction=0)
        if fmap.shape[1] * fmap.shape[2] > 1
        else fmap.flatten(1)[:, 0].abs()
    )
    spread = to_numpy(torch.nan_to_num(std, nan=0.0), torch.float64)
    return [int(c) for c in np.argsort(-spread, kind="stable")[:limit]]
