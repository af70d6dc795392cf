"""The per-batch jobs behind ``hookviz gradcam`` and ``hookviz featuremaps``: compute, then render."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hookviz.images import Box, encode_png
from hookviz.models import LoadedModel


def _weights_note(loaded: LoadedModel) -> str:
    return "RANDOM WEIGHTS (--weights none)" if not loaded.pretrained else f"weights {loaded.weights}"


@dataclass
class GradCamJob:
    """Grad-CAM overlays (and optionally raw maps) for each image."""

    loaded: LoadedModel
    layer: str
    target: int | None = None
    alpha: float = 0.5
    colormap: str = "jet"
    relu: bool = True
    save_raw: bool = False
    kind: str = "gradcam"

    def planned(self, stem: str) -> list[str]:
        names = [f"{stem}.gradcam.{self.layer}.png"]
        if self.save_raw:
            names.append(f"{stem}.gradcam.{self.layer}.npy")
        return names

    def compute(self, x: Any) -> Any:
        from hookviz.explain import grad_cam

        return grad_cam(self.loaded.model, x, self.layer, self.target, relu=self.relu)

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        from hookviz import render

        cam = result.maps[index].numpy()
        if not self.relu:
            # Signed map: 0.5 is "no evidence", so red and blue stay comparable.
            peak = float(np.abs(cam).max()) or 1.0
            unit = 0.5 + 0.5 * cam / peak
            picture = render.overlay(rgb, unit, box, alpha=self.alpha, colormap=self.colormap, scaled=True)
        else:
            picture = render.overlay(rgb, cam, box, alpha=self.alpha, colormap=self.colormap)
        lm = self.loaded
        pred, tgt = int(result.predicted[index]), int(result.target[index])
        p_score, t_score = float(result.predicted_score[index]), float(result.target_score[index])
        lines = [
            f"{lm.name} | Grad-CAM at {self.layer} | {_weights_note(lm)}",
            f"predicted: {lm.class_name(pred)} ({pred}) p={p_score:.3f}",
            f"explained: {lm.class_name(tgt)} ({tgt}) p={t_score:.3f}",
        ]
        files = [(f"{stem}.gradcam.{self.layer}.png", encode_png(render.caption(picture, lines)))]
        if self.save_raw:
            buf = io.BytesIO()
            np.save(buf, cam.astype(np.float32))
            files.append((f"{stem}.gradcam.{self.layer}.npy", buf.getvalue()))
        fields = {
            "layer": self.layer,
            "method": "gradcam",
            "predicted": {"index": pred, "name": lm.class_name(pred), "score": round(p_score, 6)},
            "target": {"index": tgt, "name": lm.class_name(tgt), "score": round(t_score, 6)},
            "box": [box.x0, box.y0, box.x1, box.y1],
        }
        return files, fields


@dataclass
class FeatureMapJob:
    """One channel mosaic per image, layer, stage and call."""

    loaded: LoadedModel
    layers: Sequence[str]
    stage: str = "output"
    max_channels: int = 64
    colormap: str = "viridis"
    kind: str = "featuremaps"

    def _stages(self) -> list[str]:
        return ["input", "output"] if self.stage == "both" else [self.stage]

    def planned(self, stem: str) -> list[str]:
        return [f"{stem}.featuremap.{layer}.{s}.png" for layer in self.layers for s in self._stages()]

    def compute(self, x: Any) -> Any:
        from hookviz.features import feature_maps

        return feature_maps(self.loaded.model, x, self.layers, self.stage)

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        from hookviz import render
        from hookviz.features import rank_channels

        files = []
        shown = []
        for fm in result:
            t = fm.tensor[index]
            channels = rank_channels(t, self.max_channels)
            call = f" call {fm.call}" if fm.call > 1 else ""
            title = (
                f"{self.loaded.name} {fm.layer} {fm.stage}{call} {tuple(fm.tensor.shape[1:])} | "
                f"top {len(channels)}/{t.shape[0]} channels by spatial std | {_weights_note(self.loaded)}"
            )
            grid = render.feature_grid(t.numpy(), channels, title=title, colormap=self.colormap)
            suffix = f".call{fm.call}" if fm.call > 1 else ""
            files.append((f"{stem}.featuremap.{fm.layer}.{fm.stage}{suffix}.png", encode_png(grid)))
            shown.append(
                {
                    "layer": fm.layer,
                    "stage": fm.stage,
                    "call": fm.call,
                    "shape": list(fm.tensor.shape[1:]),
                    "channels": channels,
                }
            )
        return files, {"layers": list(self.layers), "stage": self.stage, "maps": shown}
