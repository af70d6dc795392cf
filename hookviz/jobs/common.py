"""What every job shares: :class:`Job`, the protocol the pipeline runs (its ``settings`` key its outputs);
:class:`BaseJob`, the members most jobs leave as they are (notes for the user, no memory estimate); and the
helpers for predictions, raw maps and captions."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hookviz import render
from hookviz.core.conventions import score_kind
from hookviz.core.memory import Estimate
from hookviz.core.readout import scorer
from hookviz.engine.explain import ranking
from hookviz.errors import InputError
from hookviz.io.images import Box
from hookviz.jobs.settings import CamSettings
from hookviz.methods import MethodOptions
from hookviz.models.loaded import LoadedModel
from hookviz.models.settings import model_settings


@dataclass(kw_only=True)
class BaseJob:
    """What every job shares beyond its own work: notes for the user it finds while it runs (each said once;
    the runner takes them after a record), and, unless it says otherwise, no memory estimate (its batches
    are not split) and no use for where each photo's annotated objects are."""

    notes: list[str] = field(default_factory=list)
    _noted: set[str] = field(default_factory=set, repr=False)

    def take_notes(self) -> list[str]:
        """The notes found since the last call."""
        taken, self.notes = self.notes, []
        return taken

    def _note_once(self, key: str, text: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.notes.append(text)

    def memory(self, shape: tuple[int, ...]) -> Estimate | None:
        """What a batch of ``shape`` holds (None: not estimated, the batch runs whole)."""
        return None

    def annotate(self, batch: Sequence[tuple[Any, np.ndarray, Box]], size: tuple[int, int]) -> None:
        """Told, before ``compute``, which inputs (item, photo, box) a batch of input ``size`` holds."""
        return None

    def joined(self, parts: list[Any]) -> None:
        """Told the results of one batch computed in parts (split under ``--max-memory``) before any is
        rendered: what depends on the whole batch (``--normalize batch``'s scale) is made the whole's."""
        return None


class CamParams:
    """What a job holding ``gradcam``'s settings whole (``params``: a classifier's, a detector's) reads from
    them: its layers, its methods, their settings, and how a map is laid over a photo."""

    params: CamSettings

    @property
    def layers(self) -> tuple[str, ...]:
        """The layers explained (module names, or taps such as ``avgpool:input``)."""
        return self.params.layers

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods, parsed (``all`` and families expanded)."""
        return self.params.methods

    @property
    def options(self) -> MethodOptions:
        """The settings of the methods that take any (``--seed``, ``--samples``, ``--steps``, D-RISE's
        ``--masks``, ...)."""
        return self.params.options

    def _overlay(self, rgb: np.ndarray, unit: np.ndarray, box: Box) -> np.ndarray:
        """``unit`` (a map scaled to [0, 1]) over the photo ``rgb`` in ``box``, as ``--alpha`` and
        ``--colormap`` say."""
        return render.overlay(
            rgb, unit, box, alpha=self.params.alpha, colormap=self.params.colormap, scaled=True
        )


class Keyed(Protocol):
    """A job as its settings key sees it: the model it runs and its command."""

    loaded: LoadedModel
    kind: str


def job_settings(job: Keyed, **own: Any) -> dict[str, Any]:
    """A job's settings (what its outputs' key hashes): the model's (:func:`model_settings`), the command,
    then the job's ``own``, in their order."""
    return {**model_settings(job.loaded), "command": job.kind, **own}


def weights_note(loaded: LoadedModel) -> str:
    return "RANDOM WEIGHTS (--weights none)" if not loaded.pretrained else f"weights {loaded.weights}"


def predicted(loaded: LoadedModel, logits: Any, index: int) -> dict[str, Any] | None:
    """The top class of row ``index`` of a classifier's output (None when the output is not ``(B, C)``)."""
    import torch

    if logits is None or logits.dim() != 2:
        return None
    row = logits[index : index + 1].float()
    top = int(ranking(row)[0, 0])
    kind = score_kind(loaded.model)
    score = float(scorer(kind=kind)(row, torch.zeros(1, dtype=torch.long))[0, top])  # as the records read it
    return scored_class(loaded, top, score)


def scored_class(loaded: LoadedModel, index: int, score: float) -> dict[str, Any]:
    """A class as a record names it: its index, its name and its score (to 6 decimals)."""
    return {"index": index, "name": loaded.class_name(index), "score": round(float(score), 6)}


FUSED = "fused"


def full_map(cam: np.ndarray, rgb: np.ndarray, box: Box) -> np.ndarray:
    """``cam`` upsampled onto the photo's pixels where the model saw them, NaN elsewhere (float32)."""

    full = np.full(rgb.shape[:2], np.nan, dtype=np.float32)
    full[box.y0 : box.y1, box.x0 : box.x1] = render.upsample(cam, box)
    return full


def check_finite(ex: Any, index: int) -> None:
    """Refuse an image whose scores are not finite: its "prediction" would be an arbitrary class.

    Raises:
        InputError: NaN or infinite probabilities (a diverged model, an fp16 overflow).
    """

    probs = ex.probs[index]
    if not bool(probs.isfinite().all()):
        raise InputError(
            "the model's output is not finite (NaN or inf) for this input, so it predicts nothing; check "
            "the weights (a diverged checkpoint) or run in float32"
        )


def finite_stat(fn: Any, cam: np.ndarray) -> float | None:
    values = cam[np.isfinite(cam)]
    return float(fn(values)) if values.size else None


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


class Job(Protocol):
    """A computation over batches, as the pipeline runs it (one module per job in this package;
    :class:`BaseJob` gives the members most jobs leave as they are)."""

    kind: str
    loaded: LoadedModel

    def take_notes(self) -> list[str]:
        """Notes for the user found since the last call (each said once)."""
        ...

    def memory(self, shape: tuple[int, ...]) -> Estimate | None:
        """What a batch of ``shape`` holds, to split it under ``--max-memory`` (None: not estimated)."""
        ...

    def annotate(self, batch: Sequence[tuple[Any, np.ndarray, Box]], size: tuple[int, int]) -> None:
        """Which inputs (item, photo, box) the next batch of input ``size`` holds (``evaluate``'s objects)."""
        ...

    def joined(self, parts: list[Any]) -> None:
        """The results of one batch computed in parts, before any is rendered (made the whole batch's)."""
        ...

    def settings(self) -> dict[str, Any]:
        """Everything that changes the outputs' pixels (model, weights, method, layer, target, look)."""
        ...

    def planned(self, stem: str) -> list[str]:
        """File names this job will write for an input (to check --overwrite/--skip-existing)."""
        ...

    def compute(self, x: Any) -> Any:
        """Run the model on a batch."""
        ...

    def render(
        self, result: Any, index: int, rgb: np.ndarray, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        """Files ``(name, bytes)`` and manifest fields for image ``index`` of the batch."""
        ...


def region_note(region: str | None, asked: str | None) -> str:
    """The caption's account of which pixels a segmentation score sums."""
    if region is None:
        return ""
    if region == "class":
        return ", its score summed over its pixels (outlined)"
    if asked == "class":
        return ", its score summed over all pixels (the model gives it none)"
    return ", its score summed over all pixels (its own outlined)"
