"""``sanity``: the model-parameter randomisation test per image, and its summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz import evaluation, render
from hookviz.core.arrays import to_numpy
from hookviz.core.conventions import Framed
from hookviz.core.taps import slug
from hookviz.engine.explain import explain
from hookviz.evaluation import spearman, ssim
from hookviz.io.images import Box, encode_png
from hookviz.io.samples import Sample
from hookviz.jobs.build import method_options, one_layer
from hookviz.jobs.common import BaseJob, job_settings, weights_note
from hookviz.methods import MethodOptions
from hookviz.methods import parse as parse_methods
from hookviz.methods import title as method_title
from hookviz.models.loaded import LoadedModel, probe


@dataclass(kw_only=True)
class SanityJob(BaseJob):
    """The model-parameter randomisation test per image: each method's map after each randomisation step
    (block by block from the head down, on a copy; ``order="independent"``: each block alone), its Spearman
    correlation and SSIM with the original map, and a strip of the maps (at most eight steps shown, every
    step recorded); an ``edges`` map (the image's own gradient, independent of the model) is the control
    that must stay the same. ``smooth`` > 1: sMPRT, every map the mean over that many noisy copies of the
    input (noise ``noise`` x the input's range), so that gradient noise does not pass for sensitivity."""

    loaded: LoadedModel
    layer: str
    methods: Sequence[str] = ("gradcam",)
    #: The settings of the methods that take any (``--seed``, ``--samples``, ...).
    options: MethodOptions = field(default_factory=MethodOptions)
    seed: int = 0
    order: str = "cascading"
    granularity: str = "block"
    smooth: int = 1
    noise: float = 0.1
    kind: str = "sanity"

    def __post_init__(self) -> None:
        self.methods = parse_methods(self.methods)

    def settings(self) -> dict[str, Any]:
        return job_settings(
            self,
            layer=self.layer,
            methods=list(self.methods),
            **({"options": used} if (used := self.options.record(self.methods)) else {}),
            seed=self.seed,
            order=self.order,
            granularity=self.granularity,
            **({"smooth": self.smooth, "smooth_noise": self.noise} if self.smooth > 1 else {}),
        )

    def planned(self, stem: str) -> list[str]:
        return [f"{stem}.sanity.{slug(self.layer)}.png"]

    def compute(self, x: Any) -> Any:
        import torch

        with torch.no_grad():
            target = explain(self.loaded.model, x, [self.layer], ["eigencam"]).predicted
        edges = _edges(x)

        def maps_of(model: Any, inputs: Any) -> dict[str, Any]:
            ex = explain(model, inputs, [self.layer], self.methods, target, options=self.options)
            return {m: ex.maps[(m, self.layer)][:, 0].float() for m in self.methods}

        if self.smooth > 1:
            run = evaluation.smoothed(maps_of, x, samples=self.smooth, magnitude=self.noise, seed=self.seed)
        else:
            run = lambda model: maps_of(model, x)  # noqa: E731

        def maps(model: Any) -> dict[str, Any]:
            return {**run(model), "edges": edges}

        steps = evaluation.cascade(
            self.loaded.model, maps, seed=self.seed, order=self.order, granularity=self.granularity
        )
        return steps, target

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:

        steps, target = result
        original = steps[0][1]
        picture: Any = rgb  # a photo, a clip or a sample of several inputs
        if isinstance(picture, Sample):  # the first input's picture
            first = next(iter(picture.pictures))
            picture, box = picture.pictures[first], picture.boxes[first]
        # A video's clip: its middle frame shows the middle time step.
        frame = picture.frames[len(picture.frames) // 2] if isinstance(picture, Framed) else picture
        crop = frame[box.y0 : box.y1, box.x0 : box.x1]

        def similarity(a: Any, b: Any) -> tuple[float, float]:
            """Spearman over the whole map; SSIM per time step, averaged, for a video model's."""
            if a.dim() == 3:
                return spearman(a, b), float(np.mean([ssim(a[k], b[k]) for k in range(a.shape[0])]))
            return spearman(a, b), ssim(a, b)

        rows = []
        records = []
        # The original, the first step (the head) and the last, and evenly between: eight columns at most.
        n = len(steps)
        shown_steps = {0, *(round(1 + k * (n - 2) / 6) for k in range(7))} if n > 8 else None
        for method in [*self.methods, "edges"]:
            cells = []
            for k, (name, maps) in enumerate(steps):
                cam = to_numpy(maps[method][index].float())
                shown = cam[len(cam) // 2] if cam.ndim == 3 else cam
                if shown_steps is None or k in shown_steps:
                    cells.append(
                        render.overlay(crop, shown, Box(0, 0, crop.shape[1], crop.shape[0]), alpha=0.6)
                    )
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
        word = "random up to" if self.order == "cascading" else "random"
        columns = [
            "original" if k == 0 else f"{word} {name}"
            for k, (name, _) in enumerate(steps)
            if shown_steps is None or k in shown_steps
        ]
        t = int(target[index])
        title = (
            f"{self.loaded.name} | sanity check at {self.layer}: parameters randomised "
            f"{'from the head down' if self.order == 'cascading' else 'one block at a time'} | "
            f"explaining {self.loaded.describe(t)} | {weights_note(self.loaded)}"
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


def sanity_job(
    loaded: LoadedModel,
    *,
    layer: str | None = None,
    methods: Sequence[str] | None = None,
    options: MethodOptions | None = None,
    **fields: Any,
) -> SanityJob:
    """The ``sanity`` job at ``layer`` (default: the CAM default), ``fields`` as :class:`SanityJob` takes them
    (seed, order, granularity, smooth, noise)."""
    name = one_layer(loaded, layer, probe(loaded))
    return SanityJob(
        loaded=loaded,
        layer=name,
        methods=[str(m) for m in (methods or ["gradcam"])],
        options=method_options(loaded, options or MethodOptions()),
        **fields,
    )
