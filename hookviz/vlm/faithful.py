"""How faithful a word's map is: deletion and insertion on the word's log-probability, the image tokens
taken away (or given back) in the map's order, against a seeded random map's order.

Deleting a token replaces its embedding, as the language model receives it, by the mean of the photo's image
tokens (the photo's own "grey"); the photo itself and the prompt are untouched, so the curve measures what the
map ranks, the image tokens, in any family. Deletion AUC (lower is better) and insertion AUC (higher is
better) are the trapezoid areas of the log-probability over the share of tokens removed or restored.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.hooks import HookGroup
from hookviz.vlm.words import Vlm, WordMaps


def _log_prob(vlm: Vlm, wm: WordMaps, token: int, replaced: Tensor) -> float:
    """The answer token's log-probability with the image tokens at ``replaced`` set to their mean."""
    lm = vlm.family.language_model(vlm.model)
    assert wm.image is not None

    def grey(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = kwargs["inputs_embeds"].clone()
        x[0, replaced] = x[0, wm.image].mean(dim=0)
        return args, {**kwargs, "inputs_embeds": x}

    with HookGroup() as hooks, torch.no_grad():
        hooks.add(lm.register_forward_pre_hook(grey, with_kwargs=True))
        logits = vlm.model(**wm.inputs).logits
    row = wm.answer.start - 1 + token
    return float(torch.log_softmax(logits[0, row].float(), dim=-1)[wm.answer.token_ids[token]])


def _aucs(vlm: Vlm, wm: WordMaps, token: int, order: np.ndarray, steps: int) -> tuple[float, float]:
    assert wm.image is not None
    n = len(order)
    ranked = wm.image[torch.from_numpy(order.copy()).to(wm.image.device)]
    cuts = [round(i * n / steps) for i in range(steps + 1)]
    deletion = [_log_prob(vlm, wm, token, ranked[:c]) for c in cuts]
    insertion = [_log_prob(vlm, wm, token, ranked[c:]) for c in cuts]
    x = np.linspace(0.0, 1.0, steps + 1)
    return float(np.trapezoid(deletion, x)), float(np.trapezoid(insertion, x))


def word_faithfulness(
    vlm: Vlm, wm: WordMaps, method: str, token: int, *, steps: int = 8, seed: int = 0
) -> dict[str, Any]:
    """Deletion and insertion AUC of ``method``'s map of answer token ``token``, and a random map's."""
    scores = wm.maps[method][token].ravel()
    ours = _aucs(vlm, wm, token, np.argsort(-scores, kind="stable"), steps)
    chance = _aucs(vlm, wm, token, np.random.default_rng(seed).permutation(len(scores)), steps)
    return {
        "deletion_auc": round(ours[0], 6),
        "insertion_auc": round(ours[1], 6),
        "random": {"deletion_auc": round(chance[0], 6), "insertion_auc": round(chance[1], 6)},
        "steps": steps,
    }
