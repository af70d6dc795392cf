"""Layer rules, in one place: names and globs, which layers run (and how often), which have a spatial map,
how token layouts become maps, and the default CAM layer. Used by the CLI and the library alike.

Rules are decided from shapes traced in one forward pass (:func:`hookviz.hooks.trace_shapes`), not from
class names, wherever a shape can tell.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Sequence

from torch import Tensor, nn

from hookviz.errors import LayerError, UsageError, close_matches
from hookviz.hooks import ModuleCall


def is_pattern(text: str) -> bool:
    """Whether a layer spec is a glob (``*``, ``?`` or ``[``) rather than a module name."""
    return any(c in text for c in "*?[")


def module_names(model: nn.Module) -> list[str]:
    """Names of every submodule in ``named_modules`` order (the root, named "", excluded)."""
    return [name for name, _ in model.named_modules() if name]


def _listing(model_name: str) -> str:
    return f"`hookviz layers --model {model_name}` lists them"


def resolve_layers(
    model: nn.Module,
    patterns: Iterable[str],
    *,
    model_name: str = "the model",
    kinds: tuple[type[nn.Module], ...] | None = None,
) -> list[str]:
    """Turn layer names and glob patterns into module names, in network order.

    A pattern with ``*``, ``?`` or ``[`` is a glob over ``named_modules()`` names (and, when
    ``kinds`` is given, matches only modules of those types); a plain name must exist exactly.

    Raises:
        LayerError: a name does not exist (close matches are suggested) or a pattern matches nothing.
    """
    modules = dict(model.named_modules())
    names = [n for n in modules if n]
    chosen: set[str] = set()
    for pattern in patterns:
        if is_pattern(pattern):
            hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            if kinds is not None:
                hits = [n for n in hits if isinstance(modules[n], kinds)]
            if not hits:
                kind = f" {'/'.join(k.__name__ for k in kinds)}" if kinds else ""
                raise LayerError(
                    f"pattern {pattern!r} matches no{kind} layer in {model_name}; {_listing(model_name)}"
                )
            chosen.update(hits)
        elif pattern in modules and pattern:
            chosen.add(pattern)
        else:
            near = close_matches(pattern, names)
            raise LayerError(f"no layer {pattern!r} in {model_name}{near} ({_listing(model_name)})")
    return [n for n in names if n in chosen]


def outermost(names: Sequence[str]) -> list[str]:
    """``names`` without those nested inside another of them (``layer4.0`` goes when ``layer4`` is there)."""
    kept = set(names)
    return [n for n in names if not any(n.startswith(f"{other}.") for other in kept if other != n)]


def has_map(call: ModuleCall) -> bool:
    """The module ran and its output is a ``(B, C, H, W)`` feature map."""
    return bool(call.calls) and call.output_shape is not None and len(call.output_shape) == 4


def _call(calls: Sequence[ModuleCall], name: str) -> ModuleCall:
    return next(c for c in calls if c.name == name)


def map_layers(
    model: nn.Module, specs: Sequence[str] | None, calls: Sequence[ModuleCall], model_name: str = "the model"
) -> list[str]:
    """Layers whose feature maps can be shown, in network order.

    ``None``: every Conv2d that runs (auxiliary heads idle in eval mode, as in googlenet and
    inception_v3, are left out). A glob keeps the layers it matches that have a feature map (blocks,
    convs, norms); a plain name must have one.

    Raises:
        LayerError: a name without a feature map, a glob matching none, a model without a running Conv2d.
    """
    if not specs:
        names = [c.name for c in calls if c.type == "Conv2d" and has_map(c)]
        if not names:
            raise LayerError(f"{model_name} has no Conv2d layer that runs; pass --layers")
        return [n for n in module_names(model) if n in set(names)]
    chosen: set[str] = set()
    for spec in specs:
        found = resolve_layers(model, [spec], model_name=model_name)
        if is_pattern(spec):
            found = [n for n in found if has_map(_call(calls, n))]
            if not found:
                raise LayerError(f"pattern {spec!r} matches no layer with a (B, C, H, W) output")
        else:
            check_map(found[0], _call(calls, found[0]), model_name)
        chosen.update(found)
    return [n for n in module_names(model) if n in chosen]


def check_map(name: str, call: ModuleCall, model_name: str = "the model") -> None:
    """Raise unless layer ``name`` runs and outputs a ``(B, C, H, W)`` feature map.

    Raises:
        LayerError: it does not run, or its output is not 4-D (the message gives its type and shape).
    """
    if call.calls == 0:
        raise LayerError(f"layer {name!r} does not run in {model_name}'s forward pass")
    if not has_map(call):
        raise LayerError(
            f"layer {name!r} ({call.type}) outputs shape {call.output_shape}, not a feature map; "
            "pick a convolutional layer"
        )


def output_layers(
    model: nn.Module, specs: Sequence[str], calls: Sequence[ModuleCall], model_name: str = "the model"
) -> list[str]:
    """Layers whose 4-D outputs a hook may modify (DropBlock, Dropout2d): a layer nested in another chosen
    one is dropped (its output would be dropped twice), and a glob keeps only the layers with 4-D outputs.

    Raises:
        LayerError: a name without a 4-D output, or a glob that matches none.
    """
    return outermost(map_layers(model, specs, calls, model_name))


def cam_layer(model: nn.Module, name: str, calls: Sequence[ModuleCall], model_name: str = "the model") -> str:
    """Check that ``name`` can be a CAM layer: it exists, runs once, and has a spatial map.

    Raises:
        LayerError: a pattern, an unknown name, a layer that does not run or runs twice, or one with
        no spatial map (a pooled vector, a classifier head).
    """
    if is_pattern(name):
        raise LayerError(f"--layer takes module names, not patterns ({name!r})")
    (name,) = resolve_layers(model, [name], model_name=model_name)
    call = next((c for c in calls if c.name == name), None)
    if call is None or call.calls == 0:
        raise LayerError(f"layer {name!r} does not run in {model_name}'s forward pass; pick another layer")
    try:
        layout_of(model, name, call.output_shape or ())
    except LayerError as exc:
        raise LayerError(f"{exc} ({_listing(model_name)})") from None
    if call.calls > 1:
        raise LayerError(
            f"layer {name!r} runs {call.calls} times per forward pass, so its gradient is ambiguous; "
            "pick a layer that runs once (e.g. its parent block)"
        )
    return name


def channels(model: nn.Module, name: str, calls: Sequence[ModuleCall]) -> int:
    """How many channels layer ``name``'s map has (tokens: the embedding width)."""
    shape = _call(calls, name).output_shape or ()
    return int(shape[1] if layout_of(model, name, shape) == "nchw" else shape[-1])


def to_spatial(t: Tensor, layout: str) -> Tensor:
    """``(B, C, H, W)`` from a layer output in ``layout`` (``nchw``, ``nhwc`` or ``tokens``).

    Tokens ``(B, N, D)`` are reshaped to the patch grid; a leading class token is dropped when
    ``N - 1`` is a square (ViT), kept out of nothing when ``N`` is a square.
    """
    if layout == "nchw":
        return t
    if layout == "nhwc":
        return t.permute(0, 3, 1, 2)
    b, n, d = t.shape
    side = math.isqrt(n)
    if side * side != n:
        side = math.isqrt(n - 1)
        t = t[:, 1:]
    return t.reshape(b, side, side, d).permute(0, 3, 1, 2)


def layout_of(model: nn.Module, layer: str, shape: Sequence[int]) -> str:
    """How a layer's output is laid out, so maps come out as ``(B, C, H, W)`` for any architecture.

    Raises:
        LayerError: the output has no spatial structure (a classifier head, a pooled vector).
    """
    module = dict(model.named_modules())[layer]
    swin = type(model).__name__ == "SwinTransformer"
    if len(shape) == 4 and shape[2] * shape[3] == 1 and not swin:
        raise LayerError(
            f"layer {layer!r} ({type(module).__name__}) outputs shape {tuple(shape)}: a 1x1 map has no "
            "spatial extent left to show; pick an earlier layer"
        )
    if len(shape) == 4:
        # torchvision's Swin keeps features channels-last after the patch-embedding conv.
        return "nhwc" if swin and not isinstance(module, nn.Conv2d) else "nchw"
    if len(shape) == 3:
        n = shape[1]
        if n > 1 and (math.isqrt(n) ** 2 == n or math.isqrt(n - 1) ** 2 == n - 1):
            return "tokens"
    raise LayerError(
        f"layer {layer!r} ({type(module).__name__}) outputs shape {tuple(shape)}, not a (B, C, H, W) "
        "feature map or a grid of tokens, so it has no spatial map to show; pick a convolutional layer "
        "or an encoder block"
    )


def default_cam_layer(model: nn.Module, calls: Sequence[ModuleCall]) -> str:
    """The last convolutional stage: the outermost ancestor of the last Conv2d with the same spatial output.

    For resnet18 that is ``layer4``, for mobilenet_v2 and densenet121 ``features``, for vgg16
    ``features.28`` (the block after it pools).

    Raises:
        UsageError: the model has no Conv2d that runs.
    """
    kind = type(model).__name__
    if kind == "VisionTransformer":
        # The last block's output reaches the head only through the class token, so its patch tokens
        # get no gradient; the input norm of the last block still feeds every token into attention.
        blocks = [c.name for c in calls if c.calls and c.type == "EncoderBlock"]
        if blocks:
            return f"{blocks[-1]}.ln_1"
    if kind == "SwinTransformer":
        return "features"
    info = {c.name: c for c in calls if c.calls}
    convs = [c.name for c in calls if c.calls and c.type == "Conv2d"]
    if not convs:
        raise UsageError("the model has no Conv2d layer; pass --layer explicitly")
    last = convs[-1]
    shape = info[last].output_shape
    assert shape is not None
    best = last
    parts = last.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        ancestor = ".".join(parts[:depth])
        c = info.get(ancestor)
        if c is None or c.calls != 1 or c.output_shape is None or len(c.output_shape) != 4:
            break
        if c.output_shape[2:] != shape[2:]:
            break
        best = ancestor
    return best
