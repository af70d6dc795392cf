"""A loaded vision-language model (:class:`Vlm`), the processor's inputs for photos and a prompt, and the
answer to explain: given (its tokens checked) or generated greedily (photos of a batch together where the
family's prompts have one length)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hookviz.errors import InputError, SetupError, UsageError, WeightsError, first_line
from hookviz.models.hf import quiet
from hookviz.models.hf_folder import check_folder, hub_or_cache, unreachable
from hookviz.vlm.families import HF, Family, family_of, not_a_vlm, processed


@dataclass
class Vlm:
    """A loaded vision-language model, its processor and family."""

    model: HF
    processor: Any
    family: Family
    name: str
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: The attention implementation the model runs with (it was loaded with it): what :func:`eager` puts
    #: back after a pass that reads attention weights (the model's own attribute is not read or written).
    attention: str = "sdpa"


def load_vlm(spec: str, device: str = "cpu") -> Vlm:
    """``hf:DIR`` (a folder ``save_pretrained`` wrote: config, weights, processor) or a hub id, loaded
    with its processor, whose tokenizer is checked to know the model's image token.

    Raises:
        UsageError: not a folder, or not a vision-language model hookviz knows (one line naming those
            it knows).
        SetupError: nothing loadable there, no image processor or tokenizer beside the model, or a tokenizer
            that is not the model's.
    """
    import transformers

    if tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 15):
        raise SetupError(
            f"hookviz vlm needs transformers 5.15 or newer (found {transformers.__version__}): "
            "pip install 'hookviz[vlm]'"
        )
    where = spec[3:] if spec.startswith("hf:") else spec
    if spec.startswith("hf:") and not Path(where).expanduser().is_dir() and Path(where).expanduser().exists():
        raise UsageError(f"--model {spec}: not a folder; give a folder save_pretrained wrote, or a hub id")
    check_folder(where)  # a folder without config.json, a weights file cut short: one line, exit 3
    with quiet(transformers), hub_or_cache(where) as offline:
        _check_kind(transformers, spec, where, offline)
        processor = _processor(transformers, spec, where)
        model, attention = _loaded(transformers, spec, where)
    family = family_of(model)
    target = torch.device(device if device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    vlm = Vlm(model.eval().to(target), processor, family, Path(where).name or where, target, attention)
    _check_tokenizer(vlm, spec, where)
    return vlm


#: Files a saved tokenizer writes (one of them is there where the folder holds a tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
#: Files a saved image processor writes (the processor's own config holds it in transformers 5).
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
_SAVE = "save the model's own processor beside it with processor.save_pretrained(DIR)"


def _loaded(transformers: Any, spec: str, where: str) -> tuple[HF, str]:
    """The model with its attention implementation named at loading (``sdpa``, transformers' own default; a
    model without it takes ``eager``), so hookviz knows what to restore after an eager pass."""
    auto = transformers.AutoModelForImageTextToText
    try:
        try:
            return auto.from_pretrained(where, attn_implementation="sdpa"), "sdpa"
        except ValueError as exc:
            if "sdpa" not in str(exc).lower():
                raise
            return auto.from_pretrained(where, attn_implementation="eager"), "eager"
    except (OSError, ValueError) as exc:
        raise SetupError(f"--model {spec}: cannot load a vision-language model ({first_line(exc)})") from None


def _check_kind(transformers: Any, spec: str, where: str, offline: bool = False) -> None:
    """Read the model's config first (before its processor and weights): a model that is not an
    image-text-to-text model is refused from it.

    Raises:
        UsageError: not a vision-language model (one line naming the families ``hookviz vlm`` knows).
        SetupError: no config to read there (a hub id offline and not cached: said so).
    """
    from transformers.models.auto import modeling_auto

    try:
        kind = getattr(transformers.AutoConfig.from_pretrained(where), "model_type", None)
    except (OSError, ValueError, KeyError) as exc:
        if offline:
            raise WeightsError(unreachable(where)) from None
        raise SetupError(f"--model {spec}: cannot load a vision-language model ({first_line(exc)})") from None
    if kind and kind not in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise UsageError(f"--model {spec}: {not_a_vlm(str(kind))}")


def _processor(transformers: Any, spec: str, where: str) -> Any:
    """The processor saved beside the model (its image processor and tokenizer).

    Raises:
        SetupError: it cannot be loaded: one line naming the part missing from the folder where it can tell.
    """
    try:
        processor = transformers.AutoProcessor.from_pretrained(where)
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        missing = _missing(where)
        if missing:
            raise SetupError(_absent(spec, missing)) from None
        raise SetupError(f"--model {spec}: cannot load its processor ({first_line(exc)}); {_SAVE}") from None
    for part in ("image_processor", "tokenizer"):
        if getattr(processor, part, None) is None:
            raise SetupError(_absent(spec, {part.replace("_", " "): ()}))
    return processor


def _missing(where: str) -> dict[str, tuple[str, ...]]:
    """The parts of a processor a local folder lacks, each with the files it would have been read from
    (none known for a hub id)."""
    folder = Path(where).expanduser()
    if not folder.is_dir():
        return {}
    parts = {"image processor": IMAGE_PROCESSOR_FILES, "tokenizer": TOKENIZER_FILES}
    return {
        what: files[:2] for what, files in parts.items() if not any((folder / f).is_file() for f in files)
    }


def _absent(spec: str, missing: dict[str, tuple[str, ...]]) -> str:
    """One line: the processor's parts missing beside the model, and the fix."""
    files = [f for fs in missing.values() for f in fs]
    held = f" (the folder holds no {' or '.join(files)})" if files else ""
    return f"--model {spec}: no {' and no '.join(missing)} beside the model{held}; {_SAVE}"


def _check_tokenizer(vlm: Vlm, spec: str, where: str) -> None:
    """The tokenizer reads the model's image token as the model's image token id (a folder without a
    tokenizer can still load an empty one, which knows nothing).

    Raises:
        SetupError: it does not: no tokenizer beside the model, or one that is not the model's.
    """
    tokenizer, image = vlm.processor.tokenizer, vlm.family.image_token(vlm.model)
    word = _image_word(vlm)  # what the processor writes into the prompt for the photo, once per token
    token = tokenizer.convert_ids_to_tokens(image) if image < len(tokenizer) else None
    reads = tokenizer(word, add_special_tokens=False)["input_ids"]
    if isinstance(token, str) and reads == [image]:
        return
    missing = {k: v for k, v in _missing(where).items() if k == "tokenizer"}
    if missing:
        raise SetupError(_absent(spec, missing))
    raise SetupError(
        f"--model {spec}: its tokenizer does not know the model's image token (id {image}; it reads "
        f"{word!r} as {reads[:4]}): the tokenizer is not the model's; {_SAVE}"
    )


@contextmanager
def eager(vlm: Vlm) -> Iterator[None]:
    """The model on eager attention inside (its layers return their attention weights), through the public
    ``set_attn_implementation``; ``vlm.attention`` again on exit."""
    vlm.model.set_attn_implementation("eager")
    try:
        yield
    finally:
        vlm.model.set_attn_implementation(vlm.attention)


@dataclass
class Answer:
    """The prompt and the answer as token ids ``(1, L)``; the answer's tokens start at ``start``."""

    ids: Tensor
    start: int
    tokens: list[str]
    token_ids: list[int]
    text: str = ""
    probs: list[float] = field(default_factory=list)
    generated: bool = False


def encode(vlm: Vlm, rgb: np.ndarray, prompt: str) -> dict[str, Any]:
    """The processor's inputs for one photo and the prompt (see :func:`prompt_text`).

    Raises:
        UsageError: the prompt has no image token and the processor no chat template, or several.
        InputError: the processor cannot take this photo (the others may go on).
    """
    return encode_batch(vlm, [rgb], prompt)


def encode_batch(vlm: Vlm, photos: list[np.ndarray], prompt: str) -> dict[str, Any]:
    """The processor's inputs for ``photos``, each with the prompt (one photo: :func:`encode`).

    Raises:
        UsageError: see :func:`prompt_text`. InputError: the processor cannot take a photo.
    """
    text = prompt_text(vlm, prompt)
    try:
        encoded = dict(processed(vlm.processor, images=vlm.family.images([np.array(p) for p in photos]),
                                 text=[text] * len(photos), return_tensors="pt"))  # fmt: skip
    except ValueError as exc:  # the processor refuses the photo (Qwen2-VL: an aspect ratio over 200)
        h, w = photos[0].shape[:2]
        said = first_line(exc)
        raise InputError(f"a photo of {w}x{h} pixels: the processor cannot take it ({said})") from None
    return {k: v.to(vlm.device) if isinstance(v, Tensor) else v for k, v in encoded.items()}


def prompt_text(vlm: Vlm, prompt: str) -> str:
    """The text the processor is handed: the chat template's where the processor has one and the prompt
    holds no image token; else the prompt as given, which must hold the image token.

    Raises:
        UsageError: the prompt has no image token and the processor no chat template, or several.
    """
    token = vlm.processor.tokenizer.convert_ids_to_tokens(vlm.family.image_token(vlm.model))
    held = max(prompt.count(w) for w in {_image_word(vlm), str(token)})
    if held > 1:
        raise UsageError(
            f"--prompt {prompt!r} holds {held} image tokens; hookviz vlm explains one photo per prompt: put "
            f"{_image_word(vlm)} in it once"
        )
    text = prompt
    if _image_word(vlm) not in prompt and token not in prompt:
        if getattr(vlm.processor, "chat_template", None):
            chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
            text = vlm.processor.apply_chat_template(chat, add_generation_prompt=True)
        else:
            raise UsageError(
                f"--prompt {prompt!r} holds no image token and the processor has no chat template: put "
                f"{_image_word(vlm)} where the photo goes"
            )
    return str(text)


def _image_word(vlm: Vlm) -> str:
    return str(getattr(vlm.processor, "image_token", None) or "<image>")


#: The photo :func:`check_encodes` hands the processor: mid-grey, a common shape.
PROBE = np.full((48, 64, 3), 128, np.uint8)


def check_encodes(vlm: Vlm, prompt: str) -> None:
    """The processor makes the model's inputs of a plain photo and ``prompt``, and the placement of its
    image tokens is measured: checked once before any photo, so that a broken processor (a PaliGemma one
    without ``image_seq_length``, a tokenizer that splits the image token) is said once about the folder,
    never per photo.

    Raises:
        UsageError: see :func:`prompt_text`. SetupError: the processor fails on the plain photo.
    """
    try:
        encoded = encode(vlm, PROBE, prompt)
        vlm.family.placement(vlm.model, vlm.processor, encoded, PROBE.shape[:2])
    except (InputError, ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError) as exc:
        said = str(exc) if isinstance(exc, InputError) else f"{type(exc).__name__}: {first_line(exc)}"
        raise SetupError(
            f"{vlm.name}: its processor cannot make the model's inputs of a plain 64x48 photo and the "
            f"prompt ({said}); check that the processor and tokenizer beside the model are the model's "
            "own (processor.save_pretrained(DIR))"
        ) from None


def answer_of(
    vlm: Vlm,
    encoded: dict[str, Any],
    answer: str | None,
    max_new_tokens: int = 16,
    generated: list[int] | None = None,
) -> Answer:
    """The answer given (its tokens checked), ``generated`` (token ids made by :func:`generate`), or
    generated greedily here, after the prompt.

    Raises:
        UsageError: ``answer`` is empty, has a word the tokenizer does not know, or reads back as other text.
        InputError: the model answered nothing.
    """
    tokenizer = vlm.processor.tokenizer
    prompt = encoded["input_ids"][:1]
    if answer is not None:
        new = given_ids(vlm, answer)
    else:
        new = generated if generated is not None else generate(vlm, encoded, max_new_tokens)[0]
        if not new:
            raise InputError("the model answered nothing (its first token ends the answer)")
    ids = torch.cat([prompt, torch.tensor([new], device=prompt.device)], dim=1)
    tokens = [tokenizer.decode([t]) for t in new]
    said = " ".join(tokenizer.decode(new, skip_special_tokens=True).split())
    return Answer(ids, prompt.shape[1], tokens, list(new), said, generated=answer is None)


def generate(vlm: Vlm, encoded: dict[str, Any], max_new_tokens: int = 16) -> list[list[int]]:
    """Each prompt's answer of ``encoded`` (one or a batch of prompts of one length), greedy, as token ids
    up to its first end (end of sequence or padding)."""
    tokenizer = vlm.processor.tokenizer
    with torch.no_grad():
        out = vlm.model.generate(
            **encoded,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            suppress_tokens=[vlm.family.image_token(vlm.model)],  # an answer never holds the photo
        )
    ends = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    answers = []
    for row in out[:, encoded["input_ids"].shape[1] :].tolist():
        answers.append(row[: next((i for i, t in enumerate(row) if t in ends), len(row))])
    return answers


def given_ids(vlm: Vlm, answer: str) -> list[int]:
    """``--answer``'s token ids, checked.

    Raises:
        UsageError: ``answer`` is empty, has a word the tokenizer does not know, holds the image token, or
            reads back as other text.
    """
    if not answer.strip():
        raise UsageError(empty_answer(answer))
    tokenizer = vlm.processor.tokenizer
    new: list[int] = tokenizer(answer, add_special_tokens=False)["input_ids"]
    unknown = tokenizer.unk_token_id
    if not new or (unknown is not None and unknown in new):
        words = [w for w in answer.split() if unknown in tokenizer(w, add_special_tokens=False)["input_ids"]]
        raise UsageError(
            f"--answer {answer!r}: the tokenizer does not know {words[0] if words else answer!r}"
        )
    if vlm.family.image_token(vlm.model) in new:
        raise UsageError(f"--answer {answer!r}: holds the image token; give the answer's words alone")
    if " ".join(tokenizer.decode(new).split()) != " ".join(answer.split()):
        raise UsageError(
            f"--answer {answer!r}: the tokenizer reads it back as {tokenizer.decode(new)!r}; give the "
            "answer as the model would write it"
        )
    return new


def empty_answer(answer: str) -> str:
    """What is wrong with an empty ``--answer``."""
    return (
        f"--answer {answer!r}: an empty answer has no words to explain; give the answer's words, or leave "
        "--answer out to generate one"
    )


def forced(encoded: dict[str, Any], answer: Answer) -> dict[str, Any]:
    """The processor's inputs with the answer appended (per-token fields extended to its length)."""
    n, total = answer.start, answer.ids.shape[1]
    out = {}
    for key, value in encoded.items():
        if key == "input_ids":
            out[key] = answer.ids
        elif isinstance(value, Tensor) and value.dim() == 2 and value.shape == (1, n):
            fill = 1 if key == "attention_mask" else 0
            out[key] = torch.cat([value, value.new_full((1, total - n), fill)], dim=1)
        else:
            out[key] = value
    return out
