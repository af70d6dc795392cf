"""Does the map depend on what the model learned? The model-parameter randomisation test (Adebayo et al.,
NeurIPS 2018) in its cascading and independent forms, its smooth variant (sMPRT, Hedström et al. 2023), and
the random-logit test (Sixt et al., ICML 2020).

The test steps through the model at the granularity a user reads it: each residual, inverted-residual or
encoder block (``layer4.1``, ``features.5.0``, ``encoder.layers.encoder_layer_11``), each layer of a model
without blocks (VGG's convolutions), and the head. ``granularity="layer"`` steps through every module with
``reset_parameters`` and seeds it as Quantus does (``torch.manual_seed(seed + 1)`` before each).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.evaluation.stats import ssim

#: The step names' order: from the head down (cascading, as Adebayo et al.), or each alone.
ORDERS = ("cascading", "independent")
GRANULARITIES = ("block", "layer")
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _has_params(m: nn.Module, recurse: bool = True) -> bool:
    return any(True for _ in m.parameters(recurse=recurse))


def _block_classes(model: nn.Module) -> set[type]:
    """Classes that come as a stack: two or more parameterised children of one module share the class, and
    the class is neither a container nor a leaf layer (BasicBlock, InvertedResidual, EncoderBlock)."""
    found: set[type] = set()
    for m in model.modules():
        counts: dict[type, int] = {}
        for child in m.children():
            kind = type(child)
            if isinstance(child, _CONTAINERS) or not list(child.children()) or not _has_params(child):
                continue
            counts[kind] = counts.get(kind, 0) + 1
        found |= {k for k, n in counts.items() if n >= 2}
    # The outermost stack wins: Inception's BasicConv2d come in pairs inside InceptionA, which is the block.
    inner = {
        type(d)
        for m in model.modules()
        if type(m) in found
        for d in list(m.modules())[1:]
        if type(d) in found and type(d) is not type(m)
    }
    return found - inner


def randomisation_blocks(model: nn.Module, granularity: str = "block") -> list[str]:
    """The test's steps, from the head down: module names, and ``NAME.(own)`` for the parameters a module
    holds itself (a ViT's class token, ``encoder.(own)`` for its position embedding).

    ``block``: each block of a stack, each other top-level part that holds parameters (the stem, the head);
    a model without blocks steps through its layers. ``layer``: every module with ``reset_parameters``.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity {granularity!r}: one of {', '.join(GRANULARITIES)}")
    if granularity == "layer":
        names = [n for n, m in model.named_modules() if callable(getattr(m, "reset_parameters", None))]
        return list(reversed(names))
    blocks = _block_classes(model)
    steps: list[str] = []

    def holds_block(m: nn.Module) -> bool:
        return any(type(d) in blocks for d in m.modules())

    def walk(prefix: str, m: nn.Module) -> None:
        if _has_params(m, recurse=False):
            steps.append(f"{prefix}.(own)" if prefix else "(own)")
        for name, child in m.named_children():
            full = f"{prefix}.{name}" if prefix else name
            if not _has_params(child):
                continue
            leaf = not list(child.children())
            if leaf or type(child) in blocks or (blocks and not holds_block(child)):
                steps.append(full)
            else:
                walk(full, child)

    walk("", model)
    return list(reversed(steps))


def _parameters(model: nn.Module, step: str) -> Iterator[tuple[nn.Module, bool]]:
    """The modules a step re-initialises and whether their sub-modules go with them."""
    if step == "(own)" or step.endswith(".(own)"):
        yield model.get_submodule(step[: -len(".(own)")] if step != "(own)" else ""), False
    else:
        yield model.get_submodule(step), True


def randomise(module: nn.Module, seed: int, *, recurse: bool = True) -> None:
    """Re-initialise ``module``'s parameters in place, seeded by ``seed`` (the global RNG is left as it
    was): ``reset_parameters`` where a layer has it (its own default initialisation: a BatchNorm's running
    statistics go back to 0 and 1 too), else a normal draw with the tensor's own scale."""
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for m in module.modules() if recurse else [module]:
            reset = getattr(m, "reset_parameters", None)
            if (recurse or m is not module) and callable(reset):
                reset()
            else:
                for p in m.parameters(recurse=False):
                    p.normal_(0.0, float(p.detach().float().std()) if p.numel() > 1 else 0.02)


def randomised_models(
    model: nn.Module, *, order: str = "cascading", granularity: str = "block", seed: int = 0
) -> Iterator[tuple[str, nn.Module]]:
    """``(step, model)`` for each step: a copy of ``model`` with that step's parameters (and, cascading,
    every step's before it) re-initialised. The same copy is reused from step to step: use each before
    asking for the next. ``model`` itself is never touched."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: one of {', '.join(ORDERS)}")
    work = copy.deepcopy(model)
    original = copy.deepcopy(work.state_dict()) if order == "independent" else None
    for k, step in enumerate(randomisation_blocks(work, granularity)):
        if original is not None:
            work.load_state_dict(original)
        # Quantus seeds every layer alike (seed + 1); a block step gets a seed of its own.
        step_seed = seed + 1 if granularity == "layer" else seed + 1 + k
        for module, recurse in _parameters(work, step):
            randomise(module, step_seed, recurse=recurse)
        yield step, work


def cascade(
    model: nn.Module,
    compute: Callable[[nn.Module], dict[str, Tensor]],
    *,
    seed: int = 0,
    order: str = "cascading",
    granularity: str = "block",
) -> list[tuple[str, dict[str, Tensor]]]:
    """Maps after each randomisation step (on a copy: ``model`` is not touched).

    ``compute(model)`` returns maps per method; the result starts with ``("none", original maps)``.
    """
    steps = [("none", compute(model))]
    for name, work in randomised_models(model, order=order, granularity=granularity, seed=seed):
        steps.append((name, compute(work)))
    return steps


def smoothed(
    compute: Callable[[nn.Module, Tensor], dict[str, Tensor]],
    x: Tensor,
    *,
    samples: int = 50,
    magnitude: float = 0.1,
    seed: int = 0,
) -> Callable[[nn.Module], dict[str, Tensor]]:
    """sMPRT's denoised maps: ``compute(model, x)`` averaged over ``samples`` inputs, the last ``x`` itself
    and the others ``x`` plus Gaussian noise of standard deviation ``magnitude`` x (max - min) of each input
    (as Quantus's SmoothMPRT). The same noise for every step (seeded), so only the weights differ."""
    dims = tuple(range(1, x.dim()))
    std = magnitude * (x.amax(dim=dims, keepdim=True) - x.amin(dim=dims, keepdim=True))
    gen = torch.Generator().manual_seed(seed)
    noise = [torch.randn(x.shape, generator=gen).to(x) * std for _ in range(samples - 1)]

    def run(model: nn.Module) -> dict[str, Tensor]:
        total: dict[str, Tensor] = {}
        for eps in [*noise, torch.zeros_like(x)]:
            for k, v in compute(model, x + eps).items():
                total[k] = total[k] + v / samples if k in total else v / samples
        return total

    return run


def off_classes(targets: Tensor, classes: int, seed: int = 0, seeds: Sequence[int] | None = None) -> Tensor:
    """A random class other than each image's target, drawn as Quantus's RandomLogit draws it (``numpy``
    seeded ``seed``, uniform over the other classes); with ``seeds``, each image's drawn from its own seed
    (the same class whatever batch the image is in)."""
    import numpy as np

    if seeds is not None:
        picks = np.array([np.random.RandomState(s).randint(0, classes - 1) for s in seeds])
    else:
        picks = np.random.RandomState(seed).randint(0, classes - 1, int(targets.shape[0]))
    return torch.tensor([int(p) + (int(p) >= int(t)) for p, t in zip(picks, targets.tolist(), strict=True)])


def random_logit(
    explain_class: Callable[[Tensor], Tensor],
    targets: Tensor,
    classes: int,
    *,
    seed: int = 0,
    similarity: Callable[[Tensor, Tensor], float] | None = None,
    maps: Tensor | None = None,
) -> dict[str, Any]:
    """The random-logit test: each image's map for its class against the map for a random other class
    (:func:`off_classes`). A map that explains the class differs (low similarity); one that shows the image
    whatever the class does not.

    ``explain_class(classes)`` returns the maps ``(B, ...)`` for one class per image; ``maps``, the targets'
    maps where they are at hand (not explained again).
    Returns ``{"classes": off classes, "similarity": (B,) tensor}``; similarity defaults to SSIM.
    """

    off = off_classes(targets, classes, seed)
    a, o = explain_class(targets) if maps is None else maps, explain_class(off)
    sim = similarity or ssim
    return {"classes": off, "similarity": torch.tensor([sim(a[i], o[i]) for i in range(len(off))])}
