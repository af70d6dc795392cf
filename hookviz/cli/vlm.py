"""``hookviz vlm``: what a vision-language model looked at for each word it says."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.cli.flags import MAPS, Alpha, ColormapOpt, Inputs, SaveRaw
from hookviz.cli.options import DATA, RunOptions, grouped, omit
from hookviz.cli.runner import warn
from hookviz.errors import UsageError
from hookviz.report import build_report

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
DecoderLayer = Annotated[str | None, typer.Option("--layer", rich_help_panel=MAPS, help="the decoder "
    "layer LLaVA-CAM reads and attention keeps: an index or its name (...layers.10).")]  # fmt: skip
Metrics = Annotated[bool, typer.Option("--metrics", rich_help_panel=MAPS, help="each map's deletion and "
    "insertion AUC on its word's log-probability, against a random map's (2 x 9 passes a map).")]  # fmt: skip
#: What ``vlm`` takes of the run options.
VlmRun = Annotated[RunOptions, omit(
    "skip_existing", "batch_size", "workers", "max_memory", "null", *DATA
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
    from hookviz.vlm.run import VlmSettings, run_vlm

    settings = VlmSettings(
        prompt=prompt, answer=answer, max_new_tokens=max_new_tokens,
        methods=tuple(m.strip() for m in method.split(",") if m.strip()),
        words=tuple(w.strip() for w in tokens.split(",") if w.strip() and tokens.strip() != "all"),
        layer=decoder_layer(layer), alpha=alpha, colormap=str(colormap), save_raw=save_raw, metrics=metrics,
    )  # fmt: skip
    failed = run_vlm(model, list(inputs), settings, Path(run.out), device=run.device, overwrite=run.overwrite,
                     say=_sayer(run))  # fmt: skip
    if run.report:
        typer.echo(f"hookviz: report: {build_report(Path(run.out), warn=warn)}", err=True)
    if failed:
        raise typer.Exit(1)


def decoder_layer(given: str | None) -> int | None:
    """``--layer``: a decoder layer's index, or a module name ending in ``layers.N``."""
    if given is None:
        return None
    last = given.strip().rsplit(".", 1)[-1]
    if not last.lstrip("-").isdigit() or ("." in given and ".layers." not in f".{given}"):
        raise UsageError(
            f"--layer {given}: give a decoder layer's index (10) or name (model.language_model.layers.10)"
        )
    return int(last)


def _sayer(run: Any) -> Any:
    import json

    def say(record: dict[str, Any]) -> None:
        if run.as_json:
            typer.echo(json.dumps(record))
        elif record.get("status") == "error":
            typer.echo(f"hookviz: {record['input']}: {record.get('error')}", err=True)
        else:
            if not run.quiet:
                done = " (skipped: done by an earlier run)" if record.get("status") == "skipped" else ""
                typer.echo(f"{record['input']}: {record['answer']!r} ({len(record['maps'])} maps){done}")
            if record.get("status") == "ok" and record.get("note"):  # --tokens words the answer lacks
                typer.echo(f"hookviz: {record['input']}: {record['note']}", err=True)

    return say
