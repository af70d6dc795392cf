"""What a class's score is, for a classifier and for a segmentation model.

A classifier's output is ``(B, C)`` logits: a class's score is its logit, its reported score the softmax
probability. A segmentation model's is ``(B, C, H, W)``: a class's score is its logit summed over the
pixels the model assigns to the class (``region="class"``, as in Seg-Grad-CAM) or over every pixel
(``region="all"``), and its reported score the share of pixels assigned to it. A class with no pixel of
its own is explained over all pixels, so asking for a class the model did not find still gives a map.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hookviz.errors import LayerError
from hookviz.options import Region

#: ``scorer(output, rows) -> (n, C)`` probabilities of the classes for a model output of ``n`` inputs,
#: the ``rows`` of the original batch they were made from (Score-CAM's and the metrics' masked copies).
Scorer = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Readout:
    """Class scores of a batch.

    Attributes:
        scores: ``(B, C)``, differentiable: what a target's gradient explains.
        probs: ``(B, C)`` what records report: softmax probabilities, or a segmentation's pixel shares.
        order: ``(B, C)`` classes from the most likely down (see :func:`ranking`).
        labels: ``(B, H, W)`` predicted class per pixel (segmentation), else ``None``.
        region: ``class`` or ``all`` (segmentation), else ``None``.
    """

    scores: Tensor
    probs: Tensor
    order: Tensor
    labels: Tensor | None = None
    region: str | None = None
    kind: str = "softmax"

    def scorer(self) -> Scorer:
        """Probabilities of new outputs for the same images (see :data:`Scorer`)."""
        return scorer(self.labels, self.region, self.kind)


def scorer(labels: Tensor | None = None, region: str | None = None, kind: str = "softmax") -> Scorer:
    """A classifier's softmax (no ``labels``), its sigmoids (``kind="sigmoid"``: a multi-label head), the
    scores themselves (``kind="identity"``: a similarity; ``"raw"``: a regression),
    or a segmentation's mean probability of each class over the pixels ``labels`` (the original
    prediction) gives it, or over all pixels (``region="all"``)."""
    if kind in ("identity", "raw"):
        return lambda output, rows: output.float()
    if kind == "sigmoid":
        return lambda output, rows: torch.sigmoid(output.float())
    if labels is None:
        return lambda output, rows: torch.softmax(output.float(), dim=1)
    fixed = labels

    def dense(output: Tensor, rows: Tensor) -> Tensor:
        probs = torch.softmax(output.float(), dim=1)
        if region == Region.all:
            return probs.mean(dim=(2, 3))
        rows_labels = fixed[rows.to(fixed.device)].to(probs.device).long()
        own = _class_sums(probs, rows_labels)
        count = _pixel_counts(rows_labels, probs.shape[1])
        return torch.where(count > 0, own / count.clamp_min(1), probs.mean(dim=(2, 3)))

    return dense


def ranking(logits: Tensor) -> Tensor:
    """Classes of each row from the highest logit down; ties keep the lower index first.

    The one ordering behind both "predicted" and "top-K", so the class explained for ``top1`` is
    always the class reported as predicted, even when scores tie.
    """
    return logits.detach().float().sort(dim=1, descending=True, stable=True).indices


def positive_targets(logits: Tensor, order: Tensor, threshold: float) -> Tensor:
    """``(B, T)``: each image's labels whose sigmoid reaches ``threshold``, likeliest first (none: its
    likeliest label), rows shorter than the longest padded by repeating their last label."""
    probs = torch.sigmoid(logits.detach().float())
    rows = []
    for b in range(logits.shape[0]):
        ranked = order[b]
        keep = ranked[probs[b, ranked] >= threshold]
        rows.append(keep if len(keep) else ranked[:1])
    width = max(len(r) for r in rows)
    return torch.stack([torch.cat([r, r[-1:].expand(width - len(r))]) for r in rows])


def _class_sums(values: Tensor, labels: Tensor) -> Tensor:
    """``(B, C)``: per class, the sum of ``values[b, c]`` over the pixels labelled ``c`` (differentiable)."""
    b, c = values.shape[:2]
    own = values.gather(1, labels[:, None]).flatten(1)  # each pixel's value for its own class
    return torch.zeros(b, c, device=values.device, dtype=own.dtype).scatter_add(1, labels.flatten(1), own)


def _pixel_counts(labels: Tensor, classes: int) -> Tensor:
    """``(B, C)`` pixels labelled with each class."""
    flat = labels.flatten(1)
    ones = torch.ones(flat.shape, device=labels.device)
    return torch.zeros(flat.shape[0], classes, device=labels.device).scatter_add(1, flat, ones)


def read(output: Tensor, region: str = "class", background: int | None = 0, kind: str = "softmax") -> Readout:
    """Scores of a classifier's ``(B, C)`` or a segmentation model's ``(B, C, H, W)`` output.

    ``kind="identity"``: the scores are what records report (a cosine similarity,
    :mod:`hookviz.models.scores`), not logits to take the softmax of.

    For segmentation, the predicted class is the most frequent one other than ``background`` (the
    likeliest by mean probability when no pixel has another class); ``None`` counts every class.

    Raises:
        LayerError: an output of another shape.
    """
    if output.dim() == 2:
        if kind in ("identity", "raw"):  # a similarity, a regression's values: reported as they are
            return Readout(output, output.detach().float(), ranking(output), kind=kind)
        if kind == "sigmoid":  # a multi-label head: each class's own probability
            return Readout(output, torch.sigmoid(output.detach().float()), ranking(output), kind=kind)
        return Readout(output, torch.softmax(output.detach().float(), dim=1), ranking(output))
    if output.dim() != 4:
        raise LayerError(
            f"the model returns scores of shape {tuple(output.shape)}: expected (B, num_classes) class "
            "logits or (B, num_classes, H, W) segmentation logits"
        )
    region = Region.parse(region, "--region").value
    c, h, w = output.shape[1:]
    labels = output.detach().argmax(dim=1)
    count = _pixel_counts(labels, c)
    share = count / (h * w)
    totals = output.sum(dim=(2, 3))
    own = totals if region == Region.all else _class_sums(output, labels)
    scores = torch.where(count > 0, own, totals)
    mean_prob = torch.softmax(output.detach().float(), dim=1).mean(dim=(2, 3))
    # Most pixels first, then the likeliest; background last (stable sorts, least significant key first).
    order = mean_prob.sort(dim=1, descending=True, stable=True).indices
    order = order.gather(1, share.gather(1, order).sort(dim=1, descending=True, stable=True).indices)
    if background is not None and 0 <= background < c:
        last = (order == background).to(torch.int8)
        order = order.gather(1, last.sort(dim=1, stable=True).indices)
    return Readout(scores, share.float(), order, labels, region)
