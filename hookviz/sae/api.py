"""``hookviz sae train`` as a library call: a dictionary of a layer trained from live hooks over inputs into a
run folder, resumed from its checkpoint, refused over another model's folder, measured at the end."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as td

from hookviz.core.layout import Layout
from hookviz.errors import UsageError
from hookviz.io.files import atomic_write
from hookviz.io.images import DEFAULT_MAX_PIXELS
from hookviz.io.inputs import Item
from hookviz.models.loaded import LoadedModel
from hookviz.sae import dictionary, interchange, quality, store, training
from hookviz.sae.cache import Kept, Prefetched, Shards, cache_key, cached, code_digest, identity
from hookviz.sae.dictionary import Norm, Shape
from hookviz.sae.store import CHECKPOINT, CONFIG, METRICS, WEIGHTS, Trained
from hookviz.sae.training import Progress, TrainSettings
from hookviz.sae.vectors import (
    Position,
    Source,
    from_model,
    layer_output,
    read_batch,
    read_each,
    site_layout,
    stream,
    to_vectors,
)

#: Inputs the quality is measured over (the first of the inputs' seeded order).
EVAL_INPUTS = 64


@dataclass
class Outcome:
    """What a training run did: ``trained``, ``resumed`` or ``skipped`` (finished before), and its figures."""

    status: str
    folder: Path
    metrics: dict[str, Any]
    skipped_inputs: list[str]
    #: What the console should say besides (an unreadable checkpoint removed).
    notes: list[str] = field(default_factory=list)


def _batches(
    loaded: LoadedModel, items: Sequence[Item], size: int, skipped: list[str]
) -> Iterator[torch.Tensor]:
    for i in range(0, len(items), size):
        x = read_batch(items[i : i + size], loaded.preprocess, DEFAULT_MAX_PIXELS, skipped)
        if x is not None:
            yield x


def _probe(loaded: LoadedModel, items: Sequence[Item]) -> tuple[int, torch.Tensor]:
    for place, item in enumerate(items):
        x = read_batch([item], loaded.preprocess, DEFAULT_MAX_PIXELS, [])
        if x is not None:
            return place, x.to(loaded.device)
    raise UsageError("no input could be read: give a folder, files or a table of photos")


@dataclass
class Site:
    """The layer's layout, the vectors' size, and the first readable input's place and vectors (the probe
    the cache checks its shards against)."""

    layout: Layout
    d: int
    place: int
    vectors: torch.Tensor


def _site(loaded: LoadedModel, layer: str, items: Sequence[Item]) -> Site:
    """The layer's layout and the vectors' size, from the first readable input."""
    place, x = _probe(loaded, items)
    layout = site_layout(loaded.model, layer, x)
    v = to_vectors(layer_output(loaded.model, layer, x), layout)
    return Site(layout, int(v.shape[1]), place, v)


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
    if old.get("status") != "finished":
        return "resume"
    store.weights_of(folder)  # a finished run whose dictionary was cut short: one line naming the fix
    return "finished"


def train_sae(
    loaded: LoadedModel,
    items: Sequence[Item],
    layer: str,
    folder: str | os.PathLike[str],
    settings: TrainSettings = TrainSettings(),
    *,
    overwrite: bool = False,
    tick: Callable[[Progress], None] | None = None,
    options: dict[str, Any] | None = None,
    cache: str | os.PathLike[str] | None = None,
) -> Outcome:
    """Train a dictionary of ``layer`` over ``items`` into ``folder`` (resuming a checkpoint there).

    Args:
        loaded: the model.
        items: the inputs (the last ``settings.eval`` share held out and measured on).
        layer: the layer whose output is the vectors.
        folder: the run folder.
        settings: how to train.
        overwrite: train again over a finished run.
        tick: called after every step.
        options: the model options it was given (``hookviz sae features`` and ``explain`` reuse them), kept
            in its config.json.
        cache: a folder where each input's vectors are written once and read by later passes and runs.

    Under torchrun (``torch.distributed`` initialised with several ranks) every rank calls it: each trains
    on its share of the inputs, the gradients averaged at every step; rank 0 writes the run folder."""
    model, device = loaded.model.eval(), loaded.device
    folder, cache = Path(folder), None if cache is None else Path(cache)
    settings.check()
    if settings.buffer < settings.batch:
        raise UsageError(f"--buffer {settings.buffer} is below --batch {settings.batch}: a block must hold a "
                         f"step's vectors; give --buffer {settings.batch} or more")  # fmt: skip
    items, held = held_out(items, settings.eval)
    site = _site(loaded, layer, items)
    layout, d = site.layout, site.d
    shape = Shape(settings.arch, d, dictionary.parse_width(settings.width, d), settings.k)
    shape.check()
    config = {
        "format": store.FORMAT, "model": loaded.name, "weights": loaded.weights,
        "fingerprint": store.fingerprint(model), "layer": layer, "layout": store.layout_json(layout),
        **dictionary.summary(shape), "settings": settings.key(), "versions": _versions(),
        "status": "training", "options": options,
    }  # fmt: skip
    state = _agreed(lambda: _prepare(folder, config, overwrite))
    if state == "finished":
        return Outcome("skipped", folder, store.read_json(folder / METRICS), [])
    folder.mkdir(parents=True, exist_ok=True)
    skipped: list[str] = []
    sae = training.new_sae(shape, settings.seed, device)
    opt = training.optimiser(sae, settings)
    notes: list[str] = []
    checkpoint = store.load_checkpoint(folder, notes) if state == "resume" else None
    sources = _source(loaded, layer, site, items, skipped, settings, cache, config["fingerprint"])
    try:
        progress, norm = _trained(
            sae, shape, opt, sources, len(items), settings, checkpoint, folder, config, tick
        )
    except training.Diverged:  # nothing of it kept: a rerun with a lower --lr starts afresh
        _forget(folder)
        raise
    if _rank() != 0:
        return Outcome("trained", folder, {}, list(dict.fromkeys(skipped)))
    found = Trained(sae, shape, norm, layer, layout, config)
    ordered = (held or items)[:EVAL_INPUTS]
    metrics = quality.evaluate(
        model, found, _batches(loaded, ordered, settings.inputs_batch, skipped), device
    )
    _check_converged(folder, metrics.get("explained_variance"))
    on = {"evaluated_on": "held_out" if held else "training", "held_out_inputs": len(held)}
    metrics = {**metrics, **on, "steps": progress.step, "training_vectors": progress.seen}
    if checkpoint is not None:
        metrics["resumed_from_step"] = int(checkpoint["step"])
    store.write_json(folder / METRICS, metrics)
    store.write_json(folder / CONFIG, {**config, "status": "finished", "steps": progress.step})
    (folder / CHECKPOINT).unlink(missing_ok=True)
    once = list(dict.fromkeys(skipped))  # each pass reads the inputs again: each named once
    return Outcome("resumed" if checkpoint is not None else "trained", folder, metrics, once, notes)


#: An explained variance below it: the reconstruction is off by over 100 times the vectors' own variance, a
#: training that diverged (too high a learning rate), not a dictionary.
DIVERGED = -100.0


def _check_converged(folder: Path, explained: Any) -> None:
    """One line (exit 2), the run folder's files removed, where the training diverged.

    Raises:
        Diverged: the explained variance is not a number or below :data:`DIVERGED`.
    """
    if isinstance(explained, float) and math.isfinite(explained) and explained >= DIVERGED:
        return
    _forget(folder)
    said = f"{explained:.3g}" if isinstance(explained, float) else explained
    raise training.Diverged(f"the training diverged (explained variance {said}): nothing was "
                            "trained; lower --lr and rerun")  # fmt: skip


def _forget(folder: Path) -> None:
    """A diverged run's files removed (rank 0), so that no command takes it for a dictionary."""
    if _rank() == 0:
        for name in (CHECKPOINT, WEIGHTS, CONFIG):
            (folder / name).unlink(missing_ok=True)


def _rank() -> int:
    return td.get_rank() if training.world() > 1 else 0


def _agreed(decide: Callable[[], str]) -> str:
    """``decide()`` on rank 0 only (it may clear the folder), its answer or its usage error on every rank."""
    if training.world() == 1:
        return decide()
    box: list[Any] = [None]
    if _rank() == 0:
        try:
            box = [("ok", decide())]
        except UsageError as e:
            box = [("error", str(e))]
    td.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise UsageError(value)
    return str(value)


def _source(
    loaded: LoadedModel,
    layer: str,
    site: Site,
    items: Sequence[Item],
    skipped: list[str],
    settings: TrainSettings,
    cache: Path | None,
    fingerprint: str,
) -> tuple[Source, Shards | None]:
    """The vectors of ``items`` by place: kept in memory while they all fit, read from ``cache`` where it
    holds them, else the inputs read and run through the model up to ``layer`` (together). The cache is
    keyed by the weights' ``fingerprint`` and the model's code (:func:`code_digest`), its shards checked
    against the probe's vectors run now."""
    model, device, layout = loaded.model, loaded.device, site.layout

    def vectors_of(x: torch.Tensor) -> torch.Tensor:
        return to_vectors(layer_output(model, layer, x.to(device, non_blocking=True)), layout)

    def read(places: Sequence[int]) -> list[torch.Tensor | None]:
        return read_each([items[i] for i in places], loaded.preprocess, DEFAULT_MAX_PIXELS, skipped)

    shards = None
    if cache is not None:
        inputs = [identity(item) for item in items]
        model_key = f"{fingerprint}+{code_digest(model)}"
        shards = Shards(cache, cache_key(model_key, layer, loaded.preprocess, inputs), _rank())
        shards.agrees(site.place, site.vectors)
    return cached(from_model(vectors_of, read), Kept(settings.keep * settings.buffer), shards), shards


def _mine(source: Source, n: int) -> tuple[Source, int]:
    """This rank's share of the inputs (every ``world``-th, from its rank on) as a source of its own."""
    world, rank = training.world(), _rank()
    if world == 1:
        return source, n
    places = list(range(rank, n, world))
    return (lambda chosen: source([places[i] for i in chosen])), len(places)


def _trained(
    sae: torch.nn.Module,
    shape: Shape,
    opt: torch.optim.Optimizer,
    sources: tuple[Source, Shards | None],
    n: int,
    settings: TrainSettings,
    checkpoint: dict[str, Any] | None,
    folder: Path,
    config: dict[str, Any],
    tick: Callable[[Progress], None] | None,
) -> tuple[Progress, Norm]:
    """The steps over the stream of vectors (read ahead by a thread), checkpointed; rank 0 writes the
    config (with the normalisation) and, at the end, the weights."""
    norm, progress = None, Progress()
    if checkpoint is not None:
        norm, progress = training.restore(checkpoint, sae, opt)
        progress = _ranks_place(checkpoint, progress)
    source, n = _mine(sources[0], n)
    seed = settings.seed + 1_000_003 * _rank()
    blocks = stream(source, n, seed=seed, buffer=settings.buffer, batch=settings.inputs_batch,
                    start=progress.position)  # fmt: skip
    ahead = Prefetched(blocks)
    try:
        it = iter(ahead)
        if norm is None:
            first = next(it)
            norm = training.fit_norm(first.vectors.float())
            it = _chain(first, it)
        if _rank() == 0:
            store.write_json(folder / CONFIG, {**config, "norm": {"scale": norm.scale}})
        fitted = norm

        def save(p: Progress) -> None:
            state = training.checkpoint_state(sae, opt, fitted, p)
            state["ranks"] = training.gathered([p.position.epoch, p.position.index, p.offset])
            if _rank() == 0:
                store.save_checkpoint(folder, state)

        progress = training.run_blocks(sae, shape, norm, opt, it, settings, progress, save, tick)
    finally:
        ahead.close()
        if sources[1] is not None:
            sources[1].flush()
    training.check_same(sae)
    if _rank() == 0:
        store.save_weights(folder, sae, norm)
    config["norm"] = {"scale": norm.scale}
    return progress, norm


def _ranks_place(checkpoint: dict[str, Any], progress: Progress) -> Progress:
    """This rank's place in the stream from a checkpoint (written by as many ranks; one line else)."""
    ranks = checkpoint.get("ranks") or [[progress.position.epoch, progress.position.index, progress.offset]]
    if len(ranks) != training.world():
        raise UsageError(
            f"the checkpoint was written by {len(ranks)} process(es), this run has {training.world()}: "
            "resume with as many (torchrun --nproc-per-node), or --overwrite"
        )
    epoch, index, offset = (int(v) for v in ranks[_rank()])
    progress.position, progress.offset = Position(epoch, index), offset
    return progress


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _versions() -> dict[str, str]:
    return {name: dictionary.package_version(name) for name in ("hookviz", "torch", "overcomplete")}


def load_sae(folder: str | os.PathLike[str], loaded: LoadedModel) -> Trained:
    """A finished run folder's dictionary for ``loaded``'s model (refused for another model's folder)."""
    folder = Path(folder)
    found = store.load(folder, loaded.device)
    store.check_model(found.config, folder, store.fingerprint(loaded.model))
    return found


def import_sae(
    path: str | os.PathLike[str],
    kind: str,
    loaded: LoadedModel,
    layer: str,
    folder: str | os.PathLike[str],
    *,
    overwrite: bool = False,
) -> Trained:
    """A ViT-Prisma (``kind`` ``prisma``) or saev (``saev``) SAE file as a run folder of ``layer`` of
    ``loaded``'s model; refused where its width is not the layer's."""
    from safetensors.torch import save

    path, folder = Path(path), Path(folder)
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
