"""What the rest of hookviz asks of tasks: load a model with its task, build its ``gradcam`` job, refuse a
command that does not apply, describe a record, the hints a run gets."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hookviz import methods
from hookviz.core.hooks import ModuleCall
from hookviz.errors import UsageError
from hookviz.io.samples import check_names
from hookviz.jobs.build import BuiltJob, RunContext
from hookviz.jobs.settings import CamSettings, settings_of
from hookviz.models.build import build
from hookviz.models.classes import parse_targets
from hookviz.models.heads import with_head
from hookviz.models.loaded import LoadedModel, num_classes, prepare, probe
from hookviz.models.onnx import refuse_unavailable
from hookviz.models.scores import from_options
from hookviz.models.several import several, with_several
from hookviz.models.sources import WEIGHTS_DEFAULT, Options
from hookviz.tasks.registry import _TASKS, ORDER, get_task, plural_list, task_for, task_of

if TYPE_CHECKING:
    from torch import Tensor


def load_model(
    name: str = "resnet18",
    weights: str = WEIGHTS_DEFAULT,
    *,
    device: torch.device | str = "cpu",
    input_size: int | Sequence[int] | None = None,
    resize: str | None = None,
    mean: Sequence[float] | Mapping[str, Sequence[float]] | None = None,
    std: Sequence[float] | Mapping[str, Sequence[float]] | None = None,
    progress: bool = False,
    labels: str | Path | Sequence[str] | None = None,
    weights_key: str | None = None,
    trust_pickle: bool = False,
    task: str | None = None,
    head: str = "auto",
    negate: bool = False,
    output: str | None = None,
    volumes: bool = False,
    inputs: Sequence[str] = (),
) -> LoadedModel:
    """Build a model with its weights, in eval mode, on ``device``, with its task, preprocessing and class
    names.

    Args:
        name: a torchvision classifier (``resnet18``), ``timm:NAME``, ``hf:DIR_OR_ID``,
            ``file.py:FACTORY`` / ``package.module:FACTORY`` (a function or class returning an
            ``nn.Module``), or the path of a whole pickled module (with ``trust_pickle``).
        weights: ``DEFAULT`` (the source's pretrained weights; torchvision's are downloaded into the
            torch hub cache, which honours ``TORCH_HOME``), a torchvision weights name such as
            ``IMAGENET1K_V2``, ``none`` (seeded random init), or a state_dict / checkpoint /
            ``.safetensors`` file.
        input_size: square input side; defaults to the source's (224 for most). Three sides ``(D, H, W)``
            for a volume model: each volume resized to them (default: each at its own size).
        resize: ``crop`` (centre crop, torchvision's eval transform) or ``squash`` (whole image, aspect
            not kept); defaults to the source's.
        mean: input normalisation's mean; default the source's (ImageNet's for custom models).
        std: its standard deviation, likewise.
        labels: class names for the head (a file, see :func:`hookviz.models.classes.read_labels`, a
            sequence, or ``imagenet``: the ImageNet-1k names, for any 1000-way head); they replace the
            source's names in captions, records and ``--target NAME``.
        weights_key: the key of the state_dict inside a checkpoint dict (``ema``, ``model_ema``...).
        trust_pickle: allow unpickling a whole model file (it runs code from the file).
        task: a registered task's name (:mod:`hookviz.tasks`); default: the one the source names, else the
            last registered that claims the model, else classification.
        head: how a classifier's outputs are read: ``softmax``, ``sigmoid`` (multi-label), ``raw``
            (regression); ``auto``: a Hugging Face ``problem_type``, a single output (raw), else softmax.
        negate: a regression: explain what lowers the value (the target is the negated output).
        output: which of the tensors a classifier returns is explained, where it returns several: an index
            of its tuple (``"1"``) or a key of its dict; None: the first (a dict's ``logits`` or ``out``),
            with a note naming it.
        inputs: the names of a model's several inputs (``("rgb", "depth")``): called with them by name when
            its ``forward`` has them, else in this order; each input's bands found by calling it. ``mean``
            and ``std`` may then be a mapping from input name to values.
        volumes: the inputs are volumes (NIfTI, ``.npy``, DICOM): a model that would be a video model (a
            three-channel ``Conv3d`` first) is a volume model.

    Raises:
        ModelNotFoundError: unknown model name (close matches suggested).
        UsageError: ``labels`` does not have one name per class of the head; bad weights name; no such task.
        SetupError: a missing optional dependency (timm, transformers), a refused pickle, a factory
            that returns no module.
        WeightsError: pretrained weights cannot be downloaded, or the file cannot be loaded safely.
    """
    built = build(name, weights, Options(weights_key, trust_pickle, progress))
    if inputs:
        check_names(inputs)
        built.model = several(built.model, inputs, built.preprocess.crop_size)
    chosen = get_task(task) if task is not None else task_for(built)
    if task is None and volumes and chosen.name == "video":
        chosen = get_task("volume")
    if inputs:  # each input normalised by its own (with_several)
        loaded = prepare(built, chosen, device=device, input_size=input_size, resize=resize, labels=labels)
        return with_head(with_several(loaded, mean, std), head, negate, output)
    if isinstance(mean, Mapping) or isinstance(std, Mapping):
        raise UsageError("--mean/--std NAME=... are for a model of several inputs (--input NAME=PATH)")
    loaded = prepare(
        built, chosen, device=device, input_size=input_size, resize=resize, mean=mean, std=std, labels=labels
    )
    return with_head(loaded, head, negate, output)


def make_cam_job(
    loaded: LoadedModel,
    settings: CamSettings | Mapping[str, Any],
    *,
    calls: list[ModuleCall] | None = None,
    first_images: Callable[[int], Tensor | None] | None = None,
    agree: Callable[[Any], Any] | None = None,
    context: RunContext | None = None,
    target_option: str = "--target",
) -> BuiltJob:
    """The ``gradcam`` job for ``loaded``'s task, with its layers chosen and the notes to print.

    Examples:
        >>> built = make_cam_job(loaded, CamSettings(methods=("gradcam", "layercam"), target="top3"))
        >>> built.job.layers, built.notes

    Args:
        calls: the model's traced shapes (:func:`hookviz.models.loaded.probe`), if already at hand.
        first_images: ``first_images(n)``: the first ``n`` readable inputs as one batch (``--layer auto``).
        agree: under torchrun, rank 0's value on every rank (one ``--layer auto`` choice per job).
        context: the run's (gives ``first_images`` and ``agree`` when they are not given).
        target_option: how a target's message names the setting (``"target="``: the explorer's field).

    Raises:
        UsageError: options that do not apply to the task, ``--layer auto`` without a readable image, a
            setting ``settings`` (a mapping) does not have (the closest named).
        LayerError, TargetError: a bad layer or target.
    """
    settings = settings_of(CamSettings, settings)
    given = context or RunContext()
    context = RunContext(first_images or given.first_images, agree or given.agree)
    boxes = task_of(loaded).name == "detection"  # a detector's methods are those that work per box
    families = {
        n: m.family
        for n, m in ((n, methods.get(n)) for n in methods.names())
        if (m.detection if boxes else not m.detection_only)
    }
    refuse_unavailable(loaded.model, list(settings.methods) or ["gradcam"], families)
    calls = calls if calls is not None else probe(loaded)
    targets = parse_targets(settings.target, loaded, num_classes(loaded), settings.threshold, target_option)
    return task_of(loaded).cam_job(loaded, settings, calls, targets, context)


def cam_job(settings: CamSettings, loaded: LoadedModel, context: RunContext) -> BuiltJob:
    """:func:`make_cam_job` as a command's job factory takes it: ``partial(cam_job, settings)``."""
    return make_cam_job(loaded, settings, context=context)


def refuse(loaded: LoadedModel, command: str) -> None:
    """One line for a command that does not apply to ``loaded``'s task.

    Raises:
        UsageError: the command does not apply.
    """
    task = task_of(loaded)
    if task.takes(command):
        return
    works = plural_list([t.plural for t in _TASKS.values() if t.takes(command)])
    others = [f"`{c}`" for c in ORDER if task.takes(c) and c != "gradcam"] + ["`layers`", "`summary`"]
    explains = "`hookviz gradcam` explains it (and " if task.takes("gradcam") else "("
    raise UsageError(
        f"`hookviz {command}` works on {works}, and {loaded.name} is {task.noun}; "
        f"{explains}{', '.join(others)} work on it)"
    )


def describe(record: dict[str, Any]) -> list[str] | None:
    """What a record's task says of it on a line before its prediction (None: nothing more)."""
    name = record.get("task")
    return get_task(name).describe(record) if isinstance(name, str) and name in _TASKS else None


def hints(loaded: LoadedModel) -> list[str]:
    return task_of(loaded).hints(loaded)


def with_options(
    loaded: LoadedModel,
    prompt: list[str] | None,
    prompts_file: Path | None,
    similar_to: Path | None,
    embedding: str | None,
) -> LoadedModel:
    """``loaded`` explaining prompts or a similarity to a photo instead of classes, as the command line asked
    (:func:`hookviz.models.scores.from_options`), once its task allows them.

    Raises:
        UsageError: prompts or ``--similar-to`` for a detector or segmenter; see ``from_options``.
    """
    if similar_to is not None and not task_of(loaded).prompts:
        raise UsageError(
            f"--similar-to explains classifiers and image-text models; {loaded.name} is a "
            f"{loaded.task_name} model"
        )
    return from_options(loaded, prompt, prompts_file, similar_to, embedding)
