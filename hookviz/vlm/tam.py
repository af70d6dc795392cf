"""TAM, the Token Activation Map (Li et al., ICCV 2025), written from the paper and its reference code's
description of the steps:

1. A word's activation at every position is its logit read there (the decoder's final state through the
   output head), below zero cut: at the image tokens, the map to explain; at the text tokens before it, how
   much each earlier word's presence could account for it.
2. Estimated causal inference: the earlier text tokens (other than the word itself) each have their own
   image map (the same reading with their own token); their mean, weighted by the word's activation at them,
   is the interference; it is scaled by least squares onto the word's map and taken off, below zero cut.
3. A rank Gaussian filter denoises each view's grid: in each 3 x 3 window the values are sorted and averaged
   with Gaussian weights over their rank, the width the window's coefficient of variation (std / mean).

The map and the text activations are scaled together to [0, 1] before the filter, as the paper does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import HookGroup
from hookviz.vlm.families import HF


def rank_gaussian(grid: np.ndarray, size: int = 3) -> np.ndarray:
    """The rank Gaussian filter of a 2-D map (reflected at the borders)."""
    pad = size // 2
    padded = np.pad(grid.astype(np.float64), pad, mode="reflect")
    offsets = np.arange(size * size) - size * size // 2
    out = np.zeros(grid.shape, np.float64)
    for y in range(grid.shape[0]):
        for x in range(grid.shape[1]):
            window = np.sort(padded[y : y + size, x : x + size].ravel())
            mean = window.mean()
            if mean <= 0:
                continue
            spread = window.std() / mean
            if spread == 0:
                out[y, x] = mean
                continue
            weights = np.exp(-(offsets**2) / (2 * spread**2))
            out[y, x] = float((window * weights).sum() / weights.sum())
    return out


def keep_final(kept: dict[str, Tensor]) -> Callable[[nn.Module, Any, Any], None]:
    """A forward hook for the language model that keeps its final (normalised) states, detached, in
    ``kept["final"]`` (any pass over the teacher-forced sequence may keep them for the logit lens and TAM)."""

    def final(module: nn.Module, args: Any, output: Any) -> None:
        states = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        kept["final"] = states.detach()

    return final


def final_states(model: HF, lm: HF, forced: dict[str, Any]) -> Tensor:
    """The decoder's final (normalised) states ``(1, L, D)`` over the teacher-forced sequence, from one pass
    without gradients (what the output head reads: the logit lens, TAM)."""
    kept: dict[str, Tensor] = {}
    with HookGroup() as hooks, torch.no_grad():
        hooks.add(lm.register_forward_hook(keep_final(kept)))
        model(**forced)
    return kept["final"]


def token_activation_maps(
    model: HF,
    final: Tensor,
    found: Any,
    image: Tensor,
    per_view: Any,
    special: set[int],
    texts: list[str],
) -> np.ndarray:
    """Each answer token's TAM at the image tokens ``(T, N)`` (see the module's docstring) from the decoder's
    final states over the teacher-forced sequence (``final``: :func:`final_states`); ``per_view``: a
    flat map with a change made to each view's grid (:meth:`hookviz.vlm.families.Placement.per_view`);
    ``special``: token ids that are not words (left out of the context); ``texts``: each position's token
    text (a word is not its own interference)."""
    ids = found.ids[0]
    is_image = torch.zeros(len(ids), dtype=torch.bool, device=ids.device)
    is_image[image] = True
    context = [
        p for p in range(int(ids.shape[0])) if not is_image[p] and int(ids[p]) not in special
    ]  # the text positions
    head = model.get_output_embeddings()
    with torch.no_grad():
        wanted = torch.tensor(
            sorted({int(ids[p]) for p in context} | set(found.token_ids)), device=ids.device
        )
        logits = head(final[0]).float()[:, wanted].clamp(min=0)  # (L, tokens asked about)
    column = {int(t): i for i, t in enumerate(wanted.tolist())}
    at_image = to_numpy(logits[image])  # (N, tokens)
    out = []
    for t, token in enumerate(found.token_ids):
        position = found.start + t
        before = [p for p in context if p < position and texts[p].strip() != texts[position].strip()]
        img = at_image[:, column[token]].astype(np.float64)
        text = to_numpy(logits[before, column[token]]).astype(np.float64) if before else np.zeros(0)
        if before and text.sum() > 0:
            interference = (at_image[:, [column[int(ids[p])] for p in before]] * (text / text.sum())).sum(
                axis=1
            )
            scale = float(img @ interference / (interference @ interference)) if interference.any() else 0.0
            img = np.clip(img - scale * interference, 0, None)
        both = np.concatenate([img, text])
        low, high = both.min(), both.max()
        img = (img - low) / (high - low) if high > low else np.zeros_like(img)
        out.append(per_view(img, rank_gaussian))
    return np.stack(out)
