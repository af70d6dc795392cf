"""A dictionary's quality as the papers report it: the fraction of variance it explains, how many features
fire per vector (L0), how many never fire (dead) or fire on more than a tenth of the vectors (dense), and what
its reconstruction does to the model: the layer's output replaced by it in a forward hook, the top-1 class
kept and the change in cross-entropy against the original prediction."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.hooks import HookGroup, first_tensor, logits_of, preserved
from hookviz.models.facade import Facade
from hookviz.models.scores import ImageTextSource
from hookviz.sae import dictionary
from hookviz.sae.store import Trained
from hookviz.sae.vectors import from_vectors, module_of, to_vectors

#: A feature firing on more than this share of the vectors is dense.
DENSE = 0.1
#: The model-level figures measured where the model's output is class scores (None otherwise).
EFFECTS = ("top1_agreement", "ce_original", "ce_reconstructed", "delta_ce", "kl")


def code_stats(x: Tensor, x_hat: Tensor, z: Tensor) -> dict[str, float]:
    """From normalised vectors ``x``, their reconstructions and codes ``(N, width)``: the explained variance
    ``1 - sum |x - x_hat|^2 / sum |x - mean(x)|^2``, mean L0, and the shares of dead and dense features."""
    fired = (z > 0).float()
    rate = fired.mean(0)
    err = (x - x_hat).double().square().sum()
    var = (x - x.mean(0)).double().square().sum().clamp_min(1e-12)
    return {
        "explained_variance": float(1 - err / var),
        "l0": float(fired.sum(1).mean()),
        "dead": float((rate == 0).float().mean()),
        "dense": float((rate > DENSE).float().mean()),
    }


def reconstruct(found: Trained, out: Tensor, edit: Any = None) -> Tensor:
    """``out`` (the layer's output) through the dictionary, in its own layout; ``edit(z)`` may change the
    codes on the way (ablate or scale a feature)."""
    v = to_vectors(out, found.layout).float()
    z = dictionary.encode(found.sae, found.norm.apply(v))
    if edit is not None:
        z = edit(z)
    return from_vectors(found.norm.undo(dictionary.decode(found.sae, z)), out, found.layout)


@contextmanager
def replaced(model: nn.Module, found: Trained, edit: Any = None) -> Iterator[None]:
    """While open, ``found.layer``'s output is replaced by its reconstruction (codes edited by ``edit``)."""

    def hook(module: nn.Module, args: object, output: Any) -> Any:
        t = first_tensor(output)
        assert t is not None
        new = reconstruct(found, t, edit)
        return new if isinstance(output, Tensor) else (new, *output[1:])

    with HookGroup() as hooks:
        hooks.add(module_of(model, found.layer).register_forward_hook(hook, prepend=True))
        yield


def gives_classes(model: nn.Module) -> bool:
    """Whether ``model``'s output is class scores: not an image-text model's (a CLIP, SigLIP or a
    vision-language model loaded through ``hf:``) image embedding, whose vision tower's layers hookviz sae
    takes, but which has no classes before prompts."""
    while True:
        if isinstance(model, ImageTextSource):
            return False
        if not isinstance(model, Facade):
            return True
        model = model.wrapped


def _cosine(a: Tensor, b: Tensor) -> float:
    return float(nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def evaluate(
    model: nn.Module, found: Trained, batches: Iterable[Tensor], device: torch.device
) -> dict[str, Any]:
    """The quality over the inputs of ``batches``: the code statistics over every vector, and the model-level
    effect over every input: for class scores the top-1 agreement, cross-entropy and KL; for any other
    output (an image embedding) its cosine to the original (``output_cosine``), the others None."""
    xs, hats, zs = [], [], []
    agree, ce_orig, ce_rec, kl, n = 0, 0.0, 0.0, 0.0, 0
    classes, cosine = gives_classes(model), 0.0
    kept: list[Tensor] = []

    def store(module: nn.Module, args: object, output: Any) -> None:
        t = first_tensor(output)
        assert t is not None
        kept.append(t.detach().clone())  # a later in-place op (ReLU) must not change it

    with preserved(model), torch.no_grad(), HookGroup() as hooks:
        hooks.add(module_of(model, found.layer).register_forward_hook(store))
        model.eval()
        for batch in batches:
            x = batch.to(device)
            kept.clear()
            logits = logits_of(model(x)).float()
            v = to_vectors(kept[0], found.layout).float()
            vn = found.norm.apply(v)
            z = dictionary.encode(found.sae, vn)
            xs.append(vn.cpu())
            zs.append(z.cpu())
            hats.append(dictionary.decode(found.sae, z).cpu())
            with replaced(model, found):
                rec = logits_of(model(x)).float()
            classes = classes and logits.ndim == 2 and logits.shape[0] == x.shape[0]
            cosine += _cosine(logits, rec) * x.shape[0]
            if classes:
                label = logits.argmax(1)
                agree += int((rec.argmax(1) == label).sum())
                ce_orig += float(nn.functional.cross_entropy(logits, label, reduction="sum"))
                ce_rec += float(nn.functional.cross_entropy(rec, label, reduction="sum"))
                logp, logq = logits.log_softmax(1), rec.log_softmax(1)
                kl += float((logp.exp() * (logp - logq)).sum())
            n += x.shape[0]
    stats = code_stats(torch.cat(xs), torch.cat(hats), torch.cat(zs))
    per = max(n, 1)
    effect: dict[str, float | None] = dict.fromkeys(EFFECTS)
    if classes:
        figures = (agree, ce_orig, ce_rec, ce_rec - ce_orig, kl)
        effect = {key: value / per for key, value in zip(EFFECTS, figures, strict=True)}
    vectors = sum(x.shape[0] for x in xs)
    return {**stats, **effect, "output_cosine": cosine / per, "vectors": vectors, "inputs": n}


def console(metrics: dict[str, Any]) -> str:
    """One line of the figures for the console."""
    if metrics.get("top1_agreement") is None:
        effect = f"the model's output (not class scores) at cosine {metrics.get('output_cosine', 0.0):.4f}"
    else:
        effect = f"top-1 agreement {metrics['top1_agreement']:.1%}, cross-entropy {metrics['delta_ce']:+.4f}"
    on = "held-out" if metrics.get("evaluated_on") == "held_out" else "training"
    return (
        f"explained variance {metrics['explained_variance']:.3f}, L0 {metrics['l0']:.1f}, dead "
        f"{metrics['dead']:.1%}, dense {metrics['dense']:.1%}; layer replaced by its reconstruction: "
        f"{effect} over {metrics['inputs']} {on} inputs ({metrics['vectors']} vectors)"
    )
