"""hookviz: look inside convolutional networks with PyTorch hooks.

The public API is imported lazily, so ``import hookviz`` (and ``hookviz --help``) stays fast::

    from hookviz import capture, explain, feature_maps, grad_cam, load_model, summarize
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "capture": "hookviz.hooks",
    "preserved": "hookviz.hooks",
    "resolve_layers": "hookviz.hooks",
    "trace_shapes": "hookviz.hooks",
    "grad_cam": "hookviz.attribution",
    "explain": "hookviz.attribution",
    "CamResult": "hookviz.attribution",
    "Explanation": "hookviz.attribution",
    "summarize": "hookviz.summary",
    "ModelSummary": "hookviz.summary",
    "attach_dropblock": "hookviz.regularize",
    "attach_dropout2d": "hookviz.regularize",
    "drop_block": "hookviz.regularize",
    "gradient_flow": "hookviz.gradients",
    "clip_grad_values": "hookviz.gradients",
    "GlobalNormClipper": "hookviz.gradients",
    "feature_maps": "hookviz.features",
    "FeatureMap": "hookviz.features",
    "load_model": "hookviz.models",
    "LoadedModel": "hookviz.models",
    "load_rgb": "hookviz.images",
    "Preprocess": "hookviz.images",
    "HookvizError": "hookviz.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hookviz' has no attribute {name!r}")
