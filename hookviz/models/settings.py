"""What about a loaded model changes an output: the part of every output's settings key the model gives."""

from __future__ import annotations

from typing import Any

from hookviz.models.heads import head_settings
from hookviz.models.loaded import LoadedModel


def model_settings(loaded: LoadedModel) -> dict[str, Any]:
    """What about the model changes an output's pixels: architecture, weights' values, class names, input."""
    p = loaded.preprocess
    return {
        "model": loaded.name,
        "weights": loaded.weights_id or loaded.weights,
        "labels": loaded.labels_id or None,
        "input": {
            "crop_size": p.crop_size,
            "resize_size": p.resize_size,
            "resize": str(p.resize),
            "interpolation": p.interpolation,
            # PIL's antialiased resize of the whole photo, then the crop (the model's own transform)
            "resampler": "PIL",
            "crop_round": p.crop_round,
            "mean": [round(float(v), 6) for v in p.mean],
            "std": [round(float(v), 6) for v in p.std],
            # Set for some models only: the keys of the others unchanged.
            **({"alpha": p.alpha} if p.alpha != "white" else {}),
            **({"longest": p.longest} if p.longest is not None else {}),
            **({"multiple": [p.multiple, p.multiple_rounding]} if p.multiple > 1 else {}),
        },
        **loaded.inputs.key(),
        **head_settings(loaded.model),
    }
