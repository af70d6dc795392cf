# ruff: noqa: RUF001
"""The method registry: every map hookviz can make is one function plus one registration.

A registration says what the method is (name, title, family, paper), what it needs from the explain pass
(activations, layer gradients, input gradients, masked forward passes), whether its map depends on the
class, and what it costs. Everything else is generated from this table: the CLI's ``--method`` choices and
help, ``--method all``, sheet order, titles in captions and the report, the cost note, the README's method
table (``python -m hookviz.methods``). The model to follow is timm's ``register_model``.

A method's function takes a :class:`hookviz.methods.compute.LayerPass` (the pass's activations, gradients,
targets and shared work at one layer) and returns maps ``(B, T, h, w)``::

    from hookviz.methods import register_method

    @register_method("absgrad", title="|gradient| CAM", family="gradient-weighted",
                     needs={"activations", "layer_gradients"}, cost="the shared backward passes")
    def absgrad(p):
        return torch.stack([(g.abs() * p.activations).sum(1) for g in p.gradients], dim=1)

This module imports no torch (``hookviz --help`` stays fast): built-in methods name their function by
``"module:function"``, resolved when first used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: What a method can need from the explain pass.
NEEDS = frozenset({"activations", "layer_gradients", "input_gradients", "masked_passes", "attention"})
FAMILIES = ("gradient-weighted", "activation-only", "perturbation", "input-gradient", "attention")


@dataclass(frozen=True)
class Method:
    """One registered method (see the module docstring)."""

    name: str
    title: str
    family: str
    needs: frozenset[str]
    class_specific: bool
    #: What it costs per image, in words for the cost note ("one masked forward pass per channel").
    cost: str
    function: Callable[..., Any] | str = field(repr=False)
    paper: str = ""
    formula: str = ""
    #: Part of ``--method all`` (every cheap method); slow ones are asked for by name.
    in_all: bool = True
    #: Why its formula assumes non-negative activations, if it does (a note on signed tensors).
    assumes_nonnegative: str | None = None
    #: Other methods whose maps it combines (Guided Grad-CAM uses Grad-CAM's).
    uses: tuple[str, ...] = ()
    #: Works per detected box on a detector.
    detection: bool = False

    def compute(self, p: Any) -> Any:
        """The method's maps ``(B, T, h, w)`` for one layer of a pass."""
        fn = self.function
        if isinstance(fn, str):
            module, _, attr = fn.partition(":")
            fn = getattr(importlib.import_module(module), attr)
            object.__setattr__(self, "function", fn)
        return fn(p)


REGISTRY: dict[str, Method] = {}
ALL = "all"


def register_method(
    name: str,
    *,
    title: str,
    family: str,
    needs: Iterable[str],
    cost: str,
    class_specific: bool = True,
    paper: str = "",
    formula: str = "",
    in_all: bool = True,
    assumes_nonnegative: str | None = None,
    uses: Iterable[str] = (),
    detection: bool = False,
    function: Callable[..., Any] | str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a method; as a decorator on its function, or with ``function=`` (a callable or a
    ``"module:function"`` string resolved on first use).

    Raises:
        ValueError: a name taken or malformed, an unknown family or need.
    """
    if not name.isidentifier() or name == ALL or name in REGISTRY:
        raise ValueError(f"method name {name!r} is taken or not an identifier")
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: one of {', '.join(FAMILIES)}")
    wanted = frozenset(needs)
    if not wanted <= NEEDS:
        raise ValueError(f"needs {sorted(wanted - NEEDS)}: not among {sorted(NEEDS)}")

    def add(fn: Callable[..., Any] | str) -> Any:
        REGISTRY[name] = Method(
            name, title, family, wanted, class_specific, cost, fn, paper, formula, in_all,
            assumes_nonnegative, tuple(uses), detection,
        )  # fmt: skip
        return fn

    if function is not None:
        add(function)
        return lambda fn: fn
    return add


def unregister(name: str) -> None:
    """Remove a method (tests that register a toy one clean up with this)."""
    REGISTRY.pop(name, None)


def get(name: str) -> Method:
    """The registered method ``name``.

    Raises:
        UsageError: no such method (the registered ones are listed).
    """
    if name not in REGISTRY:
        from hookviz.errors import UsageError, close_matches

        raise UsageError(
            f"unknown method {name!r}{close_matches(name, list(REGISTRY))}; choose from "
            f"{', '.join(REGISTRY)} or all"
        )
    return REGISTRY[name]


def names() -> list[str]:
    """Every registered method, in registration order (the order sheets show them)."""
    return list(REGISTRY)


def title(name: str) -> str:
    return REGISTRY[name].title if name in REGISTRY else name


def parse(values: Iterable[str], option: str = "--method") -> list[str]:
    """Method names validated (a typo is a :class:`~hookviz.errors.UsageError`), ``all`` expanded to every
    cheap method, duplicates dropped."""
    chosen: list[str] = []
    for value in values:
        text = str(value).strip().lower()
        if text == ALL:
            chosen += [m.name for m in REGISTRY.values() if m.in_all]
        else:
            chosen.append(get(text).name)
    return list(dict.fromkeys(chosen))


def table() -> str:
    """The README's method table (Markdown), from the registry."""
    rows = ["| `--method` | paper | map | needs | cost |", "|---|---|---|---|---|"]
    for m in REGISTRY.values():
        needs = ", ".join(sorted(m.needs))
        rows.append(f"| `{m.name}` | {m.paper} | {m.formula} | {needs} | {m.cost} |")
    return "\n".join(rows) + "\n"


_CAMS = "hookviz.methods.compute"

register_method(
    "gradcam", title="Grad-CAM", family="gradient-weighted", needs={"activations", "layer_gradients"},
    cost="the shared backward passes", paper="Selvaraju et al., ICCV 2017",
    formula="ReLU(Σ_k mean(∂y/∂A^k) A^k)", detection=True, function=f"{_CAMS}:gradcam",
)  # fmt: skip
register_method(
    "gradcampp", title="Grad-CAM++", family="gradient-weighted", needs={"activations", "layer_gradients"},
    cost="the shared backward passes", paper="Chattopadhay et al., WACV 2018",
    formula="closed-form α from 2nd/3rd powers of the gradient", detection=True,
    assumes_nonnegative="its weights divide by each channel's sum of activations (the derivation takes "
    "A >= 0)",
    function=f"{_CAMS}:gradcampp",
)  # fmt: skip
register_method(
    "xgradcam", title="XGrad-CAM", family="gradient-weighted", needs={"activations", "layer_gradients"},
    cost="the shared backward passes", paper="Fu et al., BMVC 2020", formula="weights Σ (A/ΣA)·∂y/∂A",
    detection=True, assumes_nonnegative="its weights divide by each channel's sum of activations",
    function=f"{_CAMS}:xgradcam",
)  # fmt: skip
register_method(
    "layercam", title="LayerCAM", family="gradient-weighted", needs={"activations", "layer_gradients"},
    cost="the shared backward passes", paper="Jiang et al., TIP 2021",
    formula="ReLU(Σ_k ReLU(∂y/∂A^k) ⊙ A^k), element-wise", detection=True, function=f"{_CAMS}:layercam",
)  # fmt: skip
register_method(
    "hirescam", title="HiResCAM", family="gradient-weighted", needs={"activations", "layer_gradients"},
    cost="the shared backward passes", paper="Draelos & Carin, 2020",
    formula="ReLU(Σ_k ∂y/∂A^k ⊙ A^k), element-wise", detection=True, function=f"{_CAMS}:hirescam",
)  # fmt: skip
register_method(
    "eigencam", title="Eigen-CAM", family="activation-only", needs={"activations"}, class_specific=False,
    cost="no backward pass", paper="Muhammad & Yeasin, IJCNN 2020",
    formula="first principal component of A; no gradient, class-agnostic", detection=True,
    function=f"{_CAMS}:eigencam",
)  # fmt: skip
register_method(
    "scorecam", title="Score-CAM", family="perturbation", needs={"activations", "masked_passes"},
    cost="one masked forward pass per channel", paper="Wang et al., CVPRW 2020",
    formula="softmax-weighted channels from masked forward passes", function=f"{_CAMS}:scorecam",
)  # fmt: skip
register_method(
    "guidedbackprop", title="Guided Backprop", family="input-gradient", needs={"input_gradients"},
    cost="one forward and one backward pass per target", paper="Springenberg et al., 2015",
    formula="input gradient, only positive gradients through every rectifier (ReLU, ReLU6, "
    "hardtanh(x, 0, t), clamp(x, min=0), LeakyReLU; the record counts them, a network with none gets a "
    "note); max over colours",
    function=f"{_CAMS}:guidedbackprop",
)  # fmt: skip
register_method(
    "guidedgradcam", title="Guided Grad-CAM", family="input-gradient",
    needs={"activations", "layer_gradients", "input_gradients"}, uses=("gradcam",),
    cost="Guided Backprop's passes", paper="Selvaraju et al., ICCV 2017",
    formula="guided backprop × the upsampled Grad-CAM", function=f"{_CAMS}:guidedgradcam",
)  # fmt: skip
