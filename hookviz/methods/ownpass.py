# ruff: noqa: RUF002
"""CAM methods that explain another score than the shared pass's (Finer-CAM, Shapley-CAM) or other inputs
(Smooth Grad-CAM++): each runs its own forward pass with a gradient tap at the layer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from hookviz.core.hooks import capture
from hookviz.core.layers import single_call
from hookviz.core.layout import to_spatial
from hookviz.methods.catalogue import NOISE, SAMPLES
from hookviz.methods.compute import LayerPass, rectify


@contextmanager
def tapped(p: LayerPass, x: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
    """A forward pass of ``x`` recorded from the layer on: ``(tap, scores)``, the layer's raw tensor (a leaf
    that gradients reach) and the ``(N, C)`` class scores."""

    with capture(p.model, grad_layers=[p.layer]) as cap, torch.enable_grad():
        with torch.no_grad():  # recording starts at the tap
            scores = p.score_of(p.model(x))
        yield single_call(cap.captured.taps, p.layer), scores


def spatial(p: LayerPass, t: Tensor) -> Tensor:

    return to_spatial(t, p.layout)


def objective_cam(p: LayerPass, objective: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """Grad-CAM of ``objective(scores, classes) -> (B,)`` for each target's classes."""
    maps = []
    with tapped(p, p.x) as (tap, scores):
        for j in range(p.targets.shape[1]):
            (g,) = torch.autograd.grad(objective(scores, p.targets[:, j]).sum(), tap, retain_graph=True)
            w = spatial(p, g.detach()).mean(dim=(2, 3), keepdim=True)
            maps.append(rectify((w * p.activations).sum(1), p.relu))
    p.advance(p.x.shape[0])
    return torch.stack(maps, dim=1)


def finercam(p: LayerPass) -> Tensor:
    """Finer-CAM: Grad-CAM of the target's score against the classes it is confused with, weighted by their
    probabilities: ``Σ_j p_j (y_c − y_j) / Σ_j p_j`` over ``--compare`` (else the three classes whose logits
    are nearest to the target's)."""
    chosen = [int(k) for k in p.options.compare]  # indices: the builder resolves names

    def objective(scores: Tensor, c: Tensor) -> Tensor:
        y = scores
        yc = y.gather(1, c[:, None])
        if chosen:
            wanted = torch.tensor([k for k in chosen if k < y.shape[1]], device=y.device)
            others = wanted[None].expand(y.shape[0], -1)
            others = torch.where(others == c[:, None], -1, others)
        else:
            gap = (y.detach() - yc.detach()).abs()
            gap.scatter_(1, c[:, None], -1.0)  # the class itself comes first and is skipped
            others = gap.argsort(dim=1)[:, 1 : 1 + min(3, y.shape[1] - 1)]
        valid = others >= 0
        picked = others.clamp_min(0)
        prob = torch.softmax(y, dim=1).gather(1, picked) * valid
        diff = yc - y.gather(1, picked)
        return (prob * diff).sum(1) / prob.sum(1).clamp_min(1e-30)

    return objective_cam(p, objective)


def shapleycam(p: LayerPass) -> Tensor:
    """Shapley-CAM with its ReST score ``y_c − CE(y, c)``: channel weights ``mean(∇ − ½ H·A)`` over the map,
    the Hessian-vector product taken with the activations themselves."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    maps = []
    # The Hessian-vector product differentiates twice: attention through the math kernel, which can.
    with sdpa_kernel([SDPBackend.MATH]), tapped(p, p.x) as (tap, scores):
        for j in range(p.targets.shape[1]):
            c = p.targets[:, j]
            rest = scores.gather(1, c[:, None])[:, 0] - torch.nn.functional.cross_entropy(
                scores, c, reduction="none"
            )
            (g,) = torch.autograd.grad(rest.sum(), tap, create_graph=True)
            (hvp,) = torch.autograd.grad(
                g, tap, grad_outputs=tap.detach(), retain_graph=True, allow_unused=True
            )
            hvp = torch.zeros_like(g) if hvp is None else hvp
            w = spatial(p, (g - 0.5 * hvp).detach()).mean(dim=(2, 3), keepdim=True)
            maps.append(rectify((w * p.activations).sum(1), p.relu))
    p.advance(p.x.shape[0])
    return torch.stack(maps, dim=1)


def noisy_copies(x: Tensor, n: int, sigma: Tensor | float, seed: int, *, at_once: bool = False) -> Tensor:
    """``(B·n, ...)`` the images of ``x``, image-major, each plus ``n`` draws of Gaussian noise (σ one
    value, or one per image). Every image gets the same stream from ``seed``, drawn copy by copy as torchcam
    draws it, or ``at_once`` as captum does: with ``torch.manual_seed(seed)`` the reference sees the same
    noise for one image. Noise made on the CPU, so a seed means the same copies on any device."""
    sig = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1)
    out = []
    for i in range(x.shape[0]):
        gen = torch.Generator().manual_seed(seed)
        s = float(sig[i if sig.numel() > 1 else 0])
        shape = tuple(x.shape[1:])
        noise = (
            torch.normal(0.0, s, (n, *shape), generator=gen)
            if at_once
            else torch.stack([torch.normal(0.0, s, shape, generator=gen) for _ in range(n)])
        )
        out.append(x[i] + noise.to(x.device, x.dtype))
    return torch.cat(out)


def smoothgradcampp(p: LayerPass) -> Tensor:
    """Smooth Grad-CAM++: Grad-CAM++'s weights with the gradient's second and third powers and its ReLU
    averaged over ``--samples`` noisy copies of the input (σ ``--noise``); the map weighs the clean input's
    activations. (torchcam keeps the last copy's gradient and activations instead of the averages: equal as
    the noise goes to 0, tests/test_references.py.)"""

    n = p.options.samples or SAMPLES["smoothgradcampp"]
    sigma = p.options.noise if p.options.noise is not None else NOISE["smoothgradcampp"]
    noisy = noisy_copies(p.x, n, sigma, p.options.seed)
    a = p.activations
    b, t = a.shape[0], p.targets.shape[1]
    sums = [torch.zeros(3, *a.shape, dtype=a.dtype, device=a.device) for _ in range(t)]
    rows = torch.arange(b * n, device=a.device) // n
    for start in range(0, b * n, p.options.batch):
        part = slice(start, start + p.options.batch)
        with tapped(p, noisy[part]) as (tap, scores):
            for j in range(t):
                c = p.targets[rows[part], j]
                (g,) = torch.autograd.grad(scores.gather(1, c[:, None]).sum(), tap, retain_graph=j < t - 1)
                g = spatial(p, g.detach())
                index = rows[part]
                for power, acc in enumerate((g, g.pow(2), g.pow(3))):
                    sums[j][power].index_add_(0, index, acc)
        p.advance(int(noisy[part].shape[0]))
    maps = []
    for j in range(t):
        g1, g2, g3 = (s / n for s in sums[j])
        alpha = g2 / (2 * g2 + (g3 * a).sum(dim=(2, 3), keepdim=True) + 1e-8)
        w = (alpha * torch.relu(g1)).sum(dim=(2, 3), keepdim=True)
        maps.append(rectify((w * a).sum(1), p.relu))
    return torch.stack(maps, dim=1)
