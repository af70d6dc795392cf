"""Attention-based maps of a vision transformer: attention rollout, Chefer et al.'s relevance and LeGrad.

All three read the attention probabilities ``A^l`` ``(B, H, N, N)`` of every encoder block, captured in one
forward pass of their own (:class:`hookviz.core.attention_probe.AttentionProbe`: fused kernels are
computed explicitly within it), and give a map over the patch grid (the prefix tokens, class /
distillation / register, dropped).
A map is the relevance of each patch token to the tokens the head reads: the class token for a model pooled
by it, the mean over the patch tokens for a model pooled by their average; which ones is read from the
gradient of the output with respect to the last attention (rows that reach the output), not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hookviz.core.attention_probe import AttentionProbe
from hookviz.core.hooks import HookGroup, first_tensor, traced
from hookviz.core.layers import token_blocks
from hookviz.errors import LayerError
from hookviz.methods.compute import LayerPass

#: The methods of this module (the attention pass computes what the requested ones need).
NAMES = ("rollout", "chefer", "legrad")
APPLY = "rollout, chefer and legrad explain vision transformers (ViT, DeiT, EVA, DINOv2, CLIP's image tower)"


@dataclass
class AttentionPass:
    """What one forward pass gave: ``probs`` per block ``(B, H, N, N)`` (detached); ``readers`` ``(B, N)``
    the weight of each query token in what the head reads (rows summing to 1); ``chefer``/``legrad``:
    per target, per block, the gradient of the target's score (Chefer) or of the block's own score (LeGrad)
    with respect to the block's attention; ``prefix`` and ``grid`` the token layout."""

    probs: list[Tensor]
    readers: Tensor
    prefix: int
    grid: tuple[int, int]
    chefer: list[list[Tensor]]
    legrad: list[list[Tensor]]


def _layout(p: LayerPass) -> tuple[int, tuple[int, int]]:
    layout = p.layout
    if layout.kind != "tokens" or layout.grid is None:
        raise LayerError(
            f"layer {p.layer!r} is not a transformer's token layer: attention maps live on the patch grid of "
            f"its tokens; pick an encoder block (or leave --layer out); {APPLY}"
        )
    return int(layout.prefix), (int(layout.grid[0]), int(layout.grid[1]))


def _blocks(p: LayerPass) -> list[str]:

    return token_blocks(p.model, traced(p.model, tuple(p.x.shape[1:]), p.x.device))


def _splice(kept: list[Tensor]) -> Any:
    """A forward hook for the last block: its output followed, along the batch, by each block's mean token
    broadcast to every position, so the rest of the network (final norm, pooling, head) turns each block's
    mean token into class scores in the same pass (LeGrad's per-block score)."""

    def hook(module: Any, args: Any, output: Any) -> Any:
        tokens = output[0] if isinstance(output, tuple) else output
        means = [z.mean(dim=1, keepdim=True).expand_as(z) for z in kept]
        joined = torch.cat([tokens, *means], dim=0)
        return (joined, *output[1:]) if isinstance(output, tuple) else joined

    return hook


def attention_pass(p: LayerPass) -> AttentionPass:
    """The forward pass and backward passes the requested attention methods need (once per explain pass)."""
    return p.once("attention", lambda: _attention_pass(p))


def _attention_pass(p: LayerPass) -> AttentionPass:

    prefix, grid = _layout(p)
    n = prefix + grid[0] * grid[1]
    wanted = set(p.methods) & set(NAMES) or set(NAMES)
    blocks = _blocks(p) if "legrad" in wanted else []
    modules = dict(p.model.named_modules())
    kept: list[Tensor] = []
    b = p.x.shape[0]
    with HookGroup() as hooks, torch.enable_grad():
        for name in blocks:
            hooks.add(modules[name].register_forward_hook(_keep(kept)))
        if blocks:
            hooks.add(modules[blocks[-1]].register_forward_hook(_splice(kept)))
        x = p.x.detach().requires_grad_()  # records the graph from the input (no parameter gradients)
        with AttentionProbe() as probe:
            out = p.score_of(p.model(x))
        found = [a for a in probe.found if a.probs.shape[-2:] == (n, n) and a.probs.shape[0] == b]
        if not found:
            raise LayerError(f"{_name(p)} has no self-attention over its {n} tokens: {APPLY}; use gradcam")
        scores = out[:b]
        rows = torch.arange(b, device=scores.device)
        t = p.targets
        leaves = [a.leaf for a in found]
        chefer: list[list[Tensor]] = []
        legrad: list[list[Tensor]] = []
        last: Tensor | None = None
        for j in range(t.shape[1]):
            target = scores[rows, t[:, j]].sum()
            if "chefer" in wanted or j == 0:
                got = torch.autograd.grad(target, leaves, retain_graph=True, allow_unused=True)
                grads = [_dense(a, g) for a, g in zip(found, got, strict=True)]
                if j == 0:
                    last = grads[-1]
                if "chefer" in wanted:
                    chefer.append(grads)
            if "legrad" in wanted:
                legrad.append(_legrad_grads(p, out, found, blocks, t[:, j]))
        probs = [a.probs.detach() for a in found]
    p.advance(b)
    assert last is not None
    return AttentionPass(probs, _readers(last, prefix), prefix, grid, chefer, legrad)


def _keep(kept: list[Tensor]) -> Any:
    def hook(module: Any, args: Any, output: Any) -> None:
        t = first_tensor(output)
        if t is not None:
            kept.append(t)

    return hook


def _dense(a: Any, g: Tensor | None) -> Tensor:
    return torch.zeros_like(a.probs) if g is None else a.gradient(g.detach())


def _name(p: LayerPass) -> str:
    return type(p.model).__name__


def _legrad_grads(p: LayerPass, out: Tensor, found: list[Any], blocks: list[str], c: Tensor) -> list[Tensor]:
    """Per block ``l``: ``∂ s^l_c / ∂ A^l``, ``s^l`` the head's scores of block ``l``'s mean token."""
    b = p.x.shape[0]
    if len(blocks) != len(found) or out.shape[0] != b * (len(blocks) + 1):
        raise LayerError(
            f"legrad: {_name(p)}'s encoder blocks ({len(blocks)}) and attentions ({len(found)}) do not pair "
            "up, or its head does not score each token batch on its own; use chefer or rollout"
        )
    rows = torch.arange(b, device=out.device)
    grads = []
    for layer, a in enumerate(found):
        own = out[b * (layer + 1) : b * (layer + 2)]
        (g,) = torch.autograd.grad(own[rows, c].sum(), a.leaf, retain_graph=True)
        grads.append(a.gradient(g.detach()))
    return grads


def _readers(g: Tensor, prefix: int) -> Tensor:
    """``(B, N)``: the query tokens whose attention reaches the output (non-zero gradient rows of the last
    block's attention), equally weighted; the class token when the gradient is zero everywhere (a head that
    ignores its input, as torchvision's zero-initialised ViT head)."""
    reach = g.abs().sum(dim=(1, 3)) > 0
    fallback = torch.zeros_like(reach)
    if prefix:
        fallback[:, 0] = True
    else:
        fallback[:, :] = True
    reach = torch.where(reach.any(dim=1, keepdim=True), reach, fallback)
    w = reach.float()
    return w / w.sum(dim=1, keepdim=True)


def _on_grid(a: AttentionPass, relevance: Tensor) -> Tensor:
    """``(B, N, N)`` token-to-token relevance → ``(B, gh, gw)`` of the patches, read by the head's tokens."""
    read = torch.einsum("bn,bnm->bm", a.readers.to(relevance.dtype), relevance)
    return read[:, a.prefix :].reshape(read.shape[0], *a.grid)


def _fuse(probs: Tensor, how: str) -> Tensor:
    if how == "max":
        return probs.amax(dim=1)
    if how == "min":
        return probs.amin(dim=1)
    return probs.mean(dim=1)


def rollout(p: LayerPass) -> Tensor:
    """Attention rollout (Abnar and Zuidema 2020): ``R = Π_l norm(½ Ā^l + ½ I)``, ``Ā^l`` the heads fused by
    mean / max / min (``--head-fusion``), the lowest ``--discard-ratio`` of each fused matrix set to 0 (the
    class token's attention to itself kept), each row renormalised. Class-agnostic."""
    a = attention_pass(p)
    n = a.probs[0].shape[-1]
    eye = torch.eye(n, device=a.probs[0].device)
    r = eye.expand(a.probs[0].shape[0], n, n)
    for probs in a.probs:
        fused = _fuse(probs.float(), p.options.head_fusion)
        if p.options.discard > 0:
            flat = fused.flatten(1).clone()
            drop = flat.topk(int(flat.shape[1] * p.options.discard), dim=1, largest=False).indices
            drop = torch.where(drop == 0, drop[:, -1:], drop)  # never the class token's own entry
            fused = flat.scatter(1, drop, 0.0).view_as(fused)
        step = 0.5 * fused + 0.5 * eye
        step = step / step.sum(dim=-1, keepdim=True)
        r = step @ r
    return p.same_for_targets(_on_grid(a, r))


def chefer(p: LayerPass) -> Tensor:
    """Chefer, Gur and Wolf (ICCV 2021): ``R ← R + Ā^l R`` from ``R = I``, ``Ā^l = E_h[(∇A^l ⊙ A^l)⁺]``, the
    gradient of the target's score. Class-specific."""
    a = attention_pass(p)
    maps = []
    for grads in a.chefer:
        n = a.probs[0].shape[-1]
        r = torch.eye(n, device=a.probs[0].device).expand(a.probs[0].shape[0], n, n)
        for probs, g in zip(a.probs, grads, strict=True):
            r = r + (g.float() * probs.float()).clamp_min(0).mean(dim=1) @ r
        maps.append(_on_grid(a, r))
    return torch.stack(maps, dim=1)


def legrad(p: LayerPass) -> Tensor:
    """LeGrad (Bousselham et al. 2024): per block ``l``, the positive gradient of ``s^l`` (the head applied to
    block ``l``'s mean token, after the final norm) with respect to ``A^l``, averaged over heads and query
    tokens; the patch keys' values averaged over blocks. Class-specific."""
    a = attention_pass(p)
    maps = []
    for grads in a.legrad:
        per_block = [g.float().clamp_min(0).mean(dim=(1, 2))[:, a.prefix :] for g in grads]
        mean = torch.stack(per_block).mean(dim=0)
        maps.append(mean.reshape(mean.shape[0], *a.grid))
    return torch.stack(maps, dim=1)
