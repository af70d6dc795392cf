"""``hookviz trust``: a model's photos read as ``gradcam`` reads them, the candidates the registry allows, the
battery of :mod:`hookviz.evaluation.trust`, and the report written as ``trust.json``, ``trust.md`` and
``trust.png`` (a grid: candidates x tests, coloured by outcome, each cell's figure)."""

from __future__ import annotations

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
from hookviz.core.layers import default_cam_layer
from hookviz.errors import HookvizError, OutputError, UsageError
from hookviz.evaluation.trust import TrustReport, trust
from hookviz.io.files import atomic_write
from hookviz.io.images import DEFAULT_MAX_PIXELS, encode_png
from hookviz.io.outputs import finite
from hookviz.jobs.build import CamSettings
from hookviz.models.loaded import LoadedModel
from hookviz.run.kinds import prepared
from hookviz.tasks import make_cam_job

__all__ = ["FILES", "TESTS", "candidate_methods", "trust_photos", "write_trust"]

#: The methods tried when none are named: the gradient CAMs and the gradient pixel attributions (each
#: kept only where the registry lets it run on the model).
DEFAULT_METHODS = ("gradcam", "gradcampp", "xgradcam", "layercam", "hirescam", "saliency", "guidedbackprop",
                   "inputxgradient", "integratedgradients")  # fmt: skip
TESTS = ("randomisation", "class", "faithfulness", "stability")
FILES = ("trust.json", "trust.md", "trust.png")
COLOURS = {"pass": (46, 125, 50), "care": (230, 150, 0), "fail": (198, 40, 40)}
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


def trust_photos(
    loaded: LoadedModel,
    inputs: Sequence[str],
    *,
    methods: Sequence[str] | None = None,
    layers: Sequence[str] | None = None,
    seed: int = 0,
    max_photos: int = 16,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[TrustReport, dict[str, str], dict[str, str]]:
    """Which map to believe for ``loaded`` on its photos ``inputs`` (files, folders, globs): the report,
    the methods refused on this model with the registry's reason, and the inputs that could not be read
    with theirs.

    Raises:
        UsageError: not a classifier of photos; fewer than two readable photos; no method that applies.
    """
    if loaded.task_name != "classification":
        raise UsageError(f"hookviz trust tests a classifier's maps; {loaded.name} is a {loaded.task_name} "
                         "model (hookviz evaluate and sanity measure its maps)")  # fmt: skip
    kind, loaded = prepared(loaded, list(inputs))
    if kind.name != "photo":
        raise UsageError(f"hookviz trust takes photos; {loaded.name} takes {kind.name}s")
    items = sorted(kind.items(loaded, kind.find(loaded, list(inputs)), max_pixels), key=lambda i: str(i.path))
    failed = {i.name: str(i.error) for i in items if i.error}
    read = kind.read(loaded)
    batch: list[torch.Tensor] = []
    names: list[str] = []
    for item in [i for i in items if not i.error]:
        if len(batch) == max_photos:
            break
        try:
            _, x, _ = read(item, kind.preprocess(loaded), max_pixels)
        except HookvizError as exc:
            failed[item.name] = str(exc)
            continue
        batch.append(torch.from_numpy(np.asarray(x)))
        names.append(item.name)
    if len(batch) < 2:
        found = f"{len(batch)} readable photo" + ("" if len(batch) == 1 else "s")
        raise UsageError(f"hookviz trust needs 2 photos or more for an interval ({found} among "
                         f"{', '.join(inputs)}); 16 give answers worth reading")  # fmt: skip
    calls = traced(loaded.model, tuple(batch[0].shape), loaded.device)
    chosen, refused = candidate_methods(loaded, methods, calls)
    if not chosen:
        raise UsageError("no method named applies to this model: " + "; ".join(refused.values()))
    default_layer = default_cam_layer(loaded.model, calls)
    stacked = torch.stack(batch).to(loaded.device)
    report = trust(loaded.model, stacked, list(layers or [default_layer]), chosen, names=names,
                   model_name=loaded.name, default=("gradcam", default_layer), seed=seed)  # fmt: skip
    return report, refused, failed


def table(report: TrustReport) -> list[str]:
    """The console's table: a line per candidate with each test's figure and outcome, then the answer."""
    wide = max([5, *(len(c.layer) for c in report.candidates)])
    lines = [f"{'method':<22} {'layer':<{wide}} " + " ".join(f"{t:<14}" for t in TESTS) + " verdict"]
    for c in report.candidates:
        cells = " ".join(f"{c.tests[t].value:5.2f} {c.tests[t].outcome:<8}" for t in TESTS)
        name = c.method + (" (control)" if c.control else "")
        lines.append(f"{name:<22} {c.layer:<{wide}} {cells} {c.verdict}")
    lines += [f"note: {n}" for n in report.notes]
    lines.append(f"{report.answer} ({len(report.photos)} photo(s), seed {report.seed})")
    return lines


def markdown(report: TrustReport, command: str) -> str:
    """A model-card section: what was tested, on how many photos, the verdicts, how to reproduce them."""
    rows = ["| method | layer | " + " | ".join(TESTS) + " | verdict |", "|---" * (len(TESTS) + 3) + "|"]
    for c in report.candidates:
        figures = " | ".join(
            f"{c.tests[t].value:.2f} ± {c.tests[t].ci:.2f} ({c.tests[t].outcome})" for t in TESTS
        )
        rows.append(
            f"| {c.method}{' (control)' if c.control else ''} | {c.layer} | {figures} | {c.verdict} |"
        )
    check = report.model_check
    return "\n".join([
        "## Which saliency map to trust",
        "",
        f"**{report.answer}.**",
        "",
        f"Tested by hookviz on {len(report.photos)} photo(s) of `{report.model}` (seed {report.seed}). "
        "Each map was put through four tests, each figure the mean over the photos with its 95 % interval: "
        "randomisation (|Spearman| with the map once the classifier is re-initialised; pass below 0.5), "
        "class (SSIM with the least likely class's map; pass below 0.6), faithfulness (insertion minus "
        "deletion AUC above a random map's, and an edge detector's), stability (max-sensitivity under "
        "small noise; pass below 0.5). The edge detector is the control that must fail.",
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
    figure in each cell."""
    cell_w, cell_h, head_w = 130, 28, 260
    rows = len(report.candidates) + 1
    image = np.full((rows * cell_h + 8, head_w + (len(TESTS) + 1) * cell_w, 3), 40, np.uint8)
    for j, title in enumerate([*TESTS, "verdict"]):
        render.put_text(image, title, (head_w + j * cell_w + 6, 19), 0.45)
    for i, c in enumerate(report.candidates, start=1):
        y = i * cell_h
        render.put_text(
            image, f"{c.method}{' (ctrl)' if c.control else ''} @ {c.layer}"[:34], (6, y + 19), 0.45
        )
        for j, t in enumerate(TESTS):
            test = c.tests[t]
            x = head_w + j * cell_w
            image[y + 2 : y + cell_h - 2, x + 2 : x + cell_w - 2] = COLOURS[test.outcome]
            render.put_text(image, f"{test.value:.2f}", (x + 8, y + 19), 0.45)
        x = head_w + len(TESTS) * cell_w
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
) -> list[Path]:
    """``trust.json``, ``trust.md`` and ``trust.png`` into ``out`` (atomic; an earlier run's kept unless
    ``overwrite``)."""
    paths = [out / name for name in FILES]
    there = [p for p in paths if p.exists()]
    if there and not overwrite:
        raise OutputError(
            f"{there[0]} exists (an earlier trust run); --overwrite replaces it, or another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    data = {
        **report.as_dict(),
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
