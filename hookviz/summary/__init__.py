"""Model summary: per-module shapes, parameters and MACs, with functional ops and attention counted.

Hooks give the module tree, shapes and parameters; a ``TorchDispatchMode`` sees every aten op that
runs (convolutions, matrix products, attention kernels) and attributes its MACs to the modules being
executed at that moment, so ``F.linear``, ``torch.matmul``, ``einsum`` and scaled-dot-product attention
called inside a module's ``forward`` are counted too. 1 MAC (multiply-accumulate) = 2 FLOPs.

What is counted: convolution (any dimension, groups, transposed), ``mm``/``addmm``/``bmm``/``baddbmm``
(which ``linear``, ``matmul`` and ``einsum`` lower to), scaled-dot-product attention kernels
(``QK^T`` and ``AV``) and PyTorch's fused multi-head attention. Element-wise ops, normalisation,
pooling and softmax are not counted (they are memory-bound and small next to the products).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.hooks import HookGroup, preserved, probe_input, unwrap_compiled
from hookviz.errors import UsageError
from hookviz.summary.counting import _Counter, op_macs
from hookviz.summary.data import Row
from hookviz.summary.formatting import ModelSummary

__all__ = ["ModelSummary", "Row", "op_macs", "summarize"]


def _shape(t: Any) -> list[int]:
    return list(t.shape)


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _on_meta(model: nn.Module, input_size: Sequence[int], **how: Any) -> ModelSummary | None:
    """:func:`summarize` of a copy of ``model`` on the ``meta`` device, or None where it cannot run there."""
    import copy

    try:
        meta = copy.deepcopy(unwrap_compiled(model)).to("meta")
        return summarize(meta, input_size, device="meta", **how)
    except UsageError:
        raise
    except Exception:  # not every model runs on meta: count it for real
        return None


def summarize(
    model: nn.Module,
    input_size: Sequence[int] = (3, 224, 224),
    *,
    batch_size: int = 1,
    depth: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    name: str | None = None,
    on_meta: bool = False,
) -> ModelSummary:
    """Run one forward pass of zeros and return per-module statistics (eval mode, no grad).

    Args:
        model: any ``nn.Module`` taking one image batch.
        input_size: ``(C, H, W)`` of one input, ``(C, T, H, W)`` of one clip for a video model.
        batch_size: MACs and activation sizes are for this many inputs.
        depth: rows shown by ``str()``/markdown/csv (0 = the model only); the data keeps every row.
        device: of the probe input; by default the model's (its first floating-point tensor's).
        dtype: of the probe input, likewise.
        on_meta: count on a copy of the model on PyTorch's ``meta`` device: every shape and MAC without
            computing a value (swin3d_b's 141 GMACs in under a second instead of 9 s); a model that cannot
            run there (a data-dependent branch) is counted by a real pass instead. ``model`` is untouched.

    Raises:
        UsageError: a bad input size or batch size.

    Examples:
        >>> s = summarize(torchvision.models.resnet18())
        >>> s.total_params, s.macs  # 11689512, 1.81e9
        >>> print(s)
    """
    if batch_size < 1:
        raise UsageError(f"--batch-size {batch_size}: must be at least 1")
    if on_meta and str(device or "meta") == "meta":
        counted = _on_meta(model, input_size, batch_size=batch_size, depth=depth, dtype=dtype, name=name)
        if counted is not None:
            return counted
    if len(input_size) not in (3, 4) or any(int(v) < 1 for v in input_size):
        raise UsageError(
            f"--input-size {tuple(input_size)}: give C,H,W (a video model: C,T,H,W) with positive sizes, "
            "e.g. 3,224,224"
        )
    model = unwrap_compiled(model)
    x = probe_input(model, (batch_size, *input_size), device=device, dtype=dtype)
    modules = list(model.named_modules())
    info, counter = _run_counted(model, modules, x)
    rows = _rows(modules, info, counter)
    by_dtype: dict[str, int] = {}
    params = list(model.parameters())
    for p in params:
        key = str(p.dtype).replace("torch.", "")
        by_dtype[key] = by_dtype.get(key, 0) + p.numel() * p.element_size()
    buffers = list(model.buffers())
    leaves = {n for n, m in modules if not any(True for _ in m.children())}
    leaf_bytes = sum(info[n]["bytes"] for n in leaves)
    largest = (
        max(
            (sum(math.prod(s) for s in info[n]["in"] + info[n]["out"]) for n in leaves if info[n]["calls"]),
            default=0,
        )
        * torch.tensor([], dtype=dtype).element_size()
    )
    unused, unused_params = _unused(modules, info, counter.read)
    notes = _notes(rows, unused, unused_params)
    return ModelSummary(
        model=name or type(model).__name__,
        input_size=[int(v) for v in input_size],
        batch_size=batch_size,
        rows=rows,
        total_params=sum(p.numel() for p in params),
        trainable_params=sum(p.numel() for p in params if p.requires_grad),
        param_bytes_by_dtype=by_dtype,
        buffers=sum(b.numel() for b in buffers),
        buffer_bytes=sum(b.numel() * b.element_size() for b in buffers),
        macs=counter.inclusive.get("", 0),
        forward_activation_bytes=leaf_bytes,
        largest_activation_bytes=int(largest),
        depth=depth,
        notes=notes,
        unused=unused,
        unused_params=sum(p.numel() for p in unused_params),
        unused_param_bytes=sum(p.numel() * p.element_size() for p in unused_params),
    )


def _unused(
    modules: list[tuple[str, nn.Module]], info: dict[str, dict[str, Any]], read: set[int]
) -> tuple[list[str], list[nn.Parameter]]:
    """The outermost modules that never ran and whose weights no operation read (each with parameters),
    and those parameters (a parameter one of them shares with a module that ran is not among them)."""
    names: list[str] = []
    params: dict[int, nn.Parameter] = {}
    for n, m in modules:
        if not n or info[n]["calls"] or any(n.startswith(f"{u}.") for u in names):
            continue
        own = list(m.parameters())
        if own and not any(id(p) in read for p in own):
            names.append(n)
            params.update((id(p), p) for p in own)
    return names, [p for i, p in params.items() if i not in read]


def _notes(rows: list[Row], unused: list[str], params: list[nn.Parameter]) -> list[str]:
    """What the table cannot say: the modules that never ran at all, and those that ran inside their
    parent (a ``ModuleList``'s blocks called by their parent's loop)."""
    notes = []
    if unused:
        said = ", ".join(unused[:3]) + (f" and {len(unused) - 3} more" if len(unused) > 3 else "")
        notes.append(
            f"{said} never ran on this input: no operation read {'its' if len(unused) == 1 else 'their'} "
            f"{sum(p.numel() for p in params):,} parameters, which count in the parameter total only (the "
            "pass summarised is the model's forward on one input: a text tower or a vision-language model's "
            "language model never runs on a photo, nor an auxiliary head in eval mode)"
        )
    inside = [r.name for r in rows if r.calls == 0 and r.name and not _within(r.name, unused)]
    if inside:
        notes.append(
            f"{len(inside)} module(s) never ran as modules (e.g. {inside[0]}); what their parent computed "
            "with their weights is counted in the parent's row"
        )
    return notes


def _within(name: str, roots: list[str]) -> bool:
    return any(name == r or name.startswith(f"{r}.") for r in roots)


def _run_counted(
    model: nn.Module, modules: list[tuple[str, nn.Module]], x: Tensor
) -> tuple[dict[str, dict[str, Any]], _Counter]:
    """One forward pass of ``x`` with every module's first input and output shapes, output bytes and calls
    recorded, and the MACs counted."""
    info: dict[str, dict[str, Any]] = {n: {"calls": 0, "in": [], "out": [], "bytes": 0} for n, _ in modules}
    counter = _Counter()

    def pre(name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            counter.stack.append(name)
            if info[name]["calls"] == 0:
                info[name]["in"] = [_shape(t) for t in _tensors(args)]

        return hook

    def post(name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if counter.stack and counter.stack[-1] == name:
                counter.stack.pop()
            d = info[name]
            if d["calls"] == 0:
                d["out"] = [_shape(t) for t in _tensors(output)]
            d["bytes"] += sum(t.numel() * t.element_size() for t in _tensors(output))
            d["calls"] += 1

        return hook

    with preserved(model), HookGroup() as hooks:
        for n, m in modules:
            hooks.add(m.register_forward_pre_hook(pre(n)))
            hooks.add(m.register_forward_hook(post(n)))
        model.eval()
        with torch.no_grad(), counter:
            model(x)
    return info, counter


def _rows(
    modules: list[tuple[str, nn.Module]], info: dict[str, dict[str, Any]], counter: _Counter
) -> list[Row]:
    """One row per module; a parameter shared by several modules counts in the first one's row."""
    seen: set[int] = set()
    rows = []
    for n, m in modules:
        own = [p for p in m.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        d = info[n]
        rows.append(
            Row(
                name=n,
                type=type(m).__name__,
                depth=n.count(".") + 1 if n else 0,
                input_shapes=d["in"],
                output_shapes=d["out"],
                params=sum(p.numel() for p in own),
                trainable=sum(p.numel() for p in own if p.requires_grad),
                macs=counter.inclusive.get(n, 0),
                macs_self=counter.own.get(n, 0),
                attention_macs=counter.attention.get(n, 0),
                output_bytes=d["bytes"],
                calls=d["calls"],
            )
        )
    return rows
