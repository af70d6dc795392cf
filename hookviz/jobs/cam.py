"""``gradcam`` on classifiers and segmentation models: every method x layer (x fused) x target, a sheet,
raw maps."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from hookviz import render
from hookviz.concepts.examples import channel_terms
from hookviz.core.arrays import to_numpy
from hookviz.core.conventions import sign
from hookviz.core.memory import Estimate
from hookviz.core.readout import scorer
from hookviz.core.sites import Site
from hookviz.core.taps import MATERIAL_NEGATIVE, slug
from hookviz.core.targets import Labelled, Positive, Target, Top, said
from hookviz.engine.explain import explain
from hookviz.engine.forward import Targets
from hookviz.errors import UsageError
from hookviz.evaluation import faithfulness
from hookviz.io.images import Box, encode_png
from hookviz.jobs.cam_records import CamRecords
from hookviz.jobs.common import (
    FUSED,
    BaseJob,
    CamParams,
    check_finite,
    full_map,
    job_settings,
    npy_bytes,
    region_note,
    weights_note,
)
from hookviz.jobs.settings import CamSettings
from hookviz.methods import REGISTRY, cams, get
from hookviz.methods import parse as parse_methods
from hookviz.methods import title as method_title
from hookviz.methods.footprint import explain_estimate
from hookviz.models.loaded import LoadedModel, num_classes
from hookviz.options import Normalize


def method_family(name: str) -> str:

    spec = REGISTRY.get(name)
    return spec.family if spec is not None else ""


@dataclass
class CamBatch:
    """What ``CamJob.compute`` hands to ``render``: maps per (method, layer), and the colour scales."""

    explanation: Any
    maps: dict[tuple[str, str], np.ndarray]  # (method, layer or "fused") -> (B, T, h, w)
    scales: dict[tuple[str, str], tuple[float, float] | None]  # None: per map
    #: With ``metrics``: (method, layer) -> per target j, the Faithfulness of the batch's maps.
    metrics: dict[tuple[str, str], list[Any]] | None = None
    #: The CAM tensors' channels by layer, and the input's ``(H, W)``: what the methods' passes cost.
    channels: dict[str, int] = field(default_factory=dict)
    size: tuple[int, ...] = (0, 0)
    #: ``--channels topK``: by layer, the first target's map through its top channels.
    terms: dict[str, Any] = field(default_factory=dict)
    #: Per input, why it cannot be explained (``--target label``: no label), else None.
    refused: list[str | None] = field(default_factory=list)


@dataclass(kw_only=True)
class CamJob(CamRecords, CamParams, BaseJob):
    """CAM overlays for each image: every method x layer (x fused) x target, a comparison sheet, raw maps.

    ``params`` are ``gradcam``'s settings, held whole, with the builder's decisions in them (the layers
    chosen, the methods parsed, the method settings completed: :func:`cam_job`); ``targets`` the parsed
    ``--target`` (:data:`hookviz.core.targets.Target`), shared by every image.
    """

    loaded: LoadedModel
    params: CamSettings = field(default_factory=CamSettings)
    targets: Target = field(default_factory=Top)
    kind: str = "gradcam"
    #: Called as ``progress(done, total)`` during the methods' extra passes (a progress bar).
    progress: Any = None
    #: How ``--layer auto`` chose the layer (recorded with every input).
    auto_layer: dict[str, Any] | None = None
    #: A segmenter's job: a class's score sums its pixels (``params.region``), and the settings say which.
    dense: bool = False
    #: ``params.layers`` as the builder resolved them (:mod:`hookviz.core.sites`), taken by the hooks as is.
    sites: list[Site] = field(default_factory=list)

    def _check_assumptions(self, ex: Any) -> None:

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
        methods = tuple(parse_methods(self.params.methods or ("gradcam",)))
        self.params = dataclasses.replace(self.params, methods=methods)
        if self.params.fuse is not None and len(self.layers) < 2:
            raise UsageError("--fuse combines the maps of several layers: give two or more --layer")
        if self.params.normalize == Normalize.none and self.params.vmax is None:
            raise UsageError(
                "--normalize none needs --vmax (the map value drawn as full colour), so that a photo's "
                "picture never depends on its batch; the manifest's max of an earlier run is a good start"
            )
        if self.params.vmax is not None:
            if self.params.normalize != Normalize.none:
                raise UsageError(f"--vmax goes with --normalize none (not {self.params.normalize})")
            if not (self.params.vmax > 0 and math.isfinite(self.params.vmax)):
                raise UsageError(f"--vmax {self.params.vmax}: must be a finite number greater than 0")

    def settings(self) -> dict[str, Any]:
        """Everything that changes the pictures (with :func:`model_settings`): the output key's input."""
        return job_settings(
            self,
            layers=list(self.layers),
            methods=list(self.methods),
            targets=said(self.targets),
            alpha=self.params.alpha,
            colormap=self.params.colormap,
            relu=self.params.relu,
            normalize=self.params.normalize,
            vmax=self.params.vmax,
            fuse=self.params.fuse,
            sheet=self._want_sheet(),
            metrics=self.params.metrics,
            eigen_smooth=self.params.eigen_smooth,
            aug_smooth=self.params.aug_smooth,
            **({"region": self.params.region} if self.dense else {}),
            **({"channel_terms": self.params.channel_terms} if self.params.channel_terms else {}),
            **({"options": used} if (used := self.options.record(self.methods)) else {}),
        )

    # -- naming ---------------------------------------------------------------------------
    def _layer_names(self) -> list[str]:
        return [*self.layers, FUSED] if self.params.fuse and len(self.layers) > 1 else list(self.layers)

    def _target_suffixes(self) -> list[str]:
        """The names' suffixes of the targets, the same for every image (none for ``positive``: each image
        has its own, :meth:`_shown`)."""
        if isinstance(self.targets, Positive):
            return []
        if isinstance(self.targets, Labelled):  # one target per input
            return [""]
        if isinstance(self.targets, Top):
            k = self.targets.k
            return [""] if k == 1 else [f".top{r}" for r in range(1, k + 1)]
        ids = self.targets.ids
        return [""] if len(ids) == 1 else [f".c{c}" for c in ids]

    def _shown(self, ex: Any, index: int) -> list[tuple[int, str]]:
        """Image ``index``'s maps: ``(j, suffix)`` per target column, each class once (``positive`` pads a
        row by repeating its last label)."""
        if not isinstance(self.targets, Positive):
            return list(enumerate(self._target_suffixes()))
        seen = dict.fromkeys(int(t) for t in ex.targets[index])
        return [(list(int(t) for t in ex.targets[index]).index(c), f".c{c}") for c in seen]

    def _want_sheet(self) -> bool:
        if isinstance(self.targets, Positive):  # written last: the photo is complete when it exists
            return True
        if self.params.sheet is not None:
            return self.params.sheet
        return len(self.methods) * len(self._layer_names()) * len(self._target_suffixes()) > 1

    def _name(self, stem: str, method: str, layer: str, suffix: str) -> str:
        return f"{stem}.{method}.{slug(layer)}{suffix}"

    #: What each map is written as (a video's: an overlay video; a volume's: four pictures).
    pictures: ClassVar[tuple[str, ...]] = (".png",)

    def _sheet_name(self, stem: str) -> str | None:
        return f"{stem}.sheet.png" if self._want_sheet() else None

    def planned(self, stem: str) -> list[str]:
        names = self._planned_maps(stem)
        names += [f"{stem}.gradcam-channels.{slug(n)}.png" for n in self.layers if self.params.channel_terms]
        sheet = self._sheet_name(stem)
        return [*names, sheet] if sheet else names

    def _planned_maps(self, stem: str) -> list[str]:
        """Every map's files: its ``pictures``, and with ``--save-raw`` its arrays."""
        names = []
        for m in self.methods:
            for layer in self._layer_names():
                for suffix in self._target_suffixes():
                    base = self._name(stem, m, layer, suffix)
                    names += [f"{base}{kind}" for kind in self.pictures]
                    if self.params.save_raw:
                        names += [f"{base}.npy", f"{base}.full.npy"]
        return names

    # -- compute --------------------------------------------------------------------------
    def memory(self, shape: tuple[int, ...]) -> Estimate:
        """What a batch of inputs of ``shape`` holds (:class:`hookviz.core.memory.Estimate`); the pipeline
        splits a batch that would pass ``--max-memory``."""
        k = len(self._target_suffixes()) or min(num_classes(self.loaded), 16)
        est = explain_estimate(self.loaded.model, tuple(shape[1:]), self.loaded.device, self.layers,
                               self.methods, k, self.options)  # fmt: skip
        return est if not self.params.aug_smooth else dataclasses.replace(est, per_image=est.per_image * 2)

    def joined(self, parts: list[Any]) -> None:
        """``--normalize batch``: one colour scale over every part of a batch split under ``--max-memory``,
        the scale the batch computed whole has (each part's own made its pictures differ)."""
        import torch

        batches = [p for p in parts if isinstance(p, CamBatch)]
        if self.params.normalize != Normalize.batch or len(batches) < 2:
            return
        for key in batches[0].scales:
            whole = torch.from_numpy(np.concatenate([b.maps[key] for b in batches]))
            scale = cams.colour_scale(whole, self.params.normalize, relu=self.params.relu)
            for b in batches:
                b.scales[key] = scale

    def _explained(self) -> Targets:
        if isinstance(self.targets, Labelled):  # each input's own class: LabelledCamJob's
            raise TypeError("--target label's classes are each input's: build a LabelledCamJob")
        return self.targets

    def compute(self, x: Any) -> CamBatch:
        s = self.params
        same = [site.name for site in self.sites] == list(self.layers)  # else a job changed since: its names
        layers = self.sites if same else self.layers
        ex = explain(self.loaded.model, x, layers, self.methods, self._explained(), relu=s.relu,
                     options=self.options, progress=self.progress, eigen_smooth=s.eigen_smooth,
                     aug_smooth=s.aug_smooth, region=s.region)  # fmt: skip
        self._check_assumptions(ex)
        maps = dict(ex.maps)
        if FUSED in self._layer_names():
            size = (int(x.shape[2]), int(x.shape[3]))
            for m in self.methods:
                layer_maps = [ex.maps[(m, layer)] for layer in self.layers]
                maps[(m, FUSED)] = cams.fuse(layer_maps, size, str(self.params.fuse), relu=self.params.relu)
        scales = {
            key: cams.colour_scale(value, self.params.normalize, relu=self.params.relu, vmax=self.params.vmax)
            for key, value in maps.items()
        }
        metrics = None
        if self.params.metrics:
            score = scorer(ex.labels, ex.region, ex.score_kind)
            metrics = {
                key: [
                    faithfulness(self.loaded.model, x, value[:, j], ex.targets[:, j], scorer=score)
                    for j in range(value.shape[1])
                ]
                for key, value in maps.items()
            }
        k, first = self.params.channel_terms, ex.targets[:, 0]
        terms = {n: channel_terms(self.loaded.model, x, n, first, k) for n in self.layers} if k else {}
        return CamBatch(
            ex, {key: to_numpy(value) for key, value in maps.items()}, scales, metrics, dict(ex.channels),
            tuple(int(v) for v in x.shape[2:]), terms,
        )  # fmt: skip

    # -- render ---------------------------------------------------------------------------
    def _unit(self, cam: np.ndarray, scale: tuple[float, float] | None, method: str = "") -> np.ndarray:

        if scale is None:
            if method_family(method) == "input-gradient":
                # Pixel-level saliency is sparse: a few pixels would take the whole colour range, so the
                # top 0.5 % saturate instead (the usual way these maps are shown).
                finite = np.nan_to_num(cam, nan=0.0, posinf=0.0, neginf=0.0)
                return render.normalize(finite, float(finite.min()), float(np.percentile(finite, 99.5)))
            if self.params.relu:
                return render.normalize(cam)
            top = float(np.abs(np.nan_to_num(cam)).max()) or 1.0
            scale = (-top, top)
        return render.normalize(cam, scale[0], scale[1])

    def render(
        self, result: CamBatch, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        ex = result.explanation
        check_finite(ex, index)
        files: list[tuple[str, bytes]] = []
        records = []
        cells: dict[tuple[str, str, int], np.ndarray] = {}
        for (method, layer), maps in result.maps.items():
            for j, suffix in self._shown(ex, index):
                base = self._name(stem, method, layer, suffix)
                drawn, where, said = self._canvas(rgb, box, method, layer)
                mine, cells[(method, layer, j)], record = self._one_map(
                    result, index, drawn, where, base, method, layer, j, maps[index, j]
                )
                files += mine
                records.append({**record, **said})
        if self._want_sheet():
            files.append((f"{stem}.sheet.png", encode_png(self._sheet(ex, index, cells))))
        more: dict[str, Any] = {}
        for layer, terms in result.terms.items():
            row, more.setdefault("channel_terms", {})[layer] = self._terms(ex, index, rgb, box, layer, terms)
            files.append((f"{stem}.gradcam-channels.{slug(layer)}.png", encode_png(row)))
        return files, self._fields(ex, index, records, **more)

    def _terms(
        self, ex: Any, index: int, rgb: np.ndarray, box: Box, layer: str, terms: Any
    ) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """The first target's map through each top channel, in a row, and what each channel adds."""
        pairs = zip(terms.channels[index].tolist(), terms.shares[index].tolist(), strict=True)
        shown = [{"channel": int(c), "share": round(float(share), 6)} for c, share in pairs]
        name = self.loaded.class_name(int(ex.targets[index, 0]))
        title = f"{self.loaded.name} {layer}: Grad-CAM of {name} through its top channels (share of the sum)"
        labels = [f"channel {d['channel']}: {d['share']:.0%}" for d in shown]
        maps = to_numpy(terms.maps[index])
        return render.overlay_row(
            rgb, box, maps, labels, title, self.params.alpha, self.params.colormap
        ), shown

    def _predicted(self, ex: Any, index: int, pred: int, score: float) -> str:
        """The caption's prediction; for a segmentation whose every pixel is one class (the background),
        that class, not the "likeliest other" class that has no pixel."""
        if ex.labels is not None and not bool((ex.labels[index] == pred).any()):
            only = int(ex.labels[index].flatten()[0])
            return (
                f"nothing but {self.loaded.describe(only)} (every pixel; {self.loaded.describe(pred)}, the "
                "likeliest other class, has none)"
            )
        return f"{self.loaded.describe(pred)} {self._scored(ex, score)}"

    def _scored(self, ex: Any, score: float) -> str:
        """A score as a caption says it: a probability, a segmentation's share of the pixels, a cosine."""
        if ex.score_kind == "identity":
            return f"cos={score:.3f}"
        if ex.score_kind == "raw":  # a regression's value (negated when --negate: the explained quantity)
            return f"value={score * sign(self.loaded.model):.4g}"
        return f"{score:.1%} of pixels" if ex.labels is not None else f"p={score:.3f}"

    def _canvas(self, rgb: Any, box: Box, method: str, layer: str) -> tuple[np.ndarray, Box, dict[str, Any]]:
        """What a map of ``method`` at ``layer`` is drawn over: the photo and where the model saw it, and what
        the map's record adds about it (nothing: a sample of several inputs names the one drawn on)."""
        return rgb, box, {}

    def _one_map(
        self,
        result: CamBatch,
        index: int,
        rgb: np.ndarray,
        box: Box,
        base: str,
        method: str,
        layer: str,
        j: int,
        cam: np.ndarray,
    ) -> tuple[list[tuple[str, bytes]], np.ndarray, dict[str, Any]]:
        """One map of image ``index``: its captioned overlay (and raw arrays), its cell of the sheet, its
        record."""
        lm, ex = self.loaded, result.explanation
        scale = result.scales[(method, layer)]
        picture = self._overlay(rgb, self._unit(cam, scale, method), box)
        tgt, t_score = int(ex.targets[index, j]), float(ex.target_scores[index, j])
        pred, p_score = int(ex.predicted[index]), float(ex.predicted_score[index])
        region = None
        if ex.labels is not None:  # the pixels the model gives the explained class; none: all pixels count
            own = to_numpy(ex.labels[index] == tgt)
            render.outline(picture, own, box)
            region = "class" if ex.region == "class" and own.any() else "all"
        where = "fused " + "+".join(self.layers) if layer == FUSED else layer
        lines = [
            f"{lm.name} | {method_title(method)} at {where} | {weights_note(lm)}",
            f"predicted: {self._predicted(ex, index, pred, p_score)}",
            f"explained: {lm.describe(tgt)} {self._scored(ex, t_score)}" + region_note(region, ex.region),
        ]
        if scale is not None or not self.params.relu:
            span = f"[{scale[0]:.3g}, {scale[1]:.3g}] ({self.params.normalize})" if scale else "per map"
            signed = "signed: blue < 0 < red" if not self.params.relu else "ReLU"
            lines.append(f"colour scale {span}, {signed}")
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
        # A photo of a few pixels is enlarged, so that its caption can be read.
        files = [(f"{base}.png", encode_png(render.caption(render.enlarge_small(picture), lines)))]
        if self.params.save_raw:
            files.append((f"{base}.npy", npy_bytes(cam.astype(np.float32))))
            files.append((f"{base}.full.npy", npy_bytes(full_map(cam, rgb, box))))
        cell = picture[box.y0 : box.y1, box.x0 : box.x1]
        if faith is not None:
            cell = cell.copy()
            note = f"del {faith['deletion_auc']:.2f} ins {faith['insertion_auc']:.2f}"
            render.label(cell, note, 3, max(0, cell.shape[0] - 22), scale=0.45 * max(1, cell.shape[0] / 200))
        record = {
            **self._map_record(f"{base}.png", method, layer, tgt, t_score, cam),
            "scale": list(scale) if scale else None,
            **({"metrics": faith} if faith is not None else {}),
            **({"region": region} if region is not None else {}),
            **self._sign_fields(ex, method, layer, index),
            **self._cost_fields(method, layer, len(self._shown(ex, index)), result),
        }
        return files, cell, record

    def _sheet(self, ex: Any, index: int, cells: dict[tuple[str, str, int], np.ndarray]) -> np.ndarray:
        """Every map of image ``index`` side by side: a row per layer and class, a column per method."""
        lm = self.loaded
        rows = []
        for layer in self._layer_names():
            for j, _ in self._shown(ex, index):
                tgt = int(ex.targets[index, j])
                label = f"{layer} | {lm.describe(tgt)} {self._scored(ex, float(ex.target_scores[index, j]))}"
                rows.append((label, [cells[(m, layer, j)] for m in self.methods]))
        pred, p_score = int(ex.predicted[index]), float(ex.predicted_score[index])
        title = f"{lm.name} | predicted {lm.describe(pred)} {self._scored(ex, p_score)} | " + weights_note(lm)
        return render.sheet(rows, [method_title(m) for m in self.methods], title=title)
