# ruff: noqa: RUF002
"""Pixel attributions: maps at the input's resolution from input gradients (as captum 0.9 computes them;
tests/test_references.py), computed once per explain pass and the same at every layer.

Gradient maps are reduced over colours as their papers draw them: Saliency and SmoothGrad the largest
absolute value (a magnitude), Input × Gradient and Integrated Gradients the signed sum: its positive part (the
evidence for the class, as a CAM's ReLU keeps it), or all of it with ``--no-relu``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.hooks import HookGroup
from hookviz.methods._utils import baseline, in_fast_layout
from hookviz.methods.catalogue import NOISE, SAMPLES
from hookviz.methods.compute import LayerPass
from hookviz.methods.ownpass import noisy_copies


def input_gradients(p: LayerPass, x: Tensor, images: Tensor) -> list[Tensor]:
    """Per target ``j``, ``(N, C, H, W)`` the gradient of row ``r``'s target score (its image ``images[r]``'s
    ``j``-th target) with respect to the input ``x``, ``--batch`` rows a pass."""
    t = p.targets.shape[1]
    out = [torch.empty_like(x) for _ in range(t)]
    for start in range(0, x.shape[0], p.options.batch):
        part = slice(start, start + p.options.batch)
        with torch.enable_grad():
            xi, scores = in_fast_layout(p.model, x[part].detach(), lambda xi: _scored(p, xi))
            classes = p.targets[images[part]]
            for j in range(t):
                (g,) = torch.autograd.grad(
                    scores.gather(1, classes[:, j, None]).sum(), xi, retain_graph=j < t - 1
                )
                out[j][part] = g.detach()
        p.advance(int(xi.shape[0]))
    return out


def _scored(p: LayerPass, xi: Tensor) -> tuple[Tensor, Tensor]:
    """``xi`` made a leaf that records its gradient, and its target scores."""
    xi = xi.detach().requires_grad_()
    return xi, p.score_of(p.model(xi))


def _reduce(p: LayerPass, per_target: list[Tensor], how: str) -> Tensor:
    if how == "absmax":
        return torch.stack([g.abs().amax(dim=1) for g in per_target], dim=1)
    summed = torch.stack([g.sum(dim=1) for g in per_target], dim=1)
    return summed.clamp_min(0) if p.relu else summed


def _plain(p: LayerPass) -> list[Tensor]:
    """The input gradient per target: the explain pass's own (it records from the input when a method needs
    ``input_gradients``), else a pass of its own."""
    return p.once("input_gradient", lambda: input_gradients(p, p.x, torch.arange(p.x.shape[0])))


def saliency(p: LayerPass) -> Tensor:
    return _reduce(p, _plain(p), "absmax")


def inputxgradient(p: LayerPass) -> Tensor:
    return _reduce(p, [p.x * g for g in _plain(p)], "sum")


def _smooth(p: LayerPass) -> tuple[list[Tensor], list[Tensor]]:
    """Per target, the mean and mean square of the input gradient over ``--samples`` noisy copies of each
    image (σ = ``--noise`` × the image's value range)."""

    def compute() -> tuple[list[Tensor], list[Tensor]]:
        n = p.options.samples or SAMPLES["smoothgrad"]
        frac = p.options.noise if p.options.noise is not None else NOISE["smoothgrad"]
        span = (p.x.flatten(1).amax(1) - p.x.flatten(1).amin(1)).cpu() * frac
        noisy = noisy_copies(p.x, n, span, p.options.seed, at_once=True)
        images = torch.arange(p.x.shape[0]).repeat_interleave(n)
        grads = input_gradients(p, noisy, images)
        b = p.x.shape[0]
        means = [g.reshape(b, n, *g.shape[1:]).mean(1) for g in grads]
        squares = [g.pow(2).reshape(b, n, *g.shape[1:]).mean(1) for g in grads]
        return means, squares

    return p.once("smooth", compute)


def smoothgrad(p: LayerPass) -> Tensor:
    return _reduce(p, _smooth(p)[0], "absmax")


def smoothgradsq(p: LayerPass) -> Tensor:
    return _reduce(p, _smooth(p)[1], "absmax")


def vargrad(p: LayerPass) -> Tensor:
    means, squares = _smooth(p)
    return _reduce(p, [s - m.pow(2) for m, s in zip(means, squares, strict=True)], "absmax")


def integratedgradients(p: LayerPass) -> Tensor:
    """Integrated Gradients with ``--steps`` Gauss-Legendre points on the straight path from the baseline
    (captum's default rule); every point of every image in one stream of ``--batch``-row passes."""

    def compute() -> list[Tensor]:
        n = p.options.steps
        nodes, weights = np.polynomial.legendre.leggauss(n)
        alphas = torch.as_tensor(0.5 * (1 + nodes), dtype=p.x.dtype, device=p.x.device)
        steps = torch.as_tensor(0.5 * weights, dtype=p.x.dtype, device=p.x.device)
        base = baseline(p)
        b = p.x.shape[0]
        delta = p.x - base
        path = (base[:, None] + alphas[None, :, None, None, None] * delta[:, None]).flatten(0, 1)
        grads = input_gradients(p, path, torch.arange(b).repeat_interleave(n))
        return [
            delta * (g.reshape(b, n, *g.shape[1:]) * steps[None, :, None, None, None]).sum(1) for g in grads
        ]

    return _reduce(p, p.once("integrated", compute), "sum")


def _bias(module: nn.Module) -> Tensor:
    """A layer's bias as FullGrad's paper defines it; a BatchNorm's is its affine map's offset."""
    if isinstance(module, nn.BatchNorm2d):
        assert module.running_mean is not None and module.running_var is not None
        scale = module.weight / torch.sqrt(module.running_var + module.eps)
        return (module.bias - module.running_mean * scale).detach()
    assert isinstance(module.bias, Tensor)
    return module.bias.detach()


def _scaled_sum(a: Tensor, scale: Tensor | None = None) -> Tensor:
    """Each channel of ``scale ⊙ a`` (``a`` ``(B, K, h, w)`` not negative, ``scale`` ``(K,)`` not negative)
    min-max scaled and summed over channels ``(B, h, w)``, at the feature's own resolution (bilinear
    upsampling is linear: the sum upsampled once equals the sum of the upsampled channels).

    As ``Σ_k (s_k a_k - lo_k) / (hi_k - lo_k + ε)``: one pass for the channels' extremes and one weighted sum
    (a matrix product), never the scaled tensor itself."""
    flat = a.flatten(2).float()
    lo, hi = flat.amin(2), flat.amax(2)  # (torch.aminmax is 10x slower here, measured)
    s = torch.ones_like(lo) if scale is None else scale.float().reshape(1, -1).expand_as(lo)
    lo, hi = lo * s, hi * s
    inv = 1.0 / (hi - lo + 1e-7)
    summed = torch.bmm((s * inv)[:, None, :], flat)[:, 0] - (lo * inv).sum(1, keepdim=True)
    return summed.reshape(a.shape[0], *a.shape[2:])


def _upsampled_total(parts: dict[tuple[int, int], Tensor], size: tuple[int, int]) -> Tensor:
    """The sum of maps kept per resolution, each resolution upsampled (bilinear) to ``size`` once."""
    total: Tensor | None = None
    for hw, part in parts.items():
        up = part if hw == size else F.interpolate(part[:, None], size=size, mode="bilinear")[:, 0]
        total = up if total is None else total + up
    assert total is not None
    return total


class BiasTerms:
    """FullGrad's bias terms ``|b ⊙ ∂y/∂z|`` of every convolution and BatchNorm with a bias, gathered while a
    backward pass runs (a tensor hook on each such output) and reduced on the spot to each layer's channels
    min-max scaled and summed at its resolution: ``parts[j]`` maps a resolution to the sum for the ``j``-th
    backward pass (:meth:`start` opens the next). A context manager: its hooks are removed on exit."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = [
            m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d)) and m.bias is not None
        ]
        self.parts: list[dict[tuple[int, int], Tensor]] = []
        self._group: HookGroup | None = None

    def __enter__(self) -> BiasTerms:
        biases: dict[nn.Module, Tensor] = {m: _bias(m).abs() for m in self.layers}  # |b ⊙ g| = |b| ⊙ |g|

        def on_output(module: nn.Module, args: object, output: Tensor) -> None:
            if isinstance(output, Tensor) and output.requires_grad:
                output.register_hook(lambda g, b=biases[module]: self._add(g.detach().abs(), b))

        self._group = HookGroup([m.register_forward_hook(on_output) for m in self.layers])
        self._group.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._group is not None
        self._group.__exit__(*exc)

    def start(self) -> None:
        self.parts.append({})

    def _add(self, term: Tensor, scale: Tensor) -> None:
        if self.parts:
            _accumulate(self.parts[-1], term, scale)


def _accumulate(parts: dict[tuple[int, int], Tensor], term: Tensor, scale: Tensor | None = None) -> None:
    hw = (int(term.shape[-2]), int(term.shape[-1]))
    summed = _scaled_sum(term, scale)
    parts[hw] = parts[hw] + summed if hw in parts else summed


def fullgrad(p: LayerPass) -> Tensor:
    """FullGrad: ``|x ⊙ ∇_x y|`` plus, for every convolution and BatchNorm with a bias, ``|b ⊙ ∇_z y|`` at its
    output ``z``; each channel min-max scaled and upsampled, then all summed (summed per resolution first,
    each resolution upsampled once). The bias terms come from the shared pass's backward passes (which reach
    the input for it), else from a pass of its own."""

    def compute() -> Tensor:
        shared = p.shared.get("fullgrad_bias")
        if shared is not None and len(shared) == p.targets.shape[1]:
            grads, bias = _plain(p), shared
        else:
            grads, bias = [], []
            with BiasTerms(p.model) as terms, torch.enable_grad():
                xi = p.x.detach().requires_grad_()
                scores = p.score_of(p.model(xi))
                t = p.targets.shape[1]
                for j in range(t):
                    terms.start()
                    (gx,) = torch.autograd.grad(
                        scores.gather(1, p.targets[:, j, None]).sum(), xi, retain_graph=j < t - 1
                    )
                    grads.append(gx.detach())
            bias = terms.parts
            p.advance(p.x.shape[0])
        maps = []
        for gx, parts in zip(grads, bias, strict=True):
            parts = dict(parts)
            _accumulate(parts, (gx * p.x).abs())
            maps.append(_upsampled_total(parts, p.size))
        return torch.stack(maps, dim=1)

    return p.once("fullgrad", compute)
