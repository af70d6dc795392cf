"""Does a small change of the input change the map much? Each perturbed input is explained once and serves
all four figures, written to equal Quantus 0.6's metrics of the same names given the same perturbed inputs.

* **Max- and average sensitivity** (Yeh et al., NeurIPS 2019): ``||e(x) - e(x')|| / ||e(x)||`` (Frobenius
  norms) over inputs ``x'`` drawn uniformly within ``radius`` of ``x`` in every value: the largest and the
  mean over ``samples`` draws. Lower is more robust.
* **Relative input and output stability** (Agarwal et al., NeurIPS 2022): the map's relative change
  ``||(e(x) - e(x')) / e(x)||`` over the input's relative change ``||(x - x') / x||`` (RIS) or over the
  change of the logits ``||h(x) - h(x')||`` (ROS), the largest over the draws; draws that change the
  prediction are left out (an image all of whose draws change it gets NaN). Lower is more robust.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hookviz.core.hooks import logits_of, preserved
from hookviz.core.readout import Scorer


@dataclass(frozen=True)
class Robustness:
    """Per-image figures ``(B,)`` and the draws they came from."""

    max_sensitivity: Tensor
    avg_sensitivity: Tensor
    relative_input_stability: Tensor
    relative_output_stability: Tensor
    radius: float
    samples: int
    forward_passes: int


def uniform_noise(x: Tensor, radius: float, generator: torch.Generator) -> Tensor:
    """``x`` plus noise drawn uniformly from ``[-radius, radius]``, every value on its own."""
    noise = torch.rand(x.shape, generator=generator, dtype=torch.float64) * 2 - 1
    return x + (radius * noise).to(x)


def _norm(a: Tensor) -> Tensor:
    return a.flatten(1).norm(dim=1)


def robustness(
    model: nn.Module,
    explain: Callable[[Tensor, int], Tensor],
    x: Tensor,
    maps: Tensor,
    *,
    samples: int = 10,
    radius: float = 0.2,
    seed: int = 0,
    eps: float = 1e-6,
    perturb: Callable[[Tensor, int], Tensor] | None = None,
    scorer: Scorer | None = None,
) -> Robustness:
    """The four figures for ``maps`` (what ``explain(x)`` gives, any shape ``(B, ...)``) of inputs ``x``.

    ``explain(x', k)`` must return the maps of the ``k``-th perturbed inputs for the same classes;
    ``perturb(x, k)`` replaces the default draw (:func:`uniform_noise`, seeded ``seed``) for the ``k``-th.
    """
    gen = torch.Generator().manual_seed(seed)
    draw = perturb or (lambda inputs, _k: uniform_noise(inputs, radius, gen))
    e = maps.detach().double().cpu()
    xd = x.detach().double().cpu()
    passes = 0
    rows = torch.arange(x.shape[0], device=x.device)

    def predicted(out: Tensor) -> Tensor:
        return (
            (torch.softmax(out.float(), dim=1) if scorer is None else scorer(out, rows)).argmax(dim=1).cpu()
        )

    with torch.no_grad(), preserved(model):
        model.eval()
        out = logits_of(model(x))
        logits, top = out.double().cpu().flatten(1), predicted(out)
        passes += x.shape[0]
    sens, ris, ros = [], [], []
    for k in range(samples):
        xp = draw(x, k)
        ep = explain(xp, k).detach().double().cpu()
        with torch.no_grad(), preserved(model):
            model.eval()
            out = logits_of(model(xp))
            lp, top_p = out.double().cpu().flatten(1), predicted(out)
        passes += x.shape[0]  # the readout of the noisy copy (its explanation's passes are the caller's)
        sens.append(_norm(e - ep) / _norm(e))
        rel = _norm((e - ep) / (e + (e == 0) * eps))
        dx = xp.detach().double().cpu() - xd
        den_in = _norm(dx / (xd + (xd == 0) * eps))
        den_out = _norm(logits - lp)
        changed = top_p != top
        nan = torch.full_like(rel, float("nan"))
        ris.append(torch.where(changed, nan, rel / (den_in + (den_in == 0) * eps)))
        ros.append(torch.where(changed, nan, rel / (den_out + (den_out == 0) * eps)))
    s = torch.stack(sens, dim=1)

    def nanmax(v: list[Tensor]) -> Tensor:
        t = torch.stack(v, dim=1)
        out = torch.nan_to_num(t, nan=float("-inf")).amax(dim=1)
        return torch.where(torch.isinf(out) & (out < 0), torch.full_like(out, float("nan")), out)

    return Robustness(
        max_sensitivity=s.amax(dim=1),
        avg_sensitivity=s.mean(dim=1),
        relative_input_stability=nanmax(ris),
        relative_output_stability=nanmax(ros),
        radius=radius,
        samples=samples,
        forward_passes=passes,
    )
