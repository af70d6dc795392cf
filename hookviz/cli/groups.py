"""Settings from options, one function per option group: a command hands its parameters (``locals()``) to
these and gets the objects the library takes (the model options, the run options, the methods' settings, what
replaces the classes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from hookviz.cli.app import _method_options, memory_size
from hookviz.cli.loading import ModelOptions, _rgb
from hookviz.cli.runner import RunOptions


def model_options(p: Mapping[str, Any]) -> ModelOptions:
    """The model options (``--model``, ``--weights``, ``--device``, ``--input-size``, ... ``--clips``)."""
    return ModelOptions(
        model=p["model"],
        weights=p["weights"],
        device=p.get("device", "auto"),
        input_size=p.get("input_size"),
        resize=p.get("resize"),
        labels=p.get("labels"),
        weights_key=p.get("weights_key"),
        mean=_rgb(p.get("mean"), "--mean"),
        std=_rgb(p.get("std"), "--std"),
        trust_pickle=p.get("trust_pickle", False),
        head=p.get("head", "auto"),
        negate=p.get("negate", False),
        task=p.get("task"),
        volumes=all_volumes(p.get("inputs") or []),
        inputs=tuple(s.partition("=")[0].strip() for s in p.get("several") or ()),
        clip_len=p.get("clip_len"),
        frame_stride=p.get("frame_stride"),
        clips=p.get("clips"),
    )


def all_volumes(inputs: list[str]) -> bool:
    """Whether every input names a volume (a NIfTI or ``.npy`` file, a DICOM folder, a folder of volumes)."""
    from hookviz.io.volume import is_volume, volume_suffix  # loads numpy: only once a command runs

    def one(spec: str) -> bool:
        path = Path(spec).expanduser()
        if is_volume(path):
            return True
        return path.is_dir() and any(volume_suffix(f) for f in path.iterdir())

    return bool(inputs) and "-" not in inputs and all(one(s) for s in inputs)


def run_options(p: Mapping[str, Any], **fixed: Any) -> RunOptions:
    """How to run over the inputs (``--out``, ``--batch-size``, ``--overwrite``, ... ``--report``); ``fixed``
    sets what a command does not let the user choose."""
    given = {
        name: p[name]
        for name in (
            "inputs", "out", "batch_size", "workers", "overwrite", "skip_existing", "max_pixels", "null",
            "quiet", "as_json", "debug", "report",
        )
        if name in p
    }  # fmt: skip
    if p.get("several"):  # a model of several inputs: the NAME=PATH specs are its inputs
        if given.get("inputs"):
            raise typer.BadParameter("give the inputs as --input NAME=PATH only, not also as arguments")
        given["inputs"] = list(p["several"])
    elif "inputs" in given and not given["inputs"]:
        raise typer.BadParameter("give files, folders, globs or - (stdin); or --input NAME=PATH for a model "
                                 "of several inputs", param_hint="INPUTS")  # fmt: skip
    return RunOptions(**{**given, "max_memory": memory_size(p.get("max_memory")), **fixed})


def method_options(p: Mapping[str, Any]) -> Any:
    """The methods' settings (``--seed``, ``--samples``, ``--ig-steps``, ``--rise-masks``, ...): a
    :class:`hookviz.methods.MethodOptions`."""
    rise = p["rise_masks"] if "rise_masks" in p else p["masks"]
    return _method_options(
        p["seed"], p["samples"], p["noise"], p["ig_steps"], p["baseline"], p["window"], p["stride"], rise,
        p["cells"], p["masked_batch"], head_fusion=p["head_fusion"], discard=p["discard_ratio"],
    )  # fmt: skip


@dataclass(frozen=True)
class Prompts:
    """What replaces the classes: text prompts, or the similarity to a photo (``--prompt``, ``--prompts``,
    ``--similar-to``, ``--embedding``)."""

    prompt: list[str] | None = None
    prompts_file: Path | None = None
    similar_to: Path | None = None
    embedding: str | None = None

    def apply(self, loaded: Any) -> Any:
        """``loaded`` explaining them (its task allowing)."""
        from hookviz import tasks  # loads torch: only once a command runs

        return tasks.with_options(loaded, self.prompt, self.prompts_file, self.similar_to, self.embedding)


def prompts(p: Mapping[str, Any]) -> Prompts:
    return Prompts(p.get("prompt"), p.get("prompts_file"), p.get("similar_to"), p.get("embedding"))
