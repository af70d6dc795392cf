"""The per-batch jobs of the per-image commands (gradcam, featuremaps, gradflow, dropblock)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz.errors import UsageError
from hookviz.images import Box, encode_png
from hookviz.methods import title as method_title
from hookviz.models import LoadedModel
from hookviz.options import Colormap, Fuse, Normalize, Region, Stage
from hookviz.taps import slug


def _weights_note(loaded: LoadedModel) -> str:
    return "RANDOM WEIGHTS (--weights none)" if not loaded.pretrained else f"weights {loaded.weights}"


def model_settings(loaded: LoadedModel) -> dict[str, Any]:
    """What about the model changes an output's pixels: architecture, weights' values, class names, input."""
    p = loaded.preprocess
    return {
        "model": loaded.name,
        "weights": loaded.weights_id or loaded.weights,
        "labels": loaded.labels_id or None,
        "input": {
            "crop_size": p.crop_size,
            "resize_size": p.resize_size,
            "resize": str(p.resize),
            "interpolation": p.interpolation,
            # PIL's antialiased resize of the whole photo, then the crop (the model's own transform)
            "resampler": "PIL",
            "crop_round": p.crop_round,
            "mean": [round(float(v), 6) for v in p.mean],
            "std": [round(float(v), 6) for v in p.std],
        },
    }


def parse_methods(methods: Sequence[str]) -> list[str]:
    """Method names validated (a typo is a :class:`UsageError`), ``all`` expanded, duplicates dropped."""
    from hookviz import methods as registry

    return registry.parse(methods)


def predicted(loaded: LoadedModel, logits: Any, index: int) -> dict[str, Any] | None:
    """The top class of row ``index`` of a classifier's output (None when the output is not ``(B, C)``)."""
    import torch

    from hookviz.attribution import ranking

    if logits is None or logits.dim() != 2:
        return None
    row = logits[index : index + 1].float()
    top = int(ranking(row)[0, 0])
    score = float(torch.softmax(row, dim=1)[0, top])
    return {"index": top, "name": loaded.class_name(top), "score": round(score, 6)}


FUSED = "fused"


def _full_map(cam: np.ndarray, rgb: np.ndarray, box: Box) -> np.ndarray:
    """``cam`` upsampled onto the photo's pixels where the model saw them, NaN elsewhere (float32)."""
    from hookviz import render

    full = np.full(rgb.shape[:2], np.nan, dtype=np.float32)
    full[box.y0 : box.y1, box.x0 : box.x1] = render.upsample(cam, box)
    return full


def _check_finite(ex: Any, index: int) -> None:
    """Refuse an image whose scores are not finite: its "prediction" would be an arbitrary class.

    Raises:
        InputError: NaN or infinite probabilities (a diverged model, an fp16 overflow).
    """
    from hookviz.errors import InputError

    probs = ex.probs[index]
    if not bool(probs.isfinite().all()):
        raise InputError(
            "the model's output is not finite (NaN or inf) for this input, so it predicts nothing; check "
            "the weights (a diverged checkpoint) or run in float32"
        )


def _region_note(region: str | None, asked: str | None) -> str:
    """The caption's account of which pixels a segmentation score sums."""
    if region is None:
        return ""
    if region == "class":
        return ", its score summed over its pixels (outlined)"
    if asked == "class":
        return ", its score summed over all pixels (the model gives it none)"
    return ", its score summed over all pixels (its own outlined)"


@dataclass
class CamBatch:
    """What ``CamJob.compute`` hands to ``render``: maps per (method, layer), and the colour scales."""

    explanation: Any
    maps: dict[tuple[str, str], np.ndarray]  # (method, layer or "fused") -> (B, T, h, w)
    scales: dict[tuple[str, str], tuple[float, float] | None]  # None: per map
    #: With ``metrics``: (method, layer) -> per target j, the Faithfulness of the batch's maps.
    metrics: dict[tuple[str, str], list[Any]] | None = None


@dataclass
class CamJob:
    """CAM overlays for each image: every method x layer (x fused) x target, a comparison sheet, raw maps.

    ``targets`` is ``None`` (top-1), ``"topK"``, or a list of class indices shared by every image.
    ``normalize``: ``image`` (each map min-max), ``batch`` (one scale per method and layer across the
    batch), ``none`` (the fixed scale ``[0, vmax]``, so a photo's picture never depends on its batch).
    """

    loaded: LoadedModel
    layers: Sequence[str]
    methods: Sequence[str] = ("gradcam",)
    targets: str | list[int] | None = None
    alpha: float = 0.5
    colormap: str = "jet"
    relu: bool = True
    save_raw: bool = False
    normalize: str = "image"
    vmax: float | None = None
    fuse: str | None = None
    sheet: bool | None = None
    scorecam_batch: int = 64
    #: Deletion and insertion AUCs for every map (in its record, caption and the sheet).
    metrics: bool = False
    eigen_smooth: bool = False
    aug_smooth: bool = False
    kind: str = "gradcam"
    #: Called as ``progress(done, total)`` during Score-CAM's masked passes (a progress bar).
    progress: Any = None
    #: How ``--layer auto`` chose the layer (recorded with every input).
    auto_layer: dict[str, Any] | None = None
    #: Segmentation: explain a class's pixels (``class``) or every pixel (``all``).
    region: str = "class"
    #: Notes for the user found while computing (each said once); :meth:`take_notes` hands them over.
    notes: list[str] = field(default_factory=list)
    _noted: set[str] = field(default_factory=set, repr=False)

    def take_notes(self) -> list[str]:
        """The notes found since the last call (signed activations, a network with no rectifier)."""
        taken, self.notes = self.notes, []
        return taken

    def _note_once(self, key: str, text: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.notes.append(text)

    def _check_assumptions(self, ex: Any) -> None:
        from hookviz.methods import get
        from hookviz.taps import MATERIAL_NEGATIVE

        reasons = {m: get(m).assumes_nonnegative for m in self.methods if get(m).assumes_nonnegative}
        risky = list(reasons)
        for layer, share in ex.negative_mass.items():
            worst = float(share.max()) if share.numel() else 0.0
            if risky and worst >= MATERIAL_NEGATIVE:
                names = " and ".join(method_title(m) for m in risky)
                self._note_once(
                    f"signed:{layer}",
                    f"{worst:.0%} of the activation mass of {layer} is negative, and {names} assume "
                    f"non-negative activations ({reasons[risky[0]]}), so their maps there "
                    "can point anywhere; take a post-activation tensor (the default: the one entering the "
                    "pooling)",
                )
        if ex.guided is not None and not ex.guided:
            self._note_once(
                "guided",
                f"{self.loaded.name} has no rectifier (ReLU, ReLU6, LeakyReLU, hardtanh(0, x)): Guided "
                "Backprop is the plain input gradient here",
            )

    def __post_init__(self) -> None:
        self.normalize = Normalize.parse(self.normalize, "--normalize").value
        self.region = Region.parse(self.region, "--region").value
        self.colormap = Colormap.parse(self.colormap, "--colormap").value
        self.methods = parse_methods(self.methods)
        if self.fuse is not None:
            self.fuse = Fuse.parse(self.fuse, "--fuse").value
            if len(self.layers) < 2:
                raise UsageError("--fuse combines the maps of several layers: give two or more --layer")
        if self.normalize == Normalize.none and self.vmax is None:
            raise UsageError(
                "--normalize none needs --vmax (the map value drawn as full colour), so that a photo's "
                "picture never depends on its batch; the manifest's max of an earlier run is a good start"
            )
        if self.vmax is not None:
            if self.normalize != Normalize.none:
                raise UsageError(f"--vmax goes with --normalize none (not {self.normalize})")
            if not (self.vmax > 0 and math.isfinite(self.vmax)):
                raise UsageError(f"--vmax {self.vmax}: must be a finite number greater than 0")

    def settings(self) -> dict[str, Any]:
        """Everything that changes the pictures (with :func:`model_settings`): the output key's input."""
        targets = "top1" if self.targets is None else self.targets
        return {
            **model_settings(self.loaded),
            "command": self.kind,
            "layers": list(self.layers),
            "methods": list(self.methods),
            "targets": targets,
            "alpha": self.alpha,
            "colormap": self.colormap,
            "relu": self.relu,
            "normalize": self.normalize,
            "vmax": self.vmax,
            "fuse": self.fuse,
            "sheet": self._want_sheet(),
            "metrics": self.metrics,
            "eigen_smooth": self.eigen_smooth,
            "aug_smooth": self.aug_smooth,
            **({"region": self.region} if self.loaded.task == "segmentation" else {}),
        }

    # -- naming ---------------------------------------------------------------------------
    def _layer_names(self) -> list[str]:
        return [*self.layers, FUSED] if self.fuse and len(self.layers) > 1 else list(self.layers)

    def _target_suffixes(self) -> list[str]:
        if self.targets is None:
            return [""]
        if isinstance(self.targets, str):
            k = int(self.targets[3:])
            return [""] if k == 1 else [f".top{r}" for r in range(1, k + 1)]
        return [""] if len(self.targets) == 1 else [f".c{c}" for c in self.targets]

    def _want_sheet(self) -> bool:
        if self.sheet is not None:
            return self.sheet
        return len(self.methods) * len(self._layer_names()) * len(self._target_suffixes()) > 1

    def _name(self, stem: str, method: str, layer: str, suffix: str) -> str:
        return f"{stem}.{method}.{slug(layer)}{suffix}"

    def planned(self, stem: str) -> list[str]:
        names = []
        for m in self.methods:
            for layer in self._layer_names():
                for suffix in self._target_suffixes():
                    base = self._name(stem, m, layer, suffix)
                    names.append(f"{base}.png")
                    if self.save_raw:
                        names += [f"{base}.npy", f"{base}.full.npy"]
        if self._want_sheet():
            names.append(f"{stem}.sheet.png")
        return names

    # -- compute --------------------------------------------------------------------------
    def compute(self, x: Any) -> CamBatch:
        from hookviz import cams
        from hookviz.attribution import explain

        ex = explain(
            self.loaded.model,
            x,
            self.layers,
            self.methods,
            self.targets,
            relu=self.relu,
            scorecam_batch=self.scorecam_batch,
            progress=self.progress,
            eigen_smooth=self.eigen_smooth,
            aug_smooth=self.aug_smooth,
            region=self.region,
        )
        self._check_assumptions(ex)
        maps = dict(ex.maps)
        if FUSED in self._layer_names():
            size = (int(x.shape[2]), int(x.shape[3]))
            for m in self.methods:
                layer_maps = [ex.maps[(m, layer)] for layer in self.layers]
                maps[(m, FUSED)] = cams.fuse(layer_maps, size, str(self.fuse), relu=self.relu)
        scales = {
            key: cams.colour_scale(value, self.normalize, relu=self.relu, vmax=self.vmax)
            for key, value in maps.items()
        }
        metrics = None
        if self.metrics:
            from hookviz.evaluation import faithfulness
            from hookviz.readout import scorer

            score = scorer(ex.labels, ex.region)
            metrics = {
                key: [
                    faithfulness(self.loaded.model, x, value[:, j], ex.targets[:, j], scorer=score)
                    for j in range(value.shape[1])
                ]
                for key, value in maps.items()
            }
        return CamBatch(ex, {key: value.numpy() for key, value in maps.items()}, scales, metrics)

    # -- render ---------------------------------------------------------------------------
    def _unit(self, cam: np.ndarray, scale: tuple[float, float] | None, method: str = "") -> np.ndarray:
        from hookviz import render

        if scale is None:
            if method.startswith("guided"):
                # Pixel-level saliency is sparse: a few pixels would take the whole colour range, so the
                # top 0.5 % saturate instead (the usual way these maps are shown).
                finite = np.nan_to_num(cam, nan=0.0, posinf=0.0, neginf=0.0)
                return render.normalize(finite, float(finite.min()), float(np.percentile(finite, 99.5)))
            if self.relu:
                return render.normalize(cam)
            top = float(np.abs(np.nan_to_num(cam)).max()) or 1.0
            scale = (-top, top)
        return render.normalize(cam, scale[0], scale[1])

    def render(
        self, result: CamBatch, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        from hookviz import render

        lm, ex = self.loaded, result.explanation
        dense = ex.labels is not None

        def scored(score: float) -> str:  # a probability, or a segmentation's share of the pixels
            return f"{score:.1%} of pixels" if dense else f"p={score:.3f}"

        pred, p_score = int(ex.predicted[index]), float(ex.predicted_score[index])
        _check_finite(ex, index)
        suffixes = self._target_suffixes()
        files: list[tuple[str, bytes]] = []
        records = []
        cells: dict[tuple[str, str, int], np.ndarray] = {}
        for (method, layer), maps in result.maps.items():
            for j, suffix in enumerate(suffixes):
                cam = maps[index, j]
                unit = self._unit(cam, result.scales[(method, layer)], method)
                picture = render.overlay(
                    rgb, unit, box, alpha=self.alpha, colormap=self.colormap, scaled=True
                )
                tgt, t_score = int(ex.targets[index, j]), float(ex.target_scores[index, j])
                region = None
                if dense:  # the pixels the model gives the explained class; none: all pixels count
                    own = (ex.labels[index] == tgt).numpy()
                    render.outline(picture, own, box)
                    region = "class" if ex.region == "class" and own.any() else "all"
                where = "fused " + "+".join(self.layers) if layer == FUSED else layer
                lines = [
                    f"{lm.name} | {method_title(method)} at {where} | {_weights_note(lm)}",
                    f"predicted: {lm.describe(pred)} {scored(p_score)}",
                    f"explained: {lm.describe(tgt)} {scored(t_score)}" + _region_note(region, ex.region),
                ]
                scale = result.scales[(method, layer)]
                if scale is not None or not self.relu:
                    span = f"[{scale[0]:.3g}, {scale[1]:.3g}] ({self.normalize})" if scale else "per map"
                    sign = "signed: blue < 0 < red" if not self.relu else "ReLU"
                    lines.append(f"colour scale {span}, {sign}")
                faith = None
                if result.metrics is not None:
                    f = result.metrics[(method, layer)][j]
                    faith = {
                        "deletion_auc": round(float(f.deletion_auc[index]), 6),
                        "insertion_auc": round(float(f.insertion_auc[index]), 6),
                    }
                    lines.append(
                        f"deletion AUC {faith['deletion_auc']:.3f} (lower is better), "
                        f"insertion AUC {faith['insertion_auc']:.3f} (higher is better)"
                    )
                base = self._name(stem, method, layer, suffix)
                # A photo of a few pixels is enlarged, so that its caption can be read.
                captioned = render.caption(render.enlarge_small(picture), lines)
                files.append((f"{base}.png", encode_png(captioned)))
                if self.save_raw:
                    files.append((f"{base}.npy", _npy(cam.astype(np.float32))))
                    files.append((f"{base}.full.npy", _npy(_full_map(cam, rgb, box))))
                cell = picture[box.y0 : box.y1, box.x0 : box.x1]
                if faith is not None:
                    cell = cell.copy()
                    note = f"del {faith['deletion_auc']:.2f} ins {faith['insertion_auc']:.2f}"
                    render.label(
                        cell, note, 3, max(0, cell.shape[0] - 22), scale=0.45 * max(1, cell.shape[0] / 200)
                    )
                cells[(method, layer, j)] = cell
                records.append(
                    {
                        "file": f"{base}.png",
                        "method": method,
                        "layer": layer,
                        "target": {"index": tgt, "name": lm.class_name(tgt), "score": round(t_score, 6)},
                        # NaN/Inf (a diverged model) are reported, and drawn as "no evidence".
                        "finite": bool(np.isfinite(cam).all()),
                        "min": _finite_stat(np.min, cam),
                        "max": _finite_stat(np.max, cam),
                        "scale": list(scale) if scale else None,
                        **({"metrics": faith} if faith is not None else {}),
                        **({"region": region} if region is not None else {}),
                        **self._sign_fields(ex, method, layer, index),
                    }
                )
        if self._want_sheet():
            rows = []
            for layer in self._layer_names():
                for j in range(len(suffixes)):
                    tgt = int(ex.targets[index, j])
                    label = f"{layer} | {lm.describe(tgt)} {scored(float(ex.target_scores[index, j]))}"
                    rows.append((label, [cells[(m, layer, j)] for m in self.methods]))
            title = f"{lm.name} | predicted {lm.describe(pred)} {scored(p_score)} | " + _weights_note(lm)
            sheet = render.sheet(rows, [method_title(m) for m in self.methods], title=title)
            files.append((f"{stem}.sheet.png", encode_png(sheet)))
        first_t = int(ex.targets[index, 0])
        fields = {
            "layers": list(self.layers),
            "methods": list(self.methods),
            "layer": self.layers[0],
            "method": self.methods[0],
            "predicted": {"index": pred, "name": lm.class_name(pred), "score": round(p_score, 6)},
            "target": {
                "index": first_t,
                "name": lm.class_name(first_t),
                "score": round(float(ex.target_scores[index, 0]), 6),
            },
            "normalize": self.normalize,
            **({"region": ex.region, "score": "share of pixels"} if dense else {}),
            "maps": records,
            **({"layer_auto": self.auto_layer} if self.auto_layer else {}),
            **({"guided": dict(ex.guided)} if ex.guided is not None else {}),
        }
        return files, fields

    @staticmethod
    def _sign_fields(ex: Any, method: str, layer: str, index: int) -> dict[str, Any]:
        """``negative_mass`` of the CAM tensor, and ``assumption_broken`` where the method assumes none."""
        from hookviz.methods import REGISTRY
        from hookviz.taps import MATERIAL_NEGATIVE

        if layer not in ex.negative_mass:
            return {}
        share = float(ex.negative_mass[layer][index])
        fields: dict[str, Any] = {"negative_mass": round(share, 4)}
        spec = REGISTRY.get(method)
        if spec is not None and spec.assumes_nonnegative and share >= MATERIAL_NEGATIVE:
            fields["assumption_broken"] = "non-negative activations"
        return fields


@dataclass
class DetectionJob:
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
    kind: str = "gradcam"

    def __post_init__(self) -> None:
        from hookviz.detection import detection_methods

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
        }

    def planned(self, stem: str) -> list[str]:
        """The outputs known before the model runs (the per-box ones depend on what it finds)."""
        names = [f"{stem}.eigencam.{slug(layer)}.png" for layer in self.layers if "eigencam" in self.methods]
        return [*names, f"{stem}.detections.png"]

    def compute(self, x: Any) -> Any:
        from hookviz.detection import explain_detections

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
        )

    def _box_text(self, label: int, score: float) -> str:
        return f"{self.loaded.class_name(label)} {score:.2f}"

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        from hookviz import render

        lm, ex = self.loaded, result[index]
        if (rgb.shape[0], rgb.shape[1]) != ex.image_size:
            raise UsageError(f"the detector saw {ex.image_size}, the photo is {rgb.shape[:2]}")
        n = len(ex.scores)
        files: list[tuple[str, bytes]] = []
        outputs: list[list[str]] = [[] for _ in range(n)]
        maps: list[dict[str, Any]] = []
        for (method, layer), stack in ex.maps.items():
            for i in range(stack.shape[0]):
                cam = stack[i].numpy()
                picture = render.overlay(
                    rgb, render.normalize(cam), box, alpha=self.alpha, colormap=self.colormap, scaled=True
                )
                if method == "eigencam":
                    for k in range(n):
                        render.draw_box(
                            picture,
                            ex.boxes[k].tolist(),
                            self._box_text(int(ex.labels[k]), float(ex.scores[k])),
                        )
                    name = f"{stem}.eigencam.{slug(layer)}.png"
                    what = f"whole image (class-agnostic), {n} detection(s) >= {self.score_threshold:g}"
                else:
                    for k in range(n):
                        if k != i:
                            render.draw_box(picture, ex.boxes[k].tolist(), "", strong=False)
                    label, score = int(ex.labels[i]), float(ex.scores[i])
                    render.draw_box(picture, ex.boxes[i].tolist(), self._box_text(label, score))
                    name = f"{stem}.{method}.{slug(layer)}.box{i + 1}.png"
                    what = f"box {i + 1} of {n}: {lm.describe(label)} score {score:.3f}"
                    outputs[i].append(name)
                head = f"{lm.name} | {method_title(method)} at {layer} | {_weights_note(lm)}"
                lines = [head, f"explained: {what}"]
                files.append((name, encode_png(render.caption(render.enlarge_small(picture), lines))))
                if self.save_raw:  # at the feature map's resolution, and at the photo's (NaN outside)
                    files.append((name[: -len(".png")] + ".npy", _npy(cam.astype(np.float32))))
                    files.append((name[: -len(".png")] + ".full.npy", _npy(_full_map(cam, rgb, box))))
                maps.append(
                    {
                        "file": name,
                        "method": method,
                        "layer": layer,
                        "box": None if method == "eigencam" else i + 1,
                        "target": None
                        if method == "eigencam"
                        else {
                            "index": int(ex.labels[i]),
                            "name": lm.class_name(int(ex.labels[i])),
                            "score": round(float(ex.scores[i]), 6),
                        },
                        "finite": bool(np.isfinite(cam).all()),
                        "min": _finite_stat(np.min, cam),
                        "max": _finite_stat(np.max, cam),
                    }
                )
        summary = rgb.copy()
        for k in range(n):
            render.draw_box(
                summary, ex.boxes[k].tolist(), self._box_text(int(ex.labels[k]), float(ex.scores[k]))
            )
        kept = f"{n} detection(s) with score >= {self.score_threshold:g}"
        lines = [
            f"{lm.name} | {_weights_note(lm)}",
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
            "maps": maps,
        }
        return files, fields


def _finite_stat(fn: Any, cam: np.ndarray) -> float | None:
    values = cam[np.isfinite(cam)]
    return float(fn(values)) if values.size else None


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


@dataclass
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
            files.append((name, encode_png(grid)))
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


@dataclass
class GradFlowJob:
    """Per image: one backward from the target score (or cross-entropy against a label); plot + JSON."""

    loaded: LoadedModel
    target: int | None = None  # class whose score is differentiated (None: the predicted class)
    label: int | None = None  # if set: cross-entropy against this class instead
    layers: Sequence[str] | None = None
    kind: str = "gradflow"

    def settings(self) -> dict[str, Any]:
        return {
            **model_settings(self.loaded),
            "command": self.kind,
            "target": "top1" if self.target is None else self.target,
            "label": self.label,
            "layers": list(self.layers) if self.layers else None,
        }

    def planned(self, stem: str) -> list[str]:
        return [f"{stem}.gradflow.png", f"{stem}.gradflow.json"]

    def compute(self, x: Any) -> Any:
        import torch
        import torch.nn.functional as F

        from hookviz.attribution import ranking
        from hookviz.gradients import gradient_flow
        from hookviz.hooks import logits_of

        seen: list[Any] = []

        def loss(output: Any) -> Any:
            z = logits_of(output)
            seen.append(z.detach().float().cpu())
            if self.label is not None:
                return F.cross_entropy(z, torch.tensor([self.label], device=z.device))
            return z[0, int(ranking(z)[0, 0]) if self.target is None else self.target]

        # One image at a time: parameter gradients of a batch would mix the images.
        flows = [gradient_flow(self.loaded.model, x[i : i + 1], loss, self.layers) for i in range(x.shape[0])]
        return flows, torch.cat(seen)

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        import json
        import math

        from hookviz import render

        flows, logits = result
        flow = flows[index]
        per_layer: dict[str, float] = {}
        for s in flow.params:
            owner = s.name.rsplit(".", 1)[0]
            per_layer[owner] = math.hypot(per_layer.get(owner, 0.0), s.norm)
        names = [s.name for s in flow.outputs]
        objective = (
            f"cross-entropy vs class {self.label}"
            if self.label is not None
            else ("predicted-class score" if self.target is None else f"score of class {self.target}")
        )
        title = (
            f"{self.loaded.name}: gradient norms per layer, loss = {objective} ({flow.loss:.4g}) | "
            f"{_weights_note(self.loaded)}"
        )
        picture = render.grad_flow_plot(
            names,
            [s.norm for s in flow.outputs],
            [per_layer.get(n, float("nan")) for n in names],
            title=title,
        )
        data = {"model": self.loaded.name, "objective": objective, **flow.to_dict()}
        files = [
            (f"{stem}.gradflow.png", encode_png(picture)),
            (f"{stem}.gradflow.json", json.dumps(data, indent=1).encode()),
        ]
        fields = {"loss": flow.loss, "objective": objective, "layers": len(names)}
        return files, {"predicted": predicted(self.loaded, logits, index), **fields}


@dataclass
class DropBlockJob:
    """Per image: the layer's feature maps before DropBlock, the keep mask, and after (one PNG)."""

    loaded: LoadedModel
    layer: str
    drop_prob: float = 0.1
    block_size: int = 7
    shared: bool = False
    seed: int = 0
    max_channels: int = 16
    kind: str = "dropblock"

    def settings(self) -> dict[str, Any]:
        return {
            **model_settings(self.loaded),
            "command": self.kind,
            "layer": self.layer,
            "drop_prob": self.drop_prob,
            "block_size": self.block_size,
            "shared": self.shared,
            "seed": self.seed,
            "max_channels": self.max_channels,
        }

    def planned(self, stem: str) -> list[str]:
        return [f"{stem}.dropblock.{self.layer}.png"]

    def compute(self, x: Any) -> Any:
        import torch

        from hookviz.features import capture_features
        from hookviz.regularize import drop_block

        features = capture_features(self.loaded.model, x, [self.layer])
        (fm,) = [m for m in features.maps if m.call == 1]
        gen = torch.Generator().manual_seed(self.seed)
        after, keep = drop_block(
            fm.tensor, self.drop_prob, self.block_size, shared=self.shared, generator=gen
        )
        return fm.tensor, after, keep, features.output

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        from hookviz import render
        from hookviz.features import rank_channels

        before, after, keep = (t[index] for t in result[:3])
        channels = rank_channels(before, self.max_channels)
        c, h, w = before.shape
        block = max(1, min(self.block_size, h, w))
        dropped = float(1.0 - keep.float().mean())
        shape = f"({c}, {h}, {w})"
        note = _weights_note(self.loaded)
        panels = [
            render.feature_grid(
                before.numpy(), channels, title=f"{self.layer} output {shape} before DropBlock | {note}"
            ),
            render.feature_grid(
                keep.numpy(),
                channels,
                title=f"keep mask: drop_prob {self.drop_prob}, block {block}, "
                f"dropped {dropped:.1%} of {'all channels (shared mask)' if self.shared else 'activations'}",
                colormap="gray",
                value_range=(0.0, 1.0),
            ),
            render.feature_grid(
                after.numpy(), channels, title="after DropBlock (kept values rescaled by 1/P(keep))"
            ),
        ]
        width = max(p.shape[1] for p in panels)
        padded = [np.pad(p, ((0, 8), (0, width - p.shape[1]), (0, 0)), constant_values=255) for p in panels]
        files = [(f"{stem}.dropblock.{self.layer}.png", encode_png(np.concatenate(padded, axis=0)))]
        fields = {"layer": self.layer, "dropped_fraction": round(dropped, 6), "channels": channels}
        return files, {"predicted": predicted(self.loaded, result[3], index), **fields}


@dataclass
class EvaluateJob:
    """Faithfulness of every method x layer per image (deletion/insertion AUC, average drop, increase in
    confidence), with the ``random`` and ``center`` chance baselines; no pictures, only records."""

    loaded: LoadedModel
    layers: Sequence[str]
    methods: Sequence[str] = ("gradcam",)
    targets: str | list[int] | None = None
    steps: int = 16
    chunk: int = 64
    kind: str = "evaluate"

    def __post_init__(self) -> None:
        self.methods = parse_methods(self.methods)

    def settings(self) -> dict[str, Any]:
        return {
            **model_settings(self.loaded),
            "command": self.kind,
            "layers": list(self.layers),
            "methods": list(self.methods),
            "targets": "top1" if self.targets is None else self.targets,
            "steps": self.steps,
            "baseline": "zeros (the data set's mean colour after normalisation)",
        }

    def planned(self, stem: str) -> list[str]:
        return []

    def compute(self, x: Any) -> Any:
        from hookviz import evaluation
        from hookviz.attribution import explain
        from hookviz.readout import scorer

        ex = explain(self.loaded.model, x, self.layers, self.methods, self.targets)
        t = ex.targets[:, 0]
        score = scorer(ex.labels, ex.region)  # a segmentation's class probability over its region
        rows: dict[str, Any] = {}
        passes = 0
        for (method, layer), maps in ex.maps.items():
            f = evaluation.faithfulness(
                self.loaded.model, x, maps[:, 0], t, steps=self.steps, chunk=self.chunk, scorer=score
            )
            rows[f"{method}@{layer}"] = f
            passes += f.forward_passes
        b, h, w = x.shape[0], *ex.maps[(self.methods[0], self.layers[0])].shape[2:]
        for name, maps in (
            ("random", evaluation.random_maps(b, h, w, x=x)),
            ("center", evaluation.center_maps(b, h, w)),
        ):
            f = evaluation.faithfulness(
                self.loaded.model, x, maps, t, steps=self.steps, chunk=self.chunk, scorer=score
            )
            rows[name] = f
            passes += f.forward_passes
        return ex, rows, passes

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        ex, rows, passes = result
        _check_finite(ex, index)
        lm = self.loaded
        pred, tgt = int(ex.predicted[index]), int(ex.targets[index, 0])
        metrics = {
            name: {
                "deletion_auc": round(float(f.deletion_auc[index]), 6),
                "insertion_auc": round(float(f.insertion_auc[index]), 6),
                "average_drop": round(float(f.average_drop[index]), 4),
                "increase": bool(f.increase[index] > 0),
            }
            for name, f in rows.items()
        }
        fields = {
            "predicted": {
                "index": pred,
                "name": lm.class_name(pred),
                "score": round(float(ex.predicted_score[index]), 6),
            },
            "target": {
                "index": tgt,
                "name": lm.class_name(tgt),
                "score": round(float(ex.target_scores[index, 0]), 6),
            },
            "metrics": metrics,
            "forward_passes": passes // max(1, int(ex.targets.shape[0])),
        }
        return [], fields


def summarise_evaluation(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method@layer (and per chance baseline): mean and 95 % CI of each metric over the images."""
    from hookviz.evaluation import mean_ci, wilson

    names: list[str] = []
    for rec in records:
        names += [n for n in rec.get("metrics", {}) if n not in names]
    rows = []
    for name in names:
        values = [rec["metrics"][name] for rec in records if name in rec.get("metrics", {})]
        method, _, layer = name.partition("@")
        row: dict[str, Any] = {"method": method, "layer": layer or "-", "images": len(values)}
        for metric in ("deletion_auc", "insertion_auc", "average_drop"):
            mean, half = mean_ci([float(v[metric]) for v in values])
            row[metric], row[f"{metric}_ci95"] = round(mean, 4), round(half, 4)
        # A proportion: the Wilson interval stays inside 0..100 % for small n (a t interval does not).
        hits = sum(bool(v["increase"]) for v in values)
        low, high = wilson(hits, len(values))
        row["increase_in_confidence"] = round(100.0 * hits / max(1, len(values)), 2)
        row["increase_in_confidence_ci95"] = [round(100.0 * low, 2), round(100.0 * high, 2)]
        rows.append(row)
    return rows


@dataclass
class SanityJob:
    """The model-parameter randomisation test per image: each method's map after each cumulative
    randomisation step (head first, on a copy), its Spearman correlation and SSIM with the original map,
    and a strip of the maps; an ``edges`` map (the image's own gradient, independent of the model) is the
    control that must stay the same."""

    loaded: LoadedModel
    layer: str
    methods: Sequence[str] = ("gradcam",)
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
            ex = explain(model, x, [self.layer], self.methods, target)
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
        crop = rgb[box.y0 : box.y1, box.x0 : box.x1]
        rows = []
        records = []
        for method in [*self.methods, "edges"]:
            cells = []
            for name, maps in steps:
                cam = maps[method][index].float().numpy()
                cells.append(render.overlay(crop, cam, Box(0, 0, crop.shape[1], crop.shape[0]), alpha=0.6))
                records.append(
                    {
                        "randomized_up_to": name,
                        "method": method,
                        "spearman": round(spearman(maps[method][index], original[method][index]), 4),
                        "ssim": round(ssim(maps[method][index], original[method][index]), 4),
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
    """The image's gradient magnitude at its own resolution: a 'map' that knows nothing of the model."""
    import torch
    import torch.nn.functional as F

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
