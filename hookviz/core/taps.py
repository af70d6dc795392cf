"""The tensors a CAM can use, by name, and the one the CAM papers mean.

A CAM tensor is named like a layer:

``layer4``                       a module's output (a forward hook)
``_avg_pooling:input``           a module's first input (a forward-pre hook)
``adaptive_avg_pool2d:input``    the tensor passed to a functional global pooling called by the model's own
``head.mean:input``              ``forward`` (or by module ``head``'s): ``F.adaptive_avg_pool2d(x, 1)``,
                                 ``x.mean((2, 3))``, ``F.avg_pool2d(x, x.shape[2:])``, ``x.amax((2, 3))``

The CAM papers (Zhou et al. 2016, Selvaraju et al. 2017, Chattopadhay et al. 2018, Fu et al. 2020) mean the
feature map that enters the global pooling feeding the classifier: after the last activation. Taking a
module's output instead can hand them a BatchNorm's signed output (an EfficientNet's head, densenet's
``norm5``), which breaks the formulas that assume non-negative activations. :func:`pool_site` finds that
tensor in one traced forward pass; it is named by the module that produced it where one did (resnet's
``layer4``), so existing names stay. File names use :func:`slug` (no colons).

This module depends on torch alone: :mod:`hookviz.core.hooks` builds on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

INPUT = ":input"

#: Functions that pool globally when their output is (B, C) or (B, C, 1, 1) of a (B, C, H, W) input (or
#: (B, C, 1, 1, 1) of a video model's (B, C, T, H, W)).
POOL_FUNCTIONS = frozenset(
    {
        "adaptive_avg_pool2d",
        "adaptive_max_pool2d",
        "_adaptive_max_pool2d",
        "adaptive_max_pool2d_with_indices",
        "avg_pool2d",
        "max_pool2d",
        "_max_pool2d",
        "max_pool2d_with_indices",
        "mean",
        "amax",
        "adaptive_avg_pool3d",
        "adaptive_max_pool3d",
        "adaptive_max_pool3d_with_indices",
        "avg_pool3d",
        "max_pool3d",
        "max_pool3d_with_indices",
    }
)


#: Functions that pool tokens globally when their output is (B, C, 1) of a (B, C, N) input (Hugging Face
#: Swin's ``AdaptiveAvgPool1d`` over its tokens transposed).
TOKEN_POOLS = frozenset({"adaptive_avg_pool1d", "adaptive_max_pool1d"})


def slug(name: str) -> str:
    """A tensor name as it appears in file names: ``_avg_pooling:input`` → ``_avg_pooling-input``."""
    return name.replace(":", "-")


def is_input(name: str) -> bool:
    """Whether ``name`` names an input (``NAME:input``) rather than a module's output."""
    return name.endswith(INPUT)


def base(name: str) -> str:
    """The module part of a tensor name (``head.mean:input`` → ``head.mean``, ``layer4`` → ``layer4``)."""
    return name[: -len(INPUT)] if is_input(name) else name


@dataclass(frozen=True)
class Ref:
    """A parsed tensor name: ``module`` (for a function: the module whose forward calls it, "" for the model
    itself), and ``function`` for a functional pooling's input."""

    name: str
    module: str
    stage: str  # "output" | "input"
    function: str | None = None


def parse(name: str, modules: dict[str, nn.Module]) -> Ref | None:
    """The :class:`Ref` of ``name`` in a model with these ``named_modules``, or None when nothing matches."""
    if not is_input(name):
        return Ref(name, name, "output") if name and name in modules else None
    head = base(name)
    if head and head in modules:
        return Ref(name, head, "input")
    owner, _, function = head.rpartition(".")
    if function in POOL_FUNCTIONS and owner in modules:
        return Ref(name, owner, "input", function)
    return None


def _global(function: str, args: Sequence[Any], out: Any) -> Tensor | None:
    """The pooled input when this call pools a (B, C, H, W) tensor over all of H x W, else None."""
    if function not in POOL_FUNCTIONS | TOKEN_POOLS or not args or not isinstance(args[0], Tensor):
        return None
    x = args[0]
    y = out[0] if isinstance(out, (tuple, list)) and out else out
    if not isinstance(y, Tensor):
        return None
    if x.dim() == 3 and function == "mean" and x.shape[1] > 1:  # tokens (B, N, C) averaged: LeViT
        b, _, c = x.shape
        return x if tuple(y.shape) in ((b, c), (b, 1, c)) else None
    if x.dim() == 3 and function in TOKEN_POOLS and x.shape[2] > 1:  # (B, C, N) pooled: Hugging Face Swin
        b, c, _ = x.shape
        return x if tuple(y.shape) in ((b, c), (b, c, 1)) else None
    if x.dim() == 5 and x.shape[3] * x.shape[4] > 1:
        b, c = x.shape[:2]
        return x if tuple(y.shape) in ((b, c), (b, c, 1, 1, 1)) else None
    if x.dim() != 4 or x.shape[2] * x.shape[3] <= 1:
        return None
    b, c = x.shape[:2]
    if tuple(y.shape) in ((b, c), (b, c, 1, 1)):
        return x
    return None


@dataclass(frozen=True)
class PoolSite:
    """Where the head's global pooling takes its input: the tensor's ``name`` (see the module docstring),
    its ``shape``, and what pools it (a module type or a function name)."""

    name: str
    shape: tuple[int, ...]
    pooled_by: str


class _Sites(TorchFunctionMode):
    """Records global poolings during a forward pass (the innermost running module from ``stack``)."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__()
        self.stack = stack
        self.found: list[tuple[str, str, Tensor, int, tuple[str, ...]]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        x = _global(name, args, out)
        if x is not None:
            owner = self.stack[-1] if self.stack else ""
            self.found.append((owner, name.strip("_"), x, x._version, tuple(self.stack)))
        return out


def _versioned(t: Tensor | None) -> tuple[Tensor, int] | None:
    return (t, t._version) if isinstance(t, Tensor) else None


def _same(a: tuple[Tensor, int] | None, b: tuple[Tensor, int]) -> bool:
    return a is not None and a[0] is b[0] and a[1] == b[1]


class PoolTracer:
    """Used by :func:`hookviz.core.hooks.trace_shapes` during its one forward pass: tracks the running
    modules, their first inputs and outputs, and every global pooling, then names the head's pooling input."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.inputs: dict[str, tuple[Tensor, int] | None] = {}
        self.outputs: dict[str, tuple[Tensor, int] | None] = {}
        self.finished: list[str] = []
        self.mode = _Sites(self.stack)

    def pre(self, name: str, first: Tensor | None) -> None:
        self.stack.append(name)
        self.inputs.setdefault(name, _versioned(first))

    def post(self, name: str, first: Tensor | None) -> None:
        if self.stack and self.stack[-1] == name:
            self.stack.pop()
        self.outputs.setdefault(name, _versioned(first))
        self.finished.append(name)

    def site(self, calls: dict[str, int], types: dict[str, str]) -> PoolSite | None:
        """The last global pooling's input, named by the module that made it, else the pooling module it
        entered, else the function (see the module docstring). ``calls``: how often each module ran."""
        if not self.mode.found:
            return None
        owner, function, x, version, stack = self.mode.found[-1]
        shape = tuple(int(s) for s in x.shape)
        # The latest to finish is the outermost of nested modules returning the same tensor (features.18.2,
        # features.18, features: mobilenet_v2's is "features").
        once = [n for n in dict.fromkeys(reversed(self.finished)) if calls.get(n) == 1]
        # Same object and same version: an in-place op in between (densenet's F.relu(x, inplace=True))
        # makes the pooled values differ from what the module returned.
        seen = (x, version)
        made = next((n for n in once if _same(self.outputs.get(n), seen)), None)
        if x.dim() == 3:  # pooled tokens: a module's output, whole or a view of it (not another tensor)
            return _token_site(made, x, version, once, self.outputs, function)
        if made is not None:
            return PoolSite(made, shape, types.get(owner, function) if owner in stack else function)
        entered = next((n for n in stack if calls.get(n) == 1 and _same(self.inputs.get(n), seen)), None)
        if entered is not None:
            return PoolSite(f"{entered}{INPUT}", shape, types.get(entered, function))
        return PoolSite(f"{owner}.{function}{INPUT}" if owner else f"{function}{INPUT}", shape, function)


def _token_site(
    made: str | None,
    x: Tensor,
    version: int,
    once: list[str],
    outputs: dict[str, tuple[Tensor, int] | None],
    function: str,
) -> PoolSite | None:
    """Where pooled tokens come from: the module whose output ``x`` is (LeViT's mean), else the one whose
    output ``x`` is a view of, named with that output's shape: DINOv2's mean of its patch tokens (a slice
    past the class and register tokens, which the token layout drops too), Hugging Face Swin's tokens
    transposed for its ``AdaptiveAvgPool1d``."""
    if made is not None:
        return PoolSite(made, tuple(int(s) for s in x.shape), function)
    whole = x._base
    if whole is None or whole.dim() != 3:
        return None
    made = next((n for n in once if _same(outputs.get(n), (whole, version))), None)
    return PoolSite(made, tuple(int(s) for s in whole.shape), function) if made is not None else None


class FunctionTaps(TorchFunctionMode):
    """Hands the inputs of functional global poolings to ``take(name, tensor)`` during a forward pass, which
    returns the tensor the pooling gets instead (a gradient tap) or the same one (capture only).

    ``wanted``: tensor names ``[owner.]function:input``; ``running(owner)`` says whether ``owner``'s own
    forward (not a child's) is the innermost code running.
    """

    def __init__(
        self,
        wanted: dict[str, Ref],
        running: Callable[[str], bool],
        take: Callable[[str, Tensor], Tensor],
    ) -> None:
        super().__init__()
        self.wanted = wanted
        self.running = running
        self.take = take

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "").strip("_")
        if name in POOL_FUNCTIONS and args and isinstance(args[0], Tensor) and args[0].dim() in (4, 5):
            for ref in self.wanted.values():
                if ref.function is not None and ref.function.strip("_") == name and self.running(ref.module):
                    probe = func(*args, **(kwargs or {}))
                    if _global(name, args, probe) is not None:
                        args = (self.take(ref.name, args[0]), *args[1:])
                    break
        return func(*args, **(kwargs or {}))


def depth_tracker(owners: dict[str, nn.Module], hooks: Any) -> Callable[[str], bool]:
    """``running(owner)``: whether ``owner``'s forward is running and none of its children's is (``owners``:
    each owner's module by name, as the sites found them).

    Registers forward-pre and forward hooks on each owner and its direct children into ``hooks`` (a
    :class:`~hookviz.core.guards.HookGroup`)."""
    active: dict[str, int] = {}

    def enter(key: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            active[key] = active.get(key, 0) + 1

        return hook

    def leave(key: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            active[key] = active.get(key, 1) - 1

        return hook

    children: dict[str, list[str]] = {}
    for owner, module in owners.items():
        keys = [f"child:{owner}:{i}" for i, _ in enumerate(module.children())]
        children[owner] = keys
        hooks.add(module.register_forward_pre_hook(enter(f"self:{owner}")))
        hooks.add(module.register_forward_hook(leave(f"self:{owner}")))
        for key, child in zip(keys, module.children(), strict=True):
            hooks.add(child.register_forward_pre_hook(enter(key)))
            hooks.add(child.register_forward_hook(leave(key)))

    def running(owner: str) -> bool:
        if owner not in children:
            return False
        return active.get(f"self:{owner}", 0) > 0 and not any(active.get(k, 0) > 0 for k in children[owner])

    return running


def negative_mass(t: Tensor) -> Tensor:
    """Per image of ``t`` (B, ...), the share of its mass (sum of absolute values) below zero: what makes
    the CAM formulas that assume non-negative activations meaningless. A ReLU's output has none, a
    BatchNorm's about half; SiLU's and GELU's small negative tails a few percent."""
    flat = torch.nan_to_num(t.detach().float().flatten(1))
    total = flat.abs().sum(dim=1)
    neg = (-flat).clamp_min(0).sum(dim=1)
    return torch.where(total > 0, neg / total.clamp_min(1e-30), torch.zeros_like(total))


#: From this share of its mass below zero, a CAM tensor counts as signed (a ReLU's output has none, a
#: BatchNorm's about half).
MATERIAL_NEGATIVE = 0.05


__all__ = [
    "INPUT",
    "MATERIAL_NEGATIVE",
    "FunctionTaps",
    "PoolSite",
    "PoolTracer",
    "Ref",
    "base",
    "depth_tracker",
    "is_input",
    "negative_mass",
    "parse",
    "slug",
]
