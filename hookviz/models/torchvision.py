"""torchvision's models: ``--model resnet18`` with ``DEFAULT``, a weights name, ``none`` or a file.

Classifiers, semantic segmentation (``deeplabv3_resnet50``, ``fcn_resnet50``, ``lraspp_mobilenet_v3_large``)
and detection (``fasterrcnn_resnet50_fpn``, ``retinanet_resnet50_fpn``, ``fcos_resnet50_fpn``,
``ssd300_vgg16``, Mask and Keypoint R-CNN).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

from torch import nn

from hookviz.errors import ModelNotFoundError, UsageError, WeightsError, close_matches
from hookviz.io.files import file_digest
from hookviz.io.images import Preprocess
from hookviz.io.video import VideoPreprocess
from hookviz.models.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options, seeded
from hookviz.models.weights import apply_state_dict, classifier_out, load_state_dict_file
from hookviz.options import Task

_IMAGENET_CLASSES = 1000


def list_models(task: str | None = "classification") -> list[str]:
    """Names of torchvision's models for ``task`` (``classification``, ``segmentation``, ``detection``,
    ``video``; ``None``: all four)."""
    import torchvision

    if task is None:
        return sorted(n for t in Task for n in list_models(t.value))
    task = Task.parse(task, "task").value
    module = {
        "classification": torchvision.models,
        "segmentation": torchvision.models.segmentation,
        "detection": torchvision.models.detection,
        "video": torchvision.models.video,
    }[task]
    return sorted(torchvision.models.list_models(module=module))


def task_of_name(name: str) -> str:
    """The task of a torchvision model name (``classification`` for names it does not know)."""
    for task in (Task.segmentation, Task.detection, Task.video):
        if name in list_models(task.value):
            return task.value
    return Task.classification.value


def task_preprocess(task: str) -> Preprocess:
    """Preprocessing of a segmentation or detection model (its own transform for a detector)."""
    if task == Task.segmentation:
        # torchvision's SemanticSegmentation transform: shorter side 520, whole image.
        return Preprocess(crop_size=520, resize_size=520, resize="shorter")
    return Preprocess(
        crop_size=800, resize_size=800, resize="model", mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)
    )


def _weights_enum(name: str) -> Any:
    import torchvision

    try:
        return torchvision.models.get_model_weights(name)
    except (ValueError, KeyError):
        return None


def imagenet_categories() -> tuple[str, ...]:
    enum = _weights_enum("resnet18")
    return tuple(enum.DEFAULT.meta["categories"]) if enum is not None else ()


def build(name: str, weights: str, options: Options) -> Built:
    """A torchvision classifier: ``DEFAULT`` (downloaded once into the torch hub cache, which honours
    ``TORCH_HOME``), another weights name (``IMAGENET1K_V2``), ``none`` (seeded random init) or a file."""
    import torchvision

    names = list_models(None)
    if name not in names:
        raise ModelNotFoundError(
            f"unknown model {name!r}{close_matches(name, names)} (`hookviz models` lists all {len(names)}; "
            "timm:NAME, hf:DIR, file.py:FUNCTION and pickled modules work too)"
        )
    task = task_of_name(name)
    if task in (Task.segmentation, Task.detection):
        return _build_dense(name, weights, options, task)
    enum = _weights_enum(name)
    clips: dict[str, Any] = {}
    if task == Task.video:
        clips = {"task": task, "video": video_preprocess(enum.DEFAULT)}
    kwargs: dict[str, Any] = {}
    if name.startswith("inception") or name == "googlenet":
        kwargs["init_weights"] = weights == WEIGHTS_NONE
    if weights.lower() == WEIGHTS_NONE:
        model = seeded(lambda: torchvision.models.get_model(name, weights=None, **kwargs))
        categories = tuple(enum.DEFAULT.meta["categories"]) if clips else imagenet_categories()
        return Built(model, name, "none (random init)", False, "none", categories, **clips)
    if enum is not None and (weights.upper() == WEIGHTS_DEFAULT or weights in enum.__members__):
        chosen = enum.DEFAULT if weights.upper() == WEIGHTS_DEFAULT else enum[weights]
        kwargs.pop("init_weights", None)
        model = _download(name, chosen, options.progress, kwargs)
        label = f"DEFAULT ({chosen.name})" if weights.upper() == WEIGHTS_DEFAULT else chosen.name
        return Built(
            model,
            name,
            label,
            True,
            f"{name}:{chosen.name}",
            tuple(chosen.meta.get("categories") or ()),
            Preprocess() if clips else preprocess_of(chosen.transforms()),
            **clips,
        )
    path, state = _weights_file(name, weights, enum, options)
    model = _fitted(name, torchvision.models.get_model(name, weights=None, **kwargs), state, path, kwargs)
    if clips:
        kinetics = tuple(enum.DEFAULT.meta["categories"])
        categories = kinetics if classifier_out(model) == len(kinetics) else ()
    else:
        categories = imagenet_categories() if classifier_out(model) == _IMAGENET_CLASSES else ()
    return Built(model, name, str(path), True, _file_id(path, options), categories, **clips)


def video_preprocess(weights: Any) -> VideoPreprocess:
    """The clips a torchvision video model's weights were evaluated on: their ``VideoClassification``
    transform (resize, crop, mean, std) and, from their documentation, ``clip_len``, ``frame_rate`` and
    ``clips_per_video`` (r3d_18: 16 frames at 15 fps, 5 clips; swin3d_t: 32 frames, 12 clips)."""
    t = weights.transforms()
    docs = str(weights.meta.get("_docs", ""))

    def number(key: str, default: float) -> float:
        found = re.search(rf"{key}=([0-9.]+)", docs)
        return float(found.group(1)) if found else default

    return VideoPreprocess(
        clip_len=int(number("clip_len", 16)),
        resize=tuple(int(v) for v in t.resize_size),
        crop=int(t.crop_size[0]),
        mean=tuple(t.mean),
        std=tuple(t.std),
        frame_rate=number("frame_rate", 15.0),
        clips=int(number("clips_per_video", 1)),
    )


def preprocess_of(transform: Any) -> Preprocess:
    """The :class:`Preprocess` equal to a torchvision ``ImageClassification`` transform (a weights enum's
    ``transforms()``): the same resize, crop, interpolation, mean and std."""
    return Preprocess(
        crop_size=int(transform.crop_size[0]),
        resize_size=int(transform.resize_size[0]),
        mean=tuple(transform.mean),
        std=tuple(transform.std),
        interpolation=str(getattr(transform.interpolation, "value", transform.interpolation)),
    )


def _weights_file(name: str, weights: str, enum: Any, options: Options) -> tuple[Path, dict[str, Any]]:
    """The state_dict in the file ``weights`` names (a UsageError when it is neither a file nor a name)."""
    path = Path(weights).expanduser()
    if not path.is_file():
        known = ", ".join(["DEFAULT", *(enum.__members__ if enum else []), "none"])
        raise UsageError(f"--weights {weights!r}: no such file, and not a weights name for {name} ({known})")
    return path, load_state_dict_file(path, options.weights_key)


def _fitted(
    name: str,
    model: nn.Module,
    state: dict[str, Any],
    path: Path,
    kwargs: dict[str, Any],
    key: str | None = None,
    per_class: int = 1,
) -> nn.Module:
    """``model`` (torchvision's ``name``) with ``state`` loaded; rebuilt with ``kwargs`` and the file's
    number of classes when its head has another."""
    import torchvision

    return apply_state_dict(
        model,
        state,
        path,
        name,
        rebuild=lambda n: torchvision.models.get_model(name, weights=None, num_classes=n, **kwargs),
        key=key,
        per_class=per_class,
    )


def _file_id(path: Path, options: Options) -> str:
    key = f"[{options.weights_key}]" if options.weights_key else ""
    return f"sha256:{file_digest(path)}{key}"


def _download(name: str, chosen: Any, progress: bool, kwargs: dict[str, Any]) -> nn.Module:
    import torchvision

    try:
        return torchvision.models.get_model(name, weights=chosen, progress=progress, **kwargs)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise WeightsError(
            f"cannot get the pretrained weights for {name} ({chosen.url}): {reason}; "
            "use --weights PATH for a local file or --weights none for random weights"
        ) from None


def _build_dense(name: str, weights: str, options: Options, task: str) -> Built:
    """A segmentation or detection model: its classes (VOC's 21, COCO's 91) come with the weights enum, and
    random init never downloads a pretrained backbone (``weights_backbone=None``)."""
    import torchvision

    enum = _weights_enum(name)
    categories = tuple(enum.DEFAULT.meta.get("categories") or ()) if enum is not None else ()
    kwargs: dict[str, Any] = {"weights_backbone": None}
    if task == Task.segmentation and not name.startswith("lraspp"):
        kwargs["aux_loss"] = False
    preprocess = task_preprocess(task)
    if weights.lower() == WEIGHTS_NONE:
        model = seeded(lambda: torchvision.models.get_model(name, weights=None, **kwargs))
        return Built(model, name, "none (random init)", False, "none", categories, preprocess, task)
    if enum is not None and (weights.upper() == WEIGHTS_DEFAULT or weights in enum.__members__):
        chosen = enum.DEFAULT if weights.upper() == WEIGHTS_DEFAULT else enum[weights]
        model = _download(name, chosen, options.progress, {})
        label = f"DEFAULT ({chosen.name})" if weights.upper() == WEIGHTS_DEFAULT else chosen.name
        categories = tuple(chosen.meta.get("categories") or categories)
        return Built(model, name, label, True, f"{name}:{chosen.name}", categories, preprocess, task)
    path, state = _weights_file(name, weights, enum, options)
    if task == Task.segmentation and any(k.startswith("aux_classifier.") for k in state):
        kwargs["aux_loss"] = True
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    model = _fitted(name, model, state, path, kwargs, *dense_class_key(model))
    heads = dense_classes(model)
    kept = categories if heads is None or heads == len(categories) else ()
    return Built(model, name, str(path), True, _file_id(path, options), kept, preprocess, task)


def dense_class_key(model: nn.Module) -> tuple[str | None, int]:
    """The weight whose rows are a segmentation or detection model's classes, and rows per class."""
    own = model.state_dict()
    if "roi_heads.box_predictor.cls_score.weight" in own:  # Faster, Mask, Keypoint R-CNN
        return "roi_heads.box_predictor.cls_score.weight", 1
    head = getattr(getattr(model, "head", None), "classification_head", None)
    if head is not None and "head.classification_head.cls_logits.weight" in own:  # RetinaNet, FCOS
        return "head.classification_head.cls_logits.weight", int(getattr(head, "num_anchors", 1))
    classifier = getattr(model, "classifier", None)
    if isinstance(classifier, nn.Module):  # FCN, DeepLabV3, LR-ASPP: the last conv scores the classes
        convs = [n for n, m in classifier.named_modules() if isinstance(m, nn.Conv2d)]
        if convs:
            return f"classifier.{convs[-1]}.weight", 1
    return None, 1


def dense_classes(model: nn.Module) -> int | None:
    """How many classes a segmentation or detection model scores (None when unknown: SSD)."""
    key, per_class = dense_class_key(model)
    if key is None:
        head = getattr(getattr(model, "head", None), "classification_head", None)
        columns = getattr(head, "num_columns", None)
        return int(columns) if columns else None
    return int(model.state_dict()[key].shape[0]) // per_class
