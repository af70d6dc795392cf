"""``hookviz vlm``: what a vision-language model looked at for each word it says; its run is
:func:`hookviz.vlm.run.vlm_run`'s :class:`hookviz.run.Run` (one process, or torchrun's ranks), said as every
command's."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from hookviz.cli.flags import MAPS, Alpha, ColormapOpt, Inputs, SaveRaw
from hookviz.cli.options import RUNNING, RunOptions, grouped, omit
from hookviz.cli.runner import RUN_SETTINGS, Reporter, run_said

ModelSpec = Annotated[str, typer.Option("--model", "-m", help="hf:DIR (a folder save_pretrained wrote, with "
    "its processor) or a hub id: LLaVA(-NeXT), PaliGemma, Qwen2(.5)-VL, SmolVLM, InternVL.")]  # fmt: skip
Prompt = Annotated[str, typer.Option("--prompt", "-p", help="the question; the chat template places the "
    "photo, or put the model's image token (<image>) where it goes.")]  # fmt: skip
AnswerOpt = Annotated[str | None, typer.Option("--answer", help="explain this answer (teacher-forced) "
    "instead of generating one.")]  # fmt: skip
MaxNew = Annotated[int, typer.Option("--max-new-tokens", min=1, max=512, help="the longest answer generated "
    "(greedy).")]  # fmt: skip
VlmMethods = Annotated[str, typer.Option("--method", rich_help_panel=MAPS, help="attention, tokengrad, "
    "llavacam, towercam, logitlens, tam, relevancy, or a comma list of them.")]  # fmt: skip
Tokens = Annotated[str, typer.Option("--tokens", rich_help_panel=MAPS, help="all, or the words of the answer "
    "to map (a comma list).")]  # fmt: skip
DecoderLayer = Annotated[str | None, typer.Option("--layer", "-l", rich_help_panel=MAPS, help="one decoder "
    "layer, the one LLaVA-CAM reads and attention keeps: a module name or a glob matching one "
    "(model.language_model.layers.10, *.layers.10), or its index.")]  # fmt: skip
Metrics = Annotated[bool, typer.Option("--metrics", rich_help_panel=MAPS, help="each map's deletion and "
    "insertion AUC on its word's log-probability, against a random map's (2 x 9 passes a map).")]  # fmt: skip
#: What ``vlm`` takes of the run options.
VlmRun = Annotated[RunOptions, omit(
    "max_memory", "null", "inputs_table", "inputs_column", "no_pictures", "log"
)]  # fmt: skip


@grouped
def vlm(
    inputs: Inputs,
    model: ModelSpec,
    prompt: Prompt,
    answer: AnswerOpt = None,
    max_new_tokens: MaxNew = 16,
    method: VlmMethods = "attention,tokengrad,llavacam,towercam,logitlens,tam",
    tokens: Tokens = "all",
    layer: DecoderLayer = None,
    alpha: Alpha = 0.5,
    colormap: ColormapOpt = "jet",
    save_raw: SaveRaw = False,
    metrics: Metrics = False,
    run: VlmRun = RunOptions(),
) -> None:
    """What a vision-language model looked at for each word of its answer: a map per answer token and
    method over the photo, a sheet with each word under its maps, and a record per photo."""
    from hookviz.vlm.run import VlmSettings

    if run.overwrite and run.skip_existing:
        raise typer.BadParameter("--overwrite (redo everything) and --skip-existing (keep what exists) "
                                 "contradict each other; pass one", param_hint="--skip-existing")  # fmt: skip
    settings = VlmSettings(
        prompt=prompt, answer=answer, max_new_tokens=max_new_tokens,
        methods=tuple(m.strip() for m in method.split(",") if m.strip()),
        words=tuple(w.strip() for w in tokens.split(",") if w.strip() and tokens.strip() != "all"),
        layer=layer, alpha=alpha, colormap=str(colormap), save_raw=save_raw, metrics=metrics,
    )  # fmt: skip
    _run(model, settings, dataclasses.replace(run, inputs=list(inputs)))


def _run(spec: str, settings: Any, r: RunOptions) -> None:
    """The run over ``r.inputs`` (under torchrun, this rank's shard; rank 0 merges the manifest), said."""
    from hookviz.vlm.run import vlm_run

    def make(quiet: bool, reporter: Reporter) -> Any:
        given = {name: getattr(r, name) for name in RUN_SETTINGS if name not in ("out", "maps")}
        return vlm_run(spec, r.inputs, settings, out=r.out, maps=r.maps, device=r.device,
                       command=RUNNING.get(), progress=reporter.inner, **given)  # fmt: skip

    _, code = run_said(make, r, line=_line)
    if code:
        raise typer.Exit(code)


def _line(record: dict[str, Any]) -> str:
    """A record on a line: the photo, its answer, how many maps (and whether an earlier run made them); an
    error's is said on stderr instead."""
    if record["status"] == "error":
        return str(record["error"])
    done = " (skipped: done by an earlier run)" if record.get("status") == "skipped" else ""
    return f"{record['input']}: {record['answer']!r} ({len(record['maps'])} maps){done}"
