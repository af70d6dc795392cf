"""The vision towers of the image-text and vision-language models ``--model hf:DIR`` loads: one square photo
in, the image embedding out (what :class:`hookviz.models.scores.ImageTextSource` returns), so that
``layers``, ``summary``, ``featuremaps`` and ``sae`` reach the tower's blocks.

Each family's tower is fed the one square view of the photo that hookviz's preprocessing gives:

- CLIP, SigLIP, LLaVA, PaliGemma, InternVL: ``get_image_features`` as it is (InternVL: one tile, the photo
  squashed to the tile's side, as its processor's thumbnail);
- LLaVA-NeXT: its base view (the whole photo squashed to the tower's side), through the tower and the
  projector; the any-res tiles are left out;
- Idefics3 and SmolVLM: the global view (the photo squashed to the tower's side), through the tower and the
  connector; the tiles are left out.

A tower that takes its patches flattened with their grid (Qwen2-VL, Qwen2.5-VL, Siglip2's NaFlex) or that
needs more than the photo (image sizes, aspect ratios) is refused in one line when the model is loaded.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.errors import UsageError
from hookviz.io.images import Preprocess

#: The families whose tower hookviz feeds one square photo (what the refusals name).
WORKING = (
    "CLIP, SigLIP, LLaVA, LLaVA-NeXT (its base view), PaliGemma, InternVL (one tile), Idefics3 and SmolVLM "
    "(the global view)"
)
#: Model types fed their base or global view by hand (``get_image_features`` wants the tiles too).
BASE_VIEW = frozenset({"llava_next"})
GLOBAL_VIEW = frozenset({"idefics3", "smolvlm"})
#: The names families go by in messages.
NAMES = {
    "llava": "LLaVA",
    "llava_next": "LLaVA-NeXT",
    "paligemma": "PaliGemma",
    "internvl": "InternVL",
    "idefics3": "Idefics3",
    "smolvlm": "SmolVLM",
    "qwen2_vl": "Qwen2-VL",
    "qwen2_5_vl": "Qwen2.5-VL",
    "qwen3_vl": "Qwen3-VL",
    "qwen3_vl_moe": "Qwen3-VL",
    "siglip2": "SigLIP 2",
    "llava_onevision": "LLaVA-OneVision",
    "mistral3": "Mistral 3",
}
#: ``get_image_features`` arguments that mean flattened patches with their grid, not a photo.
_FLATTENED = ("image_grid_thw", "spatial_shapes")
#: Its arguments hookviz leaves to the model's defaults.
_DEFAULTED = frozenset(
    {"self", "pixel_values", "kwargs", "vision_feature_layer", "vision_feature_select_strategy"}
)


def family(kind: str) -> str:
    """The family's name for messages (the model type where it has none here)."""
    return NAMES.get(kind, kind)


def check(model: Any, kind: str, name: str, where: str) -> None:
    """Refuse, in one line, a model (its class will do: nothing is loaded yet) whose vision tower cannot
    take one square photo.

    Raises:
        UsageError: a tower fed flattened patches with their grid, or needing more than the photo.
    """
    if model is None or kind in BASE_VIEW or kind in GLOBAL_VIEW:
        return
    features = getattr(model, "get_image_features", None)
    if not callable(features):
        why = "has no image embedding (get_image_features) to read its vision tower through"
    else:
        params = inspect.signature(features).parameters
        flat = [p for p in _FLATTENED if p in params]
        needed = [
            p
            for p, v in params.items()
            if p not in _DEFAULTED
            and v.default is v.empty
            and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)
        ]
        if flat:
            why = f"its vision tower takes its patches flattened with their grid ({flat[0]})"
        elif needed:
            why = f"its vision tower needs {', '.join(needed)} beside the photo"
        else:
            return
    raise UsageError(
        f"{name} ({family(kind)}): {why}, not the one square photo hookviz gives; use hookviz vlm --model "
        f"hf:{where} for what it looks at per word, or a family whose tower hookviz reads: {WORKING}"
    )


def preprocess(pre: Preprocess, kind: str, config: Any, processor: Any) -> Preprocess:
    """The one square view the family's tower is fed: LLaVA-NeXT's base view (squashed to the processor's
    shortest edge, then its crop), Idefics3's and SmolVLM's global view (squashed to the tower's side)."""
    if kind in BASE_VIEW:
        side = getattr(processor, "size", None) or {}
        edge = int(_get(side, "shortest_edge") or pre.crop_size)
        crop = _get(getattr(processor, "crop_size", None) or {}, "height") or edge
        return dataclasses.replace(pre, crop_size=int(crop), resize_size=edge, resize="squash", longest=None)
    if kind in GLOBAL_VIEW:
        edge = int(getattr(config.vision_config, "image_size", 0) or pre.crop_size)
        return dataclasses.replace(
            pre, crop_size=edge, resize_size=edge, resize="squash", longest=None, multiple=1
        )
    return pre


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


def image_features(model: nn.Module, kind: str, x: Tensor) -> Tensor:
    """The image embedding ``(B, ...)`` of photos ``x`` ``(B, C, H, W)``: the projected image tokens of a
    vision-language model, the pooled embedding of CLIP or SigLIP."""
    m: Any = model
    if kind in BASE_VIEW:
        return _base_view(m, x)
    if kind in GLOBAL_VIEW:
        h, w = x.shape[-2:]
        p = int(m.config.vision_config.patch_size)
        mask = torch.ones(x.shape[0], h // p, w // p, dtype=torch.bool, device=x.device)
        out = m.vision_model(pixel_values=x, patch_attention_mask=mask, return_dict=True)
        return m.connector(out.last_hidden_state)
    return _stacked(m.get_image_features(pixel_values=x))


def _base_view(model: Any, x: Tensor) -> Tensor:
    """LLaVA-NeXT's base-view tokens as the language model receives them: the tower's selected hidden
    states (less the class token under the ``default`` strategy), projected."""
    layer, strategy = model.config.vision_feature_layer, model.config.vision_feature_select_strategy
    states = model.vision_tower(x, output_hidden_states=True, return_dict=True).hidden_states
    chosen = states[layer] if isinstance(layer, int) else torch.cat([states[i] for i in layer], dim=-1)
    if strategy == "default":
        chosen = chosen[:, 1:]
    return model.multi_modal_projector(chosen)


def _stacked(out: Any) -> Tensor:
    """``get_image_features``' embedding: a tensor, (transformers 5) the output's ``pooler_output``, and a
    list of one tensor per photo (LLaVA's) stacked."""
    pooled = out if isinstance(out, Tensor) else out.pooler_output
    if isinstance(pooled, (list, tuple)):
        return torch.stack(list(pooled))
    return pooled
