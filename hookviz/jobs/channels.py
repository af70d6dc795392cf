"""``channels``: each channel's score and peak on every input (a small ``.channels.npz`` each, so a run
resumes and torchrun shards it like any other), gathered afterwards into each channel's best inputs
(:mod:`hookviz.concepts.dataset`)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz.concepts.dataset import Feed, parse_channels
from hookviz.concepts.examples import REDUCE, channel_scores, receptive_field
from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import probe_input
from hookviz.errors import UsageError
from hookviz.io.images import Box
from hookviz.jobs.common import BaseJob, job_settings, predicted
from hookviz.models.classes import parse_target
from hookviz.models.loaded import LoadedModel, feature_layers, num_classes


@dataclass(kw_only=True)
class ChannelsJob(BaseJob):
    """Per input: every channel's score (``reduce`` of its map) and where its maximum lies on the photo; with
    a ``target`` class, each channel's contribution to the class's logit (gradient x activation)."""

    loaded: LoadedModel
    layers: Sequence[str]
    reduce: str = "max"
    target: int | None = None
    #: Each layer's receptive field in model-input pixels (:func:`hookviz.concepts.examples.receptive_field`).
    fields: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Where each rendered input's scores are gathered as the run goes (None: only its files).
    feed: Feed | None = None
    kind: str = "channels"
    _names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.reduce not in REDUCE:
            raise UsageError(f"--reduce {self.reduce!r}: choose one of {', '.join(REDUCE)}")

    def settings(self) -> dict[str, Any]:
        return job_settings(self, layers=list(self.layers), reduce=self.reduce, target=self.target)

    def planned(self, stem: str) -> list[str]:
        return [f"{stem}.channels.npz"]

    def annotate(self, batch: Sequence[tuple[Any, np.ndarray, Box]], size: tuple[int, int]) -> None:
        self._names = [str(item.name) for item, _, _ in batch]  # the next batch's inputs, in its order

    def compute(self, x: Any) -> Any:
        found, logits = channel_scores(
            self.loaded.model, x, self.layers, reduce=self.reduce, target=self.target
        )
        names, self._names = self._names, []  # told for this batch only
        return found, logits, tuple(int(s) for s in x.shape[-2:]), names

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        found, logits, size, names = result
        arrays: dict[str, np.ndarray] = {}
        maps: dict[str, list[int]] = {}
        fields_px: dict[str, list[int]] = {}
        for i, layer in enumerate(found):
            arrays[f"scores{i}"] = to_numpy(layer.scores[index]).astype(np.float32)
            arrays[f"peaks{i}"] = photo_points(to_numpy(layer.peaks[index]), layer.size, box)
            if layer.contributions is not None:
                arrays[f"contributions{i}"] = to_numpy(layer.contributions[index]).astype(np.float32)
            maps[layer.layer] = list(layer.size)
            if layer.layer in self.fields:  # in the photo's pixels
                fh, fw = self.fields[layer.layer]
                fields_px[layer.layer] = [round(fh * box.height / size[0]), round(fw * box.width / size[1])]
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        fields: dict[str, Any] = {"layers": list(self.layers), "maps": maps, "reduce": self.reduce}
        fields["fields"] = fields_px
        if self.target is not None:
            fields["target"] = {"index": self.target, "name": self.loaded.class_name(self.target)}
            fields["top_channels"] = {
                layer.layer: _top(to_numpy(layer.contributions[index])) for layer in found
            }
        name = f"{stem}.channels.npz"
        if self.feed is not None and index < len(names):
            self.feed.add(names[index], name, arrays, maps)
        return [(name, buffer.getvalue())], {"predicted": predicted(self.loaded, logits, index), **fields}


def _top(contributions: np.ndarray, n: int = 5) -> list[dict[str, Any]]:
    order = np.argsort(-contributions, kind="stable")[:n]
    return [{"channel": int(c), "contribution": round(float(contributions[c]), 6)} for c in order]


def photo_points(cells: np.ndarray, grid: tuple[int, int], box: Box) -> np.ndarray:
    """Map cells ``(N, 2)`` ``(y, x)`` of a ``grid`` over the model's input to photo pixels (float32):
    each cell's centre, through the input's place in the photo (``box``)."""
    h, w = grid
    y = (cells[:, 0].astype(np.float64) + 0.5) / h * box.height + box.y0 - 0.5
    x = (cells[:, 1].astype(np.float64) + 0.5) / w * box.width + box.x0 - 0.5
    return np.stack([y, x], axis=1).astype(np.float32)


def channels_job(
    loaded: LoadedModel,
    layers: Sequence[str] | None = None,
    *,
    reduce: str = "max",
    target: str | None = None,
    chosen: str | None = None,
    top: int | None = None,
) -> ChannelsJob:
    """The ``channels`` job: ``layers`` as ``featuremaps`` takes them (default: the CAM layer), ``target`` as
    ``--target`` (an index or a name), ``chosen`` the ``--channels`` list, checked here so that a bad one
    fails before the run; each layer's receptive field traced on one input of the model's size. ``top``:
    each channel's best ``top`` inputs are gathered as the run goes (``job.feed``, for
    :func:`hookviz.concepts.dataset.gather`).

    Raises:
        LayerError, TargetError, UsageError: a bad layer, class or channel list.
    """
    names, calls = feature_layers(loaded, layers)
    index = parse_target(target, loaded, num_classes(loaded)) if target is not None else None
    shapes = {c.name: c.output_shape for c in calls}
    for n in names:
        shape = shapes.get(n)
        if shape is not None and len(shape) == 4:
            parse_channels(chosen, int(shape[1]))
    x = probe_input(loaded.model, (1, *loaded.input_shape))
    fields = {n: receptive_field(loaded.model, x, n) for n in names}
    feed = Feed(names, top) if top is not None else None
    return ChannelsJob(loaded=loaded, layers=names, reduce=reduce, target=index, fields=fields, feed=feed)
