"""``gradcam`` on detectors: a map per detected box."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz import render
from hookviz.core.arrays import to_numpy
from hookviz.core.taps import slug
from hookviz.engine.detection import detection_methods, explain_detections
from hookviz.errors import UsageError
from hookviz.io.images import Box, encode_png
from hookviz.jobs.common import (
    FUSED,
    BaseJob,
    finite_stat,
    full_map,
    npy_bytes,
    weights_note,
)
from hookviz.methods import REGISTRY, MethodOptions, cams
from hookviz.methods import parse as parse_methods
from hookviz.methods import title as method_title
from hookviz.models.loaded import LoadedModel
from hookviz.models.settings import model_settings
from hookviz.options import Colormap, Fuse


def _per_photo(method: str) -> bool:
    """A class-agnostic method (Eigen-CAM, KPCA-CAM, FEM) makes one map per photo, not one per box."""

    spec = REGISTRY.get(method)
    return spec is not None and not spec.class_specific


@dataclass(kw_only=True)
class DetectionJob(BaseJob):
    """For each photo: one overlay per detected box (gradient methods) or per photo (Eigen-CAM), the box
    drawn with its class and score, and a picture of every detection (``<stem>.detections.png``, written
    last, so its presence means the photo is complete).

    ``classes`` keeps only detections of those classes (``--target``); ``None`` keeps every class.
    """

    loaded: LoadedModel
    layers: Sequence[str]
    methods: Sequence[str] = ("hirescam",)
    classes: list[int] | None = None
    score_threshold: float = 0.5
    max_boxes: int = 10
    alpha: float = 0.5
    colormap: str = "jet"
    relu: bool = True
    save_raw: bool = False
    eigen_smooth: bool = False
    #: The methods' settings (D-RISE's ``masks``, ``cells``, ``seed``, ``batch``).
    options: MethodOptions = field(default_factory=MethodOptions)
    #: Called as ``progress(done, total)`` over D-RISE's masked passes.
    progress: Any = None
    kind: str = "gradcam"
    #: ``mean`` or ``max``: also one map fused from every layer's (each scaled to [0, 1] first, as
    #: ``gradcam --fuse`` on classifiers); ``fused_only``: only that one (a YOLO's neck by default).
    fuse: str | None = None
    fused_only: bool = False

    def __post_init__(self) -> None:

        self.colormap = Colormap.parse(self.colormap, "--colormap").value
        self.methods = parse_methods(self.methods)
        other = [m for m in self.methods if m not in detection_methods()]
        if other:
            raise UsageError(
                f"--method {other[0]} is not available for detectors (a masked or guided pass per box would "
                f"have to re-find the box); use {', '.join(detection_methods())}"
            )
        if not 0.0 <= self.score_threshold <= 1.0:
            raise UsageError(f"--score-threshold {self.score_threshold}: must be between 0 and 1")
        if self.max_boxes < 1:
            raise UsageError(f"--max-boxes {self.max_boxes}: must be at least 1")
        if self.fuse is not None:
            self.fuse = Fuse.parse(self.fuse, "--fuse").value
            if len(self.layers) < 2:
                raise UsageError("--fuse combines the maps of several layers: give two or more --layer")

    def settings(self) -> dict[str, Any]:
        return {
            **model_settings(self.loaded),
            "command": self.kind,
            "task": "detection",
            "layers": list(self.layers),
            "methods": list(self.methods),
            "classes": self.classes,
            "score_threshold": self.score_threshold,
            "max_boxes": self.max_boxes,
            "alpha": self.alpha,
            "colormap": self.colormap,
            "relu": self.relu,
            "eigen_smooth": self.eigen_smooth,
            **({"fuse": self.fuse, "fused_only": self.fused_only} if self.fuse else {}),
            **({"options": used} if (used := self.options.record(self.methods)) else {}),
        }

    def planned(self, stem: str) -> list[str]:
        """The outputs known before the model runs (the per-box ones depend on what it finds)."""
        names = [
            f"{stem}.{m}.{slug(layer)}.png" for m in self.methods if _per_photo(m) for layer in self._shown()
        ]
        return [*names, f"{stem}.detections.png"]

    def _shown(self) -> list[str]:
        """The layers whose maps are written: each given one, then the fused map."""
        if not self.fuse:
            return list(self.layers)
        return [FUSED] if self.fused_only else [*self.layers, FUSED]

    def compute(self, x: Any) -> Any:
        found = self._explain(x)
        if not self.fuse:
            return found
        return [
            dataclasses.replace(
                ex, maps=self._fused(ex.maps, ex.resized), region_maps=self._fused(ex.region_maps, ex.resized)
            )
            for ex in found
        ]

    def _fused(self, maps: dict[tuple[str, str], Any], size: tuple[int, int]) -> dict[tuple[str, str], Any]:
        """``maps`` with each method's fused map added (or alone, with ``fused_only``)."""
        out = dict(maps)
        for m in {m for m, _ in maps}:
            stacks = [maps[(m, layer)] for layer in self.layers]
            if not len(stacks[0]):  # nothing detected: no map to fuse
                out[(m, FUSED)] = stacks[0].new_zeros(0, *size)
                continue
            out[(m, FUSED)] = cams.fuse([t[None] for t in stacks], size, str(self.fuse), relu=self.relu)[0]
        return {(m, la): out[(m, la)] for m in self.methods for la in self._shown() if (m, la) in out}

    def _explain(self, x: Any) -> Any:
        return explain_detections(
            self.loaded.model,
            x,
            self.layers,
            self.methods,
            score_threshold=self.score_threshold,
            max_boxes=self.max_boxes,
            classes=self.classes,
            relu=self.relu,
            eigen_smooth=self.eigen_smooth,
            options=self.options,
            progress=self.progress,
        )

    def _box_text(self, label: int, score: float) -> str:
        return f"{self.loaded.class_name(label)} {score:.2f}"

    def _one_map(
        self, ex: Any, rgb: np.ndarray, box: Box, stem: str, method: str, layer: str, i: int, cam: np.ndarray
    ) -> tuple[str, list[tuple[str, bytes]], dict[str, Any]]:
        """One map (box ``i``'s, or the whole photo's for a class-agnostic method): its name, its captioned
        overlay with the boxes drawn (and raw arrays), its record."""
        lm, n = self.loaded, len(ex.scores)
        picture = render.overlay(
            rgb, render.normalize(cam), box, alpha=self.alpha, colormap=self.colormap, scaled=True
        )
        if _per_photo(method):
            for k in range(n):
                render.draw_box(
                    picture, ex.boxes[k].tolist(), self._box_text(int(ex.labels[k]), float(ex.scores[k]))
                )
            name = f"{stem}.{method}.{slug(layer)}.png"
            what = f"whole image (class-agnostic), {n} detection(s) >= {self.score_threshold:g}"
        else:
            for k in range(n):
                if k != i:
                    render.draw_box(picture, ex.boxes[k].tolist(), "", strong=False)
            label, score = int(ex.labels[i]), float(ex.scores[i])
            render.draw_box(picture, ex.boxes[i].tolist(), self._box_text(label, score))
            name = f"{stem}.{method}.{slug(layer)}.box{i + 1}.png"
            what = f"box {i + 1} of {n}: {lm.describe(label)} score {score:.3f}"
        where = f"fused ({self.fuse}) {'+'.join(self.layers)}" if layer == FUSED else layer
        head = f"{lm.name} | {method_title(method)} at {where} | {weights_note(lm)}"
        files = [
            (name, encode_png(render.caption(render.enlarge_small(picture), [head, f"explained: {what}"])))
        ]
        if self.save_raw:  # at the feature map's resolution, and at the photo's (NaN outside)
            files.append((name[: -len(".png")] + ".npy", npy_bytes(cam.astype(np.float32))))
            files.append((name[: -len(".png")] + ".full.npy", npy_bytes(full_map(cam, rgb, box))))
        per_photo = _per_photo(method)  # a class-agnostic map stands with no detection too
        target = None if per_photo else {
            "index": int(ex.labels[i]),
            "name": lm.class_name(int(ex.labels[i])),
            "score": round(float(ex.scores[i]), 6),
        }  # fmt: skip
        record = {
            "file": name,
            "method": method,
            "layer": layer,
            "box": None if per_photo else i + 1,
            "target": target,
            "finite": bool(np.isfinite(cam).all()),
            "min": finite_stat(np.min, cam),
            "max": finite_stat(np.max, cam),
        }
        return name, files, record

    def _regions(self, ex: Any, rgb: np.ndarray, box: Box, stem: str) -> dict[str, list[Any]]:
        """An instance segmenter's class regions: per class among the boxes, a map of the sum of its
        instances' scores, its region (the union of their masks) outlined."""
        lm = self.loaded
        got: dict[str, list[Any]] = {"files": [], "maps": [], "records": []}
        outputs: list[list[str]] = [[] for _ in range(len(ex.region_labels))]
        for (method, layer), stack in ex.region_maps.items():
            for r, cam in enumerate(to_numpy(stack)):
                k = int(ex.region_labels[r])
                picture = render.overlay(
                    rgb, render.normalize(cam), box, alpha=self.alpha, colormap=self.colormap, scaled=True
                )
                render.outline(picture, to_numpy(ex.region_masks[r]), box)
                name = f"{stem}.{method}.{slug(layer)}.class{k}.png"
                count = int((ex.labels == k).sum())
                where = f"fused ({self.fuse}) {'+'.join(self.layers)}" if layer == FUSED else layer
                lines = [
                    f"{lm.name} | {method_title(method)} at {where} | {weights_note(lm)}",
                    f"explained: class region {lm.describe(k)}: {count} instance(s), scores summed "
                    f"{float(ex.region_scores[r]):.3f} (outlined: their masks)",
                ]
                got["files"].append((name, encode_png(render.caption(render.enlarge_small(picture), lines))))
                if self.save_raw:
                    got["files"].append((name[: -len(".png")] + ".npy", npy_bytes(cam.astype(np.float32))))
                outputs[r].append(name)
                score = round(float(ex.region_scores[r]), 6)
                got["maps"].append(
                    {
                        "file": name, "method": method, "layer": layer, "box": None, "region": k,
                        "target": {"index": k, "name": lm.class_name(k), "score": score},
                        "finite": bool(np.isfinite(cam).all()), "min": finite_stat(np.min, cam),
                        "max": finite_stat(np.max, cam),
                    }
                )  # fmt: skip
        for r, k in enumerate(ex.region_labels.tolist()):
            pixels = float(ex.region_masks[r].float().mean()) if ex.region_masks.numel() else 0.0
            got["records"].append(
                {
                    "index": int(k), "name": lm.class_name(int(k)), "instances": int((ex.labels == k).sum()),
                    "score": round(float(ex.region_scores[r]), 6), "pixels": round(pixels, 6),
                    "outputs": outputs[r],
                }
            )  # fmt: skip
        return got

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:

        lm, ex = self.loaded, result[index]
        if (rgb.shape[0], rgb.shape[1]) != ex.image_size:
            raise UsageError(f"the detector saw {ex.image_size}, the photo is {rgb.shape[:2]}")
        n = len(ex.scores)
        files: list[tuple[str, bytes]] = []
        outputs: list[list[str]] = [[] for _ in range(n)]
        maps: list[dict[str, Any]] = []
        for (method, layer), stack in ex.maps.items():
            for i in range(stack.shape[0]):
                name, mine, record = self._one_map(ex, rgb, box, stem, method, layer, i, to_numpy(stack[i]))
                files += mine
                maps.append(record)
                if not _per_photo(method):
                    outputs[i].append(name)
        regions = self._regions(ex, rgb, box, stem)
        files += regions["files"]
        maps += regions["maps"]
        summary = rgb.copy()
        for k in range(n):
            render.draw_box(
                summary, ex.boxes[k].tolist(), self._box_text(int(ex.labels[k]), float(ex.scores[k]))
            )
        kept = f"{n} detection(s) with score >= {self.score_threshold:g}"
        lines = [
            f"{lm.name} | {weights_note(lm)}",
            kept
            + (f" (best {self.max_boxes} kept)" if n == self.max_boxes else "")
            + f"; {ex.found} returned",
        ]
        files.append(
            (f"{stem}.detections.png", encode_png(render.caption(render.enlarge_small(summary), lines)))
        )
        detections = [
            {
                "box": [round(float(v), 2) for v in ex.boxes[k].tolist()],
                "index": int(ex.labels[k]),
                "name": lm.class_name(int(ex.labels[k])),
                "score": round(float(ex.scores[k]), 6),
                "outputs": outputs[k],
            }
            for k in range(n)
        ]
        top = detections[0] if detections else None
        fields = {
            "task": "detection",
            "layers": list(self.layers),
            "methods": list(self.methods),
            "layer": self.layers[0],
            "method": self.methods[0],
            "predicted": {k: top[k] for k in ("index", "name", "score")} if top else None,
            "detections": detections,
            **({"regions": regions["records"]} if regions["records"] else {}),
            "maps": maps,
            **({"options": used} if (used := self.options.record(self.methods)) else {}),
        }
        return files, fields
