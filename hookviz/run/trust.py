"""``hookviz trust``: a model's photos read as ``gradcam`` reads them, the candidates the registry allows, the
battery of :mod:`hookviz.evaluation.trust`, and the report written as ``trust.json``, ``trust.md`` and
``trust.png`` (a grid: candidates x tests, coloured by outcome, each cell's figure)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookviz import methods as registry
from hookviz import render
from hookviz.core.hooks import traced
from hookviz.core.layers import candidate_layers, default_cam_layer
from hookviz.errors import HookvizError, OutputError, UsageError
from hookviz.evaluation.trust import NOT_APPLICABLE, TESTS_RUN, Candidate, Progress, Test, TrustReport
from hookviz.evaluation.trust import trust as battery
from hookviz.io.annotation import Annotations
from hookviz.io.annotation import load as load_annotations
from hookviz.io.files import atomic_write
from hookviz.io.images import DEFAULT_MAX_PIXELS, encode_png
from hookviz.io.outputs import finite
from hookviz.jobs.settings import CamSettings, names_of
from hookviz.models.loaded import LoadedModel, num_classes
from hookviz.models.settings import model_settings
from hookviz.run.trust_detection import trust_detections
from hookviz.run.trust_guard import parse_budget
from hookviz.run.trust_photos import Photos, outside_said, read_photos
from hookviz.tasks import load_model, make_cam_job

__all__ = [
    "FILES",
    "TESTS",
    "Photos",
    "candidate_methods",
    "read_photos",
    "trust",
    "trust_layers",
    "trust_photos",
    "write_trust",
]

#: The methods tried when none are named: the gradient CAMs and the gradient pixel attributions (each
#: kept only where the registry lets it run on the model).
DEFAULT_METHODS = ("gradcam", "gradcampp", "xgradcam", "layercam", "hirescam", "saliency", "guidedbackprop",
                   "inputxgradient", "integratedgradients")  # fmt: skip
TESTS = TESTS_RUN
FILES = ("trust.json", "trust.md", "trust.png")
COLOURS = {"pass": (46, 125, 50), "care": (230, 150, 0), "fail": (198, 40, 40), NOT_APPLICABLE: (90, 90, 90)}
VERDICT_COLOURS = {"recommended": COLOURS["pass"], "care": COLOURS["care"], "fails": COLOURS["fail"]}


def candidate_methods(
    loaded: LoadedModel, wanted: Sequence[str] | None, calls: Any
) -> tuple[list[str], dict[str, str]]:
    """The methods to test (named, ``all``, or the default set) and those the registry refuses, with why."""
    names = registry.parse(list(wanted)) if wanted else list(DEFAULT_METHODS)
    kept: list[str] = []
    refused: dict[str, str] = {}
    for name in names:
        try:
            make_cam_job(loaded, CamSettings(methods=(name,)), calls=calls)
        except HookvizError as exc:
            refused[name] = str(exc)
            continue
        kept.append(name)
    return kept, refused


def trust_layers(loaded: LoadedModel, calls: Any, layers: Sequence[str] | None) -> list[str]:
    """The layers named, else the default CAM layer and the two last others ``--layer auto`` would try
    (the last block of a CNN's stages; a transformer's blocks)."""
    if layers:
        return list(layers)
    default = default_cam_layer(loaded.model, calls)
    try:
        others = [la for la in candidate_layers(loaded.model, calls) if la != default][-2:]
    except HookvizError:
        others = []
    return [default, *others]


def trust_photos(
    loaded: LoadedModel,
    inputs: Sequence[str],
    *,
    methods: Sequence[str] | None = None,
    layers: Sequence[str] | None = None,
    seed: int = 0,
    max_photos: int = 16,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    annotations: Annotations | None = None,
    budget: float | None = None,
    progress: Progress | None = None,
    started: float | None = None,
    out: Path | None = None,
) -> tuple[TrustReport, dict[str, str], dict[str, str]]:
    """Which map to believe for ``loaded`` on its photos ``inputs`` (files, folders, globs): the report,
    the methods refused on this model with the registry's reason, and the inputs that could not be read
    with theirs. ``budget``: seconds from ``started`` (a :func:`time.monotonic` reading; default now).

    Raises:
        UsageError: not a classifier, segmenter or detector of photos; one photo; no method that applies;
            annotated classes that are not the model's (listed in one line, before the first photo).
        InputError: fewer than two readable photos.
    """
    if loaded.task_name not in ("classification", "segmentation", "detection"):
        raise UsageError(f"hookviz trust tests the maps of a classifier, a segmenter or a detector; "
                         f"{loaded.name} is a {loaded.task_name} model (hookviz evaluate measures its "
                         "maps)")  # fmt: skip
    detector = loaded.task_name == "detection"
    if detector and annotations is not None:
        raise UsageError("a detector's maps are tested against its own boxes; leave --boxes/--masks out")
    if annotations is not None:  # every class resolved before the first photo, as evaluate resolves them
        annotations.check(loaded.categories, num_classes(loaded))
    photos = read_photos(loaded, inputs, max_photos, max_pixels, annotations, out)
    calls = traced(loaded.model, tuple(photos.batch[0].shape), loaded.device)
    chosen, refused = candidate_methods(loaded, methods, calls)
    if not chosen:
        raise UsageError("no method named applies to this model: " + "; ".join(refused.values()))
    if detector:
        settings = CamSettings(methods=(chosen[0],), layers=tuple(layers or ()))
        tried = list(make_cam_job(loaded, settings, calls=calls).job.layers)
        report = trust_detections(loaded, photos.batch, photos.names, tried, chosen, seed=seed,
                                  progress=progress, budget=budget, started=started)  # fmt: skip
        return _done(report, loaded, photos), refused, photos.failed
    stacked = torch.stack(photos.batch).to(loaded.device)
    masks = None if photos.masks is None else torch.from_numpy(np.stack(photos.masks))
    tried = trust_layers(loaded, calls, layers)
    report = battery(loaded.model, stacked, tried, chosen, names=photos.names, model_name=loaded.name,
                   default=("gradcam", tried[0]), seed=seed, masks=masks, budget=budget, progress=progress,
                   task=loaded.task_name, started=started)  # fmt: skip
    said = annotations.warnings if annotations is not None else []
    return _done(report, loaded, photos, said), refused, photos.failed


def _done(
    report: TrustReport, loaded: LoadedModel, photos: Photos, warnings: Sequence[str] = ()
) -> TrustReport:
    """The report with its key; in its notes, what reading the annotations said (one line a file: boxes
    that cover no pixel), the photos the annotations do not name and those left out with nothing to
    localise, each named."""
    left = photos.unannotated
    said = [f"{len(left)} photo(s) not in the annotations left out (nothing to localise), such as {n}"
            for n in left[:1]]  # fmt: skip
    said += [outside_said(photos.outside)] if photos.outside else []
    return dataclasses.replace(report, key=_key(loaded), notes=[*report.notes, *warnings, *said])


def _key(loaded: LoadedModel) -> dict[str, str]:
    """What the run is of (``trust.json``'s ``key``): the model's name and its weights' fingerprint, as its
    outputs' settings keys say; ``gradcam --method auto`` and the report find the run by it."""
    settings = model_settings(loaded)
    return {"model": str(settings["model"]), "weights": str(settings["weights"])}


def _cell(c: Candidate, name: str) -> str:
    t = c.tests.get(name)
    if t is None or t.outcome == NOT_APPLICABLE:
        return "n/a"
    return f"{t.value:.2f}"


def table(report: TrustReport) -> list[str]:
    """The console's table: a line per candidate with each test's figure and outcome, then the answer."""
    wide = max([5, *(len(c.layer) for c in report.candidates)])
    names = report.tests
    lines = [f"{'method':<22} {'layer':<{wide}} " + " ".join(f"{t:<14}" for t in names) + " verdict"]
    for c in report.candidates:
        cells = " ".join(f"{_cell(c, t):>5} {c.tests[t].outcome if t in c.tests else '':<8}" for t in names)
        name = c.method + (" (control)" if c.control else "")
        said = f" ({c.dropped})" if c.dropped else ""
        lines.append(f"{name:<22} {c.layer:<{wide}} {cells} {c.verdict}{said}")
    lines += [f"note: {n}" for n in report.notes]
    lines += [f"n/a: {t.name}: {t.rule}" for t in _not_applicable(report)]
    lines += [f"left out: {n}" for n in report.left_out]
    lines.append(f"{report.answer} ({len(report.photos)} photo(s), seed {report.seed})")
    return lines


def _not_applicable(report: TrustReport) -> list[Test]:
    found: dict[str, Test] = {}
    for c in report.candidates:
        for t in c.tests.values():
            if t.outcome == NOT_APPLICABLE:
                found.setdefault(t.name, t)
    return list(found.values())


RULES = {
    "randomisation": "randomisation (|Spearman| with the map once the classifier is re-initialised; "
    "pass below 0.5)",
    "class": "class (SSIM with the least likely class's map; pass below 0.6)",
    "faithfulness": "faithfulness (insertion minus deletion AUC above a random map's, and an edge "
    "detector's)",
    "stability": "stability (max-sensitivity under small noise; pass below 0.5)",
    "localisation": "localisation (the pointing game's hits less the centre map's on the annotated objects; "
    "pass above 0)",
}


def markdown(report: TrustReport, command: str) -> str:
    """A model-card section: what was tested, on how many photos, the verdicts, how to reproduce them."""
    names = report.tests
    rows = ["| method | layer | " + " | ".join(names) + " | verdict |", "|---" * (len(names) + 3) + "|"]
    for c in report.candidates:
        figures = " | ".join(
            "n/a"
            if _cell(c, t) == "n/a"
            else f"{c.tests[t].value:.2f} ± {c.tests[t].ci:.2f} ({c.tests[t].outcome})"
            for t in names
        )
        rows.append(
            f"| {c.method}{' (control)' if c.control else ''} | {c.layer} | {figures} | {c.verdict} |"
        )
    check = report.model_check
    said = ", ".join(RULES.get(t, t) for t in names)
    return "\n".join([
        "## Which saliency map to trust",
        "",
        f"**{report.answer}.**",
        "",
        f"Tested by hookviz on {len(report.photos)} photo(s) of `{report.model}`, a {report.task} model "
        f"(seed {report.seed}). Each map was put through these tests, each figure the mean over the photos "
        f"with its 95 % interval: {said}. The edge detector is the control that must fail.",
        *[f"Not applicable here: {t.name}: {t.rule}." for t in _not_applicable(report)],
        *[f"Dropped: {c.method} at {c.layer}: {c.dropped}." for c in report.candidates if c.dropped],
        *[f"Left out: {n}." for n in report.left_out],
        "",
        f"The model: {check.reason} (normalised entropy {check.entropy:.2f}, top class flipped by small "
        f"noise on {check.flips:.0%} of the photos).",
        "",
        *rows,
        "",
        "Reproduce:",
        "",
        "```bash",
        command,
        "```",
        "",
    ])  # fmt: skip


def grid(report: TrustReport) -> np.ndarray:
    """The picture: a row per candidate, a column per test and the verdict, coloured by outcome, with the
    figure in each cell (grey where a test does not apply); the first column as wide as its longest label."""
    labels = [f"{c.method}{' (ctrl)' if c.control else ''} @ {c.layer}" for c in report.candidates]
    cell_w, cell_h, head_w = 130, 28, max([260, *(render.text_size(t, 0.45)[0] + 16 for t in labels)])
    names = report.tests
    rows = len(report.candidates) + 1
    image = np.full((rows * cell_h + 8, head_w + (len(names) + 1) * cell_w, 3), 40, np.uint8)
    for j, title in enumerate([*names, "verdict"]):
        render.put_text(image, title, (head_w + j * cell_w + 6, 19), 0.45)
    for i, c in enumerate(report.candidates, start=1):
        y = i * cell_h
        render.put_text(image, labels[i - 1], (6, y + 19), 0.45)
        for j, t in enumerate(names):
            x = head_w + j * cell_w
            outcome = c.tests[t].outcome if t in c.tests else NOT_APPLICABLE
            image[y + 2 : y + cell_h - 2, x + 2 : x + cell_w - 2] = COLOURS[outcome]
            render.put_text(image, _cell(c, t), (x + 8, y + 19), 0.45)
        x = head_w + len(names) * cell_w
        image[y + 2 : y + cell_h - 2, x + 2 : x + cell_w - 2] = VERDICT_COLOURS[c.verdict]
        render.put_text(image, c.verdict, (x + 8, y + 19), 0.45)
    return image


def write_trust(
    report: TrustReport,
    out: Path,
    *,
    command: str,
    refused: dict[str, str],
    overwrite: bool,
    failed: dict[str, str] | None = None,
    key: dict[str, str] | None = None,
) -> list[Path]:
    """``trust.json``, ``trust.md`` and ``trust.png`` into ``out`` (atomic; an earlier run's kept unless
    ``overwrite``). ``key``: the model's name and weights' fingerprint
    (:func:`hookviz.run.verdicts.trust_key`), by which ``gradcam --method auto``, the report and the
    explorer find the run."""
    paths = [out / name for name in FILES]
    there = [p for p in paths if p.exists()]
    if there and not overwrite:
        raise OutputError(
            f"{there[0]} exists (an earlier trust run); --overwrite replaces it, or another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    data = {
        **report.as_dict(),
        **({"key": key} if key is not None else {}),
        "refused": refused,
        "failed": failed or {},
        "command": command,
        "versions": {"hookviz": _version(), "torch": torch.__version__, "python": platform.python_version()},
    }
    atomic_write(paths[0], json.dumps(finite(data), indent=1, allow_nan=False))
    atomic_write(paths[1], markdown(report, command))
    atomic_write(paths[2], encode_png(grid(report)))
    return paths


def _version() -> str:
    try:
        return importlib.metadata.version("hookviz")
    except importlib.metadata.PackageNotFoundError:  # a source tree not installed
        return "unknown"


def trust(
    model: str | LoadedModel,
    photos: str | Path | Sequence[str | Path],
    *,
    methods: str | Sequence[str] | None = None,
    layers: str | Sequence[str] | None = None,
    weights: str = "DEFAULT",
    seed: int = 0,
    max_photos: int = 16,
    boxes: str | Path | None = None,
    masks: str | Path | None = None,
    budget: str | float | None = None,
    progress: Progress | None = None,
    device: str = "cpu",
) -> TrustReport:
    """``hookviz trust`` as a function: which map to believe for ``model`` (a name ``load_model`` takes,
    with ``weights``, on ``device``; or a loaded model) on ``photos`` (files, folders, globs). The report
    is what ``trust.json`` holds (:meth:`TrustReport.as_dict`, its ``key`` included), with the methods the
    model refused and the inputs that could not be read added to its notes.

    Raises:
        UsageError: as the command refuses (one line: fewer than two photos, a method or layer that does
            not apply, a bad budget).
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model, weights, device=device)
    inputs = [str(photos)] if isinstance(photos, str | Path) else [str(p) for p in photos]
    found = None
    if boxes is not None or masks is not None:
        found = load_annotations(Path(boxes) if boxes else None, Path(masks) if masks else None)
    methods, layers = (None if w is None else names_of(w) for w in (methods, layers))  # "gradcam,saliency"
    report, refused, failed = trust_photos(loaded, inputs, methods=methods, layers=layers, seed=seed,
                                           max_photos=max_photos, annotations=found,
                                           budget=parse_budget(budget), progress=progress)  # fmt: skip
    said = [f"{m} refused on this model: {why}" for m, why in refused.items()]
    said += [f"{name} could not be read: {why}" for name, why in failed.items()]
    return dataclasses.replace(report, notes=[*report.notes, *said])
