"""How a per-image command gets its model: the model options every such command shares, completed with what
the run decides (:func:`prepared`), loading them, and the warm models of ``hookviz serve`` (a forked child
finds the model its parent loaded)."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hookviz.cli.options import ModelOptions, RunOptions, Sampling
from hookviz.errors import UsageError
from hookviz.io.files import file_digest
from hookviz.options import Resize
from hookviz.startup import release_collector

if TYPE_CHECKING:  # for annotations only: importing it here would load torch for --help
    from hookviz.models.loaded import LoadedModel

__all__ = ["USED", "WARM", "ModelOptions", "load_options", "prepared", "warm_key", "with_sampling"]


#: Models kept warm by ``hookviz serve`` (a forked child finds them here), by :func:`warm_key`.
WARM: dict[Any, LoadedModel] = {}
#: The model options this process loaded (a server's child tells its parent, which keeps them warm).
USED: list[ModelOptions] = []


def warm_key(m: ModelOptions) -> Any:
    """What identifies a loaded model for ``hookviz serve``: the options, and the content of every file they
    name (the weights, the labels, and the files its source's fingerprint names: a local ``hf:DIR``, a
    ``timm:``/``ultralytics:`` file or folder, an ONNX or pickled file), so a file rewritten, re-saved or
    copied over with its size and time kept (``cp -p``) is loaded again; None for a model its source never
    keeps warm (the user's own code, ``module:function``, ``file.py:FN``): loaded afresh every call."""
    from hookviz.models.build import model_files  # the sources' records: torch, loaded by the server only

    fingerprint = model_files(m.model)
    if fingerprint is None:
        return None
    named = [m.weights, m.labels, *fingerprint]
    stamps = []
    for value in named:
        path = Path(str(value)) if value else None
        if path is None or not path.exists():
            continue
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        stamps.append((str(path.resolve()), tuple((str(f.relative_to(path)) if f != path else "", _digest(f))
                                                   for f in files)))  # fmt: skip
    return (m, tuple(stamps))


#: Content digests by (device, inode, size, modification and change times): a file left as it was is not read
#: again, and any write changes its change time (which no copy can keep).
_DIGESTS: dict[tuple[int, ...], str] = {}


def _digest(path: Path) -> str:
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_digest(path)
    return _DIGESTS[key]


#: The model options :func:`hookviz.tasks.load_model` takes as they are.
_AS_GIVEN = (
    "input_size", "labels", "weights_key", "trust_pickle", "head", "negate", "output", "task", "volumes",
    "inputs",
)  # fmt: skip


def load_options(m: ModelOptions, quiet: bool) -> LoadedModel:
    """The model ``m`` asks for, loaded (no warm copy consulted)."""
    from hookviz.models.loaded import resolve_device
    from hookviz.tasks import load_model

    as_given = {name: getattr(m, name) for name in _AS_GIVEN}
    loaded = load_model(
        m.model, m.weights, device=resolve_device(m.device),
        resize=str(m.resize) if m.resize is not None else None, mean=_per_input(m.mean),
        std=_per_input(m.std), progress=not quiet and sys.stderr.isatty(), **as_given,
    )  # fmt: skip
    release_collector()  # the start is over (hookviz.startup)
    return with_sampling(loaded, m.clip_len, m.frame_stride, m.clips)


def _per_input(values: Any) -> Any:
    """``NAME=values`` pairs as the mapping :func:`hookviz.tasks.load_model` takes; numbers as they are."""
    return dict(values) if values and isinstance(values[0], tuple) else values


def load_warm(m: ModelOptions, quiet: bool) -> LoadedModel:
    USED.append(m)
    key = warm_key(m) if WARM else None
    if key is not None and key in WARM:
        return WARM[key]
    return load_options(m, quiet)


def with_sampling(
    loaded: LoadedModel, clip_len: int | None, frame_stride: int | None, clips: str | None
) -> LoadedModel:
    """``loaded`` with the user's clip sampling (a UsageError for a model that takes photos)."""
    given = [
        o for o, v in (("--clip-len", clip_len), ("--frame-stride", frame_stride), ("--clips", clips)) if v
    ]
    if not given:
        return loaded
    video = loaded.video
    if video is None:
        raise UsageError(f"{given[0]} is for video models, and {loaded.name} takes photos; leave it out")
    if clips is not None and clips != "all" and not (clips.isascii() and clips.isdigit() and int(clips) > 0):
        raise UsageError(f"--clips {clips!r}: give a positive number of clips, or all")
    return dataclasses.replace(loaded, inputs=video.sampled(clip_len, frame_stride, clips))


def prepared(
    model: ModelOptions,
    run: RunOptions,
    inputs: list[str] | None,
    several: list[str] | None = None,
    sampling: Sampling | None = None,
    **fixed: Any,
) -> tuple[ModelOptions, RunOptions]:
    """The model and run options of a command over ``inputs`` (or ``--input NAME=PATH`` specs, ``several``):
    completed with what the run decides for the model (the device, the inputs' kind and names, the sampling);
    ``fixed`` sets run options a command does not let the user choose."""
    from hookviz.io.volume import all_volumes  # loads numpy: only once a command runs

    if several:  # a model of several inputs: the NAME=PATH specs are its inputs
        if inputs:
            raise typer.BadParameter("give the inputs as --input NAME=PATH only, not also as arguments")
        inputs = list(several)
    elif not inputs and run.inputs_table is None:
        raise typer.BadParameter("give files, folders, globs or - (stdin); or --input NAME=PATH for a model "
                                 "of several inputs", param_hint="INPUTS")  # fmt: skip
    run = dataclasses.replace(run, inputs=list(inputs or ()), **fixed)
    model = dataclasses.replace(
        model,
        device=run.device,
        volumes=all_volumes(list(inputs or ())),
        inputs=tuple(s.partition("=")[0].strip() for s in several or ()),
        **(dataclasses.asdict(sampling) if sampling is not None else {}),
    )
    return model, run


def finite_options(**values: float) -> None:
    """Refuse an option given NaN or infinity (``--lr inf``), in one line (exit 2).

    Raises:
        UsageError: a value that is not a finite number.
    """
    for name, value in values.items():
        if not math.isfinite(value):
            raise UsageError(f"--{name} {value}: give a finite number")


def _plain(value: Any) -> Any:
    if isinstance(value, Resize):
        return value.value
    if isinstance(value, Path):
        return str(value.resolve())
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def options_json(m: ModelOptions) -> dict[str, Any]:
    """The model options as the run folder keeps them (config.json's ``options``): the model, its weights (a
    file's path made absolute) and every option given other than its default; the device left out."""
    base = ModelOptions()
    kept: dict[str, Any] = {}
    for f in dataclasses.fields(m):
        value = getattr(m, f.name)
        if f.name != "device" and (f.name in ("model", "weights") or value != getattr(base, f.name)):
            kept[f.name] = _plain(value)
    if Path(m.weights).is_file():
        kept["weights"] = str(Path(m.weights).resolve())
    return kept


def from_run(m: ModelOptions, folder: Path) -> ModelOptions:
    """``m`` with every option left at its default taken from the run folder's config.json (the options
    ``sae train`` was given); one given differs from the run's and is kept: the fingerprint check then says
    whether it is the run's model."""
    from hookviz.sae.store import read_config

    saved = (read_config(folder) or {}).get("options")
    if not isinstance(saved, dict):
        return m
    base, changes = ModelOptions(), dict[str, Any]()
    for name, value in saved.items():
        if name in {f.name for f in dataclasses.fields(m)} and getattr(m, name) == getattr(base, name):
            restore = {"labels": Path, "resize": Resize}.get(name, _tuples)
            changes[name] = restore(value) if value is not None else None
    return dataclasses.replace(m, **changes)
