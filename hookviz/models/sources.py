"""Model sources: what ``--model`` can name, each turned into one :class:`Built` model.

=====================================  =====================================================
``resnet18``                           a torchvision classifier (:mod:`.torchvision`)
``timm:convnext_tiny``                 a timm model (:mod:`.timm`, needs ``hookviz[timm]``)
``hf:DIR_OR_ID``                       a Hugging Face classifier, detector or segmenter (:mod:`.hf`)
``ultralytics:FILE.pt``                an ultralytics YOLO (:mod:`.ultralytics`, ``hookviz[ultralytics]``)
``monai:DenseNet121?spatial_dims=3``   a MONAI network (:mod:`.monai`, ``hookviz[monai]``; 3-D: volumes)
``net.py:make_net``, ``pkg.mod:Net``   a function or class in the user's code (:mod:`.python`)
``model.pt``                           a whole pickled module, with ``trust_pickle`` only
``efficientnet_lite0``                 the trained ImageNet classifier of ``hookviz[demo]`` (:mod:`.lite`)
=====================================  =====================================================

Each source is one :class:`Source` record: its scheme (or the suffixes and names it claims), its
``build(spec, weights, options) -> Built`` function, and the files that identify its models for the warm
server. A new family is one :func:`register_source` call (``register_source(Source("onnx", build))`` for
``--model onnx:FILE``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import torch
from torch import nn

from hookviz.errors import SetupError
from hookviz.io.images import Preprocess
from hookviz.io.video import VideoPreprocess

WEIGHTS_NONE = "none"
WEIGHTS_DEFAULT = "DEFAULT"


@dataclass(frozen=True)
class Options:
    """How to build: the options every source may use."""

    weights_key: str | None = None
    trust_pickle: bool = False
    progress: bool = False


@dataclass
class Built:
    """A model as a source made it, with the preprocessing and class names it comes with."""

    model: nn.Module
    name: str  # short, for captions and file names: "resnet18", "timm:convnext_tiny", "hf:vit-small"
    weights: str  # what the captions say: "DEFAULT (IMAGENET1K_V1)", "none (random init)", a path
    pretrained: bool
    weights_id: str  # what identifies the weights' values (a name, or a content hash)
    categories: tuple[str, ...] = ()
    #: How photos become inputs for it (ImageNet's 224 crop unless the source knows better).
    preprocess: Preprocess = field(default_factory=Preprocess)
    #: The task the source knows its model is of (a registered task's name, :func:`hookviz.tasks.task_for`).
    task: str = "classification"
    #: How videos become clips, for a video model (its weights' Kinetics transform).
    video: VideoPreprocess | None = None
    #: Why ``--input-size`` must be given (an ONNX graph of symbolic height and width); None: it need not.
    input_size_note: str | None = None
    #: A note that the preprocessing was guessed (a folder without its image processor), said unless the
    #: user gives ``--mean`` and ``--std``; None: nothing was guessed.
    normalisation_note: str | None = None


def missing_extra(package: str, extra: str) -> SetupError:
    """The one-line error for an optional dependency that is not installed."""
    return SetupError(f"this model needs {package}, which is not installed: pip install 'hookviz[{extra}]'")


def seeded(make: Callable[[], nn.Module]) -> nn.Module:
    """Build a model with random weights from seed 0, so two runs give the same maps."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return make()


#: How a source builds a model: ``build(spec, weights, options)``.
Builder = Callable[[str, str, Options], Built]


def query(spec: str) -> tuple[str, dict[str, Any]]:
    """``scheme:NAME?key=value&...`` → the name and its arguments (values as Python literals where they
    parse: ``img_size=384``, ``spatial_dims=3``, ``global_pool='avg'``; else the text as given)."""
    name, _, rest = spec.split(":", 1)[1].partition("?")
    kwargs: dict[str, Any] = {}
    for key, value in parse_qsl(rest, keep_blank_values=True):
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return name, kwargs


def named_files(spec: str) -> tuple[Path, ...]:
    """The file or folder a spec names (``hf:DIR``'s folder, ``ultralytics:best.pt``, ``model.onnx``; the
    query after ``?`` left out): the warm server reads their content into its key."""
    scheme, sep, rest = spec.partition(":")
    named = rest if sep and scheme.isidentifier() else spec
    return (Path(named.partition("?")[0]).expanduser(),)


def no_files(spec: str) -> tuple[Path, ...]:
    """A source whose models a name identifies alone (torchvision's, the packaged classifier)."""
    return ()


@dataclass(frozen=True)
class Source:
    """One model source, whole: what ``--model`` names it by, how it builds, and what identifies its models
    for ``hookviz serve`` (which keeps a loaded model warm until a file it was built from changes)."""

    #: Its name, and its scheme when ``scheme``: ``--model NAME:REST`` (``timm:convnext_tiny``).
    name: str
    build: Builder
    #: Whether ``NAME:REST`` names it (False: it claims specs by ``suffixes``, ``names`` or ``claims`` only).
    scheme: bool = True
    #: Files it builds, by suffix (``.onnx``): ``--model model.onnx``.
    suffixes: tuple[str, ...] = ()
    #: Models named without a scheme that it builds (``efficientnet_lite0``).
    names: tuple[str, ...] = ()
    #: Any other spec it takes (the user's ``net.py:make_net``), asked after the schemes, names and suffixes.
    claims: Callable[[str], bool] | None = None
    #: The files whose content identifies a model it built (the warm server's fingerprint, with the weights
    #: and labels); None: never kept warm (the user's own code, loaded afresh by every call).
    fingerprint: Callable[[str], tuple[Path, ...]] | None = named_files

    def files(self, spec: str) -> tuple[Path, ...] | None:
        return self.fingerprint(spec) if self.fingerprint is not None else None


#: The registered sources, by name, oldest first (:func:`register_source`).
_SOURCES: dict[str, Source] = {}
#: The source of a spec that no registered one claims.
DEFAULT = "torchvision"


def register_source(
    source: Source | str, build: Builder | None = None, *, replace: bool = False, **fields: Any
) -> Source:
    """Make ``--model`` build what ``source`` claims (its scheme, suffixes, names); ``replace`` swaps one
    registered under the same name. The newest registered is asked first.

    Examples:
        >>> register_source(Source("onnx", onnx_build))  # --model onnx:model.onnx
        >>> register_source("onnx", onnx_build)  # the same: a scheme and its builder
        >>> register_source(Source("tflite", tflite_build, scheme=False, suffixes=(".tflite",)))
    """
    if isinstance(source, str):
        if build is None:
            raise ValueError(f"source {source!r}: give its builder, or a Source")
        source = Source(source, build, **fields)
    if not source.name.isidentifier() or (source.name in _SOURCES and not replace):
        raise ValueError(f"source {source.name!r}: give a new name (an identifier), or replace=True")
    _SOURCES.pop(source.name, None)
    _SOURCES[source.name] = source
    return source


def unregister_source(name: str) -> None:
    if name == DEFAULT:
        raise ValueError(f"{DEFAULT} builds every model no other source claims; it stays")
    _SOURCES.pop(name, None)


def source_named(name: str) -> Source:
    """The registered source ``name``."""
    return _SOURCES[name]


def source_of(spec: str) -> Source:
    """The source a ``--model`` spec names: a registered scheme's (``timm:NAME``), else the one naming it
    (``efficientnet_lite0``), else the one claiming its suffix (``model.onnx``), else the first whose
    ``claims`` takes it (the user's code, a pickled file), else torchvision's (a name)."""
    newest = list(reversed(_SOURCES.values()))
    scheme, sep, _ = spec.partition(":")
    suffix = Path(spec).suffix.lower()
    found = (
        next((s for s in newest if sep and s.scheme and s.name == scheme), None)
        or next((s for s in newest if spec in s.names), None)
        or next((s for s in newest if suffix and suffix in s.suffixes), None)
        or next((s for s in newest if s.claims is not None and s.claims(spec)), None)
    )
    return found if found is not None else _SOURCES[DEFAULT]


def model_files(spec: str) -> tuple[Path, ...] | None:
    """What the warm server reads to tell whether the model ``spec`` names changed (its source's
    fingerprint); None: the model is loaded afresh by every call."""
    return source_of(spec).files(spec)
