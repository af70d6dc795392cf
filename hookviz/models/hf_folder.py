"""What a ``--model hf:DIR`` folder must hold before transformers reads it, each refused in one line (exit 3)
where it is missing or broken: a folder (not a file), its ``config.json``, weights files that are whole, a
classification head where hookviz explains a classifier, a tokenizer where prompts are read.

transformers' own errors for these name a symptom (``Should have a model_type key``, ``Error while
deserializing header``) or nothing at all (a random head, an empty tokenizer): these checks name the folder's
problem and what to save into it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hookviz.errors import WeightsError, first_line

#: What ``save_pretrained`` writes into a classifier's folder (what the refusals name).
_SAVED = "config.json (the architecture), model.safetensors (the weights) and preprocessor_config.json"
#: A tokenizer's vocabulary, one of which a folder holds when its tokenizer was saved beside the model.
_VOCABULARY = ("tokenizer.json", "vocab.json", "vocab.txt")


def local(where: str) -> Path | None:
    """The local path ``where`` names, or None for a hub id (nothing there)."""
    path = Path(where).expanduser()
    return path if path.exists() else None


def check_folder(where: str) -> None:
    """Refuse, in one line, a local ``hf:`` path that is no model folder: a file, a folder without
    ``config.json``, a weights file cut short or corrupt (a hub id passes: the hub decides).

    Raises:
        WeightsError: one of those, naming what the folder should hold.
    """
    path = local(where)
    if path is None:
        return
    if not path.is_dir():
        raise WeightsError(
            f"hf:{where} is a file, not a folder; give the folder save_pretrained wrote ({_SAVED})"
        )
    if not (path / "config.json").is_file():
        raise WeightsError(
            f"hf:{where}: no config.json in the folder; give the folder save_pretrained wrote ({_SAVED})"
        )
    for file in sorted(path.glob("*.safetensors")):
        check_safetensors(file)


def check_safetensors(file: Path) -> None:
    """Refuse a ``.safetensors`` file whose header cannot be read or whose data it does not cover (a copy
    cut short): opening it reads only the header.

    Raises:
        WeightsError: the file is corrupt or truncated.
    """
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt"):
            pass
    except Exception as exc:  # SafetensorError, OSError: any failure to open it is the file's
        raise WeightsError(
            f"{file}: corrupt weights file, cut short or not safetensors ({first_line(exc)}); save or "
            "download it again"
        ) from None


def check_head(transformers: Any, config: Any, name: str, where: str) -> None:
    """Refuse, in one line, a folder whose saved model has no image-classification head (a backbone such as
    ``ViTModel``, or a vision tower alone such as ``CLIPVisionModel``): loading it as a classifier would put a
    random head on it, a different one each time.

    Raises:
        WeightsError: the saved architecture is not an image classifier.
    """
    archs = [str(a) for a in getattr(config, "architectures", None) or []]
    mapping = getattr(transformers.AutoModelForImageClassification, "_model_mapping", {})
    known = type(config) in mapping if hasattr(mapping, "__contains__") else True
    if known and (not archs or any("ForImageClassification" in a for a in archs)):
        return
    saved = archs[0] if archs else f"a {getattr(config, 'model_type', '?')} model"
    tower = "VisionModel" in saved or not known
    what = "a vision tower alone" if tower else "a backbone saved without its classification head"
    fix = (
        "save the whole image-text model (CLIPModel, SiglipModel: hookviz scores prompts with it) or a "
        "vision-language model (hookviz vlm)"
        if tower
        else f"save the folder from an image classifier ({saved.replace('Model', '')}ForImageClassification, "
        "trained or fine-tuned)"
    )
    raise WeightsError(
        f"{name}: the folder holds {saved}, {what}; hookviz explains a classifier's classes and will not "
        f"put a random head on it; {fix} (hf:{where})"
    )


def has_tokenizer(where: str) -> bool:
    """Whether a tokenizer was saved beside the model (a hub id: assumed; the hub decides)."""
    path = local(where)
    if path is None:
        return True
    return any((path / f).is_file() for f in _VOCABULARY) or any(path.glob("*.model"))


def has_processor(where: str) -> bool:
    """Whether an image processor was saved beside the model (a hub id: assumed)."""
    path = local(where)
    if path is None:
        return True
    return (path / "preprocessor_config.json").is_file() or (path / "processor_config.json").is_file()


def check_processor(name: str, where: str) -> None:
    """Refuse an image-text or vision-language folder saved without its processor: the tower's input size,
    mean and std are the processor's, and no default stands in for them.

    Raises:
        WeightsError: no ``preprocessor_config.json`` / ``processor_config.json`` in the folder.
    """
    if not has_processor(where):
        raise WeightsError(
            f"{name}: no image processor in the folder (preprocessor_config.json or processor_config.json); "
            f"its tower's input size, mean and std are the processor's: save it with "
            f"processor.save_pretrained(DIR) (hf:{where})"
        )


def guessed(name: str, where: str, mean: tuple[float, ...], std: tuple[float, ...], side: int) -> str | None:
    """The note for a classifier folder saved without its image processor (None where it has one): the
    input size, mean and std hookviz took instead, and the options that set them."""
    if has_processor(where):
        return None
    numbers = ", ".join
    return (
        f"{name}: no image processor in the folder (preprocessor_config.json): guessed {side}x{side} inputs "
        f"(the config's image_size, or 224), mean {numbers(f'{v:g}' for v in mean)} and std "
        f"{numbers(f'{v:g}' for v in std)} (ImageNet's); set them with --input-size, --mean and --std, or "
        "save the processor with processor.save_pretrained(DIR)"
    )


@contextmanager
def hub_or_cache(where: str) -> Iterator[bool]:
    """For a hub id, one quick try to reach the hub (a 2 s connection); where it cannot be reached, the hub's
    offline mode inside, so transformers reads its cache alone instead of retrying each file five times with
    a log line each (about 40 s). Yields whether the hub was found unreachable (a local folder: False).

    Skipped behind a proxy (``HTTPS_PROXY``), where a direct connection says nothing about the hub.
    """
    from huggingface_hub import constants

    if local(where) is not None or constants.is_offline_mode() or _proxied():
        yield False
        return
    url = urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname or "", url.port or 443), timeout=2).close()
    except OSError:
        before, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
        try:
            yield True
        finally:
            constants.HF_HUB_OFFLINE = before
        return
    yield False


def _proxied() -> bool:
    return any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))


def unreachable(where: str) -> str:
    """The one line for a hub id neither reachable nor cached."""
    return (
        f"hf:{where} is no local folder, the hub cannot be reached (offline?) and it is not in the cache; "
        "give a folder save_pretrained wrote, or load it once online"
    )
