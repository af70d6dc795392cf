"""Building the model a ``--model`` spec names: the sources hookviz ships, each one
:class:`~hookviz.models.sources.Source` record, and :func:`build`, which asks the source
:func:`~hookviz.models.sources.source_of` picks."""

from __future__ import annotations

from hookviz.models import exported, hf, lite, monai, onnx, python, timm, torchvision, ultralytics
from hookviz.models.sources import (
    Builder,
    Built,
    Options,
    Source,
    model_files,
    no_files,
    register_source,
    source_of,
    unregister_source,
)

__all__ = ["Builder", "Source", "build", "model_files", "register_source", "unregister_source"]

for _source in (
    Source("torchvision", torchvision.build, scheme=False, fingerprint=no_files),
    Source("pickle", python.pickled, scheme=False, suffixes=python.PICKLES, claims=python.is_pickle),
    Source("python", python.build, scheme=False, claims=python.is_code, fingerprint=None),
    Source("export", exported.build, scheme=False, suffixes=(".pt2",)),
    Source("onnx", onnx.build, scheme=False, suffixes=(".onnx",)),
    Source("lite", lite.build, scheme=False, names=("efficientnet_lite0",), fingerprint=no_files),
    Source("timm", timm.build),
    Source("hf", hf.build),
    Source("ultralytics", ultralytics.build),
    Source("monai", monai.build),
):
    register_source(_source)


def build(spec: str, weights: str, options: Options) -> Built:
    """The model ``spec`` names, with ``weights``: ``DEFAULT``, ``none``, a weights name, or a file.

    Raises:
        ModelNotFoundError, UsageError: the spec or weights name nothing buildable.
        SetupError: a missing optional dependency, a refused pickle, a factory that returns no module.
        WeightsError: weights that cannot be fetched or do not fit.
    """
    return source_of(spec).build(spec, weights, options)
