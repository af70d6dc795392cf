"""What a layer has learned: ``hookviz sae train`` (a sparse dictionary of a layer's activations, from live
hooks), ``hookviz sae features`` (each feature's top patches, histogram and classes), ``hookviz sae explain``
(where a photo's features fire, what a feature does to the class probabilities), ``hookviz sae import``."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.cli.app import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE
from hookviz.cli.flags import Debug, Device, Inputs, Null, Quiet
from hookviz.cli.loading import finite_options, from_run, load_options, options_json
from hookviz.cli.options import ModelOptions, PlainModel, grouped
from hookviz.errors import HookvizError, InputError, OutputError, UsageError
from hookviz.io.outputs import make_folder, settings_key, to_json
from hookviz.run import distributed
from hookviz.run.trust_guard import held

DICT = "Dictionary"

sae_app = typer.Typer(
    name="sae",
    help="What a layer has learned: sparse dictionaries (SAEs) trained from live hooks, their features.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

Layer = Annotated[str, typer.Option("--layer", "-l", help="the layer whose output is the vectors: a "
    "convolution's map (every position) or a transformer block's tokens (every patch token).")]  # fmt: skip
Arch = Annotated[str, typer.Option("--arch", rich_help_panel=DICT,
    help="topk, batchtopk, matryoshka or jumprelu.")]  # fmt: skip
Width = Annotated[str, typer.Option("--width", rich_help_panel=DICT,
    help="features: a multiple of the layer's width (8x) or a count (4096).")]  # fmt: skip
K = Annotated[int, typer.Option("--k", rich_help_panel=DICT,
    help="features active per vector (TopK; BatchTopK's mean; JumpReLU's L0 penalty scale).")]  # fmt: skip
Vectors = Annotated[int, typer.Option("--vectors", min=1, rich_help_panel=DICT,
    help="training vectors in all (passes over the inputs repeat).")]  # fmt: skip
Batch = Annotated[int, typer.Option("--batch", min=1, rich_help_panel=DICT, help="vectors per step.")]
Lr = Annotated[float, typer.Option("--lr", min=0.0, rich_help_panel=DICT, help="Adam's learning rate.")]
Seed = Annotated[int, typer.Option("--seed", rich_help_panel=DICT, help="initial weights and shuffling.")]
Buffer = Annotated[int, typer.Option("--buffer", min=1, rich_help_panel=DICT,
    help="vectors per shuffle block (the buffer's bound).")]  # fmt: skip
Every = Annotated[int, typer.Option("--checkpoint-every", min=1, rich_help_panel=DICT,
    help="steps between checkpoints (a killed run resumes from the last).")]  # fmt: skip
Keep = Annotated[int, typer.Option("--keep", min=0, rich_help_panel=DICT,
    help="blocks of --buffer vectors held in memory over passes while every input's vectors fit in them: the "
    "passes after the first then run no forward pass (0: every pass runs the model).")]  # fmt: skip
Cache = Annotated[str | None, typer.Option("--cache", metavar="DIR|auto", help="write each input's vectors "
    "once to shards in DIR (auto: the run folder's cache/), read by later passes and later runs instead of "
    "running the model; keyed by the model's weights and code, the layer, the preprocessing and the inputs "
    "(each local file's name and SHA-256; a remote object's URL).")]  # fmt: skip
Eval = Annotated[float, typer.Option("--eval", min=0.0, max=0.99, rich_help_panel=DICT,
    help="share of the inputs held out of training (the last ones given) that the quality is measured on; "
    "0: measured on the first 64 training inputs (metrics.json's evaluated_on says which).")]  # fmt: skip
InputsBatch = Annotated[int, typer.Option("--batch-size", "-b", min=1, help="inputs per forward pass.")]


RUN_HELP = "the run folder: config.json, sae.safetensors, metrics.json (checkpoint.pt while training)."
RunDir = Annotated[Path, typer.Option("--out", "-o", help=RUN_HELP)]
#: ``sae train``'s ``--out`` as typed: an empty one (the current folder, unasked) is refused, not read as ".".
TrainDir = Annotated[str, typer.Option("--out", "-o", help=RUN_HELP)]
Again = Annotated[bool, typer.Option("--overwrite", help="train again over a finished run.")]
JsonOut = Annotated[bool, typer.Option("--json", help="print the metrics as JSON on stdout.")]


@grouped
def train(
    inputs: Inputs,
    layer: Layer,
    model: PlainModel = ModelOptions(),
    arch: Arch = "topk",
    width: Width = "8x",
    k: K = 32,
    vectors: Vectors = 200_000,
    batch: Batch = 1024,
    lr: Lr = 4e-4,
    seed: Seed = 0,
    buffer: Buffer = 16_384,
    keep: Keep = 8,
    checkpoint_every: Every = 200,
    eval_share: Eval = 0.0,
    batch_size: InputsBatch = 16,
    cache: Cache = None,
    out: TrainDir = "sae",
    overwrite: Again = False,
    null: Null = False,
    device: Device = "auto",
    quiet: Quiet = False,
    as_json: JsonOut = False,
    debug: Debug = False,
) -> None:
    """Train a sparse dictionary of a layer's activations over DATA (photos, folders, globs, shards), streamed
    from forward hooks; resumable; metrics.json and the console give its quality. Under torchrun every
    process trains on its share of DATA, the gradients averaged at every step; rank 0 writes the run."""
    from hookviz.sae.training import TrainSettings

    finite_options(lr=lr, eval=eval_share)
    settings = TrainSettings(
        arch=arch, width=width, k=k, vectors=vectors, batch=batch, lr=lr, seed=seed, buffer=buffer, keep=keep,
        checkpoint_every=checkpoint_every, inputs_batch=batch_size, eval=eval_share,
    )  # fmt: skip
    run, folder = _folders(out, cache, inputs)
    dist = distributed.from_env()
    if dist is None:
        with held(run, "sae.lock", "hookviz sae train"):  # a second run into --out refused before it computes
            _train(model, (inputs, null), layer, settings, run, folder, overwrite, device, quiet, as_json)
        return
    if "-" in inputs:  # said once, by rank 0, before any rank waits on another; every rank exits 2
        if dist.rank != 0:
            raise typer.Exit(EXIT_USAGE)
        read_inputs(inputs, null)
    distributed.init(dist)
    lead = dist.rank == 0  # the one that says the outcome
    code = 0
    with contextlib.ExitStack() as lock:  # rank 0 holds --out until every rank is done
        try:
            _job_held(dist, run, lock)
            device = distributed.device_and_threads(dist, device)
            _train(model, (inputs, null), layer, settings, run, folder, overwrite, device, quiet or not lead,
                   as_json and lead)  # fmt: skip
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
        except HookvizError as exc:
            if lead or not _said_by_rank0(exc):  # a usage error or a refusal is the same on every rank
                typer.echo(f"hookviz[rank {dist.rank}]: error: {exc}", err=True)
            code = exc.exit_code
        except Exception as exc:
            typer.echo(f"hookviz[rank {dist.rank}]: internal error: {type(exc).__name__}: {exc}", err=True)
            code = EXIT_INTERNAL
        worst = distributed.finish(dist, code)
    if worst and lead:  # torchrun exits with rank 0's code
        raise typer.Exit(worst)


def _folders(out: str, cache: str | None, inputs: list[str]) -> tuple[Path, Path | None]:
    """--out and --cache as folders: neither an empty name (the current folder), --out no input's folder."""
    if not out.strip():
        raise UsageError('--out "": an empty name would write into the current folder; give a folder name')
    if cache is not None and not cache.strip():
        raise UsageError('--cache "": give a folder for the shards, or auto (the run folder\'s cache/), or '
                         "leave --cache out")  # fmt: skip
    run = Path(out)
    _library().refuse_out_among_inputs(run, inputs)  # the photos' folder: outputs read back as inputs
    return run, None if cache is None else run / "cache" if cache == "auto" else Path(cache)


class _Refused(OutputError):
    """Rank 0's refusal to take --out (another run holds it), raised on every rank."""


def _said_by_rank0(exc: HookvizError) -> bool:
    return exc.exit_code == EXIT_USAGE or isinstance(exc, _Refused)


def _job_held(dist: distributed.Dist, out: Path, lock: contextlib.ExitStack) -> None:
    """``out``'s ``sae.lock`` taken by rank 0 for the whole torchrun job (before any rank writes: a second job
    or process into ``out`` is refused, as one process is), kept open in ``lock``; every rank learns of a
    refusal through one broadcast and raises it, rather than wait in a collective.

    Raises:
        OutputError: another run holds ``out``, or it cannot be a folder written to (on every rank).
    """
    refused = None
    if dist.rank == 0:
        try:
            lock.enter_context(held(out, "sae.lock", "hookviz sae train"))
        except OutputError as exc:
            refused = str(exc)
        except OSError as exc:  # the lock cannot be written: said, never left to a collective to wait on
            refused = f"--out {out}: cannot write its lock ({exc.strerror}); choose another --out"
    refused = distributed.agree(refused)
    if refused is not None:
        raise _Refused(refused)


def _train(
    model: ModelOptions,
    inputs: tuple[list[str], bool],
    layer: str,
    settings: Any,
    out: Path,
    cache: Path | None,
    overwrite: bool,
    device: str,
    quiet: bool,
    as_json: bool,
) -> None:
    """One process's training (the whole of it, or a torchrun rank's share); rank 0 (or the one process)
    says the outcome."""
    lib = _library()
    items = read_inputs(*inputs)
    loaded = load_options(dataclasses.replace(model, device=device), quiet)
    done = lib.train_sae(loaded, items, layer, out, settings, overwrite=overwrite,
                         options=options_json(model), cache=cache)  # fmt: skip
    if not done.metrics:  # a torchrun rank other than 0
        return
    for note in done.notes if not quiet else []:
        typer.echo(f"hookviz: note: {note}", err=True)
    if done.skipped_inputs and not quiet:
        few = "; ".join(done.skipped_inputs[:3]) + ("; ..." if len(done.skipped_inputs) > 3 else "")
        typer.echo(
            f"hookviz: note: {len(done.skipped_inputs)} input(s) unreadable, left out: {few}", err=True
        )
    if as_json:
        typer.echo(to_json({"status": done.status, "out": str(out), **done.metrics}))
    if not quiet:
        if done.status == "skipped":
            typer.echo(f"skipped: {out} holds a finished dictionary (--overwrite trains again)", err=as_json)
        else:
            typer.echo(f"{done.status}: {out}; {lib.console(done.metrics)}", err=as_json)


def read_inputs(inputs: list[str], null: bool) -> list[Any]:
    """DATA's inputs as the other commands read them (``-``: paths on stdin, NUL-separated with ``--null``;
    refused under torchrun, where each rank has its own stdin); one line (exit 1) where none names a file.

    Raises:
        UsageError: ``-`` under torchrun.
        InputError: no input names a file (empty stdin, a missing folder).
    """
    if "-" in inputs and distributed.from_env() is not None:
        raise UsageError("reading paths from stdin is not supported under torchrun (each rank has its own "
                         "stdin); pass files, folders or globs")  # fmt: skip
    found: list[Any] = _library().expand_inputs(inputs, sys.stdin if "-" in inputs else None, null=null)
    errors = list(dict.fromkeys(item.error for item in found if item.error is not None))
    if len(errors) == len(found):
        raise InputError("; ".join(errors[:3] or ["no inputs were given"]) + "; nothing was done")
    return found


def _library() -> Any:
    """The library calls the commands use (imported on first use: torch stays out of ``--help``)."""
    from types import SimpleNamespace

    from hookviz.io.inputs import expand_inputs, refuse_out_among_inputs
    from hookviz.run.names import item_prefix
    from hookviz.sae import api, store, views
    from hookviz.sae.quality import console

    return SimpleNamespace(
        expand_inputs=expand_inputs, item_prefix=item_prefix, train_sae=api.train_sae, load_sae=api.load_sae,
        import_sae=api.import_sae, describe=views.describe, explain_photo=views.explain_photo,
        console=console, finished_config=store.finished_config,
        refuse_out_among_inputs=refuse_out_among_inputs,
    )  # fmt: skip


def _opened(model: ModelOptions, folder: Path, device: str, quiet: bool) -> tuple[Any, Any]:
    """The run folder's model (its options, those given again replacing them) and its dictionary; a folder
    holding no finished dictionary is refused before any model is loaded (or fetched) for it."""
    _library().finished_config(folder)
    loaded = load_options(dataclasses.replace(from_run(model, folder), device=device), quiet)
    return loaded, _library().load_sae(folder, loaded)


Top = Annotated[int, typer.Option("--top", "-k", min=1, help="top patches kept per feature.")]
Detail = Annotated[int, typer.Option("--detail", min=0, help="features given a sheet and their classes "
    "(by ablation): those firing most often.")]  # fmt: skip
SaeDir = Annotated[Path, typer.Option("--sae", help="the run folder of hookviz sae train.")]
Feature = Annotated[int | None, typer.Option("--feature", help="a feature to scale inside the forward pass: "
    "the class probabilities before and after.")]  # fmt: skip
Scale = Annotated[
    float, typer.Option("--scale", help="what --feature's code is multiplied by (0 ablates it).")
]
Strongest = Annotated[int, typer.Option("--strongest", min=1, help="features mapped over each photo.")]
ExplainOut = Annotated[Path, typer.Option("--out", "-o", help="output folder: a picture per photo, "
    "STEM-PATHHASH.MODEL.KEY.sae.png (KEY: 8 hex of the settings).")]  # fmt: skip
Replace = Annotated[bool, typer.Option("--overwrite", help="replace the pictures of an earlier run with "
    "these settings (else its photos are skipped).")]  # fmt: skip
RawMaps = Annotated[bool, typer.Option("--save-raw", help="also NAME.sae.npy: the maps upsampled to the "
    "photo, (features, height, width), zero outside the part the model saw.")]  # fmt: skip


@grouped
def features(
    folder: Annotated[Path, typer.Argument(help="the run folder of hookviz sae train.")],
    inputs: Inputs,
    model: PlainModel = ModelOptions(),
    top: Top = 8,
    detail: Detail = 32,
    batch_size: InputsBatch = 16,
    null: Null = False,
    device: Device = "auto",
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """Each feature of a dictionary over DATA: its top patches (input and box in the photo's pixels), its
    histogram and the classes it pushes (by ablation); DIR/features/features.json and a sheet per feature."""
    lib = _library()
    loaded, found = _opened(model, folder, device, quiet)
    data = lib.describe(found, loaded, read_inputs(inputs, null), folder, top=top, detail=detail,
                        batch=batch_size)  # fmt: skip
    if not quiet:
        live = sum(1 for f in data["features"] if f["fired"] > 0)
        sheets = sum(1 for f in data["features"] if "sheet" in f)
        typer.echo(f"{live} of {len(data['features'])} features fire over {data['inputs']} inputs; wrote "
                   f"{folder / 'features' / 'features.json'} and {sheets} sheets", err=True)  # fmt: skip
    for line in dict.fromkeys(data["skipped"]):  # one line per input left out, exit 1 as other commands
        typer.echo(f"hookviz: error: {line}", err=True)
    if data["skipped"]:
        raise typer.Exit(1)


@grouped
def explain(
    inputs: Inputs,
    sae: SaeDir,
    model: PlainModel = ModelOptions(),
    feature: Feature = None,
    scale: Scale = 0.0,
    strongest: Strongest = 3,
    out: ExplainOut = Path("out"),
    save_raw: RawMaps = False,
    overwrite: Replace = False,
    null: Null = False,
    device: Device = "auto",
    quiet: Quiet = False,
    as_json: JsonOut = False,
    debug: Debug = False,
) -> None:
    """Per photo, where its strongest features fire (their maps over the patch grid, upsampled onto the
    photo), and with --feature, the class probabilities when that feature is scaled (--scale 0 ablates it)
    inside the forward pass (an image-text model's embedding: its cosine to the unscaled one)."""
    finite_options(scale=scale)
    loaded, found = _opened(model, sae, device, quiet)
    if feature is not None and not 0 <= feature < found.shape.width:
        raise UsageError(f"--feature {feature}: the dictionary has features 0 to {found.shape.width - 1}")
    items = read_inputs(inputs, null)
    make_folder(out)  # a file or a read-only folder: one line, exit 3
    chosen = {"strongest": strongest, "feature": feature, "scale": scale, "save_raw": save_raw}
    which = {k: found.config.get(k) for k in ("fingerprint", "layer", "settings", "steps", "imported")}
    key = settings_key({**chosen, "sae": str(sae.resolve()), "of": which, "model": options_json(model)})
    if _explained(found, loaded, items, out, (key, chosen, overwrite), quiet, as_json):
        raise typer.Exit(1)


def _explained(found: Any, loaded: Any, items: list[Any], out: Path, how: tuple[str, dict[str, Any], bool],
               quiet: bool, as_json: bool) -> int:  # fmt: skip
    """Each photo explained into ``out`` (its files named as every command's outputs are, a photo whose
    picture for these settings is there skipped unless ``overwrite``), said; the number that failed."""
    lib, (key, chosen, overwrite), failed = _library(), how, 0
    for item in items:
        try:
            if item.error is not None:
                raise InputError(item.error)
            prefix = lib.item_prefix(item, loaded.name, key)
            if (out / f"{prefix}.sae.png").exists() and not overwrite:
                record = {"input": item.name, "status": "skipped", "picture": str(out / f"{prefix}.sae.png")}
            else:
                record = lib.explain_photo(found, loaded, item, out, prefix=prefix, **chosen)
        except InputError as e:  # one line, the other photos go on; exit 1 at the end
            typer.echo(f"hookviz: error: {str(e).replace(' or raise --max-pixels', '')}", err=True)
            failed += 1
            continue
        if as_json:
            typer.echo(to_json(record))
        if not quiet and record.get("status") == "skipped":
            typer.echo(f"{item.name}: skipped, {record['picture']} is there (--overwrite replaces it)",
                       err=as_json)  # fmt: skip
        elif not quiet:
            _said(item.name, record, as_json)
    return failed


def _said(name: str, record: dict[str, Any], as_json: bool) -> None:
    """One photo's strongest features and, with --feature, the classes before and after, on the console."""
    fired = ", ".join(f"{f['feature']} ({f['peak']:.3g})" for f in record["features"]) or "none"
    typer.echo(f"{name}: strongest features {fired}", err=as_json)
    scaled = record.get("scaled", {})
    if scaled and not scaled["active"]:
        typer.echo(f"  feature {scaled['feature']} is inactive on this photo: its top classes, unchanged",
                   err=as_json)  # fmt: skip
    for c in scaled.get("classes", []):
        typer.echo(f"  {c['name']}: {c['before']:.3f} -> {c['after']:.3f}", err=as_json)
    if scaled and not scaled["classes"]:
        typer.echo(f"  the model's output (no classes) at cosine {scaled['output_cosine']:.4f}", err=as_json)


Format = Annotated[str, typer.Option("--format", help="prisma (ViT-Prisma: a folder of config.json and "
    "weights.pt) or saev (saev's checkpoint file).")]  # fmt: skip


@grouped
def import_(
    path: Annotated[Path, typer.Argument(help="the SAE file or folder, local (nothing is downloaded).")],
    layer: Layer,
    fmt: Format,
    model: PlainModel = ModelOptions(),
    out: RunDir = Path("sae"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace a dictionary in --out.")] = False,
    device: Device = "auto",
    quiet: Quiet = False,
    debug: Debug = False,
) -> None:
    """A published ViT-Prisma or saev SAE of a layer, read from a local file into a run folder that features
    and explain take."""
    loaded = load_options(dataclasses.replace(model, device=device), quiet)
    found = _library().import_sae(path, fmt, loaded, layer, out, overwrite=overwrite)
    if not quiet:
        typer.echo(f"imported {path} ({found.shape.width} features of {found.shape.d}-wide vectors, k "
                   f"{found.shape.k}) into {out}", err=True)  # fmt: skip


def register(app: Any, flowing: Any) -> None:
    """``hookviz sae ...``: the group and its commands, their docstrings as flowing help."""
    for fn in (train, features, explain, import_):
        sae_app.command(fn.__name__.rstrip("_"), help=flowing(fn.__doc__))(fn)
    app.add_typer(sae_app, name="sae")
