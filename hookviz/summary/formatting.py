"""Drawing a :class:`~hookviz.summary.data.ModelSummary`: text table, Markdown, CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass

from hookviz.summary.data import SummaryData


def _table_rows(s: SummaryData) -> list[list[str]]:
    out = []
    for r, params, macs in s.visible_rows():
        label = ("  " * r.depth + (r.name.rsplit(".", 1)[-1] if r.name else s.model)) if r.depth else s.model
        ins = ", ".join("x".join(map(str, s)) for s in r.input_shapes) or "-"
        outs = ", ".join("x".join(map(str, s)) for s in r.output_shapes) or "-"
        train = (
            "" if not params else ("yes" if r.trainable == r.params else "no" if r.trainable == 0 else "part")
        )
        row = [label, r.type, ins, outs, f"{params:,}", train, _si(macs).strip(), _bytes(r.output_bytes)]
        if _has_attention(s):
            row.insert(7, _si(r.attention_macs).strip() if r.attention_macs else "")
        out.append(row)
    return out


def _has_attention(s: SummaryData) -> bool:
    return any(r.attention_macs for r in s.rows)


def _headers(s: SummaryData) -> tuple[tuple[str, ...], set[int]]:
    """Column titles and the indices of right-aligned (numeric) columns."""
    if _has_attention(s):
        return (*HEADERS[:7], "attention MACs", HEADERS[7]), {4, 6, 7, 8}
    return HEADERS, {4, 6, 7}


HEADERS = ("layer", "type", "input", "output", "params", "trainable", "MACs", "output size")


def table(s: SummaryData) -> str:
    """The summary as an aligned text table with the totals below."""
    rows = _table_rows(s)
    headers, right = _headers(s)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "-" * len(line(headers))
    body = [line(headers), rule, *(line(r) for r in rows), rule]
    return "\n".join(body + _totals(s))


def _totals(s: SummaryData) -> list[str]:
    dtypes = ", ".join(f"{k} {_bytes(v)}" for k, v in sorted(s.param_bytes_by_dtype.items()))
    shape = "x".join(map(str, [s.batch_size, *s.input_size]))
    lines = [
        f"input: {shape}",
        f"parameters: {s.total_params:,} total, {s.trainable_params:,} trainable, "
        f"{s.non_trainable_params:,} non-trainable ({dtypes})",
        *_unused(s),
        f"buffers: {s.buffers:,} values ({_bytes(s.buffer_bytes)})",
        f"compute: {_si(s.macs)}MACs = {_si(s.flops)}FLOPs (1 MAC = 2 FLOPs)"
        + (f", of which attention products {_si(s.attention_macs)}MACs" if s.attention_macs else ""),
        f"activations: {_bytes(s.forward_activation_bytes)} of layer outputs per forward; "
        f"largest single layer {_bytes(s.largest_activation_bytes)}",
        f"training memory estimate: {_bytes(s.training_memory_estimate)} "
        "(params + grads + Adam moments + stored activations)",
    ]
    return lines + [f"note: {n}" for n in s.notes]


def _unused(s: SummaryData) -> list[str]:
    """The parameters line's second line, where modules never ran (:attr:`SummaryData.unused`)."""
    if not s.unused_params:
        return []
    names = ", ".join(s.unused)
    return [f"  of which {s.unused_params:,} in modules that never ran ({names}): not in the MACs or the "
            "training memory estimate"]  # fmt: skip


def markdown(s: SummaryData) -> str:
    """The table as Markdown, the totals as a list."""
    rows = _table_rows(s)
    headers, right = _headers(s)
    head = "| " + " | ".join(headers) + " |"
    sep = "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"
    body = [
        "| " + " | ".join(c.replace("|", "\\|").replace("  ", "&nbsp;&nbsp;") for c in r) + " |" for r in rows
    ]
    return "\n".join([head, sep, *body, "", *(f"- {t}" for t in _totals(s))])


def csv_text(s: SummaryData) -> str:
    """One CSV line per visible row."""
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
    for r, params, macs in s.visible_rows():
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


@dataclass(frozen=True)
class ModelSummary(SummaryData):
    """A model's per-module statistics and totals; ``str()`` draws the table.

    ``macs`` count multiply-accumulates (1 MAC = 2 FLOPs), for the given batch.
    """

    def __str__(self) -> str:
        return table(self)

    def to_markdown(self) -> str:
        return markdown(self)

    def to_csv(self) -> str:
        return csv_text(self)
