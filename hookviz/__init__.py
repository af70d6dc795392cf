"""hookviz: what a vision network sees and where it looks, with PyTorch hooks.

The public API is imported lazily, so ``import hookviz`` (and ``hookviz --help``) stays fast::

    from hookviz import capture, explain, feature_maps, grad_cam, load_model, summarize
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The one source of the version (pyproject reads it from here).
__version__ = "0.6.0"

_EXPORTS = {
    "capture": "hookviz.core.hooks",
    "preserved": "hookviz.core.hooks",
    "resolve_layers": "hookviz.core.layers",
    "trace_shapes": "hookviz.core.hooks",
    "grad_cam": "hookviz.engine.explain",
    "explain": "hookviz.engine.explain",
    "CamResult": "hookviz.engine.explain",
    "Explanation": "hookviz.engine.explain",
    "explain_detections": "hookviz.engine.detection",
    "explain_inputs": "hookviz.run.runner",
    "Run": "hookviz.run.runner",
    "register_sink": "hookviz.io.sinks",
    "widget": "hookviz.explore.widget",
    "explain_videos": "hookviz.run.runner",
    "explain_volumes": "hookviz.run.runner",
    "explain_samples": "hookviz.run.runner",
    "read_volume": "hookviz.io.volume",
    "InputKind": "hookviz.run.kinds",
    "register_input_kind": "hookviz.run.kinds",
    "evaluate": "hookviz.jobs.evaluate",
    "trust": "hookviz.run.trust",
    "TrustReport": "hookviz.evaluation.trust",
    "DetectionExplanation": "hookviz.engine.detection",
    "summarize": "hookviz.summary",
    "ModelSummary": "hookviz.summary",
    "attach_dropblock": "hookviz.training.regularize",
    "attach_dropout2d": "hookviz.training.regularize",
    "drop_block": "hookviz.training.regularize",
    "gradient_flow": "hookviz.training.gradients",
    "clip_grad_values": "hookviz.training.gradients",
    "GlobalNormClipper": "hookviz.training.gradients",
    "Monitor": "hookviz.training.monitor",
    "feature_maps": "hookviz.engine.features",
    "FeatureMap": "hookviz.engine.features",
    "load_model": "hookviz.tasks",
    "LoadedModel": "hookviz.models.loaded",
    "load_rgb": "hookviz.io.images",
    "Preprocess": "hookviz.io.images",
    "HookvizError": "hookviz.errors",
    "Method": "hookviz.methods",
    "MethodOptions": "hookviz.methods",
    "register_method": "hookviz.methods",
    "Normalize": "hookviz.options",
    "Stage": "hookviz.options",
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the names load on first use
    from hookviz.core.hooks import capture, preserved, trace_shapes
    from hookviz.core.layers import resolve_layers
    from hookviz.engine.detection import DetectionExplanation, explain_detections
    from hookviz.engine.explain import CamResult, Explanation, explain, grad_cam
    from hookviz.engine.features import FeatureMap, feature_maps
    from hookviz.errors import HookvizError
    from hookviz.evaluation.trust import TrustReport
    from hookviz.explore.widget import widget
    from hookviz.io.images import Preprocess, load_rgb
    from hookviz.io.sinks import register_sink
    from hookviz.io.volume import read_volume
    from hookviz.jobs.evaluate import evaluate
    from hookviz.methods import Method, MethodOptions, register_method
    from hookviz.models.loaded import LoadedModel
    from hookviz.options import Normalize, Stage
    from hookviz.run.kinds import InputKind, register_input_kind
    from hookviz.run.runner import Run, explain_inputs, explain_samples, explain_videos, explain_volumes
    from hookviz.run.trust import trust
    from hookviz.summary import ModelSummary, summarize
    from hookviz.tasks import load_model
    from hookviz.training.gradients import GlobalNormClipper, clip_grad_values, gradient_flow
    from hookviz.training.monitor import Monitor
    from hookviz.training.regularize import attach_dropblock, attach_dropout2d, drop_block

__all__ = [
    "CamResult",
    "DetectionExplanation",
    "Explanation",
    "FeatureMap",
    "GlobalNormClipper",
    "HookvizError",
    "InputKind",
    "LoadedModel",
    "Method",
    "MethodOptions",
    "ModelSummary",
    "Monitor",
    "Normalize",
    "Preprocess",
    "Run",
    "Stage",
    "TrustReport",
    "attach_dropblock",
    "attach_dropout2d",
    "capture",
    "clip_grad_values",
    "drop_block",
    "evaluate",
    "explain",
    "explain_detections",
    "explain_inputs",
    "explain_samples",
    "explain_videos",
    "explain_volumes",
    "feature_maps",
    "grad_cam",
    "gradient_flow",
    "load_model",
    "load_rgb",
    "preserved",
    "read_volume",
    "register_input_kind",
    "register_method",
    "register_sink",
    "resolve_layers",
    "summarize",
    "trace_shapes",
    "trust",
    "widget",
]
assert sorted(__all__) == sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hookviz' has no attribute {name!r}")
