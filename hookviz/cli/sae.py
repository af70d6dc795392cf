"""What a layer has learned: ``hookviz sae train`` (a sparse dictionary of a layer's activations, from live
hooks), ``hookviz sae features`` (each feature's top patches, histogram and classes) and ``hookviz sae explain``
(where a photo's features fire, and what a feature does to the class probabilities)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from hookviz.cli.flags import Device, Inputs, Quiet
from hookviz.cli.loading import load_options
from hookviz.cli.options import ModelOptions, PlainModel, grouped

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
InputsBatch = Annotated[int, typer.Option("--batch-size", "-b", min=1, help="inputs per forward pass.")]
RunDir = Annotated[Path, typer.Option("--out", "-o", help="the run folder: config.json, sae.safetensors, "
    "metrics.json (checkpoint.pt while training).")]  # fmt: skip
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
    checkpoint_every: Every = 200,
    batch_size: InputsBatch = 16,
    out: RunDir = Path("sae"),
    overwrite: Again = False,
    device: Device = "auto",
    quiet: Quiet = False,
    as_json: JsonOut = False,
) -> None:
    """Train a sparse dictionary of a layer's activations over DATA (photos, folders, globs, shards), streamed
    from forward hooks; resumable; metrics.json and the console give its quality."""
    from hookviz.io.inputs import expand_inputs
    from hookviz.sae.api import train_sae
    from hookviz.sae.quality import console
    from hookviz.sae.training import TrainSettings

    settings = TrainSettings(arch=arch, width=width, k=k, vectors=vectors, batch=batch, lr=lr, seed=seed,
                             buffer=buffer, checkpoint_every=checkpoint_every, inputs_batch=batch_size)  # fmt: skip
    loaded = load_options(dataclasses.replace(model, device=device), quiet)
    items = expand_inputs(inputs)
    done = train_sae(loaded, items, layer, out, settings, overwrite=overwrite)
    if done.skipped_inputs and not quiet:
        typer.echo(f"hookviz: note: {len(done.skipped_inputs)} input(s) unreadable, e.g. "
                   f"{done.skipped_inputs[0]}", err=True)  # fmt: skip
    if as_json:
        typer.echo(json.dumps({"status": done.status, "out": str(out), **done.metrics}))
    if not quiet:
        if done.status == "skipped":
            typer.echo(f"skipped: {out} holds a finished dictionary (--overwrite trains again)", err=as_json)
        else:
            typer.echo(f"{done.status}: {out}; {console(done.metrics)}", err=as_json)


def register(app: Any, flowing: Any) -> None:
    """``hookviz sae ...``: the group and its commands, their docstrings as flowing help."""
    for fn in (train,):
        sae_app.command(help=flowing(fn.__doc__))(fn)
    app.add_typer(sae_app, name="sae")
