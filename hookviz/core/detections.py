"""What a detector gives for a photo (:class:`Found`), and what a detector of any library implements to be
explained (:class:`Detects`); :mod:`hookviz.engine.detection` explains it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor


@dataclass(frozen=True)
class Found:
    """One photo's detections as its detector returned them, and where the photo lay in the network's input.

    ``scores`` are tensors of the very pass that found the boxes (recorded by autograd when gradients are on),
    so a box's gradient is that of its own score. ``canvas`` is the network input's ``(H, W)`` (resized and
    padded); the photo fills ``region`` = ``(top, left, height, width)`` of it.
    """

    boxes: Tensor
    labels: Tensor
    scores: Tensor
    canvas: tuple[int, int]
    region: tuple[int, int, int, int]
    #: An instance segmenter's masks ``(N, height, width)`` (bool, over ``region``), else None.
    masks: Tensor | None = None


@runtime_checkable
class Detects(Protocol):
    """A detector hookviz can explain: photos ``(3, H, W)`` in [0, 1] in, each photo's :class:`Found` out
    (those scoring at least ``threshold``). torchvision's detectors are adapted by :func:`detector_of`; a
    model from another library (ultralytics, Hugging Face) is wrapped in a module that implements this.

    Such a module may also have ``num_classes`` (its head's), ``set_input_size(size)`` (``--input-size``),
    ``default_layers`` (the layers ``gradcam`` explains when none are given; several are fused) and
    ``layers_note`` (what the note line says of them).
    """

    def detect(self, images: Sequence[Tensor], threshold: float) -> list[Found]: ...
