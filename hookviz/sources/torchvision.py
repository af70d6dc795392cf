"""torchvision's classifiers: ``--model resnet18`` with ``DEFAULT``, a weights name, ``none`` or a file."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from torch import nn

from hookviz.errors import ModelNotFoundError, UsageError, WeightsError, close_matches
from hookviz.images import Preprocess
from hookviz.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options, seeded
from hookviz.sources.weights import apply_state_dict, classifier_out, file_digest, load_state_dict_file

_IMAGENET_CLASSES = 1000


def list_models() -> list[str]:
    """Names of torchvision's classification models."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def _weights_enum(name: str) -> Any:
    import torchvision

    try:
        return torchvision.models.get_model_weights(name)
    except (ValueError, KeyError):
        return None


def _imagenet_categories() -> tuple[str, ...]:
    enum = _weights_enum("resnet18")
    return tuple(enum.DEFAULT.meta["categories"]) if enum is not None else ()


def build(name: str, weights: str, options: Options) -> Built:
    """A torchvision classifier: ``DEFAULT`` (downloaded once into the torch hub cache, which honours
    ``TORCH_HOME``), another weights name (``IMAGENET1K_V2``), ``none`` (seeded random init) or a file."""
    import torchvision

    names = list_models()
    if name not in names:
        raise ModelNotFoundError(
            f"unknown model {name!r}{close_matches(name, names)} (`hookviz models` lists all {len(names)}; "
            "timm:NAME, hf:DIR, file.py:FUNCTION and pickled modules work too)"
        )
    enum = _weights_enum(name)
    kwargs: dict[str, Any] = {}
    if name.startswith("inception") or name == "googlenet":
        kwargs["init_weights"] = weights == WEIGHTS_NONE
    if weights.lower() == WEIGHTS_NONE:
        model = seeded(lambda: torchvision.models.get_model(name, weights=None, **kwargs))
        return Built(model, name, "none (random init)", False, "none", _imagenet_categories())
    if enum is not None and (weights.upper() == WEIGHTS_DEFAULT or weights in enum.__members__):
        chosen = enum.DEFAULT if weights.upper() == WEIGHTS_DEFAULT else enum[weights]
        kwargs.pop("init_weights", None)
        model = _download(name, chosen, options.progress, kwargs)
        label = f"DEFAULT ({chosen.name})" if weights.upper() == WEIGHTS_DEFAULT else chosen.name
        base = chosen.transforms()
        return Built(
            model,
            name,
            label,
            True,
            f"{name}:{chosen.name}",
            tuple(chosen.meta.get("categories") or ()),
            Preprocess(
                crop_size=int(base.crop_size[0]),
                resize_size=int(base.resize_size[0]),
                mean=tuple(base.mean),
                std=tuple(base.std),
            ),
        )
    path = Path(weights).expanduser()
    if not path.is_file():
        known = ", ".join(["DEFAULT", *(enum.__members__ if enum else []), "none"])
        raise UsageError(f"--weights {weights!r}: no such file, and not a weights name for {name} ({known})")
    state = load_state_dict_file(path, options.weights_key)
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    model = apply_state_dict(
        model,
        state,
        path,
        name,
        rebuild=lambda n: torchvision.models.get_model(name, weights=None, num_classes=n, **kwargs),
    )
    key = f"[{options.weights_key}]" if options.weights_key else ""
    categories = _imagenet_categories() if classifier_out(model) == _IMAGENET_CLASSES else ()
    return Built(model, name, str(path), True, f"sha256:{file_digest(path)}{key}", categories)


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
