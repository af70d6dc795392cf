"""Training a dictionary: the library's SAE fed blocks of vectors (from hooks, :mod:`hookviz.sae.vectors`, or
held in memory), seeded, checkpointed at block ends so that a killed run resumes where it left off and ends
with the dictionary an uninterrupted run gives."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from hookviz.sae import dictionary
from hookviz.sae.dictionary import Norm, Shape
from hookviz.sae.vectors import Block, Position


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
    #: Steps between checkpoints (taken at the end of the block where they are due).
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
        return asdict(self)


@dataclass
class Progress:
    """Where a training stands: steps taken, vectors seen, the stream's position, and per feature how many
    vectors went by since it last fired."""

    step: int = 0
    seen: int = 0
    position: Position = field(default_factory=Position)
    since_fired: Tensor | None = None
    losses: list[float] = field(default_factory=list)


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
    torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
    opt.step()
    fired = (z.detach() > 0).any(0)
    progress.since_fired += x.shape[0]
    progress.since_fired[fired] = 0
    progress.step += 1
    progress.seen += x.shape[0]
    progress.losses.append(float(loss.detach()))


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
    """Train on ``blocks`` until ``settings.steps()`` steps were taken; ``save`` is called at the end of a
    block where a checkpoint is due."""
    total, dead_after = settings.steps(), settings.dead_window()
    device = next(sae.parameters()).device
    if progress.since_fired is None:
        progress.since_fired = torch.zeros(shape.width, dtype=torch.long, device=device)
    saved_at = progress.step
    sae.train()
    for block in blocks:
        x = norm.apply(block.vectors.to(device, torch.float32))
        for i in range(0, x.shape[0], settings.batch):
            if progress.step >= total:
                break
            step(sae, shape, opt, x[i : i + settings.batch], progress, dead_after)
            if tick is not None:
                tick(progress)
        progress.position = block.after
        if progress.step >= total:
            break
        if save is not None and progress.step - saved_at >= settings.checkpoint_every:
            save(progress)
            saved_at = progress.step
    sae.eval()
    return progress


def in_memory(x: Tensor, batch: int, seed: int) -> Iterator[Block]:
    """Blocks over vectors held in memory (each pass a seeded permutation of all of them)."""
    epoch = 0
    while True:
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        yield Block(x[torch.randperm(x.shape[0], generator=g)], Position(epoch + 1, 0), 0)
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
    return norm, Progress(int(state["step"]), int(state["seen"]), position, since)  # type: ignore[call-overload]
