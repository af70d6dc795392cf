"""Counting multiply-accumulates: a ``TorchDispatchMode`` that sees every aten op and credits its MACs
to the modules running at that moment (see :mod:`hookviz.summary`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


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
    """Adds each op's MACs to every module on the current stack (inclusive) and to the top one (self), and
    notes every tensor an op read (``read``: their ids), so that weights no operation used are told apart."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[int] = set()
        self.stack: list[str] = []
        self.inclusive: dict[str, int] = {}
        self.own: dict[str, int] = {}
        self.attention: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for arg in (*args, *(kwargs or {}).values()):
            if isinstance(arg, Tensor):
                self.read.add(id(arg))
            elif isinstance(arg, (list, tuple)):
                self.read.update(id(a) for a in arg if isinstance(a, Tensor))
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
