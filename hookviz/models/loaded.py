"""Models, weights, devices, class names and the layer a CAM should use by default."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from hookviz.core.hooks import ModuleCall, logits_of, probe_input, traced
from hookviz.errors import (
    DeviceError,
    TargetError,
    UsageError,
    close_matches,
)
from hookviz.io.images import Preprocess
from hookviz.io.video import VideoPreprocess

WEIGHTS_NONE = "none"
WEIGHTS_DEFAULT = "DEFAULT"


def list_models(task: str | None = "classification") -> list[str]:
    """Names of torchvision's models for ``task`` (``classification``, ``segmentation``, ``detection``;
    ``None`` for all)."""
    from hookviz.models.torchvision import list_models as names

    return names(task)


def task_of(model: nn.Module) -> str:
    """``detection`` for torchvision's detector classes (Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS, SSD
    and the user's models built from them), ``segmentation`` for FCN, DeepLabV3 and LR-ASPP, else
    ``video`` for a model whose first layer is a ``Conv3d`` (it takes clips), else ``classification`` (a
    model returning ``(B, C, H, W)`` scores is explained as segmentation anyway)."""
    from torchvision.models import detection, segmentation

    detectors = (
        detection.generalized_rcnn.GeneralizedRCNN,
        detection.retinanet.RetinaNet,
        detection.fcos.FCOS,
        detection.ssd.SSD,
    )
    if isinstance(model, detectors):
        return "detection"
    if isinstance(model, (segmentation.FCN, segmentation.DeepLabV3, segmentation.LRASPP)):
        return "segmentation"
    first = next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Linear))), None)
    if isinstance(first, nn.Conv3d):  # a clip classifier: (B, 3, T, H, W) in
        return "video"
    return "classification"


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


def class_label(name: str | None, index: object) -> str:
    """How captions and lines name a class: ``tabby (281)``, or ``class 281`` when it has no name (a record's
    ``name`` is then ``class 281`` already)."""
    return f"class {index}" if name in (None, f"class {index}") else f"{name} ({index})"


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
    #: ``classification``, ``segmentation``, ``detection`` or ``video``: what the output is and which job
    #: explains it.
    task: str = "classification"
    #: How a video becomes clips for a ``video`` model (None for the others).
    video: VideoPreprocess | None = None
    #: Lines for the user about how the model was set up (prompts cut to the tokenizer's limit, ...).
    notes: tuple[str, ...] = ()

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One input's shape: ``(3, H, W)``, or ``(3, T, H, W)`` for a video model."""
        s = self.preprocess.crop_size
        return (3, self.video.clip_len, s, s) if self.video is not None else (3, s, s)

    def class_name(self, index: int) -> str:
        return self.categories[index] if 0 <= index < len(self.categories) else f"class {index}"

    def describe(self, index: int) -> str:
        """``tabby (281)`` with a class name, ``class 281`` without one (never ``class 281 (281)``)."""
        return class_label(self.categories[index] if 0 <= index < len(self.categories) else None, index)


def _imagenet_categories() -> tuple[str, ...]:
    from hookviz.models.torchvision import _imagenet_categories as names

    return names()


def load_model(
    name: str = "resnet18",
    weights: str = WEIGHTS_DEFAULT,
    *,
    device: torch.device | str = "cpu",
    input_size: int | None = None,
    resize: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    progress: bool = False,
    labels: str | Path | Sequence[str] | None = None,
    weights_key: str | None = None,
    trust_pickle: bool = False,
) -> LoadedModel:
    """Build a model with its weights, in eval mode, on ``device``, with its preprocessing and class names.

    Args:
        name: a torchvision classifier (``resnet18``), ``timm:NAME``, ``hf:DIR_OR_ID``,
            ``file.py:FACTORY`` / ``package.module:FACTORY`` (a function or class returning an
            ``nn.Module``), or the path of a whole pickled module (with ``trust_pickle``).
        weights: ``DEFAULT`` (the source's pretrained weights; torchvision's are downloaded into the
            torch hub cache, which honours ``TORCH_HOME``), a torchvision weights name such as
            ``IMAGENET1K_V2``, ``none`` (seeded random init), or a state_dict / checkpoint /
            ``.safetensors`` file.
        input_size: square input side; defaults to the source's (224 for most).
        resize: ``crop`` (centre crop, torchvision's eval transform) or ``squash`` (whole image, aspect
            not kept); defaults to the source's.
        mean, std: input normalisation; default the source's (ImageNet's for custom models).
        labels: class names for the head (a file, see :func:`read_labels`, a sequence, or ``imagenet``:
            the ImageNet-1k names, for any 1000-way head); they replace the source's names in captions,
            records and ``--target NAME``.
        weights_key: the key of the state_dict inside a checkpoint dict (``ema``, ``model_ema``...).
        trust_pickle: allow unpickling a whole model file (it runs code from the file).

    Raises:
        ModelNotFoundError: unknown model name (close matches suggested).
        UsageError: ``labels`` does not have one name per class of the head; bad weights name.
        SetupError: a missing optional dependency (timm, transformers), a refused pickle, a factory
            that returns no module.
        WeightsError: pretrained weights cannot be downloaded, or the file cannot be loaded safely.
    """
    from hookviz.models.sources import Options, build
    from hookviz.models.weights import classifier_out

    built = build(name, weights, Options(weights_key, trust_pickle, progress))
    task = built.task if built.task != "classification" else task_of(built.model)
    categories, labels_id = built.categories, ""
    if labels is not None:
        from hookviz.models.torchvision import dense_classes

        # The CLI hands a Path: ``--labels imagenet`` is the word unless a file of that name exists.
        if (
            isinstance(labels, (str, Path))
            and str(labels).lower() == "imagenet"
            and not Path(labels).exists()
        ):
            class_names = _imagenet_categories()
        elif isinstance(labels, (str, Path)):
            class_names = read_labels(labels)
        else:
            class_names = tuple(labels)
        heads = (
            classifier_out(built.model) if task in ("classification", "video") else dense_classes(built.model)
        )
        if heads is not None and heads != len(class_names):
            where = f"--labels {str(labels)!r}" if isinstance(labels, (str, Path)) else "labels"
            raise UsageError(
                f"{where} has {len(class_names)} class names but the head of {built.name} has {heads} "
                "outputs; give one name per output, in index order"
            )
        categories = class_names
        # A JSON list: a name holding a newline is not two names.
        labels_id = hashlib.sha256(json.dumps(list(class_names)).encode()).hexdigest()[:16]
    base = built.preprocess
    video = built.video or (VideoPreprocess() if task == "video" else None)
    if video is not None:  # the image preprocessing names the clip's frame size and normalisation
        base = Preprocess(crop_size=video.crop, resize_size=max(video.resize), mean=video.mean, std=video.std)
    elif task != built.task:  # a detector or segmenter from the user's code: its task's transform
        from hookviz.models.torchvision import task_preprocess

        base = task_preprocess(task)
    crop, rsz = base.crop_size, base.resize_size
    if resize == "squash" and base.resize != "squash":
        rsz = crop  # --resize squash: the whole photo, squashed to the input size, no crop
    if input_size is not None:
        rsz, crop = round(input_size * rsz / crop), input_size
        if task == "detection":
            _detector_size(built.model, input_size, built.name)
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
    preprocess = Preprocess(
        crop_size=crop,
        resize_size=rsz,
        mean=_triple(mean, "--mean") if mean is not None else base.mean,
        std=_triple(std, "--std") if std is not None else base.std,
        resize=resize or base.resize,
        interpolation=base.interpolation,
        crop_round=base.crop_round,
    )
    device = torch.device(device)
    model = built.model.to(device).eval()
    return LoadedModel(
        model,
        built.name,
        built.weights,
        built.pretrained,
        categories,
        preprocess,
        device,
        built.weights_id,
        labels_id,
        task,
        video,
    )


def _detector_size(model: nn.Module, size: int, name: str) -> None:
    """``--input-size`` of a detector: the shorter side its transform resizes photos to (the longer one
    capped at the same 1333/800 ratio as torchvision's default)."""
    transform = getattr(model, "transform", None)
    if transform is None or not hasattr(transform, "min_size"):
        raise UsageError(f"--input-size: {name} has no resizing transform to set; leave it out")
    if getattr(transform, "fixed_size", None) is not None:
        h, w = transform.fixed_size
        raise UsageError(f"--input-size: {name} resizes every photo to {w}x{h}; leave it out")
    transform.min_size = (size,)
    transform.max_size = round(size * 1333 / 800)


def _triple(values: Sequence[float], option: str) -> tuple[float, float, float]:
    if len(values) != 3:
        raise UsageError(f"{option} takes three values (R,G,B), got {len(values)}")
    return (float(values[0]), float(values[1]), float(values[2]))


def probe(loaded: LoadedModel) -> list[ModuleCall]:
    """Every module's type and output shape for one input of the model's size.

    Raises:
        SetupError: the model cannot take an input of that size (a ViT built for 224 given 64): one line.
    """
    from hookviz.errors import HookvizError, SetupError

    shape = loaded.input_shape
    try:
        return traced(loaded.model, shape, loaded.device)
    except HookvizError:
        raise
    except Exception as exc:  # a model's own size checks raise AssertionError, RuntimeError, ValueError
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        size = "x".join(map(str, shape))
        raise SetupError(
            f"{loaded.name} cannot take a {size} input ({first}); leave --input-size out, or build the "
            "model for that size (timm:NAME?img_size=N)"
        ) from None


def num_classes(loaded: LoadedModel) -> int:
    """How many classes the model's head scores (from the class names, else one forward pass of zeros)."""
    if loaded.categories:
        return len(loaded.categories)
    if loaded.task == "detection":
        from hookviz.models.torchvision import dense_classes

        return dense_classes(loaded.model) or 1
    from hookviz.core.hooks import preserved

    with torch.no_grad(), preserved(loaded.model):
        loaded.model.eval()
        logits = logits_of(loaded.model(probe_input(loaded.model, (1, *loaded.input_shape))))
    return int(logits.shape[1])


#: A class index as a user types it: ASCII digits (``"²".isdigit()`` is true, and ``int("²")`` fails).
_DIGITS = re.compile(r"^[0-9]+$")
_INDEX = re.compile(r"^(?:class\s+)?(-?[0-9]+)$", re.IGNORECASE)


def find_class(text: str, categories: Sequence[str], option: str = "--target", model: str = "") -> int:
    """The index of a class name: exact match first, then case-insensitive exact, then a unique partial match.

    ImageNet has both ``cardigan`` (474) and ``Cardigan`` (264, a corgi), so an exact match must win
    over a case-insensitive one; ``corgi`` matches one class only and is accepted.

    Raises:
        TargetError: no class matches, or several match equally well (the candidates are listed).
    """
    of = f" of {model}" if model else ""
    exact = [i for i, c in enumerate(categories) if c == text]
    if len(exact) > 1:
        raise TargetError(
            f"{option} {text!r} is ambiguous: classes {', '.join(map(str, exact))} all have this name; "
            "give an index"
        )
    if exact:
        return exact[0]
    low = text.lower()
    for rule in (lambda c: c.lower() == low, lambda c: low in c.lower()):
        hits = [i for i, c in enumerate(categories) if rule(c)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            shown = ", ".join(f"{categories[i]!r} ({i})" for i in hits[:8])
            more = f" and {len(hits) - 8} more" if len(hits) > 8 else ""
            raise TargetError(
                f"{option} {text!r} is ambiguous: it matches {shown}{more}; give the exact name or an index"
            )
    lowered = [c.lower() for c in categories]
    raise TargetError(
        f"{option} {text!r} is not a class{of}{close_matches(low, lowered)}; "
        "give a class index or a class name"
    )


def parse_target(
    spec: str | int | None, loaded: LoadedModel, num_classes: int, option: str = "--target"
) -> int | None:
    """``top1``/None → None (the predicted class); an index; or a class name (see :func:`find_class`).

    Raises:
        TargetError: index out of range, or a name that is not a class (close matches suggested).
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("top1", "")):
        return None
    text = str(spec).strip()
    by_index = _INDEX.match(text)
    if by_index:  # "281", or "class 281" as captions write a class without a name
        index = int(by_index.group(1))
        if not 0 <= index < num_classes:
            raise TargetError(
                f"{option} {index} is out of range: {loaded.name} has classes 0..{num_classes - 1}"
            )
        return index
    if not loaded.categories:
        raise TargetError(
            f"{option} {text!r}: {loaded.name} has no class names with these weights; "
            "give a class index, or name the classes with --labels FILE"
        )
    return find_class(text, loaded.categories, option, loaded.name)


def parse_targets(spec: str, loaded: LoadedModel, num_classes: int) -> str | list[int] | None:
    """``top1`` → None; ``topK`` → ``"topK"``; ``281``, ``tabby`` or ``281,tiger cat`` → class indices.

    The same class named twice (``281,tabby``) is explained once.

    Raises:
        TargetError: a bad topK, an index out of range, or an unknown class name.
    """
    text = spec.strip().lower()
    if text.startswith("top"):
        k = text[3:]
        if not _DIGITS.match(k) or not 1 <= int(k) <= num_classes:
            raise TargetError(f"--target {spec!r}: use top1..top{num_classes}, a class index or a class name")
        return None if int(k) == 1 else f"top{int(k)}"
    indices = [parse_target(part, loaded, num_classes) for part in spec.split(",") if part.strip()]
    if not indices:
        raise TargetError(f"--target {spec!r}: give topK, a class index or a class name")
    return list(dict.fromkeys(i for i in indices if i is not None))


def _json_names(data: object, path: Path) -> list[str]:
    """Names from a JSON list of strings, or an object keyed by index 0..n-1 (``{"0": "tench"}``; Keras'
    ``imagenet_class_index.json`` maps each index to ``["n01440764", "tench"]``: the last string is the name).
    """
    where = f"--labels {str(path)!r}"
    if isinstance(data, list) and all(isinstance(n, str) for n in data):
        return list(data)
    if isinstance(data, dict):
        try:
            indexed = {int(k): v for k, v in data.items()}
        except (TypeError, ValueError):
            raise UsageError(f"{where}: a JSON object must be keyed by class index (0, 1, ...)") from None
        if sorted(indexed) != list(range(len(indexed))):
            raise UsageError(f"{where}: the JSON object's keys must be the indices 0..{len(indexed) - 1}")
        names = []
        for i in range(len(indexed)):
            v = indexed[i]
            if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                v = v[-1]
            if not isinstance(v, str):
                raise UsageError(f"{where}: class {i} is not a name (a string, or a list ending in one)")
            names.append(v)
        return names
    raise UsageError(f"{where}: the JSON must be a list of class names or an object keyed by index")


def read_labels(path: str | Path) -> tuple[str, ...]:
    """Class names from a file: one per line (blank lines at the end ignored), a JSON list of strings, or a
    JSON object keyed by index (Keras' ``imagenet_class_index.json``).

    Raises:
        UsageError: the file cannot be read, is empty, or is JSON but not a list of strings.
    """
    import json

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"--labels {str(path)!r}: cannot read the file ({reason})") from None
    if text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"--labels {str(path)!r}: not valid JSON ({exc.msg}, line {exc.lineno})"
            ) from None
        names = _json_names(data, path)
    else:
        names = [line.strip() for line in text.rstrip("\n\r ").splitlines()]
    if not names:
        raise UsageError(f"--labels {str(path)!r}: the file holds no class names")
    return tuple(names)
