"""One way to run a job over inputs, for the CLI and the Python API alike: the inputs expanded (a video cut
into clips), the pipeline run with the task's reader, and a video's clips followed by the whole video's
prediction."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
import torch

from hookviz.errors import InputError, UsageError
from hookviz.io.images import DEFAULT_MAX_PIXELS, load_rgb
from hookviz.io.inputs import Item, clip_items, expand_inputs
from hookviz.io.outputs import Output
from hookviz.io.samples import pair_inputs, parse_specs, read_sample
from hookviz.jobs.build import CamSettings
from hookviz.jobs.video import VideoCamJob, video_summary
from hookviz.models.loaded import LoadedModel
from hookviz.run import pipeline
from hookviz.tasks import make_cam_job, task_of

if TYPE_CHECKING:
    from torch import Tensor

    from hookviz.jobs.common import Job


def find_inputs(
    loaded: LoadedModel,
    inputs: list[str],
    *,
    stdin: TextIO | None = None,
    exclude: Path | None = None,
    null: bool = False,
) -> list[Item]:
    """What ``inputs`` name, each an :class:`~hookviz.io.inputs.Item` (videos for a model taking clips,
    volumes for a volume model, samples of ``NAME=PATH`` specs paired for a model of several inputs)."""
    if loaded.several is not None:
        pairs = parse_specs(inputs)
        if [n for n, _ in pairs] != list(loaded.several.names):
            raise UsageError(f"--input names {', '.join(n for n, _ in pairs)}; the model was loaded with "
                             f"{', '.join(loaded.several.names)}")  # fmt: skip
        return pair_inputs(pairs, exclude)
    return pipeline.expand_inputs(
        inputs,
        stdin,
        exclude=exclude,
        null=null,
        video=loaded.video is not None,
        volume=loaded.volume is not None,
    )


def clips_of(loaded: LoadedModel, items: list[Item], max_pixels: int = DEFAULT_MAX_PIXELS) -> list[Item]:
    """``items`` as the model takes them: each video cut into clips, photos as they are."""
    return list(clip_items(items, loaded.video, max_pixels)) if loaded.video is not None else items


def run_job(
    job: Job,
    loaded: LoadedModel,
    items: Iterable[Item],
    output: Output,
    *,
    batch_size: int = 8,
    workers: int = 2,
    skip_existing: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_memory: int | None = None,
    note: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """``job`` over ``items`` (from :func:`clips_of`), writing into ``output``: one record per input (and,
    for a video model, one per whole video after its clips)."""
    base = {
        "command": job.kind,
        "model": loaded.name,
        "weights": loaded.weights,
        "pretrained": loaded.pretrained,
        **task_of(loaded).fields(loaded),
    }
    records = pipeline.run(
        items,
        job,
        preprocess=loaded.video or loaded.volume or loaded.several or loaded.preprocess,
        output=output,
        device=loaded.device,
        base=base,
        batch_size=batch_size,
        workers=workers,
        skip_existing=skip_existing,
        max_pixels=max_pixels,
        max_memory=max_memory,
        note=note,
        read=read_sample if loaded.several is not None else task_of(loaded).read,
    )
    if loaded.video is not None:
        records = with_video_summaries(records, job, output, loaded)
    return records


def first_images(items: list[Item], loaded: LoadedModel, n: int, max_pixels: int) -> Tensor | None:
    """The first ``n`` readable photos among ``items``, preprocessed, as one batch on the model's device
    (photos of the first one's input size only), or None."""
    xs: list[Any] = []
    for item in items:
        if item.path is None:
            continue
        try:
            x, _ = loaded.preprocess(load_rgb(item.path, max_pixels=max_pixels))
        except InputError:
            continue
        if xs and x.shape != xs[0].shape:  # one batch: photos of the first one's input size
            continue
        xs.append(x)
        if len(xs) == n:
            break
    return torch.from_numpy(np.stack(xs)).to(loaded.device) if xs else None


def explain_videos(
    loaded: Any,
    inputs: str | Path | list[str | Path],
    out: str | Path,
    settings: Any = None,
    *,
    overwrite: bool = False,
    batch_size: int = 4,
) -> list[dict[str, Any]]:
    """The ``hookviz gradcam`` of a video model, from Python: each clip's overlay videos, contact sheet (and
    raw maps) written under ``out``, and the records (each clip's, then each video's whole prediction), also
    appended to ``out/manifest.jsonl``.

    Args:
        loaded: a video model (:func:`hookviz.load_model`; its ``video`` says how clips are sampled: change it
            with ``dataclasses.replace(loaded, video=loaded.video.sampled(clip_len=8, clips="all"))``).
        inputs: video files, folders of videos, folders of frames.
        settings: a :class:`hookviz.jobs.build.CamSettings` (layers, methods, target, colours, ``save_raw``);
            default: Grad-CAM at the default layer, the top class.

    Raises:
        UsageError: not a video model, or settings that do not apply to one.

    Example:
        >>> loaded = load_model("r3d_18")
        >>> records = explain_videos(loaded, "videos/", "out/")
        >>> [r["video"]["name"] for r in records if "video" in r]
    """
    if loaded.video is None:
        raise UsageError(f"{loaded.name} takes photos, not videos; explain photos with hookviz.explain")
    names = [str(p) for p in (inputs if isinstance(inputs, list) else [inputs])]
    output = Output(Path(out), overwrite=overwrite)
    built = make_cam_job(loaded, settings or CamSettings())
    items = clips_of(loaded, expand_inputs(names, exclude=Path(out), video=True))
    output.prepare()
    return list(run_job(built.job, loaded, items, output, batch_size=batch_size))


def explain_volumes(
    loaded: Any,
    inputs: str | Path | list[str | Path],
    out: str | Path,
    settings: Any = None,
    *,
    overwrite: bool = False,
    batch_size: int = 2,
) -> list[dict[str, Any]]:
    """The ``hookviz gradcam`` of a volume model, from Python: each volume's NIfTI overlays (its own grid and
    affine), orthogonal slices, slice mosaics and sweeps written under ``out``, and the records, also appended
    to ``out/manifest.jsonl``.

    Args:
        loaded: a volume model (:func:`hookviz.load_model`, with ``volumes=True`` for a three-channel one).
        inputs: ``.nii``/``.nii.gz``/``.npy`` files, DICOM series folders, folders of them.
        settings: a :class:`hookviz.jobs.build.CamSettings`; default: Grad-CAM at the default layer, the top
            class.

    Raises:
        UsageError: not a volume model, or settings that do not apply to one.

    Example:
        >>> loaded = load_model("monai:DenseNet121?spatial_dims=3&in_channels=1&out_channels=2", "model.pt")
        >>> records = explain_volumes(loaded, "scans/", "out/")
        >>> [m["peak"]["world"] for r in records for m in r["maps"]]
    """
    if loaded.volume is None:
        raise UsageError(f"{loaded.name} does not take volumes; load it with volumes=True or task='volume'")
    names = [str(p) for p in (inputs if isinstance(inputs, list) else [inputs])]
    output = Output(Path(out), overwrite=overwrite)
    built = make_cam_job(loaded, settings or CamSettings())
    items = find_inputs(loaded, names, exclude=Path(out))
    output.prepare()
    try:
        return list(run_job(built.job, loaded, items, output, batch_size=batch_size))
    finally:
        output.close()


def explain_samples(
    loaded: Any,
    inputs: Mapping[str, str | Path],
    out: str | Path,
    settings: Any = None,
    *,
    overwrite: bool = False,
    batch_size: int = 8,
) -> list[dict[str, Any]]:
    """The ``hookviz gradcam`` of a model of several inputs, from Python: each sample's maps, each drawn over
    the input its layer sees, written under ``out``, and the records (naming every file of each sample).

    Args:
        loaded: :func:`hookviz.load_model` with ``inputs=(names...)``.
        inputs: each input's folder (or file), by name, in the model's order: ``{"rgb": "photos/", "depth":
            "depth/"}``.
        settings: a :class:`hookviz.jobs.build.CamSettings`; default: Grad-CAM at the default layer.

    Raises:
        UsageError: not a model of several inputs, or names other than those it was loaded with.
    """
    if loaded.several is None:
        raise UsageError(f"{loaded.name} takes one input; load it with load_model(..., inputs=(names...))")
    output = Output(Path(out), overwrite=overwrite)
    built = make_cam_job(loaded, settings or CamSettings())
    items = find_inputs(loaded, [f"{n}={p}" for n, p in inputs.items()], exclude=Path(out))
    output.prepare()
    try:
        return list(run_job(built.job, loaded, items, output, batch_size=batch_size))
    finally:
        output.close()


def with_video_summaries(
    records: Iterable[dict[str, Any]], job: Any, output: Output, loaded: Any
) -> Iterator[dict[str, Any]]:
    """``records`` of a video model's clips, each video's followed by one record of the whole video's
    prediction (the mean of its clips' class probabilities; clips computed in this run), also appended to
    the manifest. A video whose clips were all skipped or failed gets none."""
    probs: dict[str, Any] = job.clip_probs if isinstance(job, VideoCamJob) else {}
    current: str | None = None
    done: list[dict[str, Any]] = []

    def summary() -> dict[str, Any] | None:
        got = [(r, probs.pop(r["prefix"])) for r in done if r.get("prefix") in probs and r["status"] == "ok"]
        if not got:
            return None
        entry: dict[str, Any] = {
            "input": current,
            "status": "ok",
            "error": None,
            "command": done[0].get("command"),
            "model": done[0].get("model"),
            "key": done[0].get("key"),
            "video": video_summary(str(current), [r for r, _ in got], [p for _, p in got], loaded),
            "outputs": [],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        output.record(entry)
        return entry

    try:
        for rec in records:
            if rec["input"] != current and done:
                if (found := summary()) is not None:
                    yield found
                done = []
            current = rec["input"]
            if rec.get("clip") is not None:
                done.append(rec)
            yield rec
        if done and (entry := summary()) is not None:
            yield entry
    finally:
        output.close()
