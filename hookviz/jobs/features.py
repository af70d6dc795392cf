"""``featuremaps``: channel mosaics of layer inputs and outputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hookviz import render
from hookviz.core.arrays import to_numpy
from hookviz.core.layers import map_layers
from hookviz.engine.features import capture_features, rank_channels
from hookviz.io.images import Box, encode_png
from hookviz.jobs.common import BaseJob, job_settings, npy_bytes, predicted, weights_note
from hookviz.models.loaded import LoadedModel, probe
from hookviz.options import Colormap, Stage


@dataclass(kw_only=True)
class FeatureMapJob(BaseJob):
    """One channel mosaic per image, layer, stage and call; with ``save_raw`` (``--save-raw``, ``--maps``)
    also the feature map itself, every channel of it, as ``.npy`` (float32; in the Zarr store instead with
    ``--maps``)."""

    loaded: LoadedModel
    layers: Sequence[str]
    stage: str = "output"
    max_channels: int = 64
    colormap: str = "viridis"
    save_raw: bool = False
    kind: str = "featuremaps"

    def __post_init__(self) -> None:
        self.stage = Stage.parse(self.stage, "--stage").value
        self.colormap = Colormap.parse(self.colormap, "--colormap").value

    def settings(self) -> dict[str, Any]:
        return job_settings(
            self,
            layers=list(self.layers),
            stage=self.stage,
            max_channels=self.max_channels,
            colormap=self.colormap,
        )

    def _stages(self) -> list[str]:
        return ["input", "output"] if self.stage == "both" else [self.stage]

    def planned(self, stem: str) -> list[str]:
        kinds = (".png", ".npy") if self.save_raw else (".png",)
        return [
            f"{stem}.featuremap.{layer}.{s}{k}"
            for layer in self.layers
            for s in self._stages()
            for k in kinds
        ]

    def compute(self, x: Any) -> Any:

        return capture_features(self.loaded.model, x, self.layers, self.stage)

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:

        files = []
        shown = []
        for fm in result.maps:
            t = fm.tensor[index]
            channels = rank_channels(t, self.max_channels)
            if t.dim() == 4:  # a video model's (C, T, H, W): each channel a strip of time slices
                t = time_strips(t)
            call = f" call {fm.call}" if fm.call > 1 else ""
            title = (
                f"{self.loaded.name} {fm.layer} {fm.stage}{call} {tuple(fm.tensor.shape[1:])} | "
                f"top {len(channels)}/{t.shape[0]} channels by spatial std{_strips(fm.tensor)} | "
                f"{weights_note(self.loaded)}"
            )
            grid = render.feature_grid(to_numpy(t), channels, title=title, colormap=self.colormap)
            suffix = f".call{fm.call}" if fm.call > 1 else ""
            name = f"{stem}.featuremap.{fm.layer}.{fm.stage}{suffix}.png"
            files.append((name, encode_png(grid, mosaic=True)))
            if self.save_raw:  # the whole map, every channel (the record's ``channels`` says those drawn)
                files.append(
                    (f"{name[: -len('.png')]}.npy", npy_bytes(to_numpy(fm.tensor[index]).astype(np.float32)))
                )
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


#: Time slices shown per channel of a video model's feature map (evenly spaced).
MAX_SLICES = 8


def _slices(steps: int) -> list[int]:
    return sorted({round(float(v)) for v in np.linspace(0, steps - 1, min(MAX_SLICES, steps))})


def _strips(tensor: Any) -> str:
    if tensor.dim() != 5:
        return ""
    return f", each a strip of {len(_slices(int(tensor.shape[2])))} time slices"


def time_strips(t: Any) -> Any:
    """``(C, H, k * (W + 1) - 1)`` from ``(C, T, H, W)``: each channel's time slices (at most 8, evenly
    spaced) side by side, with a column of the channel's minimum between them."""
    import torch

    picked = t[:, _slices(int(t.shape[1]))]
    c, k, h, w = picked.shape
    gap = picked.flatten(1).amin(dim=1)[:, None, None, None].expand(c, k, h, 1)
    joined = torch.cat([picked, gap], dim=3).permute(0, 2, 1, 3).reshape(c, h, k * (w + 1))
    return joined[:, :, :-1]


def featuremap_job(
    loaded: LoadedModel,
    layers: Sequence[str] | None = None,
    *,
    stage: str = "output",
    max_channels: int = 64,
    colormap: str = "viridis",
    save_raw: bool = False,
) -> FeatureMapJob:
    """The ``featuremaps`` job: ``layers`` as names or globs (default: every Conv2d that runs); ``save_raw``
    also writes each feature map as it is (``--save-raw``; what a maps store, ``--maps``, takes: give it
    with :class:`hookviz.Run`'s ``maps=``, as the command does)."""
    names = map_layers(loaded.model, list(layers) if layers else None, probe(loaded), loaded.name)
    return FeatureMapJob(
        loaded=loaded, layers=names, stage=stage, max_channels=max_channels, colormap=colormap,
        save_raw=save_raw,
    )  # fmt: skip
