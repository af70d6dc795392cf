"""``sanity``: the model-parameter randomisation test per image, and its summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz.images import Box, encode_png
from hookviz.jobs.common import _weights_note, model_settings, parse_methods
from hookviz.methods import MethodOptions
from hookviz.methods import title as method_title
from hookviz.models import LoadedModel
from hookviz.taps import slug


@dataclass(kw_only=True)
class SanityJob:
    """The model-parameter randomisation test per image: each method's map after each cumulative
    randomisation step (head first, on a copy), its Spearman correlation and SSIM with the original map,
    and a strip of the maps; an ``edges`` map (the image's own gradient, independent of the model) is the
    control that must stay the same."""

    loaded: LoadedModel
    layer: str
    methods: Sequence[str] = ("gradcam",)
    #: The settings of the methods that take any (``--seed``, ``--samples``, ...).
    options: MethodOptions = field(default_factory=MethodOptions)
    seed: int = 0
    kind: str = "sanity"

    def __post_init__(self) -> None:
        self.methods = parse_methods(self.methods)

    def settings(self) -> dict[str, Any]:
        return {
            **model_settings(self.loaded),
            "command": self.kind,
            "layer": self.layer,
            "methods": list(self.methods),
            **({"options": used} if (used := self.options.record(self.methods)) else {}),
            "seed": self.seed,
        }

    def planned(self, stem: str) -> list[str]:
        return [f"{stem}.sanity.{slug(self.layer)}.png"]

    def compute(self, x: Any) -> Any:
        import torch

        from hookviz import evaluation
        from hookviz.attribution import explain

        with torch.no_grad():
            target = explain(self.loaded.model, x, [self.layer], ["eigencam"]).predicted
        edges = _edges(x)

        def maps(model: Any) -> dict[str, Any]:
            ex = explain(model, x, [self.layer], self.methods, target, options=self.options)
            got = {m: ex.maps[(m, self.layer)][:, 0] for m in self.methods}
            got["edges"] = edges
            return got

        return evaluation.cascade(self.loaded.model, maps, seed=self.seed), target

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        from hookviz import render
        from hookviz.evaluation import spearman, ssim

        steps, target = result
        original = steps[0][1]
        clip = getattr(rgb, "frames", None)  # a video's clip: its middle frame shows the middle time step
        frame = clip[len(clip) // 2] if clip is not None else rgb
        crop = frame[box.y0 : box.y1, box.x0 : box.x1]

        def similarity(a: Any, b: Any) -> tuple[float, float]:
            """Spearman over the whole map; SSIM per time step, averaged, for a video model's."""
            if a.dim() == 3:
                return spearman(a, b), float(np.mean([ssim(a[k], b[k]) for k in range(a.shape[0])]))
            return spearman(a, b), ssim(a, b)

        rows = []
        records = []
        for method in [*self.methods, "edges"]:
            cells = []
            for name, maps in steps:
                cam = maps[method][index].float().numpy()
                shown = cam[len(cam) // 2] if cam.ndim == 3 else cam
                cells.append(render.overlay(crop, shown, Box(0, 0, crop.shape[1], crop.shape[0]), alpha=0.6))
                rho, s = similarity(maps[method][index], original[method][index])
                records.append(
                    {
                        "randomized_up_to": name,
                        "method": method,
                        "spearman": round(rho, 4),
                        "ssim": round(s, 4),
                    }
                )
            rows.append((method_title(method) if method != "edges" else "image edges (control)", cells))
        columns = ["original", *(f"random up to {name}" for name, _ in steps[1:])]
        t = int(target[index])
        title = (
            f"{self.loaded.name} | sanity check at {self.layer}: parameters randomised from the head down | "
            f"explaining {self.loaded.describe(t)} | {_weights_note(self.loaded)}"
        )
        strip = render.sheet(rows, columns, title=title, cell=140)
        name = f"{stem}.sanity.{slug(self.layer)}.png"
        fields = {
            "layer": self.layer,
            "target": {"index": t, "name": self.loaded.class_name(t)},
            "steps": records,
        }
        return [(name, encode_png(strip))], fields


def _edges(x: Any) -> Any:
    """The image's gradient magnitude at its own resolution: a 'map' that knows nothing of the model (a
    clip's: frame by frame, ``(B, T, H, W)``)."""
    import torch
    import torch.nn.functional as F

    if x.dim() == 5:
        b, c, t = x.shape[:3]
        return _edges(x.transpose(1, 2).reshape(b * t, c, *x.shape[3:])).reshape(b, t, *x.shape[3:])
    gray = x.float().mean(dim=1, keepdim=True)
    kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], device=x.device)
    gx = F.conv2d(gray, kx[None, None], padding=1)
    gy = F.conv2d(gray, kx.T[None, None], padding=1)
    return torch.sqrt(gx**2 + gy**2)[:, 0].cpu()


def summarise_sanity(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean Spearman and SSIM over the images for each step and method, in cascade order."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in records:
        for step in rec.get("steps", []):
            groups.setdefault((step["randomized_up_to"], step["method"]), []).append(step)
    return [
        {
            "randomized_up_to": name,
            "method": method,
            "images": len(v),
            "spearman": round(sum(s["spearman"] for s in v) / len(v), 4),
            "ssim": round(sum(s["ssim"] for s in v) / len(v), 4),
        }
        for (name, method), v in groups.items()
    ]
