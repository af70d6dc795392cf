"""``gradflow`` and ``dropblock``: what training-time hooks see."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hookviz import render
from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import logits_of
from hookviz.core.layers import default_cam_layer, output_layers, resolve_layers
from hookviz.engine.explain import ranking
from hookviz.engine.features import capture_features, rank_channels
from hookviz.errors import UsageError
from hookviz.io.images import Box, encode_png
from hookviz.jobs.common import BaseJob, job_settings, predicted, weights_note
from hookviz.models.classes import parse_target
from hookviz.models.loaded import LoadedModel, num_classes, probe
from hookviz.training.gradients import gradient_flow
from hookviz.training.regularize import drop_block


@dataclass(kw_only=True)
class GradFlowJob(BaseJob):
    """Per image: one backward from the target score (or cross-entropy against a label); plot + JSON."""

    loaded: LoadedModel
    target: int | None = None  # class whose score is differentiated (None: the predicted class)
    label: int | None = None  # if set: cross-entropy against this class instead
    layers: Sequence[str] | None = None
    kind: str = "gradflow"

    def settings(self) -> dict[str, Any]:
        return job_settings(
            self,
            target="top1" if self.target is None else self.target,
            label=self.label,
            layers=list(self.layers) if self.layers else None,
        )

    def planned(self, stem: str) -> list[str]:
        return [f"{stem}.gradflow.png", f"{stem}.gradflow.json"]

    def compute(self, x: Any) -> Any:
        import torch
        import torch.nn.functional as F

        seen: list[Any] = []

        def loss(output: Any) -> Any:
            z = logits_of(output)
            seen.append(z.detach().float().cpu())
            if self.label is not None:
                return F.cross_entropy(z, torch.tensor([self.label], device=z.device))
            return z[0, int(ranking(z)[0, 0]) if self.target is None else self.target]

        # One image at a time: parameter gradients of a batch would mix the images.
        flows = [gradient_flow(self.loaded.model, x[i : i + 1], loss, self.layers) for i in range(x.shape[0])]
        return flows, torch.cat(seen)

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        import json

        flows, logits = result
        flow = flows[index]
        per_layer: dict[str, float] = {}
        for s in flow.params:
            owner = s.name.rsplit(".", 1)[0]
            per_layer[owner] = math.hypot(per_layer.get(owner, 0.0), s.norm)
        names = [s.name for s in flow.outputs]
        objective = (
            f"cross-entropy vs class {self.label}"
            if self.label is not None
            else ("predicted-class score" if self.target is None else f"score of class {self.target}")
        )
        title = (
            f"{self.loaded.name}: gradient norms per layer, loss = {objective} ({flow.loss:.4g}) | "
            f"{weights_note(self.loaded)}"
        )
        picture = render.grad_flow_plot(
            names,
            [s.norm for s in flow.outputs],
            [per_layer.get(n, float("nan")) for n in names],
            title=title,
        )
        data = {"model": self.loaded.name, "objective": objective, **flow.to_dict()}
        files = [
            (f"{stem}.gradflow.png", encode_png(picture)),
            (f"{stem}.gradflow.json", json.dumps(data, indent=1).encode()),
        ]
        fields = {"loss": flow.loss, "objective": objective, "layers": len(names)}
        return files, {"predicted": predicted(self.loaded, logits, index), **fields}


@dataclass(kw_only=True)
class DropBlockJob(BaseJob):
    """Per image: the layer's feature maps before DropBlock, the keep mask, and after (one PNG)."""

    loaded: LoadedModel
    layer: str
    drop_prob: float = 0.1
    block_size: int = 7
    shared: bool = False
    seed: int = 0
    max_channels: int = 16
    kind: str = "dropblock"

    def settings(self) -> dict[str, Any]:
        return job_settings(
            self,
            layer=self.layer,
            drop_prob=self.drop_prob,
            block_size=self.block_size,
            shared=self.shared,
            seed=self.seed,
            max_channels=self.max_channels,
        )

    def planned(self, stem: str) -> list[str]:
        return [f"{stem}.dropblock.{self.layer}.png"]

    def compute(self, x: Any) -> Any:
        import torch

        features = capture_features(self.loaded.model, x, [self.layer])
        (fm,) = [m for m in features.maps if m.call == 1]
        gen = torch.Generator().manual_seed(self.seed)
        after, keep = drop_block(
            fm.tensor, self.drop_prob, self.block_size, shared=self.shared, generator=gen
        )
        return fm.tensor, after, keep, features.output

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:

        before, after, keep = (t[index] for t in result[:3])
        channels = rank_channels(before, self.max_channels)
        c, h, w = before.shape
        block = max(1, min(self.block_size, h, w))
        dropped = float(1.0 - keep.float().mean())
        shape = f"({c}, {h}, {w})"
        note = weights_note(self.loaded)
        panels = [
            render.feature_grid(
                to_numpy(before), channels, title=f"{self.layer} output {shape} before DropBlock | {note}"
            ),
            render.feature_grid(
                to_numpy(keep),
                channels,
                title=f"keep mask: drop_prob {self.drop_prob}, block {block}, "
                f"dropped {dropped:.1%} of {'all channels (shared mask)' if self.shared else 'activations'}",
                colormap="gray",
                value_range=(0.0, 1.0),
            ),
            render.feature_grid(
                to_numpy(after), channels, title="after DropBlock (kept values rescaled by 1/P(keep))"
            ),
        ]
        width = max(p.shape[1] for p in panels)
        padded = [np.pad(p, ((0, 8), (0, width - p.shape[1]), (0, 0)), constant_values=255) for p in panels]
        files = [
            (f"{stem}.dropblock.{self.layer}.png", encode_png(np.concatenate(padded, axis=0), mosaic=True))
        ]
        fields = {"layer": self.layer, "dropped_fraction": round(dropped, 6), "channels": channels}
        return files, {"predicted": predicted(self.loaded, result[3], index), **fields}


def gradflow_job(
    loaded: LoadedModel,
    *,
    target: str = "top1",
    label: str | None = None,
    layers: Sequence[str] | None = None,
) -> GradFlowJob:
    """The ``gradflow`` job: the gradient of ``target``'s score, or the cross-entropy against ``label``, at
    ``layers`` (names or globs; default: every module with parameters).

    Raises:
        UsageError: ``label`` names no class; TargetError, LayerError: a bad target or layer.
    """
    n = num_classes(loaded)
    names = resolve_layers(loaded.model, list(layers), model_name=loaded.name) if layers else None
    lab = parse_target(label, loaded, n, "--label") if label is not None else None
    if label is not None and lab is None:
        raise UsageError(f"--label {label}: give a class index or name")
    return GradFlowJob(loaded=loaded, target=parse_target(target, loaded, n), label=lab, layers=names)


def dropblock_job(loaded: LoadedModel, layer: str | None = None, **fields: Any) -> DropBlockJob:
    """The ``dropblock`` job at ``layer`` (one module name, or a glob matching one; default: the CAM
    default), ``fields`` as :class:`DropBlockJob` takes them (drop_prob, block_size, shared, seed,
    max_channels).

    Raises:
        UsageError: a glob matching several layers; LayerError: a bad layer.
    """
    calls = probe(loaded)
    chosen = layer or default_cam_layer(loaded.model, calls)
    found = output_layers(loaded.model, [chosen], calls, loaded.name)
    if len(found) > 1:
        shown = ", ".join(found[:4]) + (" ..." if len(found) > 4 else "")
        raise UsageError(f"--layer {chosen}: takes one layer, and the pattern matches {len(found)} ({shown})")
    return DropBlockJob(loaded=loaded, layer=found[0], **fields)
