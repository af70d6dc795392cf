"""``hookviz sae train`` as a library call: a dictionary of a layer trained from live hooks over inputs into a
run folder, resumed from its checkpoint, refused over another model's folder, measured at the end."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hookviz.errors import UsageError
from hookviz.io.files import atomic_write
from hookviz.io.images import DEFAULT_MAX_PIXELS
from hookviz.io.inputs import Item
from hookviz.models.loaded import LoadedModel
from hookviz.sae import dictionary, interchange, quality, store, training
from hookviz.sae.dictionary import Norm, Shape
from hookviz.sae.store import CHECKPOINT, CONFIG, METRICS, WEIGHTS, Trained
from hookviz.sae.training import Progress, TrainSettings
from hookviz.sae.vectors import Position, layer_output, read_batch, site_layout, stream, to_vectors

#: Inputs the quality is measured over (the first of the inputs' seeded order).
EVAL_INPUTS = 64


@dataclass
class Outcome:
    """What a training run did: ``trained``, ``resumed`` or ``skipped`` (finished before), and its figures."""

    status: str
    folder: Path
    metrics: dict[str, Any]
    skipped_inputs: list[str]


def _batches(
    loaded: LoadedModel, items: Sequence[Item], size: int, skipped: list[str]
) -> Iterator[torch.Tensor]:
    for i in range(0, len(items), size):
        x = read_batch(items[i : i + size], loaded.preprocess, DEFAULT_MAX_PIXELS, skipped)
        if x is not None:
            yield x


def _probe(loaded: LoadedModel, items: Sequence[Item]) -> torch.Tensor:
    for item in items:
        x = read_batch([item], loaded.preprocess, DEFAULT_MAX_PIXELS, [])
        if x is not None:
            return x.to(loaded.device)
    raise UsageError("no input could be read: give a folder, files or a table of photos")


def held_out(items: Sequence[Item], share: float) -> tuple[Sequence[Item], Sequence[Item]]:
    """The training inputs and those held out for the quality: the last ``share`` of ``items`` (at least one
    where ``share`` > 0); one line (exit 2) where none would be left to train on."""
    if not 0 <= share < 1:
        raise UsageError(f"--eval {share}: give a share of the inputs from 0 to below 1 (0.1: a tenth)")
    n = max(round(share * len(items)), 1) if share > 0 else 0
    if n >= len(items):
        raise UsageError(f"--eval {share} holds out all {len(items)} inputs; give more or a lower share")
    return items[: len(items) - n], items[len(items) - n :]


def _prepare(folder: Path, config: dict[str, Any], overwrite: bool) -> str:
    """``new``, ``resume`` or ``finished`` for a run folder, after refusing one that holds another model's
    dictionary or other settings (``overwrite`` clears it instead)."""
    old = store.read_config(folder)
    if old is None:
        return "new"
    store.check_model(old, folder, config["fingerprint"])
    if overwrite:
        for name in (CHECKPOINT, WEIGHTS, METRICS, CONFIG):
            (folder / name).unlink(missing_ok=True)
        shutil.rmtree(folder / "features", ignore_errors=True)
        return "new"
    same = all(old.get(key) == config[key] for key in ("layer", "arch", "d", "width", "k", "settings"))
    if not same:
        raise UsageError(f"{folder} holds a dictionary trained with other settings; give another --out, or "
                         "--overwrite to train again there")  # fmt: skip
    return "finished" if old.get("status") == "finished" else "resume"


def train_sae(
    loaded: LoadedModel,
    items: Sequence[Item],
    layer: str,
    folder: Path,
    settings: TrainSettings = TrainSettings(),
    *,
    overwrite: bool = False,
    tick: Callable[[Progress], None] | None = None,
    options: dict[str, Any] | None = None,
) -> Outcome:
    """Train a dictionary of ``layer`` over ``items`` into ``folder`` (resuming a checkpoint there);
    ``options``, the model options it was given (``hookviz sae features`` and ``explain`` reuse them), go into
    its config.json."""
    model, device = loaded.model.eval(), loaded.device
    items, held = held_out(items, settings.eval)
    layout = site_layout(model, layer, _probe(loaded, items))
    d = int(to_vectors(layer_output(model, layer, _probe(loaded, items)), layout).shape[1])
    shape = Shape(settings.arch, d, dictionary.parse_width(settings.width, d), settings.k)
    shape.check()
    config = {
        "format": store.FORMAT, "model": loaded.name, "weights": loaded.weights,
        "fingerprint": store.fingerprint(model), "layer": layer, "layout": store.layout_json(layout),
        **dictionary.summary(shape), "settings": settings.key(), "versions": _versions(),
        "status": "training", "options": options,
    }  # fmt: skip
    state = _prepare(folder, config, overwrite)
    if state == "finished":
        return Outcome("skipped", folder, store.read_json(folder / METRICS), [])
    folder.mkdir(parents=True, exist_ok=True)
    skipped: list[str] = []
    sae = training.new_sae(shape, settings.seed, device)
    opt = training.optimiser(sae, settings)
    checkpoint = store.load_checkpoint(folder) if state == "resume" else None
    start, norm, progress = Position(), None, Progress()
    if checkpoint is not None:
        norm, progress = training.restore(checkpoint, sae, opt)
        start = progress.position

    def vectors_of(x: torch.Tensor) -> torch.Tensor:
        return to_vectors(layer_output(model, layer, x.to(device)), layout)

    def read(chunk: Sequence[Item]) -> torch.Tensor | None:
        return read_batch(chunk, loaded.preprocess, DEFAULT_MAX_PIXELS, skipped)

    blocks = stream(vectors_of, items, read, seed=settings.seed, buffer=settings.buffer,
                    batch=settings.inputs_batch, start=start)  # fmt: skip
    if norm is None:
        first = next(blocks)
        norm = Norm.fit(first.vectors.float())
        blocks = _chain(first, blocks)
    config["norm"] = {"scale": norm.scale}
    store.write_json(folder / CONFIG, config)
    fitted = norm

    def save(p: Progress) -> None:
        store.save_checkpoint(folder, training.checkpoint_state(sae, opt, fitted, p))

    progress = training.run_blocks(sae, shape, norm, opt, blocks, settings, progress, save, tick)
    store.save_weights(folder, sae, norm)
    found = Trained(sae, shape, norm, layer, layout, config)
    ordered = (held or items)[:EVAL_INPUTS]
    metrics = quality.evaluate(
        model, found, _batches(loaded, ordered, settings.inputs_batch, skipped), device
    )
    on = {"evaluated_on": "held_out" if held else "training", "held_out_inputs": len(held)}
    metrics = {**metrics, **on, "steps": progress.step, "training_vectors": progress.seen}
    store.write_json(folder / METRICS, metrics)
    store.write_json(folder / CONFIG, {**config, "status": "finished", "steps": progress.step})
    (folder / CHECKPOINT).unlink(missing_ok=True)
    return Outcome("resumed" if checkpoint is not None else "trained", folder, metrics, skipped)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _versions() -> dict[str, str]:
    return {name: dictionary.package_version(name) for name in ("hookviz", "torch", "overcomplete")}


def load_sae(folder: Path, loaded: LoadedModel) -> Trained:
    """A finished run folder's dictionary for ``loaded``'s model (refused for another model's folder)."""
    found = store.load(folder, loaded.device)
    store.check_model(found.config, folder, store.fingerprint(loaded.model))
    return found


def import_sae(
    path: Path, kind: str, loaded: LoadedModel, layer: str, folder: Path, *, overwrite: bool = False
) -> Trained:
    """A ViT-Prisma (``kind`` ``prisma``) or saev (``saev``) SAE file as a run folder of ``layer`` of
    ``loaded``'s model; refused where its width is not the layer's."""
    from safetensors.torch import save

    readers = {"prisma": interchange.read_prisma, "saev": interchange.read_saev}
    if kind not in readers:
        raise UsageError(f"--format {kind}: choose prisma or saev")
    if (folder / CONFIG).exists() and not overwrite:
        raise UsageError(f"{folder} holds a dictionary already; --overwrite replaces it")
    shape, tensors = interchange.to_library(*readers[kind](path))
    probe = torch.zeros((1, *loaded.input_shape), device=loaded.device)
    layout = site_layout(loaded.model, layer, probe)
    d = int(to_vectors(layer_output(loaded.model, layer, probe), layout).shape[1])
    if d != shape.d:
        raise UsageError(
            f"{path}: an SAE of {shape.d}-wide vectors; layer {layer!r} gives {d}; pick its layer"
        )
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "format": store.FORMAT, "model": loaded.name, "weights": loaded.weights,
        "fingerprint": store.fingerprint(loaded.model), "layer": layer, "layout": store.layout_json(layout),
        **dictionary.summary(shape), "norm": {"scale": 1.0}, "versions": _versions(), "status": "finished",
        "imported": {"format": kind, "file": str(path)},
    }  # fmt: skip
    atomic_write(folder / WEIGHTS, save(tensors))
    store.write_json(folder / CONFIG, config)
    return store.load(folder, loaded.device)
