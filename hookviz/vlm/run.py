"""``hookviz vlm`` on the pipeline's rails: :class:`VlmJob` is a job like ``gradcam``'s (photos read and
processed while the model works, answers generated together where the family allows, maps drawn and written
while the next batch computes, the manifest, ``--skip-existing``/``--overwrite``, the Parquet table and the
Zarr store), and :func:`run_vlm` runs it from Python."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hookviz.errors import InputError, UsageError
from hookviz.io import timing
from hookviz.io.images import DEFAULT_MAX_PIXELS, Box, load_rgb
from hookviz.io.inputs import Item, expand_inputs
from hookviz.io.outputs import MANIFEST, Output
from hookviz.io.sinks import data_sinks
from hookviz.jobs.common import BaseJob
from hookviz.methods.registry import token_method
from hookviz.run import distributed, pipeline
from hookviz.run.distributed import Dist
from hookviz.vlm.faithful import word_faithfulness
from hookviz.vlm.families import Placement
from hookviz.vlm.model import empty_answer, encode, generate, given_ids, prompt_text
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


@dataclass
class Photo:
    """One photo as the reader leaves it for the model: its pixels, the processor's inputs, and where its
    image tokens lie on it."""

    rgb: np.ndarray
    encoded: dict[str, Any]
    placement: Placement


#: What the model made of one photo of a batch: its maps, the answer tokens to draw and (``--metrics``) each
#: map's faithfulness by method and token, measured with the model (not in the drawing threads); or why it
#: failed (that photo's own error).
Made = tuple[WordMaps, list[int], dict[tuple[str, int], dict[str, Any]]] | InputError


class VlmJob(BaseJob):
    """The ``vlm`` job (the pipeline's :class:`~hookviz.jobs.common.Job`): ``read`` processes a photo in the
    reading threads, ``compute`` explains the photos of a batch (their answers generated in one ``generate``
    where the family's prompts have one length), ``render`` draws one photo's maps.

    Raises:
        UsageError: a prompt, answer, layer or method that no photo could take (before any work).
    """

    kind = "vlm"
    loaded: Any = None

    def __init__(self, vlm: Vlm, settings: VlmSettings, output: Output) -> None:
        super().__init__()
        layer = decoder_index(vlm, settings.layer)
        chosen_layer(vlm, layer, settings.methods)
        prompt_text(vlm, settings.prompt)
        if settings.answer is not None:
            given_ids(vlm, settings.answer)
        self.vlm, self.asked, self.output = vlm, dataclasses.replace(settings, layer=layer), output
        self.layer = layer
        self._batch: list[Photo] = []
        #: Batches this job computed (a rerun that finds every photo done computes none).
        self.batches = 0

    def settings(self) -> dict[str, Any]:
        return {"model": self.vlm.name, **dataclasses.asdict(self.asked)}

    def planned(self, stem: str) -> list[str]:
        """The files of this input an earlier run recorded (their names hold its answer's words: each map's
        picture and raw map, then the sheet), else the words sheet every answer gets."""
        earlier = self.output.previous.get(stem) or {}
        files = [str(m["file"]) for m in earlier.get("maps") or [] if m.get("file")]
        raw = self.asked.save_raw
        named = [n for f in files for n in ([f, f"{f[: -len('.png')]}.npy"] if raw else [f])]
        return [*named, f"{stem}.vlm.words.png"]

    def read(self, item: Item, preprocess: Any, max_pixels: int) -> tuple[Photo, np.ndarray, Box]:
        """One photo read and processed (in a reading thread); every photo is one batch's."""
        with timing.stage("decode"):
            rgb = load_rgb(item.source(), max_pixels=max_pixels)
        try:
            with timing.stage("preprocess"):
                encoded = encode(self.vlm, rgb, self.asked.prompt)
                placement = self.vlm.family.placement(
                    self.vlm.model, self.vlm.processor, encoded, rgb.shape[:2]
                )
        except InputError as exc:
            raise InputError(f"{item.name}: {exc}") from None
        return Photo(rgb, encoded, placement), np.zeros(1, np.uint8), placement.box()

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
            record["note"] = f"the answer {wm.answer.text!r} has no word {', '.join(map(repr, missing))} " \
                             f"(its words: {words}); the others are drawn"  # fmt: skip
        record.pop("box")
        return files, record


def vlm_records(
    vlm: Vlm,
    items: Iterable[Item],
    settings: VlmSettings,
    output: Output,
    *,
    batch_size: int = 8,
    workers: int = 2,
    skip_existing: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    job: VlmJob | None = None,
) -> Iterator[dict[str, Any]]:
    """Each photo of ``items`` explained into ``output`` by the pipeline; one record each, as it comes.

    Raises:
        UsageError: a prompt, answer, layer or method no photo could take. SetupError: ``output``.
    """
    job = job or VlmJob(vlm, settings, output)
    base = {"command": job.kind, "model": vlm.name}
    return pipeline.run(items, job, preprocess=None, output=output, device=vlm.device, base=base,  # type: ignore[arg-type]
                        batch_size=batch_size, workers=workers, skip_existing=skip_existing,
                        max_pixels=max_pixels, read=job.read)  # fmt: skip


def run_vlm(
    spec: str | Vlm,
    inputs: Sequence[str],
    settings: VlmSettings,
    out: Path,
    *,
    device: str = "auto",
    overwrite: bool = False,
    skip_existing: bool = False,
    batch_size: int = 8,
    workers: int = 2,
    records: str | None = None,
    maps: str | None = None,
    dist: Dist | None = None,
    say: Callable[[dict[str, Any]], None] = lambda record: None,
) -> int:
    """Every photo of ``inputs`` explained into ``out``; the number that failed. ``records``: the records also
    into a Parquet table (``parquet``: under ``out``); ``maps``: the raw maps into a Zarr store (``zarr``).
    ``dist``: this torchrun rank's share (its shard of the photos, its manifest part; the caller merges).

    Raises:
        UsageError: a bad model, prompt, answer or setting (nothing was written). SetupError: ``out``.
    """
    vlm = spec if isinstance(spec, Vlm) else load_vlm(spec, device)
    if maps is not None:
        settings = dataclasses.replace(settings, save_raw=True)
    output = Output(Path(out), overwrite=overwrite, manifest=dist.part_name if dist is not None else MANIFEST)
    job = VlmJob(vlm, settings, output)
    photos = distributed.shard(expand_inputs(list(inputs), exclude=Path(out)), dist)
    if (dist is None or dist.rank == 0) and Path(out).is_dir():  # parts a killed torchrun job left
        distributed.merge_parts(Path(out), MANIFEST, only_dead=True)
    output.maps, table = data_sinks(Path(out), maps, records, dist.rank if dist is not None else 0)
    output.prepare()
    failed = 0
    try:
        for record in vlm_records(vlm, photos, settings, output, batch_size=batch_size, workers=workers,
                                  skip_existing=skip_existing, job=job):  # fmt: skip
            failed += record["status"] == "error"
            if table is not None:
                table.add(record)
            say(record)
    finally:
        output.close()
        if table is not None:
            table.close()
    return failed
