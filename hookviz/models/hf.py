"""Hugging Face models: ``--model hf:DIR_OR_ID`` (needs ``pip install 'hookviz[hf]'``).

``DIR`` is a folder written by ``save_pretrained`` (a hub id works where the network allows). Class
names come from the config's ``id2label``, preprocessing from the image processor's config, and the
logits from the output's ``.logits``. A detector or semantic segmenter (by its saved architecture) is read
through its image processor's post-processing (:mod:`.hf_dense`); CLIP and SigLIP through their prompts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hookviz.errors import UsageError, WeightsError, first_line
from hookviz.io.files import file_digest
from hookviz.io.images import Preprocess
from hookviz.models import hf_folder, towers
from hookviz.models.hf_dense import HfDetector, HfSegmenter
from hookviz.models.scores import ImageTextSource
from hookviz.models.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options, missing_extra, seeded
from hookviz.models.weights import apply_state_dict, load_state_dict_file


def build(spec: str, weights: str, options: Options) -> Built:
    try:
        import transformers
    except ImportError:
        raise missing_extra("transformers", "hf") from None
    where = spec.split(":", 1)[1]
    with quiet(transformers), hf_folder.hub_or_cache(where) as offline:
        try:
            return _build(transformers, spec, weights, options)
        except WeightsError:
            if offline:
                raise WeightsError(hf_folder.unreachable(where)) from None
            raise


@contextmanager
def quiet(transformers: Any) -> Iterator[None]:
    """No progress bars or info lines from transformers while loading (stdout/stderr stay hookviz's)."""
    from huggingface_hub.utils import logging as hub_logging

    logging = transformers.utils.logging
    level, hub_level = logging.get_verbosity(), hub_logging.get_verbosity()
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    hub_logging.set_verbosity_error()  # the hub's retries ("Retrying in 8s [Retry 5/5]") are not ours to say
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        hub_logging.set_verbosity(hub_level)
        if bars:
            logging.enable_progress_bar()


def _build(transformers: Any, spec: str, weights: str, options: Options) -> Built:
    where = spec.split(":", 1)[1]
    if not where:
        raise UsageError("--model hf: needs a folder written by save_pretrained, or a hub id (hf:DIR_OR_ID)")
    auto = transformers.AutoModelForImageClassification
    hf_folder.check_folder(where)
    try:
        config = transformers.AutoConfig.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise WeightsError(
            f"hf:{where}: cannot read a Hugging Face model config ({first_line(exc)}); give a folder "
            "written by save_pretrained, or a hub id (which needs the network)"
        ) from None
    name = f"hf:{Path(where).name or where}"
    # An image-text model (CLIP, SigLIP): the whole model, its tokenizer beside it; prompts come later.
    image_text = getattr(config, "text_config", None) is not None and getattr(config, "vision_config", None)
    task, auto_name = _kind(config)
    if image_text:
        hf_folder.check_processor(name, where)
        auto = transformers.AutoModel
        towers.check(_model_class(auto, config), str(config.model_type), name, where)
    elif auto_name:
        auto = getattr(transformers, auto_name)
    else:
        hf_folder.check_head(transformers, config, name, where)
    if weights.lower() == WEIGHTS_NONE:
        model = seeded(lambda: auto.from_config(config))
        label, pretrained, weights_id = "none (random init)", False, "none"
    elif weights.upper() == WEIGHTS_DEFAULT:
        try:
            model = auto.from_pretrained(where)
        except (OSError, ValueError) as exc:
            raise WeightsError(
                f"cannot get the weights of hf:{where} ({first_line(exc)}); "
                "use --weights PATH for a local file or --weights none for random weights"
            ) from None
        label, pretrained, weights_id = f"DEFAULT ({where})", True, _weights_id(where, config)
    else:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise UsageError(f"--weights {weights!r}: no such file, and not DEFAULT or none (for {name})")
        state = load_state_dict_file(path, options.weights_key)
        model = _from_file(auto, config, state, path, name)
        key = f"[{options.weights_key}]" if options.weights_key else ""
        label, pretrained, weights_id = str(path), True, f"sha256:{file_digest(path)}{key}"
    if image_text:
        model = ImageTextSource(model, _tokenizer(transformers, where), str(config.model_type))
    elif task != "classification":
        return _dense(transformers, model, task, where, config, (name, label, pretrained, weights_id))
    built = Built(model, name, label, pretrained, weights_id, () if image_text else _categories(config))
    _preprocessing(built, where, config)
    p = built.preprocess
    built.normalisation_note = hf_folder.guessed(name, where, p.mean, p.std, p.crop_size)
    if image_text:
        built.preprocess = towers.preprocess(
            built.preprocess, str(config.model_type), config, _processor(where)
        )
    return built


def _from_file(auto: Any, config: Any, state: dict[str, Any], path: Path, name: str) -> Any:
    """The model of ``config`` with the weights of a file: read through transformers' own loading, which maps
    the key names ``save_pretrained`` writes (the checkpoint's) to the modules' (they differ in transformers
    5); a file keyed by the modules' names loads too. Where a weight is missing or of another shape, the file
    is loaded as a plain state_dict, whose refusal lists the keys."""
    cls = _model_class(auto, config)
    if cls is not None:
        try:
            pair: Any = seeded(
                lambda: cls.from_pretrained(
                    None, config=config, state_dict=dict(state), output_loading_info=True
                )
            )
            model, info = pair
        except (OSError, ValueError, RuntimeError, KeyError, TypeError):
            info = None
        # Keys the model has no module for (a generation head beside the tower) are left, as DEFAULT does.
        if info is not None and not info.get("missing_keys") and not info.get("mismatched_keys"):
            return model
    return apply_state_dict(seeded(lambda: auto.from_config(config)), state, path, name)


def _model_class(auto: Any, config: Any) -> Any:
    """The class ``auto`` builds for ``config`` (None where it cannot tell: the model tells when built)."""
    try:
        return auto._model_mapping[type(config)]
    except (KeyError, AttributeError, ValueError):
        return None


def _kind(config: Any) -> tuple[str, str | None]:
    """The task of a Hugging Face model (``classification``, ``detection``, ``segmentation``) and the auto
    class that builds it (None: image classification's), from the saved architecture or the model type."""
    from transformers.models.auto import modeling_auto as auto

    archs = " ".join(getattr(config, "architectures", None) or [])
    kind = str(getattr(config, "model_type", ""))
    if "ForObjectDetection" in archs or (not archs and kind in auto.MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES):
        return "detection", "AutoModelForObjectDetection"
    semantic = kind in auto.MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES
    if "ForSemanticSegmentation" in archs or (not archs and semantic and kind not in _CLASSIFIERS):
        return "segmentation", "AutoModelForSemanticSegmentation"
    universal = kind in auto.MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES and kind != "detr"
    if any(w in archs for w in ("ForUniversalSegmentation", "ForInstanceSegmentation")) or (
        not archs and universal
    ):
        return "segmentation", "AutoModelForUniversalSegmentation"
    return "classification", None


#: Model types that are image classifiers too (a config without ``architectures`` is taken as one).
_CLASSIFIERS = frozenset({"beit", "data2vec-vision", "mobilenet_v2", "mobilevit", "mobilevitv2", "segformer"})


def _dense(
    transformers: Any, model: Any, task: str, where: str, config: Any, ids: tuple[str, str, bool, str]
) -> Built:
    """A detector or semantic segmenter, read through the image processor saved beside it."""
    try:
        proc = transformers.AutoImageProcessor.from_pretrained(where)
    except (OSError, ValueError, KeyError) as exc:
        raise WeightsError(
            f"hf:{where}: no image processor beside the model ({first_line(exc)}); save it with "
            "processor.save_pretrained(DIR): its post-processing decides the boxes and regions"
        ) from None
    name, label, pretrained, weights_id = ids
    categories = _categories(config)
    if task == "detection":
        zero, one = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        side = _sizes(getattr(proc, "size", None))
        edge = side.get("shortest_edge") or side.get("height") or 800
        pre = Preprocess(crop_size=edge, resize_size=edge, resize="model", mean=zero, std=one)
        return Built(HfDetector(model, proc), name, label, pretrained, weights_id, categories, pre, task=task)
    built = Built(HfSegmenter(model, proc), name, label, pretrained, weights_id, categories, task=task)
    _preprocessing(built, where, config)
    return built


def _tokenizer(transformers: Any, where: str) -> Any:
    """The tokenizer saved beside an image-text model, or None (``--prompt`` then says so). A folder
    without a vocabulary has none: transformers would build an empty one that reads every prompt alike."""
    if not hf_folder.has_tokenizer(where):
        return None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return tokenizer if len(tokenizer) > 2 else None


def _weights_id(where: str, config: Any) -> str:
    """The content of a local folder's weight files, or a hub id at its commit."""
    folder = Path(where)
    if folder.is_dir():
        h = hashlib.sha256()
        for f in sorted(folder.iterdir()):
            if f.suffix in (".safetensors", ".bin", ".json") and f.is_file():
                h.update(f.name.encode() + file_digest(f).encode())
        return f"hf-dir:{h.hexdigest()[:16]}"
    return f"hf:{where}@{getattr(config, '_commit_hash', None) or 'main'}"


def _categories(config: Any) -> tuple[str, ...]:
    id2label = getattr(config, "id2label", None) or {}
    names = [str(id2label[i]) for i in sorted(id2label, key=int)]
    # transformers fills in LABEL_0, LABEL_1, ... when a model was saved without names.
    if not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return ()
    return tuple(names)


def _sizes(value: Any) -> dict[str, int]:
    """An image processor's ``size`` / ``crop_size`` (a dict, or transformers 5's ``SizeDict``) as a dict of
    the keys that are set."""
    if not value:
        return {}
    keys = ("height", "width", "shortest_edge", "longest_edge")
    if isinstance(value, dict):
        return {k: int(v) for k, v in value.items() if k in keys and v is not None}
    return {k: int(v) for k in keys if (v := getattr(value, k, None)) is not None}


def _square(d: dict[str, Any], what: str, where: str) -> int:
    """The side of a square size in the image processor's config (a UsageError for another)."""
    if int(d["height"]) != int(d["width"]):
        raise UsageError(
            f"{where}: the image processor's {what} is {d['height']}x{d['width']}; hookviz takes square "
            "inputs (give --input-size N to use N x N)"
        )
    return int(d["height"])


def _normalisation(
    proc: Any, mean: tuple[float, ...], std: tuple[float, ...]
) -> tuple[tuple[float, ...], tuple[float, ...], str]:
    """The image processor's mean, std (``mean`` and ``std`` when it gives none) and resampling filter."""
    if proc is not None and getattr(proc, "image_mean", None) and getattr(proc, "image_std", None):
        mean = tuple(float(v) for v in proc.image_mean)
        std = tuple(float(v) for v in proc.image_std)
    resample = getattr(proc, "resample", None)
    filters = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
    return mean, std, filters.get(int(resample), "bilinear") if resample is not None else "bilinear"


def _processor(where: str) -> Any:
    """The image processor saved beside a model, or None."""
    try:
        import transformers

        return transformers.AutoImageProcessor.from_pretrained(where)
    except (OSError, ValueError, KeyError):
        return None


def _preprocessing(built: Built, where: str, config: Any) -> None:
    """Input size, resize mode, mean and std from the image processor's config (defaults: ImageNet, 224)."""
    proc = _processor(where)
    p = built.preprocess
    crop, resize_size, resize = p.crop_size, p.resize_size, p.resize
    size = _sizes(getattr(proc, "size", None))
    crop_to = _sizes(getattr(proc, "crop_size", None))
    do_crop = bool(getattr(proc, "do_center_crop", False)) and bool(crop_to)
    crop_pct = getattr(proc, "crop_pct", None)

    def square(d: dict[str, Any], what: str) -> int:
        return _square(d, what, where)

    longest, multiple, rounding = None, 1, "ceil"
    if "height" in size and "width" in size:  # resized straight to H x W (ViT, DeiT: 256, then crop 224)
        resize_size = square(size, "size")
        crop = square(crop_to, "crop_size") if do_crop else resize_size
        resize = "squash"
        if getattr(proc, "ensure_multiple_of", None):  # DPT: each side to a multiple, aspect kept or not
            multiple, rounding = int(proc.ensure_multiple_of), "round"
            resize = "fit" if getattr(proc, "keep_aspect_ratio", False) else "squash"
    elif "shortest_edge" in size:
        edge = int(size["shortest_edge"])
        if crop_pct is not None and not crop_to:
            # ConvNeXt: below 384, the shorter side to int(edge / crop_pct) and the centre edge x edge;
            # from 384, the photo is squashed to edge x edge, no crop.
            if edge < 384:
                crop, resize_size, resize = edge, int(edge / float(crop_pct)), "crop"
            else:
                crop = resize_size = edge
                resize = "squash"
        elif do_crop:  # CLIP: the shorter side to edge, then the centre crop
            crop, resize_size, resize = square(crop_to, "crop_size"), edge, "crop"
        else:  # the shorter side to edge, aspect kept, the longer capped: the whole photo
            crop = resize_size = edge
            resize = "shorter"
            longest = int(size["longest_edge"]) if size.get("longest_edge") else None
            multiple = int(getattr(proc, "size_divisor", 0) or 1)  # Mask(2)Former: sides rounded up
    elif getattr(config, "image_size", None):
        side = config.image_size
        crop = resize_size = int(side[0] if isinstance(side, (list, tuple)) else side)
        resize = "squash"
    mean, std, interpolation = _normalisation(proc, p.mean, p.std)
    built.preprocess = Preprocess(
        crop_size=crop,
        resize_size=resize_size,
        mean=mean,
        std=std,
        resize=resize,
        interpolation=interpolation,
        crop_round="floor",  # transformers' center_crop: (height - crop) // 2
        longest=longest,
        multiple=multiple,
        multiple_rounding=rounding,
    )
