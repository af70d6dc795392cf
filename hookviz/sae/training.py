"""Training a dictionary: the library's SAE fed blocks of vectors (from hooks, :mod:`hookviz.sae.vectors`, or
held in memory), seeded, checkpointed every so many steps (where in which block it stood) so that a killed run
resumes where it left off and ends with the dictionary an uninterrupted run gives. Under torchrun (a
``torch.distributed`` group of several ranks) every rank trains the same SAE on its own vectors, the gradients
averaged over the ranks at every step."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as td
from torch import Tensor, nn

from hookviz.errors import UsageError
from hookviz.sae import dictionary
from hookviz.sae.dictionary import Norm, Shape
from hookviz.sae.vectors import Block, Position

#: The largest count a setting may give (a 64-bit counter of vectors seen stays far from overflowing).
COUNT_LIMIT = 2**50


@dataclass(frozen=True)
class TrainSettings:
    """How a dictionary is trained (``hookviz sae train``'s options)."""

    arch: str = "topk"
    width: str = "8x"
    k: int = 32
    #: Training vectors in all (passes over the inputs repeat until this many were seen).
    vectors: int = 200_000
    batch: int = 1024
    lr: float = 4e-4
    seed: int = 0
    #: Vectors per shuffle block (the buffer's bound; all of an input's vectors go into one block).
    buffer: int = 16_384
    #: Blocks (``buffer`` vectors each) kept in memory over passes while all the inputs' vectors fit in them
    #: (no forward pass after the first); the same vectors either way, so not part of :meth:`key`.
    keep: int = 8
    #: Steps between checkpoints.
    checkpoint_every: int = 200
    #: A feature that fired on none of this many training vectors counts as dead (auxiliary loss).
    #: Default: a fifth of ``vectors``.
    dead_after: int | None = None
    #: Inputs per forward pass.
    inputs_batch: int = 16
    #: The share of the inputs held out of training (the last of them, in the order given) and measured on;
    #: 0 measures the quality on the first training inputs.
    eval: float = 0.0

    def steps(self) -> int:
        return math.ceil(self.vectors / self.batch)

    def dead_window(self) -> int:
        return self.dead_after if self.dead_after is not None else max(self.vectors // 5, self.batch)

    def key(self) -> dict[str, object]:
        """The settings that decide the dictionary (a run resumes only with the same)."""
        return {k: v for k, v in asdict(self).items() if k != "keep"}

    def check(self) -> None:
        """Refuse a count too large for the counters it feeds (64-bit tensors), before anything is computed
        or written.

        Raises:
            UsageError: one line naming the option and its bound.
        """
        for name, value in asdict(self).items():
            if isinstance(value, int) and not isinstance(value, bool) and value > COUNT_LIMIT:
                flag = {"inputs_batch": "batch-size", "dead_after": "dead-after"}.get(name, name)
                flag = flag.replace("_", "-")
                raise UsageError(f"--{flag} {value} is too large; give at most {COUNT_LIMIT}")
        if not 0 <= self.seed <= 2**32 - 1:
            raise UsageError(f"--seed {self.seed}: give a seed from 0 to 4294967295")


@dataclass
class Progress:
    """Where a training stands: steps taken, vectors seen (over every rank), the stream's position (where
    the block being trained on starts, and how many of its vectors were trained on), and per feature how many
    vectors went by since it last fired."""

    step: int = 0
    seen: int = 0
    position: Position = field(default_factory=Position)
    since_fired: Tensor | None = None
    offset: int = 0
    #: The last step's loss (a tensor: reading it would wait for the device at every step).
    loss: Tensor | None = None


def new_sae(shape: Shape, seed: int, device: torch.device | str) -> nn.Module:
    """The library's SAE, its initial weights seeded; the encoder starts as the dictionary's transpose (as
    Gao et al. and the library's ``untied`` do)."""
    torch.manual_seed(seed)
    sae = dictionary.build(shape, device)
    with torch.no_grad():
        atoms = dictionary.dictionary_of(sae)
        sae.encoder.final_block[0].weight.copy_(atoms)  # type: ignore[index, union-attr]
        sae.encoder.final_block[0].bias.zero_()  # type: ignore[index, union-attr]
    return sae.train()


def optimiser(sae: nn.Module, settings: TrainSettings) -> torch.optim.Optimizer:
    return torch.optim.Adam(sae.parameters(), lr=settings.lr, betas=(0.9, 0.999))


def step(
    sae: nn.Module, shape: Shape, opt: torch.optim.Optimizer, x: Tensor, progress: Progress, dead_after: int
) -> None:
    """One optimiser step on normalised vectors ``x``."""
    assert progress.since_fired is not None
    dictionary.batch_k(sae, shape, x.shape[0])
    loss, z = dictionary.loss(sae, shape, x, progress.since_fired, dead_after)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    fired, n = averaged(sae, (z.detach() > 0).any(0), x.shape[0])
    torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
    opt.step()
    progress.since_fired += n
    progress.since_fired[fired] = 0
    progress.step += 1
    progress.seen += n
    progress.loss = loss.detach()


def world() -> int:
    """The number of ranks training together (1 outside torchrun)."""
    return td.get_world_size() if td.is_available() and td.is_initialized() else 1


def averaged(sae: nn.Module, fired: Tensor, n: int) -> tuple[Tensor, int]:
    """Under torchrun, in one all-reduce: the gradients averaged over the ranks (every rank then takes the
    same step), the features that fired on any rank, the vectors of the step on all of them; else as given."""
    if world() == 1:
        return fired, n
    params = list(sae.parameters())
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [fired.to(grads[0].dtype), grads[0].new_tensor([n])])
    td.all_reduce(flat)
    at = 0
    for p, g in zip(params, grads, strict=True):
        p.grad = (flat[at : at + g.numel()].reshape(g.shape) / world()).to(g.dtype)
        at += g.numel()
    return flat[at : at + fired.numel()] > 0, int(flat[-1].item())


def run_blocks(
    sae: nn.Module,
    shape: Shape,
    norm: Norm,
    opt: torch.optim.Optimizer,
    blocks: Iterable[Block],
    settings: TrainSettings,
    progress: Progress,
    save: Callable[[Progress], None] | None = None,
    tick: Callable[[Progress], None] | None = None,
) -> Progress:
    """Train on ``blocks`` until ``settings.vectors`` vectors were trained on (each rank at most ``batch /
    world`` vectors a step; a block's last step takes what is left of it, so the steps may be more than
    ``settings.steps()``); ``save`` is called every ``checkpoint_every`` steps. The first block, where
    ``progress`` stands inside one (a resumed run's), is trained on from its ``offset``."""
    total, dead_after = settings.vectors, settings.dead_window()
    device = next(sae.parameters()).device
    if progress.since_fired is None:
        progress.since_fired = torch.zeros(shape.width, dtype=torch.long, device=device)
    batch = max(1, settings.batch // world())
    sae.train()
    for block in blocks:
        skip = progress.offset if block.start == progress.position else 0
        progress.position, progress.offset = block.start, skip
        x = norm.apply(block.vectors[skip:].to(device, torch.float32, non_blocking=True))
        for i in range(0, x.shape[0], batch):
            if progress.seen >= total:
                break
            step(sae, shape, opt, x[i : i + batch], progress, dead_after)
            progress.offset = skip + min(i + batch, x.shape[0])
            if tick is not None:
                tick(progress)
            if save is not None and progress.step % settings.checkpoint_every == 0 and progress.seen < total:
                check_finite(sae, progress)  # a diverged dictionary is never checkpointed
                save(progress)
        if progress.seen >= total:
            break
        progress.position, progress.offset = block.after, 0
    check_finite(sae, progress)
    sae.eval()
    return progress


class Diverged(UsageError):
    """The training's loss or weights are no longer finite (too high a learning rate)."""


def check_finite(sae: nn.Module, progress: Progress) -> None:
    """One line (exit 2) where the training diverged: its loss or its weights are no longer finite.

    Raises:
        Diverged: the loss or a weight is NaN or infinite.
    """
    loss = progress.loss
    bad = loss is not None and not bool(torch.isfinite(loss).all())
    if bad or not all(bool(torch.isfinite(p).all()) for p in sae.parameters()):
        raise Diverged(f"the training diverged by step {progress.step} (its loss is no longer finite): "
                         "nothing was trained; lower --lr and rerun")  # fmt: skip


def in_memory(x: Tensor, batch: int, seed: int) -> Iterator[Block]:
    """Blocks over vectors held in memory (each pass a seeded permutation of all of them)."""
    epoch = 0
    while True:
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        yield Block(x[torch.randperm(x.shape[0], generator=g)], Position(epoch + 1, 0), 0, Position(epoch, 0))
        epoch += 1


def train_vectors(x: Tensor, shape: Shape, settings: TrainSettings) -> tuple[nn.Module, Norm, Progress]:
    """A dictionary of vectors ``x`` ``(N, d)`` held in memory (the tests' planted dictionary)."""
    norm = Norm.fit(x)
    sae = new_sae(shape, settings.seed, x.device)
    opt = optimiser(sae, settings)
    progress = run_blocks(
        sae, shape, norm, opt, in_memory(x, settings.batch, settings.seed), settings, Progress()
    )
    return sae, norm, progress


def checkpoint_state(
    sae: nn.Module, opt: torch.optim.Optimizer, norm: Norm, progress: Progress
) -> dict[str, object]:
    assert progress.since_fired is not None
    return {
        "sae": {k: v.detach().cpu() for k, v in sae.state_dict().items()},
        "extra": {k: v.cpu() for k, v in dictionary.extra_state(sae).items()},
        "opt": opt.state_dict(),
        "norm_mean": norm.mean.cpu(),
        "norm_scale": norm.scale,
        "step": progress.step,
        "seen": progress.seen,
        "epoch": progress.position.epoch,
        "index": progress.position.index,
        "offset": progress.offset,
        "since_fired": progress.since_fired.cpu(),
    }


def restore(state: dict[str, object], sae: nn.Module, opt: torch.optim.Optimizer) -> tuple[Norm, Progress]:
    """The norm and progress of a checkpoint, its weights and optimiser state put into ``sae`` and ``opt``."""
    device = next(sae.parameters()).device
    sae.load_state_dict(state["sae"])  # type: ignore[arg-type]
    dictionary.load_extra(sae, {k: v.to(device) for k, v in state["extra"].items()})  # type: ignore[attr-defined]
    opt.load_state_dict(state["opt"])  # type: ignore[arg-type]
    norm = Norm(state["norm_mean"], float(state["norm_scale"]))  # type: ignore[arg-type]
    since = state["since_fired"].to(device)  # type: ignore[attr-defined]
    position = Position(int(state["epoch"]), int(state["index"]))  # type: ignore[call-overload]
    offset = int(state.get("offset", 0))  # type: ignore[call-overload]
    return norm, Progress(int(state["step"]), int(state["seen"]), position, since, offset)  # type: ignore[call-overload]


def fit_norm(x: Tensor) -> Norm:
    """The normalisation of the first block's vectors; under torchrun, of every rank's first block (their
    sums all-reduced), the same on each."""
    if world() == 1:
        return Norm.fit(x)
    stats = torch.cat([x.sum(0), x.new_tensor([x.shape[0]])])
    td.all_reduce(stats)
    mean = stats[:-1] / stats[-1]
    sq = torch.cat([(x - mean).square().sum().reshape(1), x.new_tensor([x.shape[0]])])
    td.all_reduce(sq)
    return Norm(mean.detach().clone(), float((x.shape[1] / (sq[0] / sq[1]).clamp_min(1e-12)).sqrt()))


def gathered(value: list[int]) -> list[list[int]]:
    """``value`` of every rank, in rank order (``[value]`` outside torchrun)."""
    if world() == 1:
        return [value]
    out: list[Any] = [None] * world()
    td.all_gather_object(out, value)
    return [list(v) for v in out]


def check_same(sae: nn.Module) -> None:
    """Under torchrun: that every rank ends with the same weights (its gradients were averaged with the
    others' at every step); a RuntimeError naming the gap where they differ."""
    if world() == 1:
        return
    flat = torch.cat([p.detach().reshape(-1) for p in sae.parameters()])
    hi, lo = flat.clone(), flat.clone()
    td.all_reduce(hi, op=td.ReduceOp.MAX)
    td.all_reduce(lo, op=td.ReduceOp.MIN)
    gap = float((hi - lo).abs().max())
    if gap > 1e-5:
        raise RuntimeError(
            f"the ranks' dictionaries differ by up to {gap:.3g}: their steps were not the same"
        )
