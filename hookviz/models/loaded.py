"""A loaded model: the network with its weights, device, preprocessing, class names and task, and what is
asked of it (its traced shapes, how many classes it scores)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from hookviz.core.hooks import ModuleCall, logits_of, preserved, probe_input, traced
from hookviz.core.layers import default_cam_layer, map_layers
from hookviz.errors import DeviceError, HookvizError, SetupError, UsageError
from hookviz.io.images import Preprocess
from hookviz.io.samples import SeveralPreprocess
from hookviz.io.video import VideoPreprocess
from hookviz.io.volume import VolumePreprocess
from hookviz.models.labels import class_label, read_labels
from hookviz.models.sources import Built
from hookviz.models.torchvision import imagenet_categories


class ModelTask(Protocol):
    """What loading a model asks of its task (:class:`hookviz.tasks.Task` is the whole of one)."""

    @property
    def name(self) -> str: ...

    def base_preprocess(self, built: Built) -> Preprocess:
        """How photos become inputs when the user sets nothing (the source's, or the task's own)."""
        ...

    def clips(self, built: Built) -> VideoPreprocess | None:
        """How videos become clips, for a model that takes clips (None: it takes photos)."""
        ...

    def volumes(self, preprocess: Preprocess, size: tuple[int, int, int] | None) -> VolumePreprocess | None:
        """How volumes become inputs, for a model that takes volumes (None: it takes photos or clips)."""
        ...

    def head_classes(self, model: nn.Module) -> int | None:
        """How many classes the head scores, read from its modules (None: unknown), to check ``--labels``."""
        ...

    def known_classes(self, model: nn.Module) -> int | None:
        """The class count when a forward pass cannot tell it (a detector's), else None."""
        ...

    def set_input_size(self, model: nn.Module, size: int, name: str) -> None:
        """``--input-size`` for a model that resizes its inputs itself (a detector's transform)."""
        ...

    def input_shape(self, loaded: LoadedModel) -> tuple[int, ...]:
        """One input's shape, without the batch axis (what tracing the model feeds it)."""
        ...


class ModelInputs(Protocol):
    """What a model takes, as its input kind prepared it when the model was loaded (photos:
    :data:`PHOTOS`; a video's clips: :class:`~hookviz.io.video.VideoPreprocess`; volumes:
    :class:`~hookviz.io.volume.VolumePreprocess`; several inputs:
    :class:`~hookviz.io.samples.SeveralPreprocess`; a kind of your own: its own object). The layers below the
    input kinds ask it, never which kind it is."""

    #: The name of the input kind that takes them (``photo``, ``video``, ``volume``, ``sample``).
    kind: ClassVar[str]
    #: How ``--input-size`` gives the size: ``N`` (a square side) or ``D,H,W``.
    sides: ClassVar[str]

    def shape(self, preprocess: Preprocess) -> tuple[int, ...]:
        """One input's shape, without the batch axis (what tracing the model feeds it)."""
        ...

    def key(self) -> dict[str, Any]:
        """What it adds to the settings that key every output (photos: nothing)."""
        ...


@dataclass(frozen=True)
class PhotoInputs:
    """Photos: one image of the model's bands at its input size."""

    kind: ClassVar[str] = "photo"
    sides: ClassVar[str] = "N"

    def shape(self, preprocess: Preprocess) -> tuple[int, ...]:
        return (preprocess.channels, preprocess.crop_size, preprocess.crop_size)

    def key(self) -> dict[str, Any]:
        return {}


PHOTOS = PhotoInputs()


def resolve_device(spec: str = "auto") -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        DeviceError: CUDA was asked for and is not there, or the spec is not a device.
    """
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise DeviceError(f"--device {spec!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {spec}: CUDA is not available on this machine; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(
                f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here; use cuda:0..."
            )
    elif device.type != "cpu":
        raise DeviceError(f"--device {spec!r} is not supported; use auto, cpu, cuda or cuda:N")
    return device


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to explain, with what a report needs to say about it."""

    model: nn.Module
    name: str
    weights: str  # "DEFAULT (IMAGENET1K_V1)", "none (random init)" or a file path
    pretrained: bool
    categories: tuple[str, ...]
    preprocess: Preprocess
    device: torch.device
    #: What identifies the weights' values: a torchvision weights name, ``sha256:<hex>`` of a file, or
    #: ``none`` (seeded random init); with the class names' source it goes into every output's key.
    weights_id: str = ""
    labels_id: str = ""
    #: What the output is and which job explains it (:mod:`hookviz.tasks`: ``classification``,
    #: ``segmentation``, ``detection``, ``video``, or one registered by the user).
    task: ModelTask | None = None
    #: What the model takes, as its input kind prepared it (photos, a video's clips, volumes, samples of
    #: several inputs): how one becomes the model's input, its traced shape, what it adds to the key.
    inputs: ModelInputs = PHOTOS
    #: Lines for the user about how the model was set up (prompts cut to the tokenizer's limit, ...).
    notes: tuple[str, ...] = ()
    #: Whether the input size is the user's (``--input-size``), not the source's or the task's default.
    sized: bool = False

    @property
    def video(self) -> VideoPreprocess | None:
        """How a video becomes clips, for a model that takes clips (None for the others)."""
        return self.inputs if isinstance(self.inputs, VideoPreprocess) else None

    @property
    def volume(self) -> VolumePreprocess | None:
        """How a volume becomes an input, for a model that takes volumes (None for the others)."""
        return self.inputs if isinstance(self.inputs, VolumePreprocess) else None

    @property
    def several(self) -> SeveralPreprocess | None:
        """How a sample's inputs become the model's input, for a model of several (None for the others)."""
        return self.inputs if isinstance(self.inputs, SeveralPreprocess) else None

    @property
    def task_name(self) -> str:
        return self.task.name if self.task is not None else "classification"

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One input's shape, as its task says: ``(3, H, W)`` for a photo, ``(3, T, H, W)`` for a clip."""
        return self.task.input_shape(self) if self.task is not None else photo_shape(self)

    def class_name(self, index: int) -> str:
        return self.categories[index] if 0 <= index < len(self.categories) else f"class {index}"

    def describe(self, index: int) -> str:
        """``tabby (281)`` with a class name, ``class 281`` without one (never ``class 281 (281)``)."""
        return class_label(self.categories[index] if 0 <= index < len(self.categories) else None, index)


def photo_shape(loaded: LoadedModel) -> tuple[int, ...]:
    """One input's shape as the model's inputs say: ``(C, H, W)`` of a photo, ``(3, T, H, W)`` of a clip."""
    return loaded.inputs.shape(loaded.preprocess)


def prepare(
    built: Built,
    task: ModelTask,
    *,
    device: torch.device | str = "cpu",
    input_size: int | Sequence[int] | None = None,
    resize: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    labels: str | Path | Sequence[str] | None = None,
) -> LoadedModel:
    """``built`` as a :class:`LoadedModel` of ``task``: in eval mode on ``device``, with the task's
    preprocessing changed by the user's options and the class names of ``labels`` (see
    :func:`hookviz.tasks.load_model`, which finds the task).

    Raises:
        UsageError: ``labels`` without one name per class of the head; a bad ``--mean``/``--std``/size.
    """
    categories, labels_id = built.categories, ""
    if labels is not None:
        categories = _class_names(labels, task.head_classes(built.model), built.name)
        # A JSON list: a name holding a newline is not two names.
        labels_id = hashlib.sha256(json.dumps(list(categories)).encode()).hexdigest()[:16]
    side, size3 = _sizes(input_size)
    if built.input_size_note is not None and side is None and size3 is None:
        raise UsageError(built.input_size_note)
    preprocess, video = _preprocess(built, task, side, resize, mean, std)
    volume = task.volumes(preprocess, size3)
    if size3 is not None and volume is None:
        raise UsageError(
            f"--input-size {','.join(map(str, size3))}: three sides are for volume models, and "
            f"{built.name} is not one; give one side"
        )
    model = built.model.to(torch.device(device)).eval()
    return LoadedModel(
        model,
        built.name,
        built.weights,
        built.pretrained,
        categories,
        preprocess,
        torch.device(device),
        built.weights_id,
        labels_id,
        task,
        video or volume or PHOTOS,
        notes=(built.normalisation_note,)
        if built.normalisation_note and (mean is None or std is None)
        else (),
        sized=side is not None or size3 is not None,
    )


def _sizes(input_size: int | Sequence[int] | None) -> tuple[int | None, tuple[int, int, int] | None]:
    """``--input-size`` as one side (a photo's square) or three (a volume's D,H,W)."""
    if input_size is None or isinstance(input_size, int):
        return input_size, None
    sides = tuple(int(v) for v in input_size)
    if len(sides) == 1:
        return sides[0], None
    if len(sides) != 3 or min(sides) < 1:
        raise UsageError(f"--input-size {','.join(map(str, sides))}: give one side, or D,H,W for a volume")
    return None, (sides[0], sides[1], sides[2])


def _class_names(labels: str | Path | Sequence[str], heads: int | None, model: str) -> tuple[str, ...]:
    """The names ``labels`` gives (a file, ``imagenet``, or a sequence), one per output of the head."""
    # The CLI hands a Path: ``--labels imagenet`` is the word unless a file of that name exists.
    if isinstance(labels, (str, Path)) and str(labels).lower() == "imagenet" and not Path(labels).exists():
        names = imagenet_categories()
    elif isinstance(labels, (str, Path)):
        names = read_labels(labels)
    else:
        names = tuple(labels)
    if heads is not None and heads != len(names):
        where = f"--labels {str(labels)!r}" if isinstance(labels, (str, Path)) else "labels"
        raise UsageError(
            f"{where} has {len(names)} class names but the head of {model} has {heads} "
            "outputs; give one name per output, in index order"
        )
    return names


def _preprocess(
    built: Built,
    task: ModelTask,
    input_size: int | None,
    resize: str | None,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
) -> tuple[Preprocess, VideoPreprocess | None]:
    """The task's preprocessing (and clip sampling) changed by ``--input-size``, ``--resize``, ``--mean`` and
    ``--std``."""
    base = task.base_preprocess(built)
    video = task.clips(built)
    if video is not None:  # the image preprocessing names the clip's frame size and normalisation
        base = Preprocess(crop_size=video.crop, resize_size=max(video.resize), mean=video.mean, std=video.std)
    crop, rsz = base.crop_size, base.resize_size
    if resize == "squash" and base.resize != "squash":
        rsz = crop  # --resize squash: the whole photo, squashed to the input size, no crop
    if input_size is not None:
        rsz, crop = round(input_size * rsz / crop), input_size
        task.set_input_size(built.model, input_size, built.name)
        if video is not None:
            video = replace(
                video, crop=input_size, resize=tuple(round(v * input_size / video.crop) for v in video.resize)
            )
    if video is not None:  # --resize squash: whole frames at the input size; --mean/--std
        video = replace(
            video,
            resize=(video.crop, video.crop) if resize == "squash" else video.resize,
            mean=_triple(mean, "--mean") if mean is not None else video.mean,
            std=_triple(std, "--std") if std is not None else video.std,
        )
    bands = input_channels(built.model) if video is None else 3
    own_mean, own_std = (base.mean, base.std) if bands == 3 else ((0.0,) * bands, (1.0,) * bands)
    preprocess = Preprocess(
        crop_size=crop,
        resize_size=rsz,
        mean=_values(mean, "--mean", bands) if mean is not None else own_mean,
        std=_values(std, "--std", bands) if std is not None else own_std,
        resize=resize or base.resize,
        interpolation=base.interpolation,
        crop_round=base.crop_round,
        channels=bands,
    )
    return preprocess, video


def input_channels(model: nn.Module) -> int:
    """The bands the model's first convolution takes (3 without one: a photo)."""
    first = next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d))), None)
    return int(first.in_channels) if first is not None and first.groups == 1 else 3


def _values(values: Sequence[float], option: str, n: int) -> tuple[float, ...]:
    if len(values) != n:
        names = "R,G,B" if n == 3 else f"one per band of the model's {n}"
        raise UsageError(f"{option} takes {n} value(s) ({names}), got {len(values)}")
    return tuple(float(v) for v in values)


def _triple(values: Sequence[float], option: str) -> tuple[float, float, float]:
    if len(values) != 3:
        raise UsageError(f"{option} takes three values (R,G,B), got {len(values)}")
    return (float(values[0]), float(values[1]), float(values[2]))


def probe(loaded: LoadedModel) -> list[ModuleCall]:
    """Every module's type and output shape for one input of the model's size.

    Raises:
        SetupError: the model cannot take an input of that size (a ViT built for 224 given 64): one line.
    """
    shape = loaded.input_shape
    try:
        return traced(loaded.model, shape, loaded.device)
    except HookvizError:
        raise
    except Exception as exc:  # a model's own size checks raise AssertionError, RuntimeError, ValueError
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        size = "x".join(map(str, shape))
        if loaded.sized:
            fix = "leave --input-size out, or build the model for that size (timm:NAME?img_size=N)"
        else:  # the size is the default one: the model may have been built for another
            sides = loaded.inputs.sides
            fix = f"if it was built for another input size, give it with --input-size {sides}"
        raise SetupError(f"{loaded.name} cannot take a {size} input ({first}); {fix}") from None


def num_classes(loaded: LoadedModel) -> int:
    """How many classes the model's head scores (from the class names, else one forward pass of zeros)."""
    if loaded.categories:
        return len(loaded.categories)
    known = loaded.task.known_classes(loaded.model) if loaded.task is not None else None
    if known is not None:
        return known
    with torch.no_grad(), preserved(loaded.model):
        loaded.model.eval()
        logits = logits_of(loaded.model(probe_input(loaded.model, (1, *loaded.input_shape))))
    return int(logits.shape[1])


def feature_layers(loaded: LoadedModel, specs: Sequence[str] | None) -> tuple[list[str], list[ModuleCall]]:
    """The layers ``specs`` name (globs as ``featuremaps`` takes them), else the default CAM layer; and the
    traced calls they were chosen from.

    Raises:
        LayerError: a name without a feature map, or a glob matching none.
    """
    calls = probe(loaded)
    names = map_layers(loaded.model, specs, calls, loaded.name) if specs else []
    return names or [default_cam_layer(loaded.model, calls)], calls
