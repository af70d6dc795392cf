"""``featuremaps``: channel mosaics of layer inputs and outputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hookviz.images import Box, encode_png
from hookviz.jobs.common import _weights_note, model_settings, predicted
from hookviz.models import LoadedModel
from hookviz.options import Colormap, Stage


@dataclass(kw_only=True)
class FeatureMapJob:
    """One channel mosaic per image, layer, stage and call."""

    loaded: LoadedModel
    layers: Sequence[str]
    stage: str = "output"
    max_channels: int = 64
    colormap: str = "viridis"
    kind: str = "featuremaps"

    def __post_init__(self) -> None:
        self.stage = Stage.parse(self.stage, "--stage").value
        self.colormap = Colormap.parse(self.colormap, "--colormap").value

    def settings(self) -> dict[str, Any]:
        return {
            **model_settings(self.loaded),
            "command": self.kind,
            "layers": list(self.layers),
            "stage": self.stage,
            "max_channels": self.max_channels,
            "colormap": self.colormap,
        }

    def _stages(self) -> list[str]:
        return ["input", "output"] if self.stage == "both" else [self.stage]

    def planned(self, stem: str) -> list[str]:
        return [f"{stem}.featuremap.{layer}.{s}.png" for layer in self.layers for s in self._stages()]

    def compute(self, x: Any) -> Any:
        from hookviz.features import capture_features

        return capture_features(self.loaded.model, x, self.layers, self.stage)

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        from hookviz import render
        from hookviz.features import rank_channels

        files = []
        shown = []
        for fm in result.maps:
            t = fm.tensor[index]
            channels = rank_channels(t, self.max_channels)
            call = f" call {fm.call}" if fm.call > 1 else ""
            title = (
                f"{self.loaded.name} {fm.layer} {fm.stage}{call} {tuple(fm.tensor.shape[1:])} | "
                f"top {len(channels)}/{t.shape[0]} channels by spatial std | {_weights_note(self.loaded)}"
            )
            grid = render.feature_grid(t.numpy(), channels, title=title, colormap=self.colormap)
            suffix = f".call{fm.call}" if fm.call > 1 else ""
            name = f"{stem}.featuremap.{fm.layer}.{fm.stage}{suffix}.png"
            files.append((name, encode_png(grid, mosaic=True)))
            shown.append(
                {
                    "file": name,
                    "layer": fm.layer,
                    "stage": fm.stage,
                    "call": fm.call,
                    "shape": list(fm.tensor.shape[1:]),
                    "channels": channels,
                }
            )
        fields = {"layers": list(self.layers), "stage": self.stage, "maps": shown}
        return files, {"predicted": predicted(self.loaded, result.output, index), **fields}
