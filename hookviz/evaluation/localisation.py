"""Does the map point at the object? Localisation against annotated masks (boxes drawn as masks), and the
map's complexity: each written to equal Quantus 0.6's metric of the same name on the same map and mask.

All take maps ``(B, H, W)`` at the input's resolution and, for localisation, boolean masks ``(B, H, W)`` of
the annotated object (an empty mask gives NaN: nothing to point at).

* **Pointing game** (Zhang et al., ECCV 2016 / IJCV 2018): a hit when the map's maximum lies on the object,
  or within ``tolerance`` pixels of it (the paper's 15).
* **Energy-based pointing game** (Wang et al., Score-CAM, CVPRW 2020): the share of the map's energy (the map
  min-max scaled) inside the object.
* **Relevance mass accuracy** and **relevance rank accuracy** (Arras et al., Information Fusion 2022): the
  share of the map's relevance inside the object; the share of the K most relevant pixels inside it, K the
  object's size in pixels.
* **Top-k intersection** (Theiner et al. 2021): the share of the ``k`` most relevant pixels on the object.
* **Sparseness** (Chalasani et al., ICML 2020): the Gini index of the map's absolute values (1: all relevance
  on one pixel). **Complexity** (Bhatt et al., IJCAI 2020): the entropy of the map's share per pixel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hookviz.core.arrays import to_numpy


def _flat(maps: Tensor, masks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    a = maps.detach().double().cpu().flatten(1)
    s = masks.detach().cpu().bool().flatten(1)
    return a, s, s.sum(dim=1) == 0


def _nan_where(values: Tensor, empty: Tensor) -> Tensor:
    return torch.where(empty, torch.full_like(values, float("nan")), values)


def pointing_game(maps: Tensor, masks: Tensor, tolerance: float = 15.0) -> Tensor:
    """1.0 where a maximum of the map lies within ``tolerance`` pixels (Euclidean) of the mask, else 0.0
    (with ``tolerance=0``: on the mask, Quantus's ``PointingGame``)."""
    from scipy.ndimage import distance_transform_edt

    a, s, empty = _flat(maps, masks)
    top = a == a.amax(dim=1, keepdim=True)
    if tolerance > 0:
        near = torch.stack(
            [
                torch.from_numpy(distance_transform_edt(~to_numpy(m)) <= tolerance) if m.any() else m
                for m in masks.detach().cpu().bool()
            ]
        ).flatten(1)
    else:
        near = s
    return _nan_where((top & near).any(dim=1).double(), empty)


def energy_pointing_game(maps: Tensor, masks: Tensor) -> Tensor:
    """The share of the min-max scaled map's sum that lies inside the mask."""
    a, s, empty = _flat(maps, masks)
    a = a - a.amin(dim=1, keepdim=True)
    total = a.sum(dim=1)
    share = (a * s).sum(dim=1) / total.clamp_min(1e-12)
    return _nan_where(torch.where(total > 0, share, torch.zeros_like(share)), empty)


def relevance_mass(maps: Tensor, masks: Tensor) -> Tensor:
    """Relevance mass accuracy: the map's sum inside the mask over its sum everywhere (the map as it is)."""
    a, s, empty = _flat(maps, masks)
    return _nan_where((a * s).sum(dim=1) / a.sum(dim=1), empty)


def relevance_rank(maps: Tensor, masks: Tensor) -> Tensor:
    """Relevance rank accuracy: of the K most relevant pixels (K = the mask's size), the share on the mask."""
    a, s, empty = _flat(maps, masks)
    order = torch.sort(a, dim=1, descending=True, stable=True).indices
    k = s.sum(dim=1)
    hits = s.gather(1, order).double().cumsum(dim=1)
    got = hits.gather(1, (k - 1).clamp_min(0)[:, None])[:, 0]
    return _nan_where(got / k.clamp_min(1), empty)


def top_k_intersection(maps: Tensor, masks: Tensor, k: int = 1000) -> Tensor:
    """The share of the ``k`` most relevant pixels that lie on the mask."""
    a, s, empty = _flat(maps, masks)
    order = torch.sort(a, dim=1, descending=True, stable=True).indices[:, :k]
    return _nan_where(s.gather(1, order).double().mean(dim=1), empty)


def sparseness(maps: Tensor) -> Tensor:
    """The Gini index of ``|map|`` (scaled by its maximum, plus 1e-7 as Quantus): 0 for a flat map, towards 1
    when the relevance sits on few pixels."""
    a = maps.detach().double().cpu().flatten(1).abs()
    a = a / a.amax(dim=1, keepdim=True).clamp_min(1e-300)
    a = torch.sort(a + 1e-7, dim=1).values
    n = a.shape[1]
    i = torch.arange(1, n + 1, dtype=a.dtype)
    return ((2 * i - n - 1) * a).sum(dim=1) / (n * a.sum(dim=1))


def complexity(maps: Tensor) -> Tensor:
    """The entropy (nats) of ``|map|`` as a distribution over the pixels: log(pixels) for a flat map, lower
    when the relevance is concentrated."""
    a = maps.detach().double().cpu().flatten(1).abs()
    a = a / a.amax(dim=1, keepdim=True).clamp_min(1e-300)
    p = a / a.sum(dim=1, keepdim=True).clamp_min(1e-300)
    return -(p * torch.log(p + 1e-12)).sum(dim=1)
