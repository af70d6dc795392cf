"""``hookviz vlm`` over photos: one model loaded, each photo's word maps written (PNG per token and method,
the words sheet, ``--save-raw`` grids) and its record appended to the manifest; a photo that cannot be read
is an ``error`` record and the others go on."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookviz.errors import InputError, UsageError
from hookviz.io.images import load_rgb
from hookviz.io.inputs import expand_inputs
from hookviz.io.outputs import Output, settings_key
from hookviz.run.pipeline import output_prefix
from hookviz.vlm.faithful import word_faithfulness
from hookviz.vlm.pictures import chosen_tokens, render_words
from hookviz.vlm.words import DEFAULT_METHODS, METHODS, Vlm, empty_answer, explain_words, load_vlm


@dataclass(frozen=True)
class VlmSettings:
    """What ``hookviz vlm`` asks: the prompt, the answer (None: generate), the methods, the words to map
    (empty: all), the decoder layer, and the look."""

    prompt: str
    answer: str | None = None
    max_new_tokens: int = 16
    methods: tuple[str, ...] = DEFAULT_METHODS
    words: tuple[str, ...] = ()
    layer: int | None = None
    alpha: float = 0.5
    colormap: str = "jet"
    save_raw: bool = False
    #: Each map's deletion and insertion AUC on its word's log-probability, against a random map's.
    metrics: bool = False

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise UsageError(f"--method {bad[0] if bad else ''!r}: hookviz vlm has {', '.join(METHODS)}")
        if self.answer is not None and not self.answer.strip():
            raise UsageError(empty_answer(self.answer))


def explain_photo(
    vlm: Vlm, path: Path, settings: VlmSettings, stem: str
) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
    """One photo's files and record (see :func:`hookviz.vlm.pictures.render_words`); where ``settings.words``
    names words the answer does not have, the record's ``note`` names them (and, where it has none of them,
    nothing is drawn and the record's ``error`` says so)."""
    rgb = load_rgb(path)
    wm = explain_words(
        vlm,
        rgb,
        settings.prompt,
        answer=settings.answer,
        max_new_tokens=settings.max_new_tokens,
        methods=settings.methods,
        layer=settings.layer,
    )
    tokens = chosen_tokens(wm, settings.words)
    files, record = render_words(
        wm,
        rgb,
        stem,
        vlm.name,
        tokens=tokens,
        alpha=settings.alpha,
        colormap=settings.colormap,
        save_raw=settings.save_raw,
    )
    if settings.metrics:
        for entry in record["maps"]:
            entry["metrics"] = word_faithfulness(vlm, wm, entry["method"], entry["token"])
    said = {wm.answer.tokens[k].strip().lower() for k in tokens}
    missing = [w for w in settings.words if w.strip().lower() not in said]
    if missing:
        words = ", ".join(repr(t.strip()) for t in wm.answer.tokens)
        if tokens:
            record["note"] = f"the answer {wm.answer.text!r} has no word {', '.join(map(repr, missing))} " \
                             f"(its words: {words}); the others are drawn"  # fmt: skip
        else:
            record["error"] = f"the answer {wm.answer.text!r} has none of the words " \
                f"{', '.join(map(repr, missing))}; nothing drawn (its words: {words})"  # fmt: skip
    return files, record


def done_before(output: Output, stem: str) -> dict[str, Any] | None:
    """An earlier run's record of this photo with these settings, as ``skipped``, where all its files are
    there (a rerun resumes: the photos done are not explained again)."""
    earlier = output.previous.get(stem)
    if earlier is None or not all(output.path(Path(o).name).exists() for o in earlier.get("outputs") or []):
        return None
    kept = {k: v for k, v in earlier.items() if k not in ("input", "time", "note", "status")}
    return {**kept, "status": "skipped", "note": "done by an earlier run with these settings"}


def run_vlm(
    spec: str,
    inputs: Sequence[str],
    settings: VlmSettings,
    out: Path,
    *,
    device: str = "auto",
    overwrite: bool = False,
    say: Callable[[dict[str, Any]], None] = lambda record: None,
) -> int:
    """Every photo of ``inputs`` explained into ``out``; the number that failed.

    Raises:
        UsageError: a bad model, prompt, answer or setting (nothing was written). SetupError: ``out``.
    """
    vlm = load_vlm(spec, device)
    fields = {"model": vlm.name, **{k: v for k, v in dataclasses.asdict(settings).items()}}
    key = settings_key(fields)
    output = Output(out, overwrite=overwrite)
    output.prepare()
    failed = 0
    try:
        for item in expand_inputs(inputs):
            record: dict[str, Any] = {"input": item.name, "model": vlm.name, "key": key}
            try:
                if item.error or item.path is None:
                    raise InputError(item.error or "not found")
                stem = output_prefix(item.path, vlm.name, key) + ".vlm"
                done = None if overwrite else done_before(output, stem)
                if done is not None:
                    record |= done
                else:
                    files, found = explain_photo(vlm, item.path, settings, stem)
                    if "error" in found:  # none of --tokens' words in the answer: kept, nothing drawn
                        record |= found
                        raise InputError(found["error"])
                    if not overwrite and any(output.path(n).exists() for n, _ in files):
                        raise InputError(f"{stem}: outputs of an earlier run exist; --overwrite redoes them")
                    written = [str(output.write(n, data)) for n, data in files]
                    record |= {"status": "ok", "prefix": stem, **found, "outputs": written}
                    record["settings"] = fields
            except InputError as exc:
                failed += 1
                record |= {"status": "error", "error": str(exc)}
            output.record(record)
            say(record)
    finally:
        output.close()
    return failed
