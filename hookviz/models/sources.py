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

A new family is one ``build(spec, weights, options) -> Built`` function and one
:func:`hookviz.models.build.register_source` call naming its scheme (``onnx`` for ``onnx:FILE``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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


def missing_extra(package: str, extra: str) -> SetupError:
    """The one-line error for an optional dependency that is not installed."""
    return SetupError(f"this model needs {package}, which is not installed: pip install 'hookviz[{extra}]'")


def seeded(make: Callable[[], nn.Module]) -> nn.Module:
    """Build a model with random weights from seed 0, so two runs give the same maps."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return make()


_MODULE_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


#: The sources named by a scheme before a colon (``timm:convnext_tiny``); :func:`hookviz.models.build.
#: register_source` adds one.
SCHEMES: set[str] = {"timm", "hf", "ultralytics", "monai"}
#: Models named without a scheme that a source other than torchvision builds (``efficientnet_lite0``: the
#: trained classifier hookviz[demo] ships).
NAMED: dict[str, str] = {"efficientnet_lite0": "lite"}


def source_of(spec: str) -> str:
    """Which source a ``--model`` spec names: a registered scheme's (``timm:NAME``), else python (a function
    in the user's code), pickle (a file) or torchvision (a name)."""
    scheme = spec.partition(":")[0]
    if ":" in spec and scheme in SCHEMES:
        return scheme
    if spec in NAMED:
        return NAMED[spec]
    if Path(spec).suffix.lower() == ".pt2":
        return "export"
    if Path(spec).suffix.lower() == ".onnx":
        return "onnx"
    head, sep, tail = spec.rpartition(":")
    if sep and (head.endswith(".py") or _MODULE_PATH.match(spec)) and tail.isidentifier():
        return "python"
    if Path(spec).suffix.lower() in (".pt", ".pth", ".pkl", ".bin", ".ckpt") or Path(spec).is_file():
        return "pickle"
    return "torchvision"
