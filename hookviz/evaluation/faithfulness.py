"""Faithfulness by deletion and insertion, average drop and increase in confidence; the chance baselines;
the choice of ``--layer auto``.

* **Deletion / insertion** (Petsiuk et al., RISE, BMVC 2018): pixels are removed from the image (deletion:
  replaced by the baseline, zeros in the model's input space, i.e. the data set's mean colour) or revealed on
  a blurred copy (insertion), most important first by the map; the area under the target's probability curve
  over the fraction of pixels changed. A faithful map makes the probability fall fast (low deletion AUC) and
  rise fast (high insertion).
* **Average drop / increase in confidence** (Chattopadhay et al., Grad-CAM++, WACV 2018): the image multiplied
  by the map (scaled to [0, 1]); average drop = mean of max(0, p - p_masked) / p (in %, lower is better);
  increase in confidence = how often p_masked > p (in %, higher is better).

Every perturbed image of a batch is run through the model in chunks of ``chunk``; ``forward_passes`` counts
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import capture, logits_of, preserved
from hookviz.core.readout import Scorer, scorer
from hookviz.core.taps import MATERIAL_NEGATIVE, negative_mass
from hookviz.engine.explain import explain
from hookviz.errors import LayerError
from hookviz.methods import get

#: Fractions of pixels changed at each step of the deletion and insertion curves (0 .. 1 inclusive).
STEPS = 16


@dataclass(frozen=True)
class Faithfulness:
    """Per-image metrics for one set of maps (tensors of shape ``(B,)`` on the CPU)."""

    deletion_auc: Tensor
    insertion_auc: Tensor
    average_drop: Tensor  # in %, per image: max(0, p - p_masked) / p * 100
    increase: Tensor  # 1.0 where p_masked > p, else 0.0 (its mean x 100 is the "increase in confidence")
    deletion_curve: Tensor  # (B, STEPS + 1)
    insertion_curve: Tensor
    forward_passes: int


def upsample(maps: Tensor, size: tuple[int, ...]) -> Tensor:
    """``(B, h, w)`` maps at the input's size (bilinear), NaN/Inf as 0; a video's ``(B, t, h, w)`` at its
    ``(T, H, W)`` (trilinear)."""
    mode = "trilinear" if len(size) == 3 else "bilinear"
    up = F.interpolate(maps[:, None].float(), size=size, mode=mode, align_corners=False)[:, 0]
    return torch.nan_to_num(up, nan=0.0, posinf=0.0, neginf=0.0)


def blurred(x: Tensor, factor: int = 16) -> Tensor:
    """A heavily blurred copy (where the insertion curve starts): averaged ``factor`` times down, then up
    (a video's frames each on its own: time is not blurred)."""
    if x.dim() == 5:
        b, c, t = x.shape[:3]
        frames = x.transpose(1, 2).reshape(b * t, c, *x.shape[3:])
        return blurred(frames, factor).reshape(b, t, c, *x.shape[3:]).transpose(1, 2)
    h, w = x.shape[2:]
    small = F.adaptive_avg_pool2d(x, (max(1, h // factor), max(1, w // factor)))
    return F.interpolate(small, size=(h, w), mode="bilinear", align_corners=False)


def chunk_size(x: Tensor, chunk: int | None = None) -> int:
    """How many perturbed images go through the model at once: ``chunk``, else 64 on a GPU and 8 on the CPU
    (where a batch of 64 at 224 x 224 runs 1.3x slower an image than batches of 8: the cache, measured)."""
    return chunk or (64 if x.device.type == "cuda" else 8)


def probabilities(
    model: nn.Module,
    images: Tensor,
    targets: Tensor,
    chunk: int | None,
    counter: list[int],
    scorer: Scorer | None = None,
    rows: Tensor | None = None,
) -> Tensor:
    chunk = chunk_size(images, chunk)
    out = []
    rows = torch.arange(images.shape[0], device=images.device) if rows is None else rows
    for i in range(0, images.shape[0], chunk):
        logits = logits_of(model(images[i : i + chunk]))
        probs = (
            torch.softmax(logits.float(), dim=1) if scorer is None else scorer(logits, rows[i : i + chunk])
        )
        out.append(probs.gather(1, targets[i : i + chunk, None])[:, 0])
        counter[0] += images[i : i + chunk].shape[0]
    return torch.cat(out)


def auc(curve: Tensor) -> Tensor:
    """Area under curves sampled at evenly spaced fractions 0..1 (trapezoids), one per row."""
    return torch.trapezoid(curve, dx=1.0 / (curve.shape[-1] - 1), dim=-1)


def faithfulness(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    targets: Tensor,
    *,
    steps: int = STEPS,
    chunk: int | None = None,
    baseline: Tensor | None = None,
    scorer: Scorer | None = None,
) -> Faithfulness:
    """Deletion and insertion AUCs, average drop and increase in confidence for ``maps`` of ``x``.

    Args:
        model: the classifier (eval mode is used; the model is left as found).
        x: ``(B, 3, H, W)`` preprocessed inputs; ``maps``: ``(B, h, w)``, any resolution (a video model's
            clips ``(B, 3, T, H, W)`` and maps ``(B, t, h, w)``: voxels are deleted and inserted);
        targets: ``(B,)`` the class each map explains.
        chunk: perturbed images a forward pass (:func:`chunk_size`).
        baseline: what deleted pixels become (default zeros: the data set's mean colour after normalisation).
        scorer: how an output becomes class probabilities (a segmentation's, from
            :meth:`hookviz.core.readout.Readout.scorer`); default the softmax of a classifier's logits.
    """
    b = x.shape[0]
    size = tuple(int(s) for s in x.shape[2:])
    importance = upsample(maps.to(x.device), size).flatten(1)
    # Pixels most important first; ties keep a fixed order, so the curve does not depend on chance.
    order = torch.sort(importance, dim=1, descending=True, stable=True).indices
    n = importance.shape[1]
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(n, device=x.device).expand(b, n))
    counts = [round(n * k / steps) for k in range(steps + 1)]
    base = torch.zeros_like(x) if baseline is None else baseline.expand_as(x)
    start = blurred(x)
    deleted, inserted = [], []
    for c in counts:
        keep = (rank >= c).reshape(b, 1, *size).to(x.dtype)  # pixels not yet changed
        deleted.append(x * keep + base * (1 - keep))
        inserted.append(start * keep + x * (1 - keep))
    unit = importance - importance.amin(dim=1, keepdim=True)
    unit = unit / unit.amax(dim=1, keepdim=True).clamp_min(1e-12)
    masked = x * unit.reshape(b, 1, *size)
    passes = [0]
    with torch.no_grad(), preserved(model):
        model.eval()
        t = targets.to(x.device)
        reps = t.repeat(steps + 1)
        rows = torch.arange(b, device=x.device).repeat(steps + 1)
        d = probabilities(model, torch.cat(deleted), reps, chunk, passes, scorer, rows)
        ins = probabilities(model, torch.cat(inserted), reps, chunk, passes, scorer, rows)
        d, ins = d.reshape(steps + 1, b).T, ins.reshape(steps + 1, b).T
        p_masked = probabilities(model, masked, t, chunk, passes, scorer)
    p = d[:, 0]  # nothing deleted yet: the original image
    drop = (p - p_masked).clamp_min(0) / p.clamp_min(1e-12) * 100
    return Faithfulness(
        deletion_auc=auc(d).cpu(),
        insertion_auc=auc(ins).cpu(),
        average_drop=drop.cpu(),
        increase=(p_masked > p).float().cpu(),
        deletion_curve=d.cpu(),
        insertion_curve=ins.cpu(),
        forward_passes=passes[0],
    )


def random_maps(b: int, h: int, w: int, seed: int = 0, x: Tensor | None = None) -> Tensor:
    """The ``random`` chance baseline: uniform noise, seeded (the same maps every run).

    With the batch ``x``, each image's map is seeded by its own pixels (and ``seed``), so an image gets the
    same map whatever batch it is in and whatever its neighbours (``--batch-size`` changes nothing)."""
    if x is None:
        gen = torch.Generator().manual_seed(seed)
        return torch.rand(b, h, w, generator=gen)
    return torch.stack([torch.rand(h, w, generator=g) for g in image_generators(x, seed)])


def image_seeds(x: Tensor, seed: int = 0) -> list[int]:
    """A seed per image of the batch ``x`` from its own pixels and ``seed``: a draw made for an image is the
    same whatever batch it is in and whatever its neighbours (``--batch-size`` changes no figure)."""
    import zlib

    return [zlib.crc32(image.tobytes(), seed & 0xFFFFFFFF) for image in to_numpy(x, torch.float32)]


def image_generators(x: Tensor, seed: int = 0) -> list[torch.Generator]:
    """A CPU generator per image of ``x``, seeded by :func:`image_seeds`."""
    return [torch.Generator().manual_seed(s) for s in image_seeds(x, seed)]


def center_maps(b: int, h: int, w: int) -> Tensor:
    """The ``center`` chance baseline: a centred Gaussian (sigma a quarter of the side)."""
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    g = torch.exp(-(xx**2 + yy**2) / (2 * 0.5**2))
    return g.expand(b, h, w).clone()


def rank_layers(
    model: nn.Module, x: Tensor, layers: Sequence[str], method: str = "gradcam", targets: object = None
) -> dict[str, float]:
    """Mean insertion AUC minus deletion AUC of ``method``'s maps at each layer, over the images ``x``
    (``--layer auto`` takes the best). A layer that cannot be explained (it runs twice, no spatial map)
    scores ``-inf``."""

    scores: dict[str, float] = {}
    for layer in layers:
        try:
            ex = explain(model, x, [layer], [method], targets)  # type: ignore[arg-type]
        except LayerError:
            scores[layer] = float("-inf")
            continue
        f = faithfulness(
            model,
            x,
            ex.maps[(method, layer)][:, 0],
            ex.targets[:, 0],
            scorer=scorer(ex.labels, ex.region, ex.score_kind),
        )
        scores[layer] = float((f.insertion_auc - f.deletion_auc).mean())
    return scores


def choose_layer(
    model: nn.Module, x: Tensor, candidates: Sequence[str], methods: Sequence[str] = ("gradcam",)
) -> dict[str, Any]:
    """``--layer auto``: the candidate with the best insertion - deletion AUC of the first gradient method
    among ``methods`` on the images ``x``, as a record (``chosen``, ``method``, ``images``, ``scores``).

    For a method whose formula assumes non-negative activations (Grad-CAM++, XGrad-CAM), candidates whose
    activation mass is materially negative on ``x`` (a BatchNorm's output) are passed over when a
    non-negative one exists; the record lists them under ``signed`` with their negative mass.
    """

    method = next((m for m in methods if m not in ("all", "eigencam", "scorecam")), "gradcam")
    scores = rank_layers(model, x, candidates, method)
    record: dict[str, Any] = {"method": method, "images": int(x.shape[0])}
    eligible = list(scores)
    if get(method).assumes_nonnegative:
        with capture(model, list(scores)) as cap, torch.no_grad():
            model(x)
        mass = {
            n: float(negative_mass(cap.captured.outputs[n][0]).max())
            for n in scores
            if n in cap.captured.outputs
        }
        signed = {n: round(v, 4) for n, v in mass.items() if v >= MATERIAL_NEGATIVE}
        if signed and len(signed) < len(scores):
            eligible = [n for n in scores if n not in signed]
            record["signed"] = signed
    best = max(eligible, key=lambda n: scores[n])
    return {"chosen": best, **record, "scores": {k: round(v, 4) for k, v in scores.items()}}
