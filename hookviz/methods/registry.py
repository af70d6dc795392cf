"""The registry itself: :class:`Method`, :class:`MethodOptions`, :func:`register_method` and the lookups
(:mod:`hookviz.methods` re-exports them with the built-in methods registered). Imports no torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from hookviz.errors import UsageError, close_matches

#: What a method can need from the explain pass: the layer's tensor, its gradient per target, the input's
#: gradient per target (the shared pass then records from the input), Score-CAM's masked passes, attention,
#: FullGrad's bias terms (a hook at every biased layer during the shared backward passes), or passes of its
#: own (which it runs itself, and counts in ``passes``).
NEEDS = frozenset(
    {
        "activations", "layer_gradients", "input_gradients", "bias_gradients", "masked_passes", "attention",
        "own_passes",
    }
)  # fmt: skip
FAMILIES = (
    "gradient-weighted", "activation-only", "perturbation", "input-gradient", "pixel-perturbation",
    "attention", "control",
)  # fmt: skip
#: ``--method NAME`` for a family: every method of these families (slow ones included: asked for by name).
SELECTORS = {
    "gradient": ("gradient-weighted",),
    "activation": ("activation-only",),
    "cams": ("gradient-weighted", "activation-only", "perturbation"),
    "perturbation": ("perturbation", "pixel-perturbation"),
    "pixel": ("input-gradient", "pixel-perturbation"),
    "control": ("control",),
    "attention": ("attention",),
}

#: Passes per image ``(forward, backward)`` a method runs beyond the shared explain pass, given the CAM
#: tensor's channels ``k``, the targets ``t``, the options and the input's ``(H, W)``.
Passes = Callable[[int, int, "MethodOptions", tuple[int, ...]], tuple[int, int]]


@dataclass(frozen=True, kw_only=True)
class MethodOptions:
    """The settings of the methods that take any (``--seed``, ``--samples``, ...); one object for all.

    ``None`` means each method's own default (its paper's or its reference implementation's, in its
    registration). ``input_floor``: the input tensor of a black pixel, per colour channel (the model's
    normalisation of 0; the CLI sets it from the model's preprocessing; zeros when not given).
    """

    seed: int = 0
    samples: int | None = None
    noise: float | None = None
    steps: int = 50
    baseline: str = "black"
    window: int = 16
    stride: int = 8
    masks: int = 2000
    cells: int = 7
    #: Finer-CAM's classes (``--compare``): indices, or names resolved with the model before the methods run.
    compare: tuple[int | str, ...] = ()
    batch: int = 64
    input_floor: tuple[float, ...] | None = None
    head_fusion: str = "mean"
    discard: float = 0.0

    def __post_init__(self) -> None:

        if self.baseline not in BASELINES:
            raise UsageError(f"--baseline {self.baseline}: one of {', '.join(BASELINES)}")
        for flag, value in (("--steps", self.steps), ("--window", self.window), ("--stride", self.stride),
                            ("--masks", self.masks), ("--cells", self.cells), ("--batch", self.batch),
                            ("--samples", self.samples or 1)):  # fmt: skip
            if value < 1:
                raise UsageError(f"{flag} {value}: must be at least 1")
        if self.noise is not None and not self.noise >= 0:
            raise UsageError(f"--noise {self.noise}: must be >= 0")
        if self.head_fusion not in HEAD_FUSIONS:
            raise UsageError(f"--head-fusion {self.head_fusion}: one of {', '.join(HEAD_FUSIONS)}")
        if not 0.0 <= self.discard < 1.0:
            raise UsageError(f"--discard-ratio {self.discard}: must be in [0, 1)")

    def record(self, methods: Iterable[str]) -> dict[str, Any]:
        """What a record says of the settings the given methods used (the seed of the stochastic ones)."""
        used: dict[str, Any] = {}
        for name in methods:
            for key in REGISTRY[name].options if name in REGISTRY else ():
                used[key] = getattr(self, key)
        return used


BASELINES = ("black", "mean", "blur")
#: How attention rollout fuses the heads of a block.
HEAD_FUSIONS = ("mean", "max", "min")


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
    #: Its maps of one layer pass, or ``module:function`` naming it; None for a method the detection pass
    #: computes (D-RISE).
    function: Callable[..., Any] | str | None = field(repr=False)
    paper: str = ""
    formula: str = ""
    #: Part of ``--method all``: every cheap method (at most one extra forward pass and two backward passes
    #: per target, whatever the layer's width); Score-CAM, FullGrad's gradient at every biased layer, the
    #: samplers and the perturbations are asked for by name.
    in_all: bool = True
    #: Why its formula assumes non-negative activations, if it does (a note on signed tensors).
    assumes_nonnegative: str | None = None
    #: Other methods whose maps it combines (Guided Grad-CAM uses Grad-CAM's).
    uses: tuple[str, ...] = ()
    #: Works per detected box on a detector.
    detection: bool = False
    #: Extra passes per image (None: only the shared pass); the cost note and progress read it.
    passes: Passes | None = field(default=None, repr=False, compare=False)
    #: ``input``: a map at the input's resolution, the same at every layer (pixel attributions).
    resolution: str = "layer"
    #: The :class:`MethodOptions` fields it reads (a record gives their values).
    options: tuple[str, ...] = ()
    #: Fuses the maps of every requested layer into one (Refine-CAM).
    across_layers: bool = False
    #: Explains a detector's boxes and nothing else (D-RISE).
    detection_only: bool = False

    def compute(self, p: Any) -> Any:
        """The method's maps ``(B, T, h, w)`` for one layer of a pass."""
        fn = self.function
        if fn is None:
            raise UsageError(f"--method {self.name} explains a detector's boxes; for a classifier use rise")
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
    passes: Passes | None = None,
    resolution: str = "layer",
    options: Iterable[str] = (),
    across_layers: bool = False,
    detection_only: bool = False,
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
    if name in SELECTORS:
        raise ValueError(f"method name {name!r} is a family selector")
    unknown = set(options) - {f.name for f in fields(MethodOptions)}
    if unknown or resolution not in ("layer", "input"):
        raise ValueError(f"options {sorted(unknown)} / resolution {resolution!r}: not known")

    def add(fn: Callable[..., Any] | str | None) -> Any:
        REGISTRY[name] = Method(
            name, title, family, wanted, class_specific, cost, fn, paper, formula, in_all,
            assumes_nonnegative, tuple(uses), detection, passes, resolution, tuple(options), across_layers,
            detection_only,
        )  # fmt: skip
        return fn

    return _registration(add, function, now=function is not None or detection_only)


def _registration(add: Callable[[Any], Any], function: Any, *, now: bool) -> Any:
    """What ``register_*`` returns: with ``now`` (its function given by name, or none needed: a detector's
    method has no layer-pass function) it registers at once and returns a decorator that changes nothing;
    else the decorator that registers the function it decorates."""
    if now:
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
        raise UsageError(
            f"unknown method {name!r}{close_matches(name, list(REGISTRY))}; choose from "
            f"{', '.join(REGISTRY)}, all or a family ({', '.join(SELECTORS)})"
        )
    return REGISTRY[name]


def names() -> list[str]:
    """Every registered method, in registration order (the order sheets show them)."""
    return list(REGISTRY)


def title(name: str) -> str:
    return REGISTRY[name].title if name in REGISTRY else name


def parse(values: Iterable[str], option: str = "--method") -> list[str]:
    """Method names validated (a typo is a :class:`~hookviz.errors.UsageError`), ``all`` expanded to every
    cheap method, a family (:data:`SELECTORS`: ``pixel``, ``perturbation``, ...) to its methods, duplicates
    dropped."""
    chosen: list[str] = []
    for value in values:
        for text in str(value).lower().split(","):
            text = text.strip()
            if text == ALL:
                chosen += [m.name for m in REGISTRY.values() if m.in_all]
            elif text in SELECTORS:
                # A family is the methods for classifiers and segmenters (D-RISE is asked for by name).
                chosen += [
                    m.name for m in REGISTRY.values() if m.family in SELECTORS[text] and not m.detection_only
                ]
            elif text:
                chosen.append(get(text).name)
    return list(dict.fromkeys(chosen))


def passes(
    name: str,
    channels: int,
    targets: int,
    options: MethodOptions | None = None,
    size: tuple[int, ...] = (224, 224),
) -> tuple[int, int]:
    """``(forward, backward)`` passes per image that ``name`` runs beyond the shared explain pass."""
    spec = get(name)
    if spec.passes is None:
        return (0, 0)
    return spec.passes(channels, targets, options or MethodOptions(), size)


def table() -> str:
    """The method table of docs/methods.md (Markdown), from the registry."""
    rows = [
        "| `--method` | family | paper | map | cost per image (resnet18 layer4: 512 channels, 1 target) |",
        "|---|---|---|---|---|",
    ]
    for m in REGISTRY.values():
        fwd, bwd = passes(m.name, 512, 1)
        cost = m.cost if (fwd, bwd) == (0, 0) else f"{m.cost}: {fwd:,} forward, {bwd:,} backward"
        star = "" if m.in_all else " (not in `all`)"
        rows.append(f"| `{m.name}` | {m.family}{star} | {m.paper} | {m.formula} | {cost} |")
    return "\n".join(rows) + "\n"


#: What a token method (``hookviz vlm``: a map per answer token over a vision-language model's image tokens)
#: needs of the teacher-forced pass: the answer token's gradient at a decoder layer's output or at the image
#: tokens as the decoder receives them (one shared pass with a backward per token), the decoder's attention
#: weights (an eager-attention pass), kept with their graph, its final states (a pass without gradients),
#: the vision tower's attention, or the photo's token layout (its views' grids).
TOKEN_NEEDS = frozenset(
    {
        "layer_gradients", "embedding_gradients", "attention", "attention_gradients", "final_states",
        "tower_attention", "layout",
    }
)  # fmt: skip


@dataclass(frozen=True)
class TokenMethod:
    """One registered token method (see :func:`register_token_method`)."""

    name: str
    title: str
    needs: frozenset[str]
    cost: str
    #: Its maps ``(T, N)`` of one teacher-forced pass (``hookviz.vlm.words.TokenPass``), or
    #: ``module:function`` naming it (resolved on first use).
    function: Callable[..., Any] | str = field(repr=False)
    paper: str = ""
    #: Made when no method is named (a costly one is asked for by name).
    default: bool = True
    #: Reads the decoder layer ``--layer`` names (LLaVA-CAM), which must reach an answer token.
    reads_layer: bool = False

    def compute(self, p: Any) -> Any:
        """The method's maps ``(T, N)``: a score per answer token and image token."""
        fn = self.function
        if isinstance(fn, str):
            module, _, attr = fn.partition(":")
            fn = getattr(importlib.import_module(module), attr)
            object.__setattr__(self, "function", fn)
        return fn(p)


#: The token methods, in the order they are drawn.
TOKEN_METHODS: dict[str, TokenMethod] = {}


def register_token_method(
    name: str,
    *,
    title: str,
    needs: Iterable[str],
    cost: str,
    paper: str = "",
    default: bool = True,
    reads_layer: bool = False,
    function: Callable[..., Any] | str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a token method of ``hookviz vlm``; as a decorator on its function, or with ``function=``.

    Raises:
        ValueError: a name taken or not an identifier, an unknown need.
    """
    if not name.isidentifier() or name in TOKEN_METHODS:
        raise ValueError(f"token method name {name!r} is taken or not an identifier")
    wanted = frozenset(needs)
    if not wanted <= TOKEN_NEEDS:
        raise ValueError(f"needs {sorted(wanted - TOKEN_NEEDS)}: not among {sorted(TOKEN_NEEDS)}")

    def add(fn: Callable[..., Any] | str) -> Any:
        TOKEN_METHODS[name] = TokenMethod(name, title, wanted, cost, fn, paper, default, reads_layer)
        return fn

    return _registration(add, function, now=function is not None)


def unregister_token_method(name: str) -> None:
    """Remove a token method (tests that register one clean up with this)."""
    TOKEN_METHODS.pop(name, None)


def token_method(name: str) -> TokenMethod:
    """The registered token method ``name``.

    Raises:
        UsageError: no such method (the registered ones are listed).
    """
    if name not in TOKEN_METHODS:
        raise UsageError(f"--method {name}: hookviz vlm has {', '.join(TOKEN_METHODS)}")
    return TOKEN_METHODS[name]
