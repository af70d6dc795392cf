"""Running under ``torchrun``: every input to exactly one rank, one manifest at the end, the worst exit code.

Nothing here launches processes: ``torchrun --nproc-per-node N -m hookviz gradcam ...`` starts them and
sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and the rendezvous); without those variables (or with a
world of one) nothing changes. The ranks talk through a gloo process group only to agree at the end
(a barrier and the worst exit code); outputs need no coordination, because every input belongs to one
rank and output names depend on the input and the settings alone.

Manifest: each rank appends to its own part, ``.manifest.rank<R>.<pid>.jsonl``; once every rank is done,
rank 0 appends the parts to ``manifest.jsonl`` in rank order and removes them. A part whose process
died before the merge is merged by the next run (resume with ``--skip-existing``, any world size).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookviz.io.files import atomic_write, open_append
from hookviz.io.outputs import process_alive

#: ``.manifest.<job>.rank<R>.<pid>.jsonl`` (``.manifest.rank<R>.<pid>.jsonl`` before parts named their job).
PART = re.compile(r"^\.manifest\.(?:([\w-]+)\.)?rank(\d+)\.(\d+)\.jsonl$")
PROGRESS = ".hookviz-progress.rank{}"


@dataclass(frozen=True)
class Dist:
    """This process's place in a torchrun job."""

    rank: int
    world: int
    local_rank: int
    local_world: int

    #: This torchrun job's identity (its run id), so that two jobs writing into one folder merge only
    #: their own parts.
    job: str = "job"

    @property
    def part_name(self) -> str:
        return f".manifest.{self.job}.rank{self.rank}.{os.getpid()}.jsonl"


def from_env(env: dict[str, str] | None = None) -> Dist | None:
    """The torchrun environment, or None when this is a plain single process."""
    env = dict(os.environ) if env is None else env
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
    except ValueError:
        return None
    if world <= 1:
        return None
    local_rank = int(env.get("LOCAL_RANK", str(rank)))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    run = env.get("TORCHELASTIC_RUN_ID") or f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    job = hashlib.sha256(run.encode()).hexdigest()[:12]
    return Dist(rank, world, local_rank, local_world, job)


def shard(items: list[Any], dist: Dist | None) -> list[Any]:
    """This rank's inputs: every ``world``-th of the list sorted by name (disjoint, complete, the same
    split on every rank)."""
    if dist is None:
        return items
    ordered = sorted(items, key=lambda item: str(item.name))
    return ordered[dist.rank :: dist.world]


def device_and_threads(dist: Dist, requested: str) -> str:
    """``cuda:LOCAL_RANK`` when there is CUDA and the user asked for ``auto``; on the CPU, the cores are
    split between the ranks of this machine so that they do not oversubscribe them."""
    import torch

    if requested == "auto" and torch.cuda.is_available():
        return f"cuda:{dist.local_rank % torch.cuda.device_count()}"
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, dist.local_world)))
    return requested


def init(dist: Dist) -> bool:
    """Join the job's gloo group (the rendezvous torchrun set up), for the barrier and exit codes; whether
    it was joined here (False: the process had its own group already, as a training script has)."""
    import torch.distributed as td

    if td.is_initialized():
        return False
    td.init_process_group("gloo")
    return True


def agree(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a choice made from data, such as ``--layer auto``'s, must be one
    choice for the whole job: one settings key, one set of output names)."""
    import torch.distributed as td

    if not td.is_initialized():
        return value
    box = [value]
    td.broadcast_object_list(box, src=0)
    return box[0]


def finish(dist: Dist, code: int, leave: bool = True) -> int:
    """Wait for every rank, then return the worst exit code over the ranks (the same on each); ``leave``:
    destroy the group (one :func:`init` joined)."""
    import torch
    import torch.distributed as td

    if not td.is_initialized():
        return code
    worst = torch.tensor([code], dtype=torch.int64)
    td.all_reduce(worst, op=td.ReduceOp.MAX)
    _released(worst)
    if leave:
        td.destroy_process_group()
    return int(worst.item())


def _released(tensor: Any, timeout: float = 5.0) -> None:
    """Wait until gloo's worker thread has dropped its reference to ``tensor``.

    The collective returns when the work is done, but the worker destroys its work item (and with it a
    reference to the tensor) a moment later, taking the GIL to release the Python object. Were the
    interpreter finalizing by then, that thread would exit inside a C++ destructor and the process abort
    ("terminate called without an active exception", seen about once in ten torchrun runs, core dump
    read in gdb: ``ProcessGroupGloo::runLoop`` → ``~AsyncAllreduceWork`` → ``take_gil``)."""
    import time

    end = time.monotonic() + timeout
    while tensor._use_count() > 1 and time.monotonic() < end:
        time.sleep(0.001)


def merge_parts(root: Path, manifest: str, *, only_dead: bool, job: str | None = None) -> int:
    """Append the manifest parts in ``root`` to ``root/manifest`` in the inputs' order, then remove them.

    ``job``: merge only that job's parts (another job writing into the same folder keeps its own);
    ``only_dead``: merge only parts whose process is gone (left by a killed run, of any job). Returns the
    number of lines merged. Each line is appended with one ``write``, as every manifest line is.
    """

    parts = []
    for p in root.iterdir():
        m = PART.match(p.name)
        if not m or (job is not None and m.group(1) != job):
            continue
        if not only_dead or not process_alive(int(m.group(3))):
            parts.append((int(m.group(2)), p))
    merged = 0
    if not parts:
        return 0
    ranks = [_by_input(part.read_text(encoding="utf-8", errors="replace")) for _, part in sorted(parts)]
    fd = open_append(root / manifest)
    try:
        # Round robin over the ranks, an input's lines at a time: :func:`shard` dealt the inputs so, and
        # this gives back the order one process writes (each rank's lines are in its shard's order).
        for i in range(max(len(inputs) for inputs in ranks)):
            for inputs in ranks:
                for line in inputs[i] if i < len(inputs) else ():
                    os.write(fd, line.encode("utf-8"))
                    merged += 1
        for _, part in parts:
            part.unlink()
    finally:
        os.close(fd)
    return merged


def _by_input(text: str) -> list[list[str]]:
    """A manifest part's lines, those of one input together (consecutive lines naming the same input)."""
    groups: list[list[str]] = []
    last: object = None
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            name = json.loads(line).get("input")
        except (ValueError, AttributeError):
            name = None  # a torn line (a killed rank's last) goes on alone
        if not groups or name is None or name != last:
            groups.append([])
        groups[-1].append(line + "\n")
        last = name
    return groups


def write_progress(root: Path, dist: Dist, done: int) -> None:
    """Record how many inputs this rank has finished (rank 0 adds them up for the one progress bar)."""

    atomic_write(root / PROGRESS.format(dist.rank), str(done))


def global_progress(root: Path, dist: Dist) -> int:
    total = 0
    for r in range(dist.world):
        with contextlib.suppress(OSError, ValueError):
            total += int((root / PROGRESS.format(r)).read_text() or 0)
    return total


def clear_progress(root: Path, dist: Dist) -> None:
    for r in range(dist.world):
        (root / PROGRESS.format(r)).unlink(missing_ok=True)
