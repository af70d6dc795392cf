"""Models, weights, devices, class names and the layer a CAM should use by default."""

from __future__ import annotations

import hashlib
import pickle
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookviz.errors import (
    DeviceError,
    ModelNotFoundError,
    TargetError,
    UsageError,
    WeightsError,
    close_matches,
)
from hookviz.hooks import ModuleCall, trace_shapes
from hookviz.images import Preprocess

WEIGHTS_NONE = "none"
WEIGHTS_DEFAULT = "DEFAULT"
_IMAGENET_CLASSES = 1000


def list_models() -> list[str]:
    """Names of torchvision's classification models."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


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

    def class_name(self, index: int) -> str:
        return self.categories[index] if 0 <= index < len(self.categories) else f"class {index}"


def _weights_enum(name: str) -> Any:
    import torchvision

    try:
        return torchvision.models.get_model_weights(name)
    except (ValueError, KeyError):
        return None


def _imagenet_categories() -> tuple[str, ...]:
    enum = _weights_enum("resnet18")
    return tuple(enum.DEFAULT.meta["categories"]) if enum is not None else ()


def load_model(
    name: str = "resnet18",
    weights: str = WEIGHTS_DEFAULT,
    *,
    device: torch.device | str = "cpu",
    input_size: int | None = None,
    resize: str = "crop",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    progress: bool = False,
    labels: str | Path | Sequence[str] | None = None,
    weights_key: str | None = None,
) -> LoadedModel:
    """Build a torchvision classifier with its weights, in eval mode, on ``device``.

    Args:
        name: a torchvision classification model (``hookviz.models.list_models()``).
        weights: ``DEFAULT`` (torchvision's pretrained weights, downloaded into the torch hub cache,
            which honours ``TORCH_HOME``), another weights name such as ``IMAGENET1K_V2``, ``none``
            (random init), or the path of a state_dict / checkpoint file.
        input_size: square input side; defaults to the weights' crop size (224 for most).
        resize: ``crop`` (torchvision's eval transform) or ``squash`` (whole image, aspect not kept).
        labels: class names for the head (a file, see :func:`read_labels`, or a sequence); they
            replace the weights' names in captions, records and ``--target NAME``.
        weights_key: the key of the state_dict inside a checkpoint dict (``ema``, ``model_ema``...).

    Raises:
        ModelNotFoundError: unknown model name (close matches suggested).
        UsageError: ``labels`` does not have one name per class of the head.
        WeightsError: pretrained weights cannot be downloaded, or the file cannot be loaded safely.
    """
    import torchvision

    names = list_models()
    if name not in names:
        raise ModelNotFoundError(
            f"unknown model {name!r}{close_matches(name, names)} (`hookviz models` lists all {len(names)})"
        )
    enum = _weights_enum(name)
    chosen = None
    kwargs: dict[str, Any] = {}
    if name.startswith("inception") or name == "googlenet":
        kwargs["init_weights"] = weights == WEIGHTS_NONE
    if weights.lower() == WEIGHTS_NONE:
        # Seeded, so two runs with random weights give the same maps.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = torchvision.models.get_model(name, weights=None, **kwargs)
        label, pretrained, categories = "none (random init)", False, _imagenet_categories()
        weights_id = "none"
    elif enum is not None and (weights.upper() == WEIGHTS_DEFAULT or weights in enum.__members__):
        chosen = enum.DEFAULT if weights.upper() == WEIGHTS_DEFAULT else enum[weights]
        kwargs.pop("init_weights", None)
        model = _download(name, chosen, progress, kwargs)
        label, pretrained = (
            f"DEFAULT ({chosen.name})" if weights.upper() == WEIGHTS_DEFAULT else chosen.name,
            True,
        )
        categories = tuple(chosen.meta.get("categories") or ())
        weights_id = f"{name}:{chosen.name}"
    else:
        path = Path(weights).expanduser()
        if not path.is_file():
            known = ", ".join(["DEFAULT", *(enum.__members__ if enum else []), "none"])
            raise UsageError(
                f"--weights {weights!r}: no such file, and not a weights name for {name} ({known})"
            )
        model = _from_file(name, path, kwargs, weights_key)
        label, pretrained = str(path), True
        out = _classifier_out(model)
        categories = _imagenet_categories() if out == _IMAGENET_CLASSES else ()
        weights_id = f"sha256:{file_digest(path)}" + (f"[{weights_key}]" if weights_key else "")
    labels_id = ""
    if labels is not None:
        class_names = read_labels(labels) if isinstance(labels, (str, Path)) else tuple(labels)
        heads = _classifier_out(model)
        if heads is not None and heads != len(class_names):
            where = f"--labels {str(labels)!r}" if isinstance(labels, (str, Path)) else "labels"
            raise UsageError(
                f"{where} has {len(class_names)} class names but the head of {name} has {heads} outputs; "
                "give one name per output, in index order"
            )
        categories = class_names
        labels_id = hashlib.sha256("\n".join(class_names).encode()).hexdigest()[:16]

    base = chosen.transforms() if chosen is not None else None
    crop = int(base.crop_size[0]) if base is not None else 224
    rsz = int(base.resize_size[0]) if base is not None else 256
    if input_size is not None:
        rsz, crop = round(input_size * rsz / crop), input_size
    preprocess = Preprocess(
        crop_size=crop,
        resize_size=rsz,
        mean=tuple(mean) if mean is not None else tuple(base.mean) if base is not None else Preprocess.mean,  # type: ignore[arg-type]
        std=tuple(std) if std is not None else tuple(base.std) if base is not None else Preprocess.std,  # type: ignore[arg-type]
        resize=resize,
    )
    device = torch.device(device)
    model = model.to(device).eval()
    return LoadedModel(model, name, label, pretrained, categories, preprocess, device, weights_id, labels_id)


def file_digest(path: Path) -> str:
    """The first 16 hex digits of a file's SHA-256: its content, whatever its name or time stamp."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


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


_CHECKPOINT_KEYS = ("state_dict", "model", "model_state_dict", "net", "network")


def is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive (a zip holding compiled ``code/`` and ``constants.pkl``)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
    return any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names)


def load_state_dict_file(path: str | Path, key: str | None = None) -> dict[str, torch.Tensor]:
    """Read a state_dict safely (``weights_only=True``) from a bare state_dict or a checkpoint dict.

    Accepts ``{"state_dict": ...}``, ``{"model": ...}`` (and a few other common names) checkpoints,
    or the dict under ``key`` when given (``ema``, ``model_ema``: dotted keys reach nested dicts), and
    strips the ``module.`` (DataParallel/DDP) and ``_orig_mod.`` (``torch.compile``) prefixes.

    Raises:
        WeightsError: the file is a TorchScript archive (Python hooks cannot run inside TorchScript),
            is not a PyTorch file, holds code-carrying objects, or holds no state_dict (the keys
            found are listed).
    """
    path = Path(path)
    if is_torchscript(path):
        raise WeightsError(
            f"{str(path)!r} is a TorchScript archive: Python hooks do not run inside TorchScript, so "
            "hookviz cannot look inside it; save the eager model's state_dict instead "
            "(torch.save(model.state_dict(), path))"
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        global_line = next((line for line in lines if "GLOBAL" in line), None)
        if global_line is not None:
            raise WeightsError(
                f"{path}: refused: the file holds Python objects other than tensors, and unpickling them "
                f"could run code ({global_line}); re-save it with torch.save(model.state_dict(), path)"
            ) from None
        after = [
            line.strip() for line in text.split("WeightsUnpickler error:", 1)[-1].splitlines() if line.strip()
        ]
        raise WeightsError(
            f"{path}: not a readable PyTorch weights file ({after[0] if after else type(exc).__name__})"
        ) from None
    except Exception as exc:  # a damaged file can make the unpickler raise almost anything
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WeightsError(f"{path}: not a readable PyTorch weights file ({first})") from None
    if key is not None:
        node: Any = obj
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                found = ", ".join(repr(k) for k in list(node)[:12]) if isinstance(node, Mapping) else "none"
                raise WeightsError(f"{path}: --weights-key {key!r}: no key {part!r} (keys found: {found})")
            node = node[part]
        obj = node
    elif isinstance(obj, Mapping):
        for name in _CHECKPOINT_KEYS:
            if isinstance(obj.get(name), Mapping):
                obj = obj[name]
                break
    if not isinstance(obj, Mapping) or not any(isinstance(v, torch.Tensor) for v in obj.values()):
        if isinstance(obj, Mapping):
            found = ", ".join(f"{k!r} ({type(v).__name__})" for k, v in list(obj.items())[:12])
            raise WeightsError(
                f"{path}: holds no state_dict (a mapping of names to tensors); keys found: {found}; "
                "pick the one holding the weights with --weights-key KEY"
            )
        raise WeightsError(f"{path}: holds a {type(obj).__name__}, not a state_dict (names to tensors)")
    state = {}
    for name, value in obj.items():
        if not isinstance(value, torch.Tensor):
            continue
        for prefix in ("module.", "_orig_mod."):
            while name.startswith(prefix):
                name = name[len(prefix) :]
        state[name] = value
    return state


def _classifier_key(model: nn.Module) -> str | None:
    """The weight of the layer that produces the class scores: the last Linear (or Conv2d, for squeezenet)."""
    last = [name for name, module in model.named_modules() if isinstance(module, (nn.Linear, nn.Conv2d))]
    return f"{last[-1]}.weight" if last else None


def _classifier_out(model: nn.Module) -> int | None:
    key = _classifier_key(model)
    return int(model.state_dict()[key].shape[0]) if key else None


def _from_file(name: str, path: Path, kwargs: dict[str, Any], key: str | None = None) -> nn.Module:
    import torchvision

    state = load_state_dict_file(path, key)
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    key = _classifier_key(model)
    if key and key in state and state[key].shape[0] != model.state_dict()[key].shape[0]:
        # A fine-tuned checkpoint: rebuild with its number of classes.
        model = torchvision.models.get_model(
            name, weights=None, num_classes=int(state[key].shape[0]), **kwargs
        )
    own = model.state_dict()
    for k, v in own.items():
        # BatchNorm's step counter is absent from many exported checkpoints, and no forward pass reads it.
        if k.endswith("num_batches_tracked") and k not in state:
            state[k] = v
    wrong = [k for k in state if k in own and own[k].shape != state[k].shape]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if wrong or missing or unexpected:
        parts = []
        if wrong:
            k = wrong[0]
            parts.append(
                f"{len(wrong)} shape mismatch(es), e.g. {k} is {tuple(state[k].shape)} in the file, "
                f"{tuple(own[k].shape)} in {name}"
            )
        if missing:
            parts.append(f"{len(missing)} missing key(s), e.g. {', '.join(missing[:3])}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s), e.g. {', '.join(unexpected[:3])}")
        raise WeightsError(
            f"{path} does not fit {name}: {'; '.join(parts)}; was it saved from another architecture? "
            "pass the matching --model"
        )
    model.load_state_dict(state)
    return model


def probe(loaded: LoadedModel) -> list[ModuleCall]:
    """Every module's type and output shape for one input of the model's size."""
    s = loaded.preprocess.crop_size
    x = torch.zeros(1, 3, s, s, device=loaded.device)
    return trace_shapes(loaded.model, x)


def num_classes(loaded: LoadedModel) -> int:
    """How many classes the model's head scores (from the class names, else one forward pass of zeros)."""
    if loaded.categories:
        return len(loaded.categories)
    from hookviz.hooks import preserved

    s = loaded.preprocess.crop_size
    with torch.no_grad(), preserved(loaded.model):
        loaded.model.eval()
        logits = loaded.model(torch.zeros(1, 3, s, s, device=loaded.device))
    return int(logits.shape[-1])


def find_class(text: str, categories: Sequence[str], option: str = "--target", model: str = "") -> int:
    """The index of a class name: exact match first, then case-insensitive exact, then a unique partial match.

    ImageNet has both ``cardigan`` (474) and ``Cardigan`` (264, a corgi), so an exact match must win
    over a case-insensitive one; ``corgi`` matches one class only and is accepted.

    Raises:
        TargetError: no class matches, or several match equally well (the candidates are listed).
    """
    of = f" of {model}" if model else ""
    exact = [i for i, c in enumerate(categories) if c == text]
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
    if text.lstrip("-").isdigit():
        index = int(text)
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
        if not k.isdigit() or not 1 <= int(k) <= num_classes:
            raise TargetError(f"--target {spec!r}: use top1..top{num_classes}, a class index or a class name")
        return None if int(k) == 1 else f"top{int(k)}"
    indices = [parse_target(part, loaded, num_classes) for part in spec.split(",") if part.strip()]
    if not indices:
        raise TargetError(f"--target {spec!r}: give topK, a class index or a class name")
    return list(dict.fromkeys(i for i in indices if i is not None))


def read_labels(path: str | Path) -> tuple[str, ...]:
    """Class names from a file: one per line (blank lines at the end ignored), or a JSON list of strings.

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
    if text.lstrip().startswith("["):
        try:
            names = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"--labels {str(path)!r}: not valid JSON ({exc.msg}, line {exc.lineno})"
            ) from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise UsageError(f"--labels {str(path)!r}: the JSON must be a list of class-name strings")
    else:
        names = [line.strip() for line in text.rstrip("\n\r ").splitlines()]
    if not names:
        raise UsageError(f"--labels {str(path)!r}: the file holds no class names")
    return tuple(names)
