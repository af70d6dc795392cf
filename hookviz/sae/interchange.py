"""Published vision SAEs read from a local file (no download at run time) and written as a hookviz run folder,
so ``hookviz sae features`` and ``explain`` take them:

- ViT-Prisma: a folder (or its ``weights.pt``) holding ``config.json`` (``d_in``, ``d_sae``,
  ``activation_fn_str`` relu or topk with ``activation_fn_kwargs.k``, ``normalize_activations``) and
  ``weights.pt``, a state dict of ``W_enc (d_in, d_sae)``, ``b_enc``, ``W_dec (d_sae, d_in)``, ``b_dec``;
  codes ``act((x - b_dec) @ W_enc + b_enc)``, reconstruction ``codes @ W_dec + b_dec``.
- saev: one file, a JSON header line (``{"schema": 1 or 2, "cfg": {"d_vit", "exp_factor", "activation"}}`` or,
  before schemas, the config itself) then a ``torch.save``'d state dict of the same four tensors; codes
  ``act(x @ W_enc + b_enc)``, reconstruction ``codes @ W_dec + b_dec``.

Both map exactly onto the library's TopK SAE: the normalisation's mean is ``b_dec`` (scale 1), the encoder is
``W_enc`` with its bias moved accordingly, the dictionary is ``W_dec`` as it is (a ReLU SAE is TopK with k the
width)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hookviz.errors import UsageError
from hookviz.sae.dictionary import Shape


def _state(raw: Any, where: Path) -> dict[str, Tensor]:
    state = raw.get("state_dict", raw) if isinstance(raw, dict) else None
    needed = ("W_enc", "b_enc", "W_dec", "b_dec")
    if not isinstance(state, dict) or any(k not in state for k in needed):
        raise UsageError(f"{where}: no SAE weights (W_enc, b_enc, W_dec, b_dec) in this file")
    return {k: state[k].detach().float().cpu() for k in needed}


def _topk(kind: str, k: Any, width: int, where: Path) -> int:
    if kind.lower() in ("relu",):
        return width
    if kind.lower() in ("topk", "batchtopk") and isinstance(k, int) and 0 < k <= width:
        return k
    raise UsageError(f"{where}: activation {kind!r} is not one hookviz reads (relu, topk with its k)")


def read_prisma(path: Path) -> tuple[dict[str, Tensor], int, bool]:
    """ViT-Prisma's folder or weights file: the tensors, k, and whether ``b_dec`` is taken from the input."""
    folder = path if path.is_dir() else path.parent
    weights = folder / "weights.pt" if path.is_dir() else path
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        raw = torch.load(weights, map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError) as e:
        raise UsageError(f"{path}: not a ViT-Prisma SAE (config.json and weights.pt): {e}") from None
    if cfg.get("normalize_activations", "none") not in ("none", None):
        raise UsageError(f"{path}: normalize_activations={cfg['normalize_activations']!r} is not read yet")
    tensors = _state(raw, weights)
    width = int(tensors["W_enc"].shape[1])
    kwargs = cfg.get("activation_fn_kwargs") or {}
    return tensors, _topk(str(cfg.get("activation_fn_str", "relu")), kwargs.get("k"), width, path), True


def read_saev(path: Path) -> tuple[dict[str, Tensor], int, bool]:
    """saev's checkpoint file: the tensors, k, and whether ``b_dec`` is taken from the input (it is not)."""
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline())
            raw = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError) as e:
        raise UsageError(f"{path}: not a saev SAE (a JSON header line, then a state dict): {e}") from None
    cfg = header.get("cfg", header) if isinstance(header, dict) else {}
    tensors = _state(raw, path)
    width = int(tensors["W_enc"].shape[1])
    act = cfg.get("activation", {"cls": header.get("cls", "Relu")})
    kind, k = "relu", None
    if isinstance(act, dict):
        kind, k = str(act.get("cls", "Relu")), (act.get("params") or {}).get("top_k", cfg.get("top_k"))
    if kind.lower() == "relu" and _mentions_topk(header):
        form = '{"cls": "TopK", "params": {"top_k": K}}'
        raise UsageError(f"{path}: its header speaks of TopK, but not as saev writes it (cfg.activation: "
                         f"{form}); it would be read as ReLU: fix the header")  # fmt: skip
    return tensors, _topk(kind, k, width, path), False


def _mentions_topk(value: Any) -> bool:
    """Whether a header holds a TopK's mark anywhere: a key ``top_k``/``topk``/``k``, a value ``topk``."""
    if isinstance(value, dict):
        marks = {"topk", "k"}
        return any(str(key).lower().replace("_", "").replace("-", "") in marks or _mentions_topk(v)
                   for key, v in value.items())  # fmt: skip
    if isinstance(value, list):
        return any(_mentions_topk(v) for v in value)
    return isinstance(value, str) and value.lower().replace("_", "").replace("-", "") in ("topk", "batchtopk")


def to_library(tensors: dict[str, Tensor], k: int, subtracts_b_dec: bool) -> tuple[Shape, dict[str, Tensor]]:
    """The shape and the tensors (as :func:`hookviz.sae.store.tensors_of` writes them) of the same SAE."""
    w_enc, b_enc, w_dec, b_dec = (tensors[n] for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    d, width = w_enc.shape
    bias = b_enc if subtracts_b_dec else b_enc + b_dec @ w_enc
    shape = Shape("topk" if k < width else "relu", int(d), int(width), int(k))
    out = {
        "encoder.final_block.0.weight": w_enc.T.contiguous(),
        "encoder.final_block.0.bias": bias.contiguous(),
        "dictionary._weights": w_dec.contiguous(),
        "dictionary.multiplier": torch.tensor(0.0),
        "extra.fused_dictionary": w_dec.clone(),
        "norm.mean": b_dec.contiguous(),
    }
    return shape, out
