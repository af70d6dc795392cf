"""``hookviz vlm``: what a vision-language model looked at for each word it says (one process, or one
torchrun rank's share of the photos, the manifest merged by rank 0)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated, Any

import typer

from hookviz.cli.app import EXIT_INPUTS_FAILED, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE
from hookviz.cli.flags import MAPS, Alpha, ColormapOpt, Inputs, SaveRaw
from hookviz.cli.options import RunOptions, grouped, omit
from hookviz.cli.runner import warn
from hookviz.errors import HookvizError
from hookviz.report import build_report
from hookviz.run import distributed

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
    "layer LLaVA-CAM reads and attention keeps: its module name or a glob naming one "
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


def _run(spec: str, settings: Any, run: RunOptions) -> None:
    """One process over every photo, or (under torchrun) this rank's share, rank 0 merging the manifest."""
    dist = distributed.from_env()
    if dist is None:
        failed = _shard(spec, settings, run, None)
        if run.report:
            typer.echo(f"hookviz: report: {build_report(run.out, warn=warn)}", err=True)
        if failed:
            raise typer.Exit(EXIT_INPUTS_FAILED)
        return
    distributed.init(dist)
    code = 0
    try:
        code = EXIT_INPUTS_FAILED if _shard(spec, settings, run, dist) else 0
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except HookvizError as exc:
        if dist.rank == 0 or exc.exit_code != EXIT_USAGE:  # a usage error is the same on every rank
            typer.echo(f"hookviz[rank {dist.rank}]: error: {exc}", err=True)
        code = exc.exit_code
    except Exception as exc:
        typer.echo(f"hookviz[rank {dist.rank}]: internal error: {type(exc).__name__}: {exc}", err=True)
        code = EXIT_INTERNAL
    worst = distributed.finish(dist, code)  # every rank is done writing here
    if dist.rank == 0:
        _merged(run, dist)
    if worst and dist.rank == 0:  # torchrun exits with rank 0's code
        raise typer.Exit(worst)


def _shard(spec: str, settings: Any, run: RunOptions, dist: Any) -> int:
    """This process's photos explained; the number that failed."""
    from hookviz.vlm.run import run_vlm

    device = distributed.device_and_threads(dist, run.device) if dist is not None else run.device
    lead = dist is None or dist.rank == 0
    say = _sayer(run, quiet=run.quiet or not lead, printed=not (run.as_json and dist is not None))
    return run_vlm(spec, run.inputs, settings, run.out, device=device, overwrite=run.overwrite,
                   skip_existing=run.skip_existing, batch_size=run.batch_size, workers=run.workers,
                   records=run.records, maps=run.maps, dist=dist, say=say)  # fmt: skip


def _merged(run: RunOptions, dist: Any) -> None:
    """Rank 0, once every rank is done: the parts merged into the manifest (printed with ``--json``)."""
    from hookviz.run import pipeline

    manifest = run.out / pipeline.MANIFEST
    if not run.out.is_dir():
        return
    before = manifest.read_bytes() if manifest.exists() else b""
    distributed.merge_parts(run.out, pipeline.MANIFEST, only_dead=False, job=dist.job)
    if run.as_json:
        sys.stdout.write(manifest.read_bytes()[len(before) :].decode("utf-8", "replace"))
        sys.stdout.flush()
    if run.report:
        typer.echo(f"hookviz: report: {build_report(run.out, warn=warn)}", err=True)


def _sayer(run: RunOptions, quiet: bool, printed: bool) -> Any:
    """What each record prints: itself with ``--json`` (not under torchrun: rank 0 prints the merged
    manifest), else a line (an error's on stderr, each rank's)."""
    from hookviz.run.pipeline import to_json

    def say(record: dict[str, Any]) -> None:
        if run.as_json:
            if printed:
                typer.echo(to_json(record))
            return
        if record.get("status") == "error":
            typer.echo(f"hookviz: {record.get('error')}", err=True)
        elif not quiet:
            done = " (skipped: done by an earlier run)" if record.get("status") == "skipped" else ""
            typer.echo(f"{record['input']}: {record['answer']!r} ({len(record['maps'])} maps){done}")
            if record.get("status") == "ok" and record.get("note"):  # --tokens words the answer lacks
                typer.echo(f"hookviz: {record['input']}: {record['note']}", err=True)

    return say
