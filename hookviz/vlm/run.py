"""``hookviz vlm`` on the rails every job runs on: :class:`VlmJob` is a job of the pipeline like ``gradcam``'s
(photos read and processed while the model works, answers generated together where the family allows, maps
drawn and written while the next batch computes), and :func:`vlm_run` is its :class:`hookviz.run.Run` (the
manifest, ``--skip-existing``/``--overwrite``, the Parquet table and the Zarr store, torchrun's shards and
merge, the report), for the command line and Python alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hookviz.errors import InputError, UsageError
from hookviz.io.images import Box
from hookviz.io.outputs import MANIFEST, MapStore, Output, read_results
from hookviz.jobs.build import RunContext
from hookviz.jobs.common import BaseJob
from hookviz.methods.registry import token_method
from hookviz.models.loaded import LoadedModel
from hookviz.run.runner import Inputs, Run
from hookviz.vlm.faithful import word_faithfulness
from hookviz.vlm.inputs import Photo, PromptInputs, prompted
from hookviz.vlm.model import check_encodes, empty_answer, generate, given_ids
from hookviz.vlm.pictures import chosen_tokens, render_words
from hookviz.vlm.words import (
    DEFAULT_METHODS,
    Vlm,
    WordMaps,
    chosen_layer,
    decoder_index,
    explain_words,
    load_vlm,
)


@dataclass(frozen=True)
class VlmSettings:
    """What ``hookviz vlm`` asks: the prompt, the answer (None: generate), the methods, the words to map
    (empty: all), the decoder layer (its index, or its module name or a glob naming one), and the look."""

    prompt: str
    answer: str | None = None
    max_new_tokens: int = 16
    methods: tuple[str, ...] = DEFAULT_METHODS
    words: tuple[str, ...] = ()
    layer: int | str | None = None
    alpha: float = 0.5
    colormap: str = "jet"
    save_raw: bool = False
    #: Each map's deletion and insertion AUC on its word's log-probability, against a random map's.
    metrics: bool = False

    def __post_init__(self) -> None:
        if not self.methods:
            raise UsageError("--method '': name a token method")
        for m in self.methods:
            token_method(m)
        if self.answer is not None and not self.answer.strip():
            raise UsageError(empty_answer(self.answer))


#: What the model made of one photo of a batch: its maps, the answer tokens to draw and (``--metrics``) each
#: map's faithfulness by method and token, measured with the model (not in the drawing threads); or why it
#: failed (that photo's own error).
Made = tuple[WordMaps, list[int], dict[tuple[str, int], dict[str, Any]]] | InputError


class VlmJob(BaseJob):
    """The ``vlm`` job (the pipeline's :class:`~hookviz.jobs.common.Job`) of a model :func:`prompted` loaded
    (its input kind processes each photo in the reading threads): ``compute`` explains the photos of a batch
    (their answers generated in one ``generate`` where the family's prompts have one length), ``render``
    draws one photo's maps.

    Raises:
        UsageError: a prompt, answer, layer or method that no photo could take (before any work).
    """

    kind = "vlm"

    def __init__(self, loaded: LoadedModel, settings: VlmSettings, earlier: Output | Path) -> None:
        super().__init__()
        inputs = loaded.inputs
        if not isinstance(inputs, PromptInputs) or inputs.prompt != settings.prompt:
            raise UsageError(f"{loaded.name}: load it with hookviz.vlm.inputs.prompted(vlm, prompt) and the "
                             "settings' prompt")  # fmt: skip
        vlm = inputs.vlm
        layer = decoder_index(vlm, settings.layer)
        chosen_layer(vlm, layer, settings.methods)
        check_encodes(vlm, settings.prompt)
        if settings.answer is not None:
            given_ids(vlm, settings.answer)
        self.loaded, self.vlm, self.asked = loaded, vlm, dataclasses.replace(settings, layer=layer)
        self.layer = layer
        #: Where the records of earlier runs are: the output, or its folder (read when first asked).
        self._earlier = earlier
        self._previous: Mapping[str, dict[str, Any]] | None = None
        self._batch: list[Photo] = []
        #: Batches this job computed (a rerun that finds every photo done computes none).
        self.batches = 0

    def settings(self) -> dict[str, Any]:
        # The family places the maps: another one claiming the same model makes other outputs (another key).
        return {"model": self.vlm.name, "family": self.vlm.family.name, **dataclasses.asdict(self.asked)}

    def planned(self, stem: str) -> list[str]:
        """The files of this input an earlier run recorded (their names hold its answer's words: each map's
        picture and raw map, then the sheet), else the words sheet every answer gets."""
        earlier = self._earlier_records().get(stem) or {}
        files = [str(m["file"]) for m in earlier.get("maps") or [] if m.get("file")]
        raw = self.asked.save_raw
        named = [n for f in files for n in ([f, f"{f[: -len('.png')]}.npy"] if raw else [f])]
        return [*named, f"{stem}.vlm.words.png"]

    def _earlier_records(self) -> Mapping[str, dict[str, Any]]:
        """The latest result per output prefix in the folder's manifest, as the output read it."""
        if isinstance(self._earlier, Output):
            return self._earlier.previous
        if self._previous is None:
            self._previous = read_results(self._earlier / MANIFEST)
        return self._previous

    def annotate(self, batch: Sequence[tuple[Any, Any, Box]], size: tuple[int, int]) -> None:
        self._batch = [photo for _, photo, _ in batch]

    def compute(self, x: Any) -> list[Made]:
        photos, s = self._batch, self.asked
        self.batches += 1
        answers = self._answers(photos)
        made: list[Made] = []
        for photo, generated in zip(photos, answers, strict=True):
            try:
                wm = explain_words(
                    self.vlm, photo.rgb, s.prompt, answer=s.answer, max_new_tokens=s.max_new_tokens,
                    methods=s.methods, layer=self.layer, encoded=photo.encoded, generated=generated,
                    placement=photo.placement,
                )  # fmt: skip
            except InputError as exc:
                made.append(exc)
                continue
            tokens = chosen_tokens(wm, s.words)
            measured = {(m, k): word_faithfulness(self.vlm, wm, m, k) for m in s.methods for k in tokens
                        if s.metrics}  # fmt: skip
            made.append((wm, tokens, measured))
        return made

    def _answers(self, photos: list[Photo]) -> list[list[int] | None]:
        """The batch's answers generated together (one ``generate`` over the photos' inputs stacked), where
        the family's prompts have one length and no answer is given; else None each (each photo generates
        its own)."""
        s = self.asked
        stacked = self.vlm.family.stacked([p.encoded for p in photos]) if len(photos) > 1 else None
        if s.answer is not None or stacked is None:
            return [None] * len(photos)
        return list(generate(self.vlm, stacked, s.max_new_tokens))

    def render(
        self, result: list[Made], index: int, rgb: Any, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        made = result[index]
        if isinstance(made, InputError):
            raise made
        wm, tokens, measured = made
        s = self.asked
        files, record = render_words(wm, rgb.rgb, f"{stem}.vlm", self.vlm.name, tokens=tokens, alpha=s.alpha,
                                     colormap=s.colormap, save_raw=s.save_raw)  # fmt: skip
        for entry in record["maps"] if measured else ():
            entry["metrics"] = measured[entry["method"], entry["token"]]
        said = {wm.answer.tokens[k].strip().lower() for k in tokens}
        missing = [w for w in s.words if w.strip().lower() not in said]
        if missing:
            words = ", ".join(repr(t.strip()) for t in wm.answer.tokens)
            if not tokens:
                error = InputError(f"the answer {wm.answer.text!r} has none of the words "
                                   f"{', '.join(map(repr, missing))}; nothing drawn "
                                   f"(its words: {words})")  # fmt: skip
                error.fields = {k: v for k, v in record.items() if k != "box"}  # type: ignore[attr-defined]
                raise error
            absent = f"the answer {wm.answer.text!r} has no word {', '.join(map(repr, missing))} " \
                   f"(its words: {words}); the others are drawn"  # fmt: skip
            record["note"] = "; ".join(n for n in (absent, record.get("note")) if n)
        record.pop("box")
        return files, record


def vlm_job(settings: VlmSettings, out: Output | Path, loaded: LoadedModel, context: RunContext) -> VlmJob:
    """The job factory :class:`hookviz.run.Run` takes: ``partial(vlm_job, settings, out)``."""
    return VlmJob(loaded, settings, out)


def vlm_run(
    model: str | Vlm,
    inputs: Inputs,
    settings: VlmSettings,
    *,
    out: str | Path = "out",
    maps: str | MapStore | None = None,
    device: str = "auto",
    **given: Any,
) -> Run:
    """The :class:`hookviz.run.Run` of ``hookviz vlm`` over ``inputs`` (iterate it for its events, or call
    ``records()``): ``model`` a :class:`Vlm` or what ``--model`` takes (``hf:DIR``, a hub id; loaded on the
    run's device, under torchrun each rank's); ``maps`` as ``--maps`` (the raw maps are then kept);
    ``given``: :class:`~hookviz.run.Run`'s other settings (``records="parquet"``, ``skip_existing``,
    ``overwrite``, ``batch_size``, ``report``, ...).

    Raises:
        UsageError: a bad model, prompt, answer or setting, once iterated (nothing was written).

    Examples:
        >>> vlm_run("hf:llava", "photos/", VlmSettings(prompt="What is this?"), records="parquet").records()
    """
    if maps is not None:
        settings = dataclasses.replace(settings, save_raw=True)

    def load(on: str) -> LoadedModel:
        vlm = model if isinstance(model, Vlm) else load_vlm(model, on)
        return prompted(vlm, settings.prompt, weights=model if isinstance(model, str) else None)

    factory = partial(vlm_job, settings, Path(out))
    return Run(load, inputs, factory, out=out, maps=maps, device=device, **given)
