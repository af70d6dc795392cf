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
Each method is one function of a :class:`TokenPass` registered with
:func:`hookviz.methods.registry.register_token_method` and what it needs of the pass; the hooks are held by
:class:`hookviz.core.hooks.HookGroup`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import HookGroup
from hookviz.errors import UsageError, close_matches
from hookviz.methods.registry import TOKEN_METHODS, register_token_method, token_method
from hookviz.vlm.families import HF, Placement
from hookviz.vlm.model import Answer, Vlm, answer_of, eager, empty_answer, encode, forced, load_vlm
from hookviz.vlm.tam import final_states, keep_final, token_activation_maps

__all__ = [
    "DEFAULT_METHODS", "METHODS", "TITLES", "Answer", "TokenPass", "Vlm", "WordMaps", "decoder_index",
    "empty_answer", "encode", "explain_words", "load_vlm",
]  # fmt: skip


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


@dataclass
class TokenPass:
    """One photo's teacher-forced pass as the token methods read it: the model, its decoder, the inputs with
    the answer appended, the answer, the image tokens' positions, the decoder layer chosen (``layer``: as
    asked, None for the default), where the tokens lie, and the methods asked for (the shared gradient pass
    runs once, for every method that needs it)."""

    vlm: Vlm
    forced: dict[str, Any]
    found: Answer
    image: Tensor
    chosen: int
    layer: int | None
    placement: Placement
    methods: tuple[str, ...]
    _kept: dict[str, tuple[Tensor, Tensor]] | None = field(default=None, repr=False)
    _final: Tensor | None = field(default=None, repr=False)

    @property
    def model(self) -> HF:
        return self.vlm.model

    @property
    def lm(self) -> HF:
        return self.vlm.family.language_model(self.vlm.model)

    def gradients(self, source: str) -> tuple[Tensor, Tensor]:
        """``(activations (1, L, D), gradients (T, 1, L, D))`` of every answer token's logit at ``source``:
        ``layer`` (the chosen decoder layer's output) or ``embeddings`` (the image tokens as the decoder
        receives them); one forward and the backward passes batched, shared by every method asked for."""
        if self._kept is None:
            wanted = {n for m in self.methods for n in token_method(m).needs}
            sources = [s for s, need in _SOURCES.items() if need in wanted]
            self._kept = _gradients(self, sources)
        return self._kept[source]

    def final(self) -> Tensor:
        """The decoder's final (normalised) states ``(1, L, D)`` over the teacher-forced sequence: kept from
        the pass that gave the answer's probabilities (the shared gradient pass, or a pass without
        gradients), so the logit lens and TAM run no pass of their own."""
        if self._final is None:
            self._final = final_states(self.model, self.lm, self.forced)
        return self._final


#: Where the shared gradient pass reads, by the need that asks for it (in the order its gradients are taken).
_SOURCES = {"layer": "layer_gradients", "embeddings": "embedding_gradients"}


def decoder_index(vlm: Vlm, given: str | int | None) -> int | None:
    """``--layer``: a decoder layer's index, or its module name or a glob naming one (``*.layers.10``).

    Raises:
        UsageError: a name or glob that names no decoder layer, or several.
    """
    if given is None or isinstance(given, int):
        return given
    text = given.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    index = {id(m): i for i, m in enumerate(vlm.family.language_model(vlm.model).layers)}
    names = {n: index[id(m)] for n, m in vlm.model.named_modules() if id(m) in index}
    found = sorted({names[n] for n in names if fnmatch.fnmatchcase(n, text)})
    if len(found) == 1:
        return found[0]
    if not found:
        listed = sorted(names, key=names.__getitem__)
        raise UsageError(
            f"--layer {given}: no decoder layer is named so{close_matches(text, listed)} (they are "
            f"{listed[0]} to {listed[-1]}); give a decoder layer's name or its index (0 to {len(listed) - 1})"
        )
    raise UsageError(
        f"--layer {given} names {len(found)} decoder layers ({found[0]} to {found[-1]}); give one"
    )


def chosen_layer(vlm: Vlm, layer: int | None, methods: Sequence[str]) -> int:
    """The decoder layer the methods that read one read: ``layer`` checked, or the middle one below the last.

    Raises:
        UsageError: no such layer; the last layer for a method that reads its output at the image tokens.
    """
    depth = len(vlm.family.language_model(vlm.model).layers)
    if layer is not None and not -depth <= layer < depth:
        raise UsageError(f"--layer {layer}: the language model has {depth} decoder layers (0 to {depth - 1})")
    chosen = ((depth - 1) // 2 if layer is None else layer) % depth
    if any(token_method(m).reads_layer for m in methods) and chosen == depth - 1:
        raise UsageError(
            f"--layer {layer}: the last decoder layer's output at the image tokens reaches no answer token "
            f"(LLaVA-CAM would be zero); choose 0 to {depth - 2}"
        )
    return chosen


def explain_words(
    vlm: Vlm,
    rgb: np.ndarray,
    prompt: str,
    *,
    answer: str | None = None,
    max_new_tokens: int = 16,
    methods: Sequence[str] = (),
    layer: int | None = None,
    encoded: dict[str, Any] | None = None,
    generated: list[int] | None = None,
    placement: Placement | None = None,
) -> WordMaps:
    """Each answer token's map over the image tokens, for each of ``methods`` (default: the registered
    defaults; see the module's docstring); ``layer``: the decoder layer LLaVA-CAM reads and attention keeps
    (default: the middle one, below the last, for LLaVA-CAM; every layer's mean for attention).
    ``encoded`` (the processor's inputs), ``placement`` (where the image tokens lie) and ``generated`` (the
    answer's token ids, generated with the others of a batch), where made already, spare the work."""
    methods = tuple(methods) or DEFAULT_METHODS
    for m in methods:
        token_method(m)
    encoded = encoded if encoded is not None else encode(vlm, rgb, prompt)
    found = answer_of(vlm, encoded, answer, max_new_tokens, generated)
    chosen = chosen_layer(vlm, layer, methods)
    inputs = forced(encoded, found)
    image = (found.ids[0] == vlm.family.image_token(vlm.model)).nonzero().flatten()
    if placement is None:
        placement = vlm.family.placement(vlm.model, vlm.processor, encoded, rgb.shape[:2])
    count = placement.tokens
    if len(image) < count:
        raise UsageError(f"the prompt holds {len(image)} image tokens, the photo makes {count}")
    p = TokenPass(vlm, inputs, found, image[:count], chosen, layer, placement, methods)  # the first photo's
    if any(token_method(m).needs & set(_SOURCES.values()) for m in methods):
        p.gradients("layer" if "layer" in _needed(methods) else "embeddings")  # fills the probabilities
    else:  # one pass without gradients: the probabilities, and the final states the logit lens reads
        kept: dict[str, Tensor] = {}
        with HookGroup() as hooks, torch.no_grad():
            hooks.add(p.lm.register_forward_hook(keep_final(kept)))
            _scores(found, vlm.model(**inputs).logits)
        p._final = kept["final"]
    maps = {m: np.asarray(token_method(m).compute(p)) for m in TOKEN_METHODS if m in methods}
    ordered = {m: maps[m].reshape(len(found.tokens), count) for m in methods}
    return WordMaps(found, placement, ordered, chosen, prompt, inputs, p.image)


def _needed(methods: Sequence[str]) -> set[str]:
    wanted = {n for m in methods for n in token_method(m).needs}
    return {s for s, need in _SOURCES.items() if need in wanted}


def _scores(found: Answer, logits: Tensor) -> Tensor:
    """Each answer token's logit (differentiable) ``(T,)``; fills ``found.probs``."""
    rows = logits[0, found.start - 1 : found.ids.shape[1] - 1].float()
    picked = rows[torch.arange(len(found.token_ids)), torch.tensor(found.token_ids, device=rows.device)]
    found.probs = torch.softmax(rows.detach(), dim=-1)[
        torch.arange(len(found.token_ids)), torch.tensor(found.token_ids, device=rows.device)
    ].tolist()
    return picked


def _gradients(p: TokenPass, sources: list[str]) -> dict[str, tuple[Tensor, Tensor]]:
    """The activations at ``sources`` and every answer token's gradient there: one forward, the backward
    passes batched (see :meth:`TokenPass.gradients`)."""
    kept: dict[str, Tensor] = {}
    final: dict[str, Tensor] = {}

    def embeds(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = kwargs.get("inputs_embeds")
        if x is None:
            return None
        x = x.detach().requires_grad_(True)  # the graph starts here: no parameter's gradient is needed
        kept["embeddings"] = x
        return args, {**kwargs, "inputs_embeds": x}

    def hidden(module: nn.Module, args: Any, output: Any) -> None:
        kept["layer"] = output[0] if isinstance(output, tuple) else output

    with HookGroup() as hooks:
        hooks.add(p.lm.register_forward_pre_hook(embeds, with_kwargs=True))
        hooks.add(p.lm.layers[p.chosen].register_forward_hook(hidden))
        hooks.add(p.lm.register_forward_hook(keep_final(final)))
        with torch.enable_grad():
            logits = p.model(**p.forced).logits
    p._final = final.get("final")
    if "embeddings" not in kept:
        raise UsageError(
            "the language model was not handed the image tokens as embeddings; hookviz cannot hook it"
        )
    picked = _scores(p.found, logits)
    grads = _batched_grads(picked, [kept[s] for s in sources])
    return {s: (kept[s], g) for s, g in zip(sources, grads, strict=True)}


def _each_token(p: TokenPass, source: str, of: Callable[[Tensor, Tensor], Tensor]) -> np.ndarray:
    """``of(activations (N, D), gradient (N, D))`` at the image tokens of ``source``, per answer token."""
    act, grads = p.gradients(source)
    image = act[0, p.image].float()
    return np.stack(
        [to_numpy(of(image, grads[t, 0, p.image].float())) for t in range(len(p.found.token_ids))]
    )


#: What the methods of the shared gradient pass cost.
SHARED = "the shared pass: one forward, a backward per token"


@register_token_method("attention", title="attention to the image", needs={"attention"},
                       cost="an eager-attention forward pass", paper="")  # fmt: skip
def attention_map(p: TokenPass) -> np.ndarray:
    return _attention(p.vlm, p.found, p.image, p.layer, p.forced)


@register_token_method("tokengrad", title="gradient at the image tokens", needs={"layer_gradients"},
                       cost=SHARED, reads_layer=True)  # fmt: skip
def token_gradient(p: TokenPass) -> np.ndarray:
    return _each_token(p, "layer", lambda act, grad: grad.norm(dim=1))  # the gradient's size at each token


@register_token_method("llavacam", title="LLaVA-CAM", needs={"layer_gradients"}, reads_layer=True,
                       cost=SHARED,
                       paper="LLaVA-CAM (Grad-CAM on a decoder layer's output)")  # fmt: skip
def llava_cam(p: TokenPass) -> np.ndarray:
    return _each_token(p, "layer", lambda act, grad: torch.relu(act @ grad.mean(dim=0)))


@register_token_method("towercam", title="Grad-CAM on the image tokens", needs={"embedding_gradients"},
                       cost=SHARED)  # fmt: skip
def tower_cam(p: TokenPass) -> np.ndarray:
    return _each_token(p, "embeddings", lambda act, grad: torch.relu(act @ grad.mean(dim=0)))


@register_token_method("logitlens", title="the word read at the image tokens", needs={"final_states"},
                       cost="a forward pass without gradients")  # fmt: skip
def logit_lens(p: TokenPass) -> np.ndarray:
    return _logit_lens(p.model, p.final(), p.found, p.image)


@register_token_method("tam", title="TAM (token activation map)", needs={"final_states", "layout"},
                       cost="a forward pass without gradients",
                       paper="Li et al., ICCV 2025 (Token Activation Map)")  # fmt: skip
def tam(p: TokenPass) -> np.ndarray:
    tokenizer = p.vlm.processor.tokenizer
    texts = [tokenizer.decode([int(i)]) for i in p.found.ids[0]]
    special = set(tokenizer.all_special_ids) | {p.vlm.family.image_token(p.model)}
    return token_activation_maps(p.model, p.final(), p.found, p.image, p.placement.per_view, special, texts)


@register_token_method("relevancy", title="relevancy (gradient-weighted attention, rolled out)",
                       needs={"attention", "attention_gradients", "tower_attention"}, default=False,
                       cost="an eager forward kept with its graph (layers x heads x length squared), a "
                       "backward per token", paper="Chefer et al. 2021; LVLM-Interpret")  # fmt: skip
def relevancy(p: TokenPass) -> np.ndarray:
    return _relevancy(p.vlm, p.forced, p.found, p.image)


#: The methods, in the order they are drawn.
METHODS = tuple(TOKEN_METHODS)
#: Those made when none are named (relevancy's pass keeps every attention with its graph: asked for by name).
DEFAULT_METHODS = tuple(m.name for m in TOKEN_METHODS.values() if m.default)
TITLES = {m.name: m.title for m in TOKEN_METHODS.values()}


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


def _relevancy(vlm: Vlm, inputs: dict[str, Any], found: Answer, image: Tensor) -> np.ndarray:
    """Each answer token's relevance of the image tokens ``(T, N)`` by Chefer's rule through the decoder and,
    where the family's tower makes a token per patch, on through the vision tower's own attention: the
    decoder's relevance of each image token spread over the patches by the tower's rolled-out relevance. One
    eager forward, the backward passes batched."""
    model, lm, tower = vlm.model, vlm.family.language_model(vlm.model), vlm.family.tower(vlm.model)
    decoder: list[Tensor] = []
    vision: list[Tensor] = []

    def keeper(into: list[Tensor]) -> Callable[..., None]:
        def keep(module: nn.Module, args: Any, output: Any) -> None:
            if not isinstance(output, tuple) or len(output) < 2 or output[1] is None:
                raise UsageError("an attention returned no weights in eager mode; hookviz cannot read it")
            into.append(output[1])

        return keep

    with eager(vlm), HookGroup() as hooks:
        for block in lm.layers:
            hooks.add(block.self_attn.register_forward_hook(keeper(decoder)))
        for n, m in tower.named_modules() if tower is not None else ():
            if n.endswith("self_attn"):
                hooks.add(m.register_forward_hook(keeper(vision)))
        with torch.enable_grad():
            logits = model(**inputs).logits
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


def _logit_lens(model: HF, final: Tensor, found: Answer, image: Tensor) -> np.ndarray:
    """Each answer token's logit read at every image token ``(T, N)``: the decoder's final (normalised) state
    there (``final``: over the teacher-forced sequence) through the output head."""
    with torch.no_grad():
        logits = model.get_output_embeddings()(final[0, image]).float()  # (N, vocabulary)
    return to_numpy(logits[:, torch.tensor(found.token_ids, device=logits.device)].T)


def _attention(
    vlm: Vlm, found: Answer, image: Tensor, layer: int | None, inputs: dict[str, Any]
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

    lm = vlm.family.language_model(vlm.model)
    chosen = list(lm.layers) if layer is None else [lm.layers[layer]]
    with eager(vlm), HookGroup() as hooks:
        for block in chosen:
            hooks.add(block.self_attn.register_forward_hook(keep))
        with torch.no_grad():
            vlm.model(**inputs)
    return to_numpy(torch.stack(taken).mean(dim=(0, 1)))
