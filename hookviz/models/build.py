"""Building the model a ``--model`` spec names: one builder per source (torchvision, timm, Hugging Face, the
user's own code or a pickled module), chosen by :func:`~hookviz.models.sources.source_of`."""

from __future__ import annotations

from collections.abc import Callable

from hookviz.models import hf, monai, python, timm, torchvision, ultralytics
from hookviz.models.sources import Built, Options, source_of

#: Each source's builder: ``build(spec, weights, options)``.
SOURCES: dict[str, Callable[[str, str, Options], Built]] = {
    "torchvision": torchvision.build,
    "timm": timm.build,
    "hf": hf.build,
    "ultralytics": ultralytics.build,
    "monai": monai.build,
    "python": python.build,
    "pickle": python.build,
}


def build(spec: str, weights: str, options: Options) -> Built:
    """The model ``spec`` names, with ``weights``: ``DEFAULT``, ``none``, a weights name, or a file.

    Raises:
        ModelNotFoundError, UsageError: the spec or weights name nothing buildable.
        SetupError: a missing optional dependency, a refused pickle, a factory that returns no module.
        WeightsError: weights that cannot be fetched or do not fit.
    """
    return SOURCES[source_of(spec)](spec, weights, options)
