"""timm models: ``--model timm:convnext_tiny`` (needs ``pip install 'hookviz[timm]'``).

Preprocessing comes from timm's data config (input size, crop percentage, mean, std, interpolation);
a 1000-class head gets the ImageNet class names.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hookviz.errors import ModelNotFoundError, UsageError, WeightsError, close_matches
from hookviz.io.files import file_digest
from hookviz.io.images import Preprocess
from hookviz.models.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options, missing_extra, query, seeded
from hookviz.models.torchvision import imagenet_categories
from hookviz.models.weights import apply_state_dict, classifier_out, load_state_dict_file


def _timm() -> Any:
    try:
        import timm
    except ImportError:
        raise missing_extra("timm", "timm") from None
    return timm


def _data_config(timm: Any, model: Any, name: str, kwargs: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The input side and data config of the model as built: an ``img_size`` argument overrides the
    pretrained config's."""
    given = kwargs.get("img_size")
    override = {}
    if given is not None:
        side = given if isinstance(given, int) else tuple(given)
        if not isinstance(side, int) and len(set(side)) != 1:
            raise UsageError(f"timm:{name}: img_size={given}: hookviz takes square inputs; give one size")
        n = side if isinstance(side, int) else side[0]
        override = {"input_size": (3, int(n), int(n))}
    data = timm.data.resolve_data_config(override, model=model)
    return int(data["input_size"][-1]), data


def _pretrained(timm: Any, name: str, kwargs: dict[str, Any]) -> tuple[Any, str, bool, str]:
    """The model with its pretrained weights from the hub, its weights' label and their id."""
    try:
        model = timm.create_model(name, pretrained=True, **kwargs)
    except Exception as exc:  # the hub client raises many kinds when offline
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise WeightsError(
            f"cannot get the pretrained weights for timm:{name} from the Hugging Face hub ({first}); "
            "use --weights PATH for a local file or --weights none for random weights"
        ) from None
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    tag = cfg.get("hf_hub_id") or cfg.get("tag") or "default"
    return model, f"DEFAULT ({tag})", True, f"timm:{name}:{tag}"


def build(spec: str, weights: str, options: Options) -> Built:
    """A timm model; ``timm:NAME?img_size=384`` passes arguments to ``create_model`` (a fine-tuned model
    must be built as it was trained, or its checkpoint will not fit)."""
    timm = _timm()
    name, kwargs = query(spec)  # the name and create_model's arguments
    if not name or not timm.is_model(name):
        known = timm.list_models()
        raise ModelNotFoundError(
            f"unknown timm model {name!r}{close_matches(name, known)} (timm lists {len(known)} names: "
            "python -c 'import timm; print(timm.list_models(\"*vit*\"))')"
        )
    if weights.lower() == WEIGHTS_NONE:
        model = seeded(lambda: timm.create_model(name, pretrained=False, **kwargs))
        label, pretrained, weights_id = "none (random init)", False, "none"
    elif weights.upper() == WEIGHTS_DEFAULT:
        model, label, pretrained, weights_id = _pretrained(timm, name, kwargs)
    else:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise UsageError(
                f"--weights {weights!r}: no such file, and not DEFAULT or none (for timm:{name})"
            )
        state = load_state_dict_file(path, options.weights_key)
        model = apply_state_dict(
            seeded(lambda: timm.create_model(name, pretrained=False, **kwargs)),
            state,
            path,
            f"timm:{name}",
            rebuild=lambda n: timm.create_model(name, pretrained=False, **{**kwargs, "num_classes": n}),
        )
        key = f"[{options.weights_key}]" if options.weights_key else ""
        label, pretrained, weights_id = str(path), True, f"sha256:{file_digest(path)}{key}"
    crop, data = _data_config(timm, model, name, kwargs)
    categories: tuple[str, ...] = ()
    if classifier_out(model) == 1000:
        categories = imagenet_categories()
    args = ",".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
    return Built(
        model,
        f"timm:{name}" + (f"[{args}]" if args else ""),
        label,
        pretrained,
        weights_id,
        categories,
        Preprocess(
            crop_size=crop,
            # timm's eval transform: scale_size = floor(img_size / crop_pct)
            resize_size=max(crop, math.floor(crop / float(data.get("crop_pct") or 1.0))),
            mean=tuple(float(v) for v in data["mean"]),
            std=tuple(float(v) for v in data["std"]),
            resize="squash" if data.get("crop_mode") == "squash" else "crop",
            interpolation=str(data.get("interpolation") or "bilinear"),
        ),
    )
