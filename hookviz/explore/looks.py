"""The explorer's channel view beyond one photo: a channel's feature visualisation made on demand (as
``hookviz visualize`` makes it, fewer steps), and its best photos over a folder from a ``hookviz channels``
run given with ``--channels-run DIR`` (its ``channels.KEY.json`` and sheets, nothing else of the folder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hookviz.concepts import visualize as vis
from hookviz.core.arrays import to_numpy
from hookviz.errors import InputError, UsageError
from hookviz.io.images import encode_png
from hookviz.models.loaded import LoadedModel


class NotFound(LookupError):
    """What was asked for is not this session's to serve (the server answers 404)."""


class Gone(LookupError):
    """An input's file was deleted or moved away while the explorer ran (the server answers 410)."""


def visualisation(loaded: LoadedModel, layer: str, channel: int, steps: int = 128, seed: int = 0) -> bytes:
    """The picture that drives ``channel`` of ``layer`` most (``hookviz visualize LAYER --channel C
    --steps STEPS --seed SEED``'s optimisation, 128 pixels), as a PNG."""
    if not 1 <= steps <= 2048:
        raise InputError(f"steps {steps}: 1 to 2048")
    pre, shape = loaded.preprocess, loaded.input_shape
    found = vis.visualize(
        loaded.model, vis.Objective(layer, channel=channel), input_size=(int(shape[-2]), int(shape[-1])),
        mean=pre.mean, std=pre.std, steps=steps, seed=seed, size=128,
    )  # fmt: skip
    picture = to_numpy(found.images[0].permute(1, 2, 0).clamp(0, 1).mul(255).round().byte())
    return encode_png(np.ascontiguousarray(picture))


class ChannelsRun:
    """A ``hookviz channels`` run's output folder: each layer's channels, their best inputs and sheets."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).expanduser().resolve()
        self.layers: dict[str, dict[str, Any]] = {}
        for path in sorted(self.folder.glob("channels.*.json")) if self.folder.is_dir() else []:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise UsageError(f"--channels-run: {path.name} cannot be read ({exc})") from None
            for layer, entry in data.get("layers", {}).items():
                self.layers.setdefault(layer, entry)
        if not self.layers:
            raise UsageError(
                f"--channels-run {folder}: no channels.*.json in it; write one with "
                f"`hookviz channels PHOTOS --out {folder}` (the same model)"
            )

    def _channel(self, layer: str, channel: int) -> dict[str, Any]:
        entry = self.layers.get(layer)
        if entry is None:
            raise NotFound(f"the channels run has no layer {layer!r}; it has {', '.join(self.layers)}")
        item = next((c for c in entry["channels"] if c["channel"] == channel), None)
        if item is None:
            raise NotFound(f"the channels run kept no examples of {layer} channel {channel}")
        return dict(item)

    def best(self, layer: str, channel: int) -> dict[str, Any]:
        """The channel's best inputs (name, score, peak in map cells) and whether the run drew its sheet."""
        item = self._channel(layer, channel)
        return {
            "layer": layer,
            "channel": channel,
            "examples": item["examples"],
            "sheet": bool(item.get("sheet")),
        }

    def sheet(self, layer: str, channel: int) -> bytes:
        """The channel's sheet of crops as the run wrote it; only a file inside the run's folder."""
        given = self._channel(layer, channel).get("sheet")
        path = (self.folder / str(given)).resolve() if given else None
        if path is None or not path.is_relative_to(self.folder) or not path.is_file():
            raise NotFound(f"{layer} channel {channel}: no sheet in the channels run")
        return path.read_bytes()
