"""The attention probabilities of a transformer, read during a forward pass, whatever kernel computes them.

A vision transformer's self-attention is ``A = softmax(q kᵀ · scale + mask)`` per head, ``(B, H, N, N)`` over
its ``N`` tokens. Models compute it three ways, and :class:`AttentionProbe` (a ``TorchFunctionMode``, so
nothing is patched or added to the model) reads it from each:

- ``F.scaled_dot_product_attention`` (timm, Hugging Face's default, torchvision through
  ``nn.MultiheadAttention``): a fused kernel never forms ``A``; inside the probe's scope the call is computed
  explicitly instead (the same formula, softmax then ``A @ v``), so ``A`` exists and the output depends on it.
- ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``, torchvision's ViT): called with per-head
  weights; the softmax they are a view of is what the output was computed from.
- an explicit ``softmax`` whose output is ``(B, H, N, N)`` (timm with fused attention off, Hugging Face's
  eager attention).

Each recorded ``A`` is part of the graph of the model's output, so gradients reach it (Chefer's relevance,
LeGrad). Attention over other token counts (windowed attention in Swin, cross-attention pooling) is recorded
too; the methods keep the global self-attention over the model's tokens.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

_SOFTMAX = (F.softmax, torch.softmax, Tensor.softmax)
#: ``F.multi_head_attention_forward``'s signature, to set its weight options however it was called.
_MHA = inspect.signature(F.multi_head_attention_forward)


@dataclass
class Attention:
    """One attention call: ``probs`` ``(B, H, L, S)`` the probabilities (differentiable), ``leaf`` the
    tensor the output was computed from (``probs`` itself, or the ``(B*H, L, S)`` softmax behind
    ``nn.MultiheadAttention``'s weights): gradients are taken with respect to ``leaf``."""

    probs: Tensor
    leaf: Tensor

    def gradient(self, g: Tensor) -> Tensor:
        """A gradient with respect to :attr:`leaf` as ``(B, H, L, S)``."""
        return g.reshape(self.probs.shape)


def _explicit_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor]:
    """``scaled_dot_product_attention`` as its documentation writes it: ``(output, probabilities)``."""
    n, s = q.shape[-2], k.shape[-2]
    if enable_gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    logits = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        keep = torch.ones(n, s, dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask
    probs = logits.softmax(dim=-1)
    used = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
    return used @ v, probs


class AttentionProbe(TorchFunctionMode):
    """Within its scope, every attention's probabilities in call order: :attr:`found` (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[Attention] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out, probs = _explicit_sdpa(*args, **kwargs)
            if probs.dim() == 4:
                self.found.append(Attention(probs, probs))
            return out
        if func is F.multi_head_attention_forward:
            return self._multi_head(func, args, kwargs)
        out = func(*args, **kwargs)
        if func in _SOFTMAX and isinstance(out, Tensor) and out.dim() == 4:
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if dim in (-1, 3):
                self.found.append(Attention(out, out))
        return out

    def _multi_head(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        bound = _MHA.bind(*args, **kwargs)
        wanted = bound.arguments.get("need_weights", True)
        averaged = bound.arguments.get("average_attn_weights", True)
        bound.arguments["need_weights"] = True
        bound.arguments["average_attn_weights"] = False
        out, weights = func(*bound.args, **bound.kwargs)
        leaf = weights._base if weights is not None else None
        if weights is not None and leaf is not None and leaf.numel() == weights.numel():
            self.found.append(Attention(weights, leaf))
        if not wanted:
            return out, None
        return out, (weights.mean(dim=1) if averaged and weights is not None else weights)
