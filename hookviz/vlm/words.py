"""What a generative vision-language model looked at for each word of its answer.

The answer is generated (greedy) or given (teacher-forced); then one forward pass over the prompt and the
answer keeps the graph, and each answer token's logit is explained from it, one backward pass per token
reusing the one graph. The methods:

- ``attention``: the attention of the position that predicts the token to the image tokens, the mean over
  the heads and the decoder layers (or ``layer``'s alone); an eager-attention pass of its own (the model's
  attention implementation is restored after it).
- ``llavacam``: Grad-CAM on a decoder layer's output at the image tokens (LLaVA-CAM): the channel weights are
  the token logit's gradient averaged over the image tokens, the map the ReLU of the weighted sum.
- ``towercam``: the same at the image tokens as the language model receives them (the vision tower's output
  after the projector): the vision side's Grad-CAM against the token's logit.
- ``tokengrad``: the size (L2 norm) of the token logit's gradient at each image token of the same decoder
  layer's output as LLaVA-CAM: how much each image token's state moves the word. On the test suite's trained
  LLaVA it points best of the four (Grad-CAM's channel-mean weights, over image tokens whose states the
  decoder reads through a norm, mostly do not).
- ``logitlens``: the word's logit read from each image token's final state (the decoder's last normalised
  hidden state through the output head): what each image token already "says". It is the activation map TAM
  starts from.
- ``tam``: the Token Activation Map: the logit lens, less the interference of the earlier words (estimated
  causal inference), denoised by a rank Gaussian filter (:mod:`hookviz.vlm.tam`).
- ``relevancy``: Chefer's rule through the decoder: starting from the identity, each layer adds its
  gradient-weighted attention (the heads' mean of ``ReLU(grad * attention)``) rolled out over the relevance so
  far, ``R += A @ R``; the predicting position's row at the image tokens, carried on through the vision
  tower's own rolled-out relevance where the tower makes a token per patch (LLaVA, PaliGemma), as
  LVLM-Interpret does. Eager attention, kept with its graph, for this pass alone: memory grows with layers x
  heads x length squared.

Each map is a score per image token (:class:`hookviz.vlm.families.Placement` places the tokens on the photo).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.errors import InputError, SetupError, UsageError, first_line
from hookviz.models.hf import quiet
from hookviz.vlm.families import HF, Family, Placement, family_of, processed
from hookviz.vlm.tam import final_states, token_activation_maps

#: The methods, in the order they are drawn.
METHODS = ("attention", "tokengrad", "llavacam", "towercam", "logitlens", "tam", "relevancy")
#: Those made when none are named (relevancy's pass keeps every attention with its graph: asked for by name).
DEFAULT_METHODS = METHODS[:-1]
TITLES = {
    "tokengrad": "gradient at the image tokens",
    "attention": "attention to the image",
    "llavacam": "LLaVA-CAM",
    "towercam": "Grad-CAM on the image tokens",
    "logitlens": "the word read at the image tokens",
    "relevancy": "relevancy (gradient-weighted attention, rolled out)",
    "tam": "TAM (token activation map)",
}


@dataclass
class Vlm:
    """A loaded vision-language model, its processor and family."""

    model: HF
    processor: Any
    family: Family
    name: str
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


def load_vlm(spec: str, device: str = "cpu") -> Vlm:
    """``hf:DIR`` (a folder ``save_pretrained`` wrote: config, weights, processor) or a hub id, loaded
    with its processor.

    Raises:
        UsageError: nothing loadable there, or not a vision-language model hookviz knows.
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
    try:
        with quiet(transformers):
            processor = transformers.AutoProcessor.from_pretrained(where)
            model = transformers.AutoModelForImageTextToText.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--model {spec}: cannot load a vision-language model ({first_line(exc)})") from None
    family = family_of(model)
    target = torch.device(device if device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    return Vlm(model.eval().to(target), processor, family, Path(where).name or where, target)


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


@dataclass
class WordMaps:
    """Each method's map per answer token ``(T, N)`` (a score per image token, the views' tokens one after
    another) and where the tokens lie on the photo."""

    answer: Answer
    placement: Placement
    maps: dict[str, np.ndarray]
    layer: int
    prompt: str
    #: The teacher-forced pass's inputs and the image tokens' positions in it (what the metrics perturb).
    inputs: dict[str, Any] = field(default_factory=dict, repr=False)
    image: Tensor | None = field(default=None, repr=False)


def encode(vlm: Vlm, rgb: np.ndarray, prompt: str) -> dict[str, Any]:
    """The processor's inputs for one photo and the prompt (the chat template's where the processor has
    one and the prompt holds no image token; else the prompt as given, which must hold the image token).

    Raises:
        UsageError: the prompt has no image token and the processor no chat template, or several.
        InputError: the processor cannot take this photo (the others may go on).
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
    images = [[np.array(rgb)]] if vlm.family.name == "idefics3" else np.array(rgb)
    try:
        encoded = dict(processed(vlm.processor, images=images, text=[text], return_tensors="pt"))
    except ValueError as exc:  # the processor refuses the photo (Qwen2-VL: an aspect ratio over 200)
        h, w = rgb.shape[:2]
        said = first_line(exc)
        raise InputError(f"a photo of {w}x{h} pixels: the processor cannot take it ({said})") from None
    return {k: v.to(vlm.device) if isinstance(v, Tensor) else v for k, v in encoded.items()}


def _image_word(vlm: Vlm) -> str:
    return str(getattr(vlm.processor, "image_token", None) or "<image>")


def answer_of(vlm: Vlm, encoded: dict[str, Any], answer: str | None, max_new_tokens: int = 16) -> Answer:
    """The answer given (its tokens checked) or generated greedily, after the prompt.

    Raises:
        UsageError: ``answer`` is empty, has a word the tokenizer does not know, or reads back as other text.
    """
    if answer is not None and not answer.strip():
        raise UsageError(empty_answer(answer))
    tokenizer = vlm.processor.tokenizer
    prompt = encoded["input_ids"][:1]
    if answer is None:
        with torch.no_grad():
            out = vlm.model.generate(
                **encoded,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                suppress_tokens=[vlm.family.image_token(vlm.model)],  # an answer never holds the photo
            )
        new = out[0, prompt.shape[1] :].tolist()
        ends = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
        new = new[: next((i for i, t in enumerate(new) if t in ends), len(new))]
        if not new:
            raise InputError("the model answered nothing (its first token ends the answer)")
    else:
        new = tokenizer(answer, add_special_tokens=False)["input_ids"]
        unknown = tokenizer.unk_token_id
        if not new or (unknown is not None and unknown in new):
            words = [
                w for w in answer.split() if unknown in tokenizer(w, add_special_tokens=False)["input_ids"]
            ]
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
    ids = torch.cat([prompt, torch.tensor([new], device=prompt.device)], dim=1)
    tokens = [tokenizer.decode([t]) for t in new]
    said = " ".join(tokenizer.decode(new, skip_special_tokens=True).split())
    return Answer(ids, prompt.shape[1], tokens, list(new), said, generated=answer is None)


def empty_answer(answer: str) -> str:
    """What is wrong with an empty ``--answer``."""
    return (
        f"--answer {answer!r}: an empty answer has no words to explain; give the answer's words, or leave "
        "--answer out to generate one"
    )


def _forced(encoded: dict[str, Any], answer: Answer) -> dict[str, Any]:
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


def explain_words(
    vlm: Vlm,
    rgb: np.ndarray,
    prompt: str,
    *,
    answer: str | None = None,
    max_new_tokens: int = 16,
    methods: Sequence[str] = DEFAULT_METHODS,
    layer: int | None = None,
) -> WordMaps:
    """Each answer token's map over the image tokens, for each of ``methods`` (see the module's docstring);
    ``layer``: the decoder layer LLaVA-CAM reads and attention keeps (default: the middle one, below the
    last, for LLaVA-CAM; every layer's mean for attention)."""
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UsageError(f"--method {bad[0]}: hookviz vlm has {', '.join(METHODS)}")
    encoded = encode(vlm, rgb, prompt)
    found = answer_of(vlm, encoded, answer, max_new_tokens)
    model, lm = vlm.model, vlm.family.language_model(vlm.model)
    depth = len(lm.layers)
    if layer is not None and not -depth <= layer < depth:
        raise UsageError(f"--layer {layer}: the language model has {depth} decoder layers (0 to {depth - 1})")
    chosen = ((depth - 1) // 2 if layer is None else layer) % depth
    if {"llavacam", "tokengrad"} & set(methods) and chosen == depth - 1:
        raise UsageError(
            f"--layer {layer}: the last decoder layer's output at the image tokens reaches no answer token "
            f"(LLaVA-CAM would be zero); choose 0 to {depth - 2}"
        )
    forced = _forced(encoded, found)
    image = (found.ids[0] == vlm.family.image_token(model)).nonzero().flatten()
    placement = vlm.family.placement(model, vlm.processor, encoded, rgb.shape[:2])
    count = placement.tokens
    if len(image) < count:
        raise UsageError(f"the prompt holds {len(image)} image tokens, the photo makes {count}")
    image = image[:count]  # the first photo's
    maps: dict[str, np.ndarray] = {}
    if {"llavacam", "towercam", "tokengrad"} & set(methods):
        maps |= _gradients(model, lm, forced, found, image, chosen, methods)
    else:
        with torch.no_grad():
            _scores(found, model(**forced).logits)
    if "attention" in methods:
        maps["attention"] = _attention(model, lm, forced, found, image, layer)
    if "logitlens" in methods:
        maps["logitlens"] = _logit_lens(model, lm, forced, found, image)
    if "relevancy" in methods:
        maps["relevancy"] = _relevancy(model, lm, forced, found, image, vlm.family.tower(model))
    if "tam" in methods:
        tokenizer = vlm.processor.tokenizer
        texts = [tokenizer.decode([int(i)]) for i in found.ids[0]]
        special = set(tokenizer.all_special_ids) | {vlm.family.image_token(model)}
        maps["tam"] = token_activation_maps(
            model, lm, forced, found, image, placement.per_view, special, texts
        )
    ordered = {m: maps[m].reshape(len(found.tokens), count) for m in methods}
    return WordMaps(found, placement, ordered, chosen, prompt, forced, image)


def _scores(found: Answer, logits: Tensor) -> Tensor:
    """Each answer token's logit (differentiable) ``(T,)``; fills ``found.probs``."""
    rows = logits[0, found.start - 1 : found.ids.shape[1] - 1].float()
    picked = rows[torch.arange(len(found.token_ids)), torch.tensor(found.token_ids, device=rows.device)]
    found.probs = torch.softmax(rows.detach(), dim=-1)[
        torch.arange(len(found.token_ids)), torch.tensor(found.token_ids, device=rows.device)
    ].tolist()
    return picked


def _gradients(
    model: HF,
    lm: HF,
    forced: dict[str, Any],
    found: Answer,
    image: Tensor,
    chosen: int,
    methods: Sequence[str],
) -> dict[str, np.ndarray]:
    """LLaVA-CAM and the image tokens' Grad-CAM for every answer token: one forward, a backward each."""
    kept: dict[str, Tensor] = {}

    def embeds(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = kwargs.get("inputs_embeds")
        if x is None:
            return None
        x = x.detach().requires_grad_(True)  # the graph starts here: no parameter's gradient is needed
        kept["towercam"] = x
        return args, {**kwargs, "inputs_embeds": x}

    def hidden(module: nn.Module, args: Any, output: Any) -> None:
        kept["llavacam"] = output[0] if isinstance(output, tuple) else output

    handles = [
        lm.register_forward_pre_hook(embeds, with_kwargs=True),
        lm.layers[chosen].register_forward_hook(hidden),
    ]
    try:
        with torch.enable_grad():
            logits = model(**forced).logits
    finally:
        for h in handles:
            h.remove()
    if "towercam" not in kept:
        raise UsageError(
            "the language model was not handed the image tokens as embeddings; hookviz cannot hook it"
        )
    picked = _scores(found, logits)
    # Where each method reads: the chosen decoder layer's output, or the image tokens the decoder gets.
    where = {"llavacam": "llavacam", "tokengrad": "llavacam", "towercam": "towercam"}
    sources = sorted({where[m] for m in methods if m in where})
    grads = dict(zip(sources, _batched_grads(picked, [kept[w] for w in sources]), strict=True))
    out: dict[str, list[np.ndarray]] = {m: [] for m in methods if m in where}
    for t in range(len(found.token_ids)):
        for m in out:
            act, grad = kept[where[m]][0, image].float(), grads[where[m]][t, 0, image].float()
            if m == "tokengrad":  # the gradient's size at each image token
                out[m].append(to_numpy(grad.norm(dim=1)))
                continue
            weights = grad.mean(dim=0)  # (D,): the gradient averaged over the image tokens
            out[m].append(to_numpy(torch.relu(act @ weights)))
    return {m: np.stack(v) for m, v in out.items()}


#: Answer tokens whose backward passes run batched at once (memory grows with it: one graph's gradients each).
GRAD_BATCH = 8


def _batched_grads(picked: Tensor, inputs: list[Tensor]) -> list[Tensor]:
    """Each of ``picked``'s ``T`` values' gradient with respect to each of ``inputs``, stacked ``(T, ...)``:
    :data:`GRAD_BATCH` backward passes at a time batched into one (``is_grads_batched``: vmap over the one
    graph), or one after another where an operation of the model has no batching rule."""
    parts: list[list[Tensor]] = []
    for first in range(0, len(picked), GRAD_BATCH):
        chunk = picked[first : first + GRAD_BATCH]
        eye = torch.eye(len(picked), device=picked.device, dtype=picked.dtype)[first : first + len(chunk)]
        try:
            got = torch.autograd.grad(
                picked, inputs, grad_outputs=eye, retain_graph=True, is_grads_batched=True
            )
        except RuntimeError:  # an operation without a batching rule
            each = [torch.autograd.grad(p, inputs, retain_graph=True) for p in chunk]
            got = tuple(torch.stack([g[i] for g in each]) for i in range(len(inputs)))
        parts.append(list(got))
    return [torch.cat([p[i] for p in parts]) for i in range(len(inputs))]


def _rolled(weights: list[Tensor], grads: list[Tensor], t: int) -> Tensor:
    """Chefer's rule over layers: from the identity, ``R += mean_heads(ReLU(grad * A)) @ R`` each layer."""
    relevance = torch.eye(weights[0].shape[-1], device=weights[0].device)
    for a, g in zip(weights, grads, strict=True):
        relevance = relevance + torch.relu(g[t, 0].float() * a[0].detach().float()).mean(dim=0) @ relevance
    return relevance


def _relevancy(
    model: HF,
    lm: HF,
    forced: dict[str, Any],
    found: Answer,
    image: Tensor,
    tower: nn.Module | None,
) -> np.ndarray:
    """Each answer token's relevance of the image tokens ``(T, N)`` by Chefer's rule through the decoder and,
    where ``tower`` is given (a token per patch), on through the vision tower's own attention: the decoder's
    relevance of each image token spread over the patches by the tower's rolled-out relevance. One eager
    forward, the backward passes batched."""
    decoder: list[Tensor] = []
    vision: list[Tensor] = []

    def keeper(into: list[Tensor]) -> Callable[..., None]:
        def keep(module: nn.Module, args: Any, output: Any) -> None:
            if not isinstance(output, tuple) or len(output) < 2 or output[1] is None:
                raise UsageError("an attention returned no weights in eager mode; hookviz cannot read it")
            into.append(output[1])

        return keep

    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    handles = [block.self_attn.register_forward_hook(keeper(decoder)) for block in lm.layers]
    if tower is not None:
        handles += [
            m.register_forward_hook(keeper(vision))
            for n, m in tower.named_modules()
            if n.endswith("self_attn")
        ]
    try:
        with torch.enable_grad():
            logits = model(**forced).logits
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(before)
    picked = _scores(found, logits)
    grads = _batched_grads(picked, decoder + vision)
    extra = vision[0].shape[-1] - len(image) if vision else -1  # a CLS token before the patches
    out = []
    for t, row in enumerate(range(found.start - 1, found.ids.shape[1] - 1)):
        tokens = _rolled(decoder, grads[: len(decoder)], t)[row, image]
        if extra in (0, 1):
            tokens = tokens @ _rolled(vision, grads[len(decoder) :], t)[extra:, extra:]
        out.append(to_numpy(tokens))
    return np.stack(out)


def _logit_lens(model: HF, lm: HF, forced: dict[str, Any], found: Answer, image: Tensor) -> np.ndarray:
    """Each answer token's logit read at every image token ``(T, N)``: the decoder's final (normalised) state
    there through the output head."""
    final = final_states(model, lm, forced)
    with torch.no_grad():
        logits = model.get_output_embeddings()(final[0, image]).float()  # (N, vocabulary)
    return to_numpy(logits[:, torch.tensor(found.token_ids, device=logits.device)].T)


def _attention(
    model: HF, lm: HF, forced: dict[str, Any], found: Answer, image: Tensor, layer: int | None
) -> np.ndarray:
    """Each answer token's predicting position's attention to the image tokens ``(T, N)``: the weights each
    decoder layer's attention returns in eager mode (eager for this pass alone), taken by hooks of ours
    (``output_attentions`` would leave transformers' own recording hooks on the model)."""
    rows = torch.arange(found.start - 1, found.ids.shape[1] - 1, device=image.device)
    taken: list[Tensor] = []

    def keep(module: nn.Module, args: Any, output: Any) -> None:
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise UsageError(
                "the decoder's attention returned no weights in eager mode; hookviz cannot read it"
            )
        taken.append(weights[0][:, rows][:, :, image].float())  # (heads, T, N)

    chosen = list(lm.layers) if layer is None else [lm.layers[layer]]
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    handles = [block.self_attn.register_forward_hook(keep) for block in chosen]
    try:
        with torch.no_grad():
            model(**forced)
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(before)
    return to_numpy(torch.stack(taken).mean(dim=(0, 1)))
