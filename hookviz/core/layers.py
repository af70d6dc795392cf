"""Layer rules, in one place: which layers run (and how often), which have a spatial map, how token layouts
become maps, and the default CAM layer. Used by the CLI and the library alike. Names, globs and CAM tensors
are resolved into sites in :mod:`hookviz.core.sites` (imported from here as before).

Rules are decided from shapes traced in one forward pass (:func:`hookviz.core.hooks.trace_shapes`), not from
class names, wherever a shape can tell.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torch import Tensor, nn

from hookviz.core.layout import Layout, layout_of
from hookviz.core.sites import (
    cam_layer,
    cam_layers,
    cam_sites,
    channels,
    is_pattern,
    module_names,
    one_module,
    outermost,
    resolve_layers,
)
from hookviz.core.trace import ModuleCall, pool_of
from hookviz.errors import LayerError, UsageError


def has_map(call: ModuleCall) -> bool:
    """The module ran and its output is a ``(B, C, H, W)`` feature map (or a video model's 5-D one)."""
    return bool(call.calls) and call.output_shape is not None and len(call.output_shape) in (4, 5)


def _call(calls: Sequence[ModuleCall], name: str) -> ModuleCall:
    return next(c for c in calls if c.name == name)


def map_layers(
    model: nn.Module, specs: Sequence[str] | None, calls: Sequence[ModuleCall], model_name: str = "the model"
) -> list[str]:
    """Layers whose feature maps can be shown, in network order.

    ``None``: every Conv2d (Conv3d) that runs (auxiliary heads idle in eval mode, as in googlenet and
    inception_v3, are left out). A glob keeps the layers it matches that have a feature map (blocks,
    convs, norms); a plain name must have one.

    Raises:
        LayerError: a name without a feature map, a glob matching none, a model without a running Conv2d.
    """
    if not specs:
        # One map per input: a convolution run on heads folded into the batch (MViT's attention pooling) is
        # left out (the traced pass has one input).
        names = [
            c.name
            for c in calls
            if c.type in ("Conv2d", "Conv3d") and has_map(c) and c.output_shape and c.output_shape[0] == 1
        ]
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
        LayerError: a name without a 4-D output (a video model's 5-D one too), or a glob that matches none.
    """
    chosen = outermost(map_layers(model, specs, calls, model_name))
    shapes = {c.name: c.output_shape for c in calls}
    clips = [n for n in chosen if len(shapes.get(n) or ()) == 5]
    if clips:
        raise LayerError(
            f"layer {clips[0]!r} outputs {tuple(shapes[clips[0]] or ())}, a video model's (B, C, T, H, W): "
            "DropBlock and Dropout2d drop blocks of (B, C, H, W) maps; use them on a photo model"
        )
    return chosen


def _spatial(model: nn.Module, c: ModuleCall, calls: Sequence[ModuleCall], batch: int = 1) -> Layout | None:
    if (
        not c.calls
        or c.output_shape is None
        or len(c.output_shape) not in (3, 4, 5)
        or c.output_shape[0] != batch
    ):
        return None
    try:
        return layout_of(model, c.name, c.output_shape, calls)
    except LayerError:
        return None


def _where(shape: Sequence[int] | None) -> tuple[int, ...] | None:
    """The spatial part of a shape: (H, W) of a 4-D map (either layout), (T, H, W) of a 5-D one, N of
    tokens."""
    if shape is None or len(shape) not in (3, 4, 5):
        return None
    if len(shape) == 3:
        return (int(shape[1]),)
    if len(shape) == 5:
        return tuple(shape[2:]) if shape[3] == shape[4] or shape[2] != shape[3] else tuple(shape[1:4])
    return tuple(shape[2:]) if shape[2] == shape[3] or shape[1] != shape[2] else tuple(shape[1:3])


def _climb(name: str, info: dict[str, ModuleCall]) -> str:
    """The outermost ancestor of ``name`` that runs once with the same spatial output (a block, a stage).

    Containers that never run themselves (a ``ModuleList``) and blocks that work on another layout in
    between (tokens inside a PVT stage) are looked through.
    """
    where = _where(info[name].output_shape)
    parts = name.split(".")
    for depth in range(1, len(parts)):
        c = info.get(".".join(parts[:depth]))
        if c is not None and c.calls == 1 and where is not None and _where(c.output_shape) == where:
            return c.name
    return name


_INDEXED = re.compile(r"^(.*?)(\d+)$")


def _token_run(tokens: list[ModuleCall]) -> list[ModuleCall]:
    """The run of repeated sibling blocks with token outputs (``blocks.0`` .. ``blocks.11``, ``layer.N``,
    ``encoder_layer_N``) that finishes last, in network order, from names and types alone; [] if none."""
    groups: dict[tuple[str, str, str], list[ModuleCall]] = {}
    for c in tokens:
        parent, _, last = c.name.rpartition(".")
        m = _INDEXED.match(last)
        if m:
            groups.setdefault((parent, m.group(1), c.type), []).append(c)
    runs = [sorted(g, key=lambda c: c.order) for g in groups.values() if len(g) >= 2]
    return max(runs, key=lambda g: g[-1].order, default=[])


def _last_token_block(model: nn.Module, tokens: list[ModuleCall]) -> ModuleCall | None:
    """The last block of :func:`_token_run`, or None."""
    run = _token_run(tokens)
    return run[-1] if run else None


def token_blocks(model: nn.Module, calls: Sequence[ModuleCall]) -> list[str]:
    """A transformer's encoder blocks in order (each run once, with a token output), or [] for a model
    without a run of them."""
    # Only indexed siblings with 3-D outputs can be blocks of tokens: the others need no layout.
    once = [
        c
        for c in calls
        if c.calls == 1 and c.output_shape is not None and len(c.output_shape) == 3
        and _INDEXED.match(c.name.rpartition(".")[2])
    ]  # fmt: skip
    tokens = [c for c in once if (lay := _spatial(model, c, calls)) is not None and lay.kind == "tokens"]
    return [c.name for c in _token_run(tokens)]


def single_call(found: dict[str, list[Tensor]], layer: str) -> Tensor:
    """What ``layer`` gave in one forward pass (``found``: captured per layer, one entry per call).

    Raises:
        LayerError: the layer did not run, or ran several times (its map would be ambiguous).
    """
    got = found.get(layer)
    if not got:
        raise LayerError(f"layer {layer!r} did not run in the forward pass; pick another layer")
    if len(got) > 1:
        raise LayerError(
            f"layer {layer!r} runs {len(got)} times per forward pass, so its map is ambiguous; "
            "pick a layer that runs once (e.g. its parent block)"
        )
    return got[0]


def backbone_prefix(model: nn.Module) -> str | None:
    """The feature extractor of a segmentation or detection model: its ``backbone``'s ``body`` (before an
    FPN) or ``features`` (SSD), else the ``backbone`` itself (a Hugging Face DETR's ``model.backbone``); None
    without one."""
    modules = dict(model.named_modules())
    found = ("backbone.body", "backbone.features", "backbone", "model.backbone")
    return next((p for p in found if p in modules), None)


def default_cam_layer(model: nn.Module, calls: Sequence[ModuleCall]) -> str:
    """The layer a CAM uses when none is given, found from traced shapes (no list of class names).

    The last module to finish with a spatial output decides the family: for token models (ViT, DeiT,
    EVA) it is the first module of the last transformer block (its input norm: the block's own output
    reaches the head only through the class token, so its patch tokens would get no gradient); for
    channels-last models (Swin) that module's outermost same-shaped ancestor; for CNNs the last
    convolutional stage, the outermost ancestor of the last Conv2d with the same spatial output (resnet18
    ``layer4``, mobilenet_v2 and densenet121 ``features``, vgg11 ``features.18``).

    Segmentation and detection models (a ``backbone`` child, as torchvision's) take the map from the
    backbone's last stage (``backbone.layer4``, ``backbone.body.layer4``), not from their heads.

    Before all these shape rules: a classifier whose head pools globally (a pooling module, or
    ``F.adaptive_avg_pool2d`` / ``mean`` over H and W in its code) takes the tensor entering that pooling,
    the one the CAM papers mean (``calls.pool``, traced by :func:`hookviz.core.hooks.trace_shapes`): named by
    the module that made it where one did (resnet18 ``layer4``), else ``NAME:input``. So does a transformer
    whose head averages its patch tokens (Hugging Face Swin ``swin.layernorm``, DINOv2 ``dinov2.layernorm``
    beside its class token, timm's ``gap`` ViTs, LeViT): its last block reaches the head through them.

    Raises:
        UsageError: no module has a spatial output.
    """
    prefix = backbone_prefix(model)
    pool = pool_of(calls)
    if prefix is None and pool is not None:
        try:
            if layout_of(model, pool.name, pool.shape, calls).kind in ("nchw", "ncthw", "tokens"):
                return pool.name
        except (LayerError, KeyError):
            pass
    if prefix is not None:
        inside = [c for c in calls if c.name.startswith(f"{prefix}.")]
        if any(c.calls for c in inside):
            calls = inside
    info = {c.name: c for c in calls if c.calls}
    once = [c for c in calls if c.calls == 1]
    layouts = {c.name: lay for c in once if (lay := _spatial(model, c, calls)) is not None}
    if not layouts:
        raise UsageError("the model has no layer with a spatial output; pass --layer explicitly")
    modules = dict(model.named_modules())

    def weighty(name: str) -> bool:  # not a parameter-free leaf (a Permute, a pooling, an activation)
        m = modules[name]
        return any(True for _ in m.children()) or any(True for _ in m.parameters(recurse=False))

    last = max((info[n] for n in layouts if weighty(n)), key=lambda c: c.order, default=None)
    if last is None:
        last = max((info[n] for n in layouts), key=lambda c: c.order)
    kind = layouts[last.name].kind
    if kind == "tokens":
        tokens = [info[n] for n, lay in layouts.items() if lay.kind == "tokens"]
        block = _last_token_block(model, tokens)
        if block is None:
            return _climb(last.name, info)
        inside = [c for c in tokens if c.name.startswith(f"{block.name}.")]
        return min(inside, key=lambda c: c.order).name if inside else block.name
    if kind in ("nhwc", "nthwc"):
        return _climb(last.name, info)
    convs = [c for c in calls if c.calls and c.type in ("Conv2d", "Conv3d") and c.name in layouts]
    if not convs:
        return _climb(last.name, info)
    return _climb(max(convs, key=lambda c: c.order).name, info)


def default_reason(calls: Sequence[ModuleCall], layer: str) -> str:
    """Why ``layer`` is the default (for the note the CLI prints)."""
    pool = pool_of(calls)
    if pool is not None and pool.name == layer:
        return f"the tensor entering its global pooling ({pool.pooled_by})"
    return "its last spatial stage"


def candidate_layers(model: nn.Module, calls: Sequence[ModuleCall]) -> list[str]:
    """Layers worth trying as the CAM layer (``--layer auto``), in network order: for CNNs the last block of
    each stage (the outermost module finishing last at each spatial size); for transformers the first module
    of each encoder block (the last block's own output reaches the head only through the class token)."""
    info = {c.name: c for c in calls if c.calls}
    once = [c for c in calls if c.calls == 1]
    layouts = {c.name: lay for c in once if (lay := _spatial(model, c, calls)) is not None}
    tokens = [info[n] for n, lay in layouts.items() if lay.kind == "tokens"]
    chosen: list[str] = []
    block = _last_token_block(model, tokens)
    if block is not None:
        parent = block.name.rpartition(".")[0]
        for c in tokens:
            if c.name.rpartition(".")[0] == parent and _INDEXED.match(c.name.rpartition(".")[2]):
                inside = [t for t in tokens if t.name.startswith(f"{c.name}.")]
                chosen.append(min(inside, key=lambda t: t.order).name if inside else c.name)
    else:
        modules = dict(model.named_modules())
        by_size: dict[tuple[int, ...] | None, ModuleCall] = {}
        for n, lay in layouts.items():
            if lay.kind == "tokens" or not any(True for _ in modules[n].parameters()):
                continue
            where = _where(info[n].output_shape)
            if where not in by_size or info[n].order > by_size[where].order:
                by_size[where] = info[n]
        chosen = [_climb(c.name, info) for c in by_size.values()]
    rank = {n: i for i, n in enumerate(module_names(model))}
    chosen = sorted(dict.fromkeys(chosen), key=lambda n: rank[n])
    pool = pool_of(calls)
    if pool is not None and pool.name not in chosen and backbone_prefix(model) is None:
        try:
            layout_of(model, pool.name, pool.shape, calls)
            chosen.append(pool.name)  # the head's pooling input comes last in the network
        except (LayerError, KeyError):
            pass
    return chosen


__all__ = [
    "backbone_prefix",
    "cam_layer",
    "cam_layers",
    "cam_sites",
    "candidate_layers",
    "channels",
    "check_map",
    "default_cam_layer",
    "default_reason",
    "has_map",
    "is_pattern",
    "map_layers",
    "module_names",
    "one_module",
    "outermost",
    "output_layers",
    "resolve_layers",
    "single_call",
    "token_blocks",
]
