"""What a summary holds: one :class:`Row` per module and the :class:`ModelSummary` totals (no torch)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


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
class SummaryData:
    """A model's per-module statistics and totals (:class:`hookviz.summary.ModelSummary` prints them).

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
    #: The outermost modules whose weights no operation of the pass read (a vision-language model's language
    #: model, which a photo's pass never reaches), and their parameters: in ``total_params``, nowhere else.
    unused: list[str] = field(default_factory=list)
    unused_params: int = 0
    unused_param_bytes: int = 0

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
        """Parameters + gradients + Adam's two moments + the activations kept for backward (the parameters
        of the modules that ran: ``unused`` ones are left out)."""
        return 4 * (self.param_bytes - self.unused_param_bytes) + self.forward_activation_bytes

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
