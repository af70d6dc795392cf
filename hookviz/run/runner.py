"""One way to run a job over inputs, for the CLI and the Python API alike: the inputs found and cut into items
by their kind (:mod:`hookviz.run.kinds`), the pipeline run with the kind's reader, and what the kind runs
after (a video's whole prediction after its clips)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookviz.errors import UsageError
from hookviz.io.images import DEFAULT_MAX_PIXELS
from hookviz.io.inputs import Item
from hookviz.io.outputs import Output
from hookviz.jobs.settings import CamSettings, settings_of
from hookviz.models.loaded import LoadedModel
from hookviz.render.notebook import Records
from hookviz.run import pipeline, verdicts
from hookviz.run.kinds import InputKind, input_kind, input_kind_of, prepared
from hookviz.tasks import make_cam_job, task_of

if TYPE_CHECKING:
    from hookviz.jobs.common import Job


def run_job(
    job: Job,
    loaded: LoadedModel,
    items: Iterable[Item],
    output: Output,
    *,
    kind: InputKind | None = None,
    batch_size: int = 8,
    workers: int = 2,
    skip_existing: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_memory: int | None = None,
    note: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """``job`` over ``items`` (found and cut by ``kind``, default the one ``loaded`` takes), writing into
    ``output``: one record per item, and what the kind adds after them (a video's whole prediction)."""
    kind = kind or input_kind_of(loaded)
    base = {
        "command": job.kind,
        "model": loaded.name,
        "weights": loaded.weights,
        "pretrained": loaded.pretrained,
        **task_of(loaded).fields(loaded),
        **kind.fields(loaded),
    }
    records = pipeline.run(
        items,
        job,
        preprocess=kind.preprocess(loaded),
        output=output,
        device=loaded.device,
        base=base,
        batch_size=batch_size,
        workers=workers,
        skip_existing=skip_existing,
        max_pixels=max_pixels,
        max_memory=max_memory,
        note=note,
        read=kind.read(loaded),
    )
    return kind.after(records, job, output, loaded)


def explain_inputs(
    loaded: Any,
    inputs: str | Path | Mapping[str, str | Path] | list[str | Path],
    out: str | Path,
    settings: Any = None,
    *,
    kind: str | None = None,
    overwrite: bool = False,
    batch_size: int | None = None,
    trust: str | Path | None = None,
    **given: Any,
) -> Records:
    """The ``hookviz gradcam`` of any model over its kind of inputs, from Python: the maps written under
    ``out`` as the command writes them, and the records, also appended to ``out/manifest.jsonl`` (a list
    of dicts that a notebook displays as the overlays, with their captions).

    Args:
        loaded: :func:`hookviz.load_model`'s model: photos, a video model (its ``video`` says how clips are
            sampled), a volume model, or a model of several inputs (``inputs=(names...)``).
        inputs: files, folders, globs; for several inputs each one's folder (or file) by name, in the model's
            order (``{"rgb": "photos/", "depth": "depth/"}``).
        settings: a :class:`hookviz.jobs.settings.CamSettings` (layers, methods, target, colours,
            ``save_raw``) or a mapping of them; default: Grad-CAM at the default layer, the top class.
        given: settings by keyword (``methods=("layercam",)``), over ``settings``; a name
            :class:`~hookviz.jobs.settings.CamSettings` does not have is refused, the closest named.
        kind: the input kind expected (``video``, ``volume``, ``sample``, a registered one): a model that
            takes another is refused.
        batch_size: inputs per forward pass (default: the kind's).
        trust: ``methods=("auto",)``: the folder of a ``hookviz trust`` run of this model and weights (else
            one in ``out``, else one made on the first photos and kept in ``out/trust.KEY/``), as ``gradcam
            --method auto --trust DIR`` (:func:`hookviz.run.verdicts.auto_choice` says what it chose).

    Raises:
        UsageError: a model that does not take ``kind``, settings that do not apply to it.
        UntrustedError: ``--method auto`` and the trust run says no map here can be trusted.

    Examples:
        >>> records = explain_inputs(load_model("r3d_18"), "videos/", "out/")
        >>> [r["video"]["name"] for r in records if "video" in r]
    """
    if isinstance(inputs, Mapping):
        specs = [f"{n}={p}" for n, p in inputs.items()]
    else:
        specs = [str(p) for p in (inputs if isinstance(inputs, list) else [inputs])]
    taken, loaded = prepared(loaded, specs)
    if kind is not None and taken.name != kind:
        raise UsageError(input_kind(kind).refusal.format(name=loaded.name))
    output = Output(Path(out), overwrite=overwrite)
    settings = settings_of(CamSettings, settings, **given)
    if verdicts.wants_auto(settings):
        chosen = verdicts.auto_choice(loaded, trust=Path(trust) if trust is not None else None, out=Path(out),
                                      photos=specs)  # fmt: skip
        settings = verdicts.auto_settings(settings, chosen)
    elif trust is not None:
        raise UsageError("trust= goes with methods=('auto',): the trust run --method auto draws from")
    built = make_cam_job(loaded, settings)
    items = taken.items(loaded, taken.find(loaded, specs, exclude=Path(out)), DEFAULT_MAX_PIXELS)
    output.prepare()
    try:
        size = batch_size or taken.batch_size
        return Records(run_job(built.job, loaded, items, output, kind=taken, batch_size=size))
    finally:
        output.close()


def explain_videos(loaded: Any, inputs: Any, out: str | Path, settings: Any = None, **kw: Any) -> list[Any]:
    """:func:`explain_inputs` of a video model: each clip's overlay videos and contact sheet, then each
    video's whole prediction."""
    return explain_inputs(loaded, inputs, out, settings, kind="video", **kw)


def explain_volumes(loaded: Any, inputs: Any, out: str | Path, settings: Any = None, **kw: Any) -> list[Any]:
    """:func:`explain_inputs` of a volume model: NIfTI overlays, orthogonal slices, mosaics and sweeps."""
    return explain_inputs(loaded, inputs, out, settings, kind="volume", **kw)


def explain_samples(loaded: Any, inputs: Any, out: str | Path, settings: Any = None, **kw: Any) -> list[Any]:
    """:func:`explain_inputs` of a model of several inputs (``inputs``: each one's folder by name)."""
    return explain_inputs(loaded, inputs, out, settings, kind="sample", **kw)
