"""Scores other than a class: how similar a photo is to a reference photo, or to a sentence (CLIP, SigLIP).

Each is a model whose output is the scores, so every method, ``evaluate`` and ``sanity`` explain them as they
explain classes: :class:`Similarity` gives ``(B, 1)``, the cosine similarity of each photo's embedding to
the reference's; :class:`ImageText` gives ``(B, P)``, each photo's similarity to each of ``P`` prompts.

Both present the wrapped model's modules under their own names (``layer4`` stays ``layer4``) and are left as
they were found: the embedding is read by a hook that lives for one forward call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.hooks import HookGroup, ModuleCall, first_tensor, logits_of, preserved
from hookviz.errors import LayerError, SetupError, UsageError
from hookviz.io.images import load_rgb
from hookviz.models import towers
from hookviz.models.facade import Facade
from hookviz.models.loaded import LoadedModel, num_classes, probe


def _pool(t: Tensor) -> Tensor:
    """An embedding vector ``(B, D)`` from a layer's output: as is when 2-D, averaged over tokens (3-D) or
    positions (4-D, channels first)."""
    if t.dim() == 2:
        return t
    if t.dim() == 3:
        return t.mean(dim=1)
    if t.dim() == 4:
        return t.mean(dim=(2, 3))
    return t.flatten(1)


class Similarity(Facade):
    """``(B, 1)``: the cosine similarity of each photo's embedding (``embedding(x)`` ``(B, D)``) to the
    reference's (:attr:`reference`, set by :func:`similar_to`)."""

    #: What the records report for a score (see :func:`hookviz.core.readout.read`): the cosine itself.
    score_kind = "identity"
    reference: Tensor

    def __init__(self, model: nn.Module, embedding: Callable[[Tensor], Tensor]) -> None:
        super().__init__(model)
        self._embedding = (embedding,)
        self.register_buffer("reference", torch.zeros(0), persistent=False)

    def embedding(self, x: Tensor) -> Tensor:
        return self._embedding[0](x)

    def forward(self, x: Tensor) -> Tensor:
        e = self.embedding(x)
        return F.cosine_similarity(e.float(), self.reference.float()[None], dim=1)[:, None]


class ReadAt:
    """``x → (B, D)``: the input (``stage="input"``) or output of module ``name`` in a forward pass of
    ``model``, as a vector (see :func:`_pool`); the hook lives for the call alone. A plain object (no
    closure), so a deep copy of a :class:`Similarity` reads its own copy of the model (the sanity check)."""

    def __init__(self, model: nn.Module, name: str, stage: str) -> None:
        self.model, self.name, self.stage = model, name, stage

    def __call__(self, x: Tensor) -> Tensor:
        got: list[Tensor] = []
        module = dict(self.model.named_modules())[self.name]
        with HookGroup() as hooks:
            if self.stage == "input":
                hooks.add(module.register_forward_pre_hook(lambda m, args: got.append(args[0])))
            else:
                hooks.add(module.register_forward_hook(lambda m, args, out: got.append(_first(out))))
            self.model(x)
        if not got:
            raise LayerError(f"--embedding {self.name}: the layer did not run; pick another layer")
        return _pool(got[-1])


def _first(out: Any) -> Tensor:
    """A module's output as one tensor: itself, its first element, or a model output's logits."""
    t = first_tensor(out)
    return t if t is not None else logits_of(out)


def head_of(calls: Sequence[ModuleCall], classes: int) -> str | None:
    """The classifier head: the last ``Linear`` to run whose output is the ``(1, classes)`` scores."""
    heads = [c for c in calls if c.calls and c.type == "Linear" and c.output_shape == (1, classes)]
    return max(heads, key=lambda c: c.order).name if heads else None


def similar_to(
    loaded: LoadedModel,
    reference: str | Path,
    embedding: str | None = None,
    *,
    calls: Sequence[ModuleCall] | None = None,
    max_pixels: int | None = None,
) -> LoadedModel:
    """``loaded`` scoring each photo by its similarity to the photo ``reference``.

    The embedding is the input of the classifier head (its last ``Linear``), an image-text model's image
    embedding, or the output of ``embedding`` (a layer name), averaged over positions or tokens.

    Raises:
        UsageError: an unreadable reference, a model without a head found (a detector's or segmenter's
            task refuses it first: :func:`hookviz.tasks.api.with_options`).
        LayerError: an unknown embedding layer.
    """

    path = Path(reference)
    try:
        rgb = load_rgb(path) if max_pixels is None else load_rgb(path, max_pixels)
    except Exception as exc:
        raise UsageError(f"--similar-to {path}: cannot read it as an image ({exc})") from None
    if isinstance(loaded.model, ImageTextSource):
        source = loaded.model.wrapped
        what = "image embedding"
        wrapper = Similarity(source, loaded.model.forward)
    else:
        source = loaded.model
        if embedding is not None:
            if embedding not in dict(source.named_modules()):
                raise LayerError(
                    f"--embedding {embedding!r}: no such layer in {loaded.name} (see hookviz layers)"
                )
            name, stage = embedding, "output"
        else:
            head = head_of(calls if calls is not None else probe(loaded), num_classes(loaded))
            if head is None:
                raise UsageError(
                    f"--similar-to: {loaded.name} has no Linear head to read the embedding from; name the "
                    "layer with --embedding LAYER"
                )
            name, stage = head, "input"
        what = f"{name}:{stage}"
        wrapper = Similarity(source, ReadAt(source, name, stage))
    x = torch.from_numpy(loaded.preprocess(rgb)[0])[None].to(loaded.device)
    with torch.no_grad(), preserved(source):
        source.eval()
        wrapper.reference = wrapper.embedding(x)[0].detach()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return _replace(loaded, wrapper, (f"similarity to {path.name}",), f"similar-to:{digest}:{what}")


def _replace(
    loaded: LoadedModel, model: nn.Module, categories: tuple[str, ...], labels_id: str
) -> LoadedModel:
    return dataclasses.replace(loaded, model=model, categories=categories, labels_id=labels_id)


class ImageText(Facade):
    """``(B, P)``: an image-text model's (CLIP, SigLIP) ``scale · cos(image, prompt) + bias`` for each of
    ``P`` prompts, whose text embeddings are computed once. Its modules keep the model's names."""

    score_kind = "softmax"
    texts: Tensor

    def __init__(
        self, model: nn.Module, image_features: Callable[[Tensor], Tensor], texts: Tensor, scale: float,
        bias: float,
    ) -> None:  # fmt: skip
        super().__init__(model)
        self._features = (image_features,)
        self.register_buffer("texts", F.normalize(texts.float(), dim=-1), persistent=False)
        self.scale, self.bias = scale, bias

    def image_features(self, x: Tensor) -> Tensor:
        return self._features[0](x)

    def forward(self, x: Tensor) -> Tensor:
        image = F.normalize(self.image_features(x).float(), dim=-1)
        return self.scale * image @ self.texts.T + self.bias


def _pooled(out: Any) -> Tensor:
    """An embedding from ``get_image_features`` / ``get_text_features``: a tensor, or (transformers 5) the
    output's projected ``pooler_output``."""
    return out if isinstance(out, Tensor) else out.pooler_output


class ImageTextSource(Facade):
    """An image-text model (``CLIPModel``, ``SiglipModel``) as loaded, before any prompt: its output is the
    image embedding ``(B, D)`` (so ``featuremaps``, ``layers`` and ``summary`` see its image tower);
    :func:`with_prompts` makes it score prompts."""

    def __init__(self, model: nn.Module, tokenizer: Any, kind: str) -> None:
        super().__init__(model)
        self._tokenizer = (tokenizer,)
        self.kind = kind

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer[0]

    @property
    def scores_prompts(self) -> bool:
        """Whether it embeds text too (CLIP, SigLIP), so prompts can be scored; a generative vision-language
        model (LLaVA, PaliGemma, ...) does not."""
        return callable(getattr(self.wrapped, "get_text_features", None))

    def forward(self, x: Tensor) -> Tensor:
        return towers.image_features(self.wrapped, self.kind, x)


def needs_prompts(loaded: LoadedModel) -> bool:
    """Whether ``loaded`` is an image-text model that has no prompts (or reference photo) yet."""
    return isinstance(loaded.model, ImageTextSource)


def with_prompts(loaded: LoadedModel, prompts: Sequence[str]) -> LoadedModel:
    """``loaded`` (an image-text model) scoring each photo by its similarity to each prompt; the prompts are
    its classes (``top1`` is the best-matching prompt, captions and records name them).

    Raises:
        UsageError: not an image-text model. SetupError: no tokenizer beside it.
    """
    source = loaded.model
    if not isinstance(source, ImageTextSource):
        raise UsageError(
            f"--prompt needs an image-text model (CLIP, SigLIP: --model hf:DIR); {loaded.name} is not one"
        )
    if not source.scores_prompts:
        raise _generative(loaded, source)
    if source.tokenizer is None:
        raise SetupError(
            f"--prompt: {loaded.name} has no tokenizer beside it, so its prompts cannot be read; save it "
            "into the model's folder (processor.save_pretrained(DIR) or tokenizer.save_pretrained(DIR))"
        )
    model = source.wrapped
    padding = "max_length" if source.kind.startswith("siglip") else True
    notes = _truncated(source.tokenizer, prompts)
    encoded = source.tokenizer(list(prompts), padding=padding, truncation=True, return_tensors="pt")
    encoded = {k: v.to(loaded.device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")}
    with torch.no_grad(), preserved(model):
        model.eval()
        texts = _pooled(model.get_text_features(**encoded))  # type: ignore[operator]
        scale = float(model.logit_scale.exp())  # type: ignore[operator]
        bias = float(model.logit_bias) if getattr(model, "logit_bias", None) is not None else 0.0  # type: ignore[arg-type]
    wrapper = ImageText(model, source.forward, texts.detach(), scale, bias)
    # A JSON list: a prompt holding a newline is not two prompts (and gets another settings key).
    digest = hashlib.sha256(json.dumps(list(prompts)).encode()).hexdigest()[:12]
    replaced = _replace(loaded, wrapper, tuple(prompts), f"prompts:{digest}")
    return dataclasses.replace(replaced, notes=replaced.notes + notes)


def _generative(loaded: LoadedModel, source: ImageTextSource) -> UsageError:
    """The refusal of class or prompt scores from a generative vision-language model."""
    return UsageError(
        f"{loaded.name} is a vision-language model ({towers.family(source.kind)}) whose output here is its "
        "image embedding, not class or prompt scores: use hookviz vlm for its maps per answer word, and "
        "layers, summary, featuremaps or sae for its vision tower"
    )


def _truncated(tokenizer: Any, prompts: Sequence[str]) -> tuple[str, ...]:
    """Notes naming the prompts longer than the tokenizer's limit (the model reads only their start), where
    each is cut, and the prompts that are the same once cut (their scores are equal)."""
    limit = getattr(tokenizer, "model_max_length", None)
    if not isinstance(limit, int) or limit > 100_000:
        return ()
    with _quiet_transformers():  # its own warning says less than the notes below
        ids = [list(i) for i in tokenizer(list(prompts), truncation=False)["input_ids"]]
    long = [(p, len(i), i) for p, i in zip(prompts, ids, strict=True) if len(i) > limit]
    if not long:
        return ()
    p, n, first = long[0]
    decode = getattr(tokenizer, "decode", None)
    kept = decode(first[:limit], skip_special_tokens=True) if callable(decode) else None
    where = f", cut after {str(kept)[-40:]!r}" if kept else ""
    notes = [
        f"{len(long)} prompt(s) are longer than the text model's {limit} tokens and are cut to their first "
        f"{limit} (the model reads no more), e.g. {p[:60]!r}... ({n} tokens{where}); shorten them"
    ]
    seen: dict[tuple[Any, ...], int] = {}
    for k, i in enumerate(ids):
        cut = tuple(i[:limit])
        if cut in seen and prompts[seen[cut]] != prompts[k]:
            notes.append(
                f"prompts {seen[cut] + 1} and {k + 1} differ only past the {limit}-token limit: the model "
                "reads them as one, so their scores and maps are equal"
            )
        seen.setdefault(cut, k)
    return tuple(notes)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def from_options(
    loaded: Any,
    prompt: list[str] | None,
    prompts_file: Path | None,
    reference: Path | None,
    embedding: str | None,
) -> Any:
    """``loaded`` explaining prompts (``prompt``, lines of ``prompts_file``) or a similarity to a photo
    instead of classes, as the command line asked; an image-text model without a prompt is refused."""
    texts = [p for p in (prompt or []) if p.strip()]
    if prompts_file is not None:
        try:
            texts += [line.strip() for line in prompts_file.read_text().splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--prompts {prompts_file}: cannot read it ({exc})") from None
        if not texts:
            raise UsageError(f"--prompts {prompts_file}: no prompt in it (one per line)")
    if embedding is not None and reference is None:
        raise UsageError("--embedding names the embedding of --similar-to; give --similar-to too")
    if texts and reference is not None:
        raise UsageError("--similar-to and --prompt: explain prompts or a similarity, not both in one run")
    if texts:
        return with_prompts(loaded, texts)
    if reference is not None:
        return similar_to(loaded, reference, embedding)
    if isinstance(loaded.model, ImageTextSource) and not loaded.model.scores_prompts:
        raise _generative(loaded, loaded.model)
    if needs_prompts(loaded):
        raise UsageError(
            f"{loaded.name} is an image-text model: give --prompt TEXT (repeatable) or --prompts FILE, or "
            "--similar-to PHOTO"
        )
    return loaded
