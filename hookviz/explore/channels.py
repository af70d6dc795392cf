"""The explorer's layers and channels panel: the modules that run (with their shapes), a layer's channels
for an input, one channel over the photo, its feature visualisation, and its best inputs in a ``channels``
run's folder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hookviz import render
from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import ModuleCall, traced
from hookviz.core.layers import default_cam_layer, module_names
from hookviz.engine.features import feature_maps
from hookviz.errors import InputError
from hookviz.explore.inputs import Inputs
from hookviz.explore.looks import ChannelsRun, NotFound, visualisation
from hookviz.io.images import encode_png
from hookviz.models.loaded import LoadedModel


class Channels:
    """The layers of one model's session and their channels; ``on_model(work)`` runs ``work`` on the
    session's model thread."""

    def __init__(
        self,
        loaded: LoadedModel,
        inputs: Inputs,
        calls: list[ModuleCall],
        on_model: Callable[[Callable[[], Any]], Any],
        channels_run: ChannelsRun | None = None,
    ) -> None:
        self.loaded, self.inputs, self.calls, self.on_model = loaded, inputs, calls, on_model
        self.channels_run = channels_run
        self._pictures: dict[tuple[str, int, int], bytes] = {}

    def layers(self, index: int | None = None) -> list[dict[str, Any]]:
        """Each module that runs: name, type, output shape (for input ``index``, as its pass sees it; without
        one, for a test input of the model's size), whether it is the default CAM layer."""
        default = default_cam_layer(self.loaded.model, self.calls)
        calls = self.calls
        if index is not None:
            _, x, _ = self.inputs.read(index)
            calls = self.on_model(lambda: traced(self.loaded.model, tuple(x.shape), self.loaded.device))
        found = [
            {
                "name": c.name,
                "type": c.type,
                "shape": list(c.output_shape or ()),
                "default": c.name == default,
            }
            for c in calls
            if c.calls and c.name
        ]
        if default not in {c["name"] for c in found}:  # a NAME:input tensor (the pooling's input)
            found.append({"name": default, "type": "tensor", "shape": [], "default": True})
        return found

    def layer_name(self, layer: str = "") -> str:
        """``layer`` as given, or the default CAM layer's name."""
        return layer or default_cam_layer(self.loaded.model, self.calls)

    def channels(self, index: int, layer: str = "") -> tuple[str, np.ndarray]:
        """Input ``index``'s activations ``(C, h, w)`` at ``layer`` (default: the CAM layer), and its name."""
        name = self.layer_name(layer)
        module, _, side = name.partition(":")
        _, x, _ = self.inputs.read(index)
        batch = torch.from_numpy(x)[None].to(self.loaded.device)
        stage = "input" if side == "input" else "output"
        found = self.on_model(lambda: feature_maps(self.loaded.model, batch, [module], stage))
        return name, to_numpy(found[0].tensor[0], torch.float32)

    def channel_list(self, index: int, layer: str = "") -> dict[str, Any]:
        """The layer's channels for input ``index``, the most active first (mean and peak of each map)."""
        name, acts = self.channels(index, layer)
        means, peaks = acts.reshape(len(acts), -1).mean(axis=1), acts.reshape(len(acts), -1).max(axis=1)
        order = np.argsort(-means, kind="stable")
        each = [{"channel": int(c), "mean": float(means[c]), "max": float(peaks[c])} for c in order]
        return {"layer": name, "shape": list(acts.shape), "channels": each}

    def channel_png(self, index: int, layer: str, channel: int, alpha: float = 0.5) -> bytes:
        """One channel's activation over the photo (scaled to its own range), as a PNG."""
        name, acts = self.channels(index, layer)
        if not 0 <= channel < len(acts):
            raise InputError(f"input channel {channel}: {name} has {len(acts)} (0 to {len(acts) - 1})")
        rgb, _, box = self.inputs.read(index)
        return encode_png(
            render.overlay(np.asarray(rgb), acts[channel], box, alpha=alpha, colormap="viridis")
        )

    def visualise(self, layer: str, channel: int, steps: int = 128) -> bytes:
        """``channel``'s feature visualisation at ``layer`` (module outputs only), made once, as a PNG."""
        module = self.layer_name(layer).partition(":")[0]
        key = (module, channel, steps)
        if key not in self._pictures:
            self._pictures[key] = self.on_model(lambda: visualisation(self.loaded, module, channel, steps))
        return self._pictures[key]

    def best(self, layer: str, channel: int) -> dict[str, Any]:
        """``channel``'s best inputs in the ``--channels-run`` folder (see :class:`ChannelsRun`)."""
        name = self._layer(layer)  # a bad parameter first, whether or not there is a run
        return self._run().best(name, channel)

    def sheet(self, layer: str, channel: int) -> bytes:
        """``channel``'s sheet of best photos in the ``--channels-run`` folder."""
        name = self._layer(layer)
        return self._run().sheet(name, channel)

    # /api/best and /api/sheet answer alike: a layer the model does not have is a bad parameter (400); no
    # channels run, or nothing in it for a layer and channel, is a missing resource (404).
    def _run(self) -> ChannelsRun:
        if self.channels_run is None:
            raise NotFound(
                "no channels run given: start explore with --channels-run DIR (a hookviz channels --out)"
            )
        return self.channels_run

    def _layer(self, layer: str) -> str:
        name = self.layer_name(layer)
        if name.partition(":")[0] not in module_names(self.loaded.model):
            raise InputError(
                f"layer={layer!r}: {self.loaded.name} has no such layer (/api/layers lists them)"
            )
        return name
