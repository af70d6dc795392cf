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
from hookviz.sae import dictionary
from hookviz.sae.store import Trained
from hookviz.sae.vectors import from_vectors, module_of, to_vectors

#: A feature firing on more than this share of the vectors is dense.
DENSE = 0.1


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
        hooks.add(module_of(model, found.layer).register_forward_hook(hook))
        yield


def evaluate(
    model: nn.Module, found: Trained, batches: Iterable[Tensor], device: torch.device
) -> dict[str, Any]:
    """The quality over the inputs of ``batches``: the code statistics over every vector, and the model-level
    effect over every input."""
    xs, hats, zs = [], [], []
    agree, ce_orig, ce_rec, kl, n = 0, 0.0, 0.0, 0.0, 0
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
            label = logits.argmax(1)
            agree += int((rec.argmax(1) == label).sum())
            ce_orig += float(nn.functional.cross_entropy(logits, label, reduction="sum"))
            ce_rec += float(nn.functional.cross_entropy(rec, label, reduction="sum"))
            logp, logq = logits.log_softmax(1), rec.log_softmax(1)
            kl += float((logp.exp() * (logp - logq)).sum())
            n += x.shape[0]
    stats = code_stats(torch.cat(xs), torch.cat(hats), torch.cat(zs))
    effect = {
        "top1_agreement": agree / max(n, 1),
        "ce_original": ce_orig / max(n, 1),
        "ce_reconstructed": ce_rec / max(n, 1),
        "delta_ce": (ce_rec - ce_orig) / max(n, 1),
        "kl": kl / max(n, 1),
    }
    return {**stats, **effect, "vectors": int(sum(x.shape[0] for x in xs)), "inputs": n}


def console(metrics: dict[str, Any]) -> str:
    """One line of the figures for the console."""
    return (
        f"explained variance {metrics['explained_variance']:.3f}, L0 {metrics['l0']:.1f}, dead "
        f"{metrics['dead']:.1%}, dense {metrics['dense']:.1%}; layer replaced by its reconstruction: top-1 "
        f"agreement {metrics['top1_agreement']:.1%}, cross-entropy {metrics['delta_ce']:+.4f} "
        f"over {metrics['inputs']} {'held-out' if metrics.get('evaluated_on') == 'held_out' else 'training'} "
        f"inputs ({metrics['vectors']} vectors)"
    )
