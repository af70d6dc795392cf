"""Building the model a ``--model`` spec names: one builder per source (torchvision, timm, Hugging Face, the
user's own code or a pickled module), chosen by :func:`~hookviz.models.sources.source_of`."""

from __future__ import annotations

from collections.abc import Callable

from hookviz.models import exported, hf, lite, monai, onnx, python, sources, timm, torchvision, ultralytics
from hookviz.models.sources import Built, Options, source_of

#: How a source builds a model: ``build(spec, weights, options)``.
Builder = Callable[[str, str, Options], Built]

#: Each source's builder, by name (a scheme's name is the one ``--model SCHEME:...`` gives).
SOURCES: dict[str, Builder] = {
    "torchvision": torchvision.build,
    "timm": timm.build,
    "hf": hf.build,
    "ultralytics": ultralytics.build,
    "monai": monai.build,
    "lite": lite.build,
    "export": exported.build,
    "onnx": onnx.build,
    "python": python.build,
    "pickle": python.build,
}


def register_source(scheme: str, builder: Builder, *, replace: bool = False) -> Builder:
    """Make ``--model SCHEME:REST`` build with ``builder`` (``replace`` swaps a registered one).

    Examples:
        >>> register_source("onnx", onnx_build)  # --model onnx:model.onnx
    """
    if not scheme.isidentifier() or (scheme in SOURCES and not replace):
        raise ValueError(f"source {scheme!r}: give a new name (an identifier), or replace=True")
    SOURCES[scheme] = builder
    sources.SCHEMES.add(scheme)
    return builder


def build(spec: str, weights: str, options: Options) -> Built:
    """The model ``spec`` names, with ``weights``: ``DEFAULT``, ``none``, a weights name, or a file.

    Raises:
        ModelNotFoundError, UsageError: the spec or weights name nothing buildable.
        SetupError: a missing optional dependency, a refused pickle, a factory that returns no module.
        WeightsError: weights that cannot be fetched or do not fit.
    """
    return SOURCES[source_of(spec)](spec, weights, options)
