"""``gradcam`` on detectors: a map per detected box."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz import render
from hookviz.core.arrays import to_numpy
from hookviz.core.conventions import default_layers
from hookviz.core.hooks import ModuleCall
from hookviz.core.layers import cam_layer
from hookviz.core.taps import slug
from hookviz.core.targets import Classes, Target, Top
from hookviz.engine.detection import detection_methods, explain_detections
from hookviz.errors import UsageError
from hookviz.io.images import Box, encode_png
from hookviz.jobs.build import BuiltJob, chosen_layers, default_layer, expensive
from hookviz.jobs.common import (
    FUSED,
    BaseJob,
    CamParams,
    finite_stat,
    full_map,
    job_settings,
    npy_bytes,
    scored_class,
    weights_note,
)
from hookviz.jobs.settings import CamSettings
from hookviz.methods import REGISTRY, cams
from hookviz.methods import parse as parse_methods
from hookviz.methods import title as method_title
from hookviz.models.loaded import LoadedModel


def _per_photo(method: str) -> bool:
    """A class-agnostic method (Eigen-CAM, KPCA-CAM, FEM) makes one map per photo, not one per box."""

    spec = REGISTRY.get(method)
    return spec is not None and not spec.class_specific


@dataclass(kw_only=True)
class DetectionJob(CamParams, BaseJob):
    """For each photo: one overlay per detected box (gradient methods) or per photo (Eigen-CAM), the box
    drawn with its class and score, and a picture of every detection (``<stem>.detections.png``, written
    last, so its presence means the photo is complete).

    ``targets`` keeps only detections of those classes (``--target``); :class:`Top` keeps every class.
    """

    loaded: LoadedModel
    #: ``gradcam``'s settings, held whole, the builder's decisions in them (:func:`detection_job`).
    params: CamSettings = field(default_factory=CamSettings)
    #: The classes kept (``--target``): :class:`Top` keeps every class.
    targets: Target = field(default_factory=Top)
    #: Called as ``progress(done, total)`` over D-RISE's masked passes.
    progress: Any = None
    kind: str = "gradcam"
    #: The fused map (``params.fuse``) only: a YOLO's neck by default.
    fused_only: bool = False

    @property
    def classes(self) -> list[int] | None:
        """The classes kept, by index (None: every class)."""
        return list(self.targets.ids) if isinstance(self.targets, Classes) else None

    def __post_init__(self) -> None:
        methods = tuple(parse_methods(self.params.methods or ("hirescam",)))
        self.params = dataclasses.replace(self.params, methods=methods)
        other = [m for m in self.methods if m not in detection_methods()]
        if other:
            raise UsageError(
                f"--method {other[0]} is not available for detectors (a masked or guided pass per box would "
                f"have to re-find the box); use {', '.join(detection_methods())}"
            )
        if not 0.0 <= self.params.score_threshold <= 1.0:
            raise UsageError(f"--score-threshold {self.params.score_threshold}: must be between 0 and 1")
        if self.params.max_boxes < 1:
            raise UsageError(f"--max-boxes {self.params.max_boxes}: must be at least 1")
        if self.params.fuse is not None and len(self.layers) < 2:
            raise UsageError("--fuse combines the maps of several layers: give two or more --layer")

    def settings(self) -> dict[str, Any]:
        return job_settings(
            self,
            task="detection",
            layers=list(self.layers),
            methods=list(self.methods),
            classes=self.classes,
            score_threshold=self.params.score_threshold,
            max_boxes=self.params.max_boxes,
            alpha=self.params.alpha,
            colormap=self.params.colormap,
            relu=self.params.relu,
            eigen_smooth=self.params.eigen_smooth,
            **({"fuse": self.params.fuse, "fused_only": self.fused_only} if self.params.fuse else {}),
            **({"options": used} if (used := self.options.record(self.methods)) else {}),
        )

    def planned(self, stem: str) -> list[str]:
        """The outputs known before the model runs (the per-box ones depend on what it finds)."""
        names = [
            f"{stem}.{m}.{slug(layer)}.png" for m in self.methods if _per_photo(m) for layer in self._shown()
        ]
        return [*names, f"{stem}.detections.png"]

    def _shown(self) -> list[str]:
        """The layers whose maps are written: each given one, then the fused map."""
        if not self.params.fuse:
            return list(self.layers)
        return [FUSED] if self.fused_only else [*self.layers, FUSED]

    def compute(self, x: Any) -> Any:
        found = self._explain(x)
        if not self.params.fuse:
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
            out[(m, FUSED)] = cams.fuse(
                [t[None] for t in stacks], size, str(self.params.fuse), relu=self.params.relu
            )[0]
        return {(m, la): out[(m, la)] for m in self.methods for la in self._shown() if (m, la) in out}

    def _explain(self, x: Any) -> Any:
        return explain_detections(
            self.loaded.model,
            x,
            self.layers,
            self.methods,
            score_threshold=self.params.score_threshold,
            max_boxes=self.params.max_boxes,
            classes=self.classes,
            relu=self.params.relu,
            eigen_smooth=self.params.eigen_smooth,
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
        picture = self._overlay(rgb, render.normalize(cam), box)
        if _per_photo(method):
            for k in range(n):
                render.draw_box(
                    picture, ex.boxes[k].tolist(), self._box_text(int(ex.labels[k]), float(ex.scores[k]))
                )
            name = f"{stem}.{method}.{slug(layer)}.png"
            what = f"whole image (class-agnostic), {n} detection(s) >= {self.params.score_threshold:g}"
        else:
            for k in range(n):
                if k != i:
                    render.draw_box(picture, ex.boxes[k].tolist(), "", strong=False)
            label, score = int(ex.labels[i]), float(ex.scores[i])
            render.draw_box(picture, ex.boxes[i].tolist(), self._box_text(label, score))
            name = f"{stem}.{method}.{slug(layer)}.box{i + 1}.png"
            what = f"box {i + 1} of {n}: {lm.describe(label)} score {score:.3f}"
        where = f"fused ({self.params.fuse}) {'+'.join(self.layers)}" if layer == FUSED else layer
        head = f"{lm.name} | {method_title(method)} at {where} | {weights_note(lm)}"
        files = [
            (name, encode_png(render.caption(render.enlarge_small(picture), [head, f"explained: {what}"])))
        ]
        if self.params.save_raw:  # at the feature map's resolution, and at the photo's (NaN outside)
            files.append((name[: -len(".png")] + ".npy", npy_bytes(cam.astype(np.float32))))
            files.append((name[: -len(".png")] + ".full.npy", npy_bytes(full_map(cam, rgb, box))))
        per_photo = _per_photo(method)  # a class-agnostic map stands with no detection too
        target = None if per_photo else scored_class(lm, int(ex.labels[i]), float(ex.scores[i]))
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
                picture = self._overlay(rgb, render.normalize(cam), box)
                render.outline(picture, to_numpy(ex.region_masks[r]), box)
                name = f"{stem}.{method}.{slug(layer)}.class{k}.png"
                count = int((ex.labels == k).sum())
                where = f"fused ({self.params.fuse}) {'+'.join(self.layers)}" if layer == FUSED else layer
                lines = [
                    f"{lm.name} | {method_title(method)} at {where} | {weights_note(lm)}",
                    f"explained: class region {lm.describe(k)}: {count} instance(s), scores summed "
                    f"{float(ex.region_scores[r]):.3f} (outlined: their masks)",
                ]
                got["files"].append((name, encode_png(render.caption(render.enlarge_small(picture), lines))))
                if self.params.save_raw:
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
        kept = f"{n} detection(s) with score >= {self.params.score_threshold:g}"
        lines = [
            f"{lm.name} | {weights_note(lm)}",
            kept
            + (f" (best {self.params.max_boxes} kept)" if n == self.params.max_boxes else "")
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


def detection_job(loaded: LoadedModel, s: CamSettings, calls: list[ModuleCall], targets: Target) -> BuiltJob:
    """``gradcam`` on a detector: a map per box; ``--target`` keeps only the named classes."""
    refused = {
        "--metrics": s.metrics,
        "--channels": bool(s.channel_terms),
        "--aug-smooth": s.aug_smooth,
        "--normalize": s.normalize != "image",
    }
    for flag, given in refused.items():
        if given:
            raise UsageError(f"{flag} is not available for detectors (each box's map is scaled on its own)")
    if not isinstance(targets, Classes) and targets != Top(1):
        raise UsageError(f"--target {s.target}: a detector explains every box it finds; name classes to keep")
    if s.layers == ("auto",):
        raise UsageError("--layer auto is not available for detectors; give --layer or use the default")
    notes = []
    fuse, fused_only = s.fuse, False
    own, what = default_layers(loaded.model)  # another library's detector says (a YOLO's neck)
    if s.layers:
        chosen = chosen_layers(loaded, s.layers, calls)
    elif len(own) > 1:
        chosen = [cam_layer(loaded.model, name, calls, loaded.name) for name in own]
        fuse, fused_only = fuse or "mean", True
        what = what or "its default layers"
        notes.append(
            f"using the {fuse} of the maps at {', '.join(chosen)} ({what}; each scaled to [0, 1] first); "
            "--layer to see one"
        )
    else:
        chosen, reason = default_layer(loaded, calls)
        reason = reason if own else "its backbone's last stage"
        notes.append(f"using layer {chosen[0]} (the default for {loaded.name}: {reason}; --layer to change)")
    if fuse is not None and len(chosen) < 2:
        raise UsageError("--fuse combines the maps of several layers: give two or more --layer")
    if not s.methods:
        notes.append(
            "using HiResCAM for a detector (Grad-CAM averages a box's local gradient over the "
            "whole image, so its map spreads to similar objects; --method gradcam to see it)"
        )
    options = dataclasses.replace(s.options, batch=min(s.options.batch, 8))
    params = dataclasses.replace(s, layers=tuple(chosen), fuse=fuse, options=options)
    job = DetectionJob(loaded=loaded, params=params, targets=targets, fused_only=fused_only)
    if "drise" in job.methods:
        notes.append(
            f"note: D-RISE runs {job.options.masks:,} detector passes per photo (--masks; the paper: 5000)"
        )
    return BuiltJob(job=job, notes=tuple(notes), slow=expensive(job.methods, job.options))
