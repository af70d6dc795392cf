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

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from hookviz.errors import UsageError
from hookviz.hooks import preserved

aten = torch.ops.aten


def _shape(t: Any) -> list[int]:
    return list(t.shape)


def _conv_macs(args: Sequence[Any], out: Tensor) -> int:
    x, w = args[0], args[1]
    transposed = bool(args[6]) if len(args) > 6 else False
    kernel = math.prod(w.shape[2:])
    if transposed:
        # Every input element is scattered through a (C_out/groups x kernel) slice of the weight.
        return x.numel() * (w.shape[1]) * kernel
    return out.numel() * (w.shape[1]) * kernel  # w: (C_out, C_in/groups, *k)


def _attention_macs(q: Tensor, k: Tensor, v: Tensor) -> int:
    # QK^T: (..., L, E) x (..., E, S); AV: (..., L, S) x (..., S, Ev)
    batch = math.prod(q.shape[:-2])
    length, e = q.shape[-2], q.shape[-1]
    s, ev = k.shape[-2], v.shape[-1]
    return batch * length * s * e + batch * length * s * ev


def op_macs(func: Any, args: Sequence[Any], out: Any) -> tuple[int, int]:
    """``(MACs, of which attention products)`` of one aten op call (0 for ops that are not counted)."""
    packet = getattr(func, "overloadpacket", None)
    if packet in (aten.mm, aten.addmm):
        a, b = (args[0], args[1]) if packet is aten.mm else (args[1], args[2])
        return int(a.shape[0] * a.shape[1] * b.shape[1]), 0
    if packet in (aten.bmm, aten.baddbmm):
        a, b = (args[0], args[1]) if packet is aten.bmm else (args[1], args[2])
        return int(a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]), 0
    if packet in (aten.convolution, aten._convolution, aten.conv2d, aten.conv1d, aten.conv3d):
        result = out[0] if isinstance(out, (tuple, list)) else out
        return int(_conv_macs(args, result)), 0
    name = str(packet)
    if "scaled_dot_product" in name and "attention" in name and "backward" not in name:
        attention = int(_attention_macs(args[0], args[1], args[2]))
        return attention, attention
    if packet is getattr(aten, "_native_multi_head_attention", None):
        q, k = args[0], args[1]
        e, heads = int(args[3]), int(args[4])
        bsz, lq, lk = q.shape[0], q.shape[1], k.shape[1]
        proj = bsz * (lq + 2 * lk) * e * e + bsz * lq * e * e
        qh = q.new_empty((bsz, heads, lq, e // heads), device="meta")
        kh = k.new_empty((bsz, heads, lk, e // heads), device="meta")
        attention = int(_attention_macs(qh, kh, kh))
        return int(proj) + attention, attention
    return 0, 0


class _Counter(TorchDispatchMode):
    """Adds each op's MACs to every module on the current stack (inclusive) and to the top one (self)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.inclusive: dict[str, int] = {}
        self.own: dict[str, int] = {}
        self.attention: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        macs, attention = op_macs(func, args, out)
        if macs and self.stack:
            for name in set(self.stack):
                self.inclusive[name] = self.inclusive.get(name, 0) + macs
            top = self.stack[-1]
            self.own[top] = self.own.get(top, 0) + macs
            if attention:
                for name in set(self.stack):
                    self.attention[name] = self.attention.get(name, 0) + attention
        return out


@dataclass(frozen=True)
class Row:
    """One module. ``params`` counts the module's own parameters (shared ones once, at first owner)."""

    name: str
    type: str
    depth: int
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]
    params: int
    trainable: int
    macs: int  # inclusive: everything that ran while this module was executing
    macs_self: int  # ops run by this module's own forward, not by a child module
    attention_macs: int  # inclusive, like macs: the QK^T and AV products
    output_bytes: int
    calls: int


@dataclass(frozen=True)
class ModelSummary:
    """A model's per-module statistics and totals; ``str()`` draws the table.

    ``macs`` count multiply-accumulates (1 MAC = 2 FLOPs), for the given batch.
    """

    model: str
    input_size: list[int]
    batch_size: int
    rows: list[Row]
    total_params: int
    trainable_params: int
    param_bytes_by_dtype: dict[str, int]
    buffers: int
    buffer_bytes: int
    macs: int
    forward_activation_bytes: int
    largest_activation_bytes: int
    depth: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def flops(self) -> int:
        return 2 * self.macs

    @property
    def attention_macs(self) -> int:
        return next((r.attention_macs for r in self.rows if r.depth == 0), 0)

    @property
    def non_trainable_params(self) -> int:
        return self.total_params - self.trainable_params

    @property
    def param_bytes(self) -> int:
        return sum(self.param_bytes_by_dtype.values())

    @property
    def training_memory_estimate(self) -> int:
        """Parameters + gradients + Adam's two moments + the activations kept for backward."""
        return 4 * self.param_bytes + self.forward_activation_bytes

    def visible_rows(self) -> list[tuple[Row, int, int]]:
        """Rows down to ``depth``, each with params rolled up from hidden descendants, and MACs."""
        if self.depth is None:
            return [(r, r.params, r.macs) for r in self.rows]
        shown: list[tuple[Row, int, int]] = []
        for r in self.rows:
            if r.depth > self.depth:
                continue
            params = r.params
            if r.depth == self.depth:
                prefix = f"{r.name}." if r.name else ""
                params += sum(c.params for c in self.rows if c.depth > r.depth and c.name.startswith(prefix))
            shown.append((r, params, r.macs))
        return shown

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        d.update(
            flops=self.flops,
            attention_macs=self.attention_macs,
            non_trainable_params=self.non_trainable_params,
            param_bytes=self.param_bytes,
            training_memory_estimate_bytes=self.training_memory_estimate,
            units={"macs": "multiply-accumulates (1 MAC = 2 FLOPs)", "bytes": "bytes"},
        )
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def _table_rows(self) -> list[list[str]]:
        out = []
        for r, params, macs in self.visible_rows():
            label = (
                ("  " * r.depth + (r.name.rsplit(".", 1)[-1] if r.name else self.model))
                if r.depth
                else self.model
            )
            ins = ", ".join("x".join(map(str, s)) for s in r.input_shapes) or "-"
            outs = ", ".join("x".join(map(str, s)) for s in r.output_shapes) or "-"
            train = (
                ""
                if not params
                else ("yes" if r.trainable == r.params else "no" if r.trainable == 0 else "part")
            )
            row = [label, r.type, ins, outs, f"{params:,}", train, _si(macs).strip(), _bytes(r.output_bytes)]
            if self._has_attention():
                row.insert(7, _si(r.attention_macs).strip() if r.attention_macs else "")
            out.append(row)
        return out

    def _has_attention(self) -> bool:
        return any(r.attention_macs for r in self.rows)

    def _headers(self) -> tuple[tuple[str, ...], set[int]]:
        """Column titles and the indices of right-aligned (numeric) columns."""
        if self._has_attention():
            return (*self.HEADERS[:7], "attention MACs", self.HEADERS[7]), {4, 6, 7, 8}
        return self.HEADERS, {4, 6, 7}

    HEADERS = ("layer", "type", "input", "output", "params", "trainable", "MACs", "output size")

    def __str__(self) -> str:
        rows = self._table_rows()
        headers, right = self._headers()
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        rule = "-" * len(line(headers))
        body = [line(headers), rule, *(line(r) for r in rows), rule]
        return "\n".join(body + self._totals())

    def _totals(self) -> list[str]:
        dtypes = ", ".join(f"{k} {_bytes(v)}" for k, v in sorted(self.param_bytes_by_dtype.items()))
        shape = "x".join(map(str, [self.batch_size, *self.input_size]))
        lines = [
            f"input: {shape}",
            f"parameters: {self.total_params:,} total, {self.trainable_params:,} trainable, "
            f"{self.non_trainable_params:,} non-trainable ({dtypes})",
            f"buffers: {self.buffers:,} values ({_bytes(self.buffer_bytes)})",
            f"compute: {_si(self.macs)}MACs = {_si(self.flops)}FLOPs (1 MAC = 2 FLOPs)"
            + (
                f", of which attention products {_si(self.attention_macs)}MACs" if self.attention_macs else ""
            ),
            f"activations: {_bytes(self.forward_activation_bytes)} of layer outputs per forward; "
            f"largest single layer {_bytes(self.largest_activation_bytes)}",
            f"training memory estimate: {_bytes(self.training_memory_estimate)} "
            "(params + grads + Adam moments + stored activations)",
        ]
        return lines + [f"note: {n}" for n in self.notes]

    def to_markdown(self) -> str:
        rows = self._table_rows()
        headers, right = self._headers()
        head = "| " + " | ".join(headers) + " |"
        sep = "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"
        body = [
            "| " + " | ".join(c.replace("|", "\\|").replace("  ", "&nbsp;&nbsp;") for c in r) + " |"
            for r in rows
        ]
        return "\n".join([head, sep, *body, "", *(f"- {t}" for t in self._totals())])

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(
            [
                "name",
                "type",
                "depth",
                "input_shapes",
                "output_shapes",
                "params",
                "trainable",
                "macs",
                "macs_self",
                "attention_macs",
                "output_bytes",
                "calls",
            ]
        )
        for r, params, macs in self.visible_rows():
            writer.writerow(
                [
                    r.name,
                    r.type,
                    r.depth,
                    json.dumps(r.input_shapes),
                    json.dumps(r.output_shapes),
                    params,
                    r.trainable,
                    macs,
                    r.macs_self,
                    r.attention_macs,
                    r.output_bytes,
                    r.calls,
                ]
            )
        return buf.getvalue()


def _si(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} "


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def summarize(
    model: nn.Module,
    input_size: Sequence[int] = (3, 224, 224),
    *,
    batch_size: int = 1,
    depth: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    name: str | None = None,
) -> ModelSummary:
    """Run one forward pass of zeros and return per-module statistics (eval mode, no grad).

    Args:
        model: any ``nn.Module`` taking one image batch.
        input_size: ``(C, H, W)`` of one input.
        batch_size: MACs and activation sizes are for this many inputs.
        depth: rows shown by ``str()``/markdown/csv (0 = the model only); the data keeps every row.

    Raises:
        UsageError: a bad input size or batch size.

    Example:
        >>> s = summarize(torchvision.models.resnet18())
        >>> s.total_params, s.macs  # 11689512, 1.81e9
        >>> print(s)
    """
    if batch_size < 1:
        raise UsageError(f"--batch-size {batch_size}: must be at least 1")
    if len(input_size) != 3 or any(int(v) < 1 for v in input_size):
        raise UsageError(f"--input-size {tuple(input_size)}: give C,H,W with positive sizes, e.g. 3,224,224")
    device = torch.device(device) if device is not None else next(model.parameters(), torch.zeros(0)).device
    x = torch.zeros(batch_size, *input_size, device=device, dtype=dtype)
    modules = list(model.named_modules())
    info: dict[str, dict[str, Any]] = {n: {"calls": 0, "in": [], "out": [], "bytes": 0} for n, _ in modules}
    counter = _Counter()
    handles = []

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

    with preserved(model):
        try:
            for n, m in modules:
                handles.append(m.register_forward_pre_hook(pre(n)))
                handles.append(m.register_forward_hook(post(n)))
            model.eval()
            with torch.no_grad(), counter:
                model(x)
        finally:
            for h in handles:
                h.remove()

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
    notes = []
    unrun = [r.name for r in rows if r.calls == 0 and r.name]
    if unrun:
        notes.append(
            f"{len(unrun)} module(s) never ran as modules (e.g. {unrun[0]}); what their parent computed "
            "with their weights is counted in the parent's row"
        )
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
    )


def plot(summary: ModelSummary, path: str) -> None:
    """A horizontal bar chart of parameters and MACs per top-level block, written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {r.name: r for r in summary.rows}

    def params_of(name: str) -> int:
        return sum(r.params for r in summary.rows if r.name == name or r.name.startswith(name + "."))

    def children(name: str) -> list[str]:
        return [
            r.name for r in summary.rows if r.depth == rows[name].depth + 1 and r.name.startswith(name + ".")
        ]

    # Top-level blocks; one that dwarfs the rest (a ViT's `encoder`) is opened up until the bars say more.
    shown = [r.name for r in summary.rows if r.depth == 1]
    for _ in range(4):
        big = [
            n
            for n in shown
            if children(n)
            and (
                rows[n].macs > 0.6 * max(summary.macs, 1) or params_of(n) > 0.6 * max(summary.total_params, 1)
            )
        ]
        if not big or len(shown) - 1 + len(children(big[0])) > 40:
            break
        at = shown.index(big[0])
        shown[at : at + 1] = children(big[0])
    top = [rows[n] for n in shown]
    names = shown
    params = [params_of(n) for n in shown]
    macs = [r.macs for r in top]
    height = max(3.0, 0.35 * len(top) + 1.5)
    fig, axes = plt.subplots(1, 2, figsize=(12, height), sharey=True, constrained_layout=True)
    for ax, values, label, color in (
        (axes[0], [p / 1e6 for p in params], "parameters (millions)", "#4C72B0"),
        (axes[1], [m / 1e9 for m in macs], "MACs (billions; 1 MAC = 2 FLOPs)", "#DD8452"),
    ):
        bars = ax.barh(range(len(top)), values, color=color)
        ax.set_xlabel(label)
        total = sum(values) or 1.0
        for bar, v in zip(bars, values, strict=True):
            if v / total >= 0.005:
                ax.text(
                    bar.get_width(),
                    bar.get_y() + bar.get_height() / 2,
                    f" {v:.3g} ({v / total:.0%})",
                    va="center",
                    fontsize=8,
                )
        ax.margins(x=0.25)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(top)), names)
    axes[0].invert_yaxis()
    shape = "x".join(map(str, [summary.batch_size, *summary.input_size]))
    fig.suptitle(
        f"{summary.model}: {summary.total_params / 1e6:.2f} M parameters, {summary.macs / 1e9:.2f} G MACs "
        f"({summary.flops / 1e9:.2f} GFLOPs) for input {shape}"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
