"""How many images a batch may take under a memory budget (``--max-memory``): sizes, the memory available,
and an estimate's arithmetic. What a pass holds is estimated beside the methods it runs
(:mod:`hookviz.methods.footprint`). Standard library only: the CLI parses ``--max-memory`` with it."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from typing import Any

#: The share of the memory available when the run starts that a batch may hold by default: the rest is
#: for the decoded photos, the renders overlapping the next batch, and everything else on the machine.
DEFAULT_SHARE = 0.5
_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 2**10,
    "m": 2**20,
    "mb": 2**20,
    "g": 2**30,
    "gb": 2**30,
    "t": 2**40,
}


#: The largest size taken (1 EB): more would be no machine's memory, only a typo.
MOST = 2**60


def parse_size(text: str) -> int:
    """``"4G"``, ``"512MB"``, ``"1.5 GiB"``, ``"2000000"`` or ``"2e6"`` (bytes) as bytes: a finite number from
    1 byte to 1 EB (:data:`MOST`).

    Raises:
        ValueError: not a size, or an absurd one.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"{text!r}: not a size (4G, 512M, 1.5GB)")
    unit = m.group(2) + ("b" if m.group(3) else "")
    value = float(m.group(1)) * _UNITS.get(unit, _UNITS[m.group(2)])
    if not math.isfinite(value) or value > MOST:
        raise ValueError(f"{text!r}: over 1 EB, more than any machine holds; give a size such as 4G or 512M")
    if value < 1:
        raise ValueError(f"{text!r}: not a size (4G, 512M, 1.5GB)")
    return int(value)


def human(n: float) -> str:
    """Bytes as ``14.2 GB`` / ``512 MB`` / ``1.5 MB`` / ``1 KB`` / ``512 B``: never rounded to a bare 0."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GB"
    if n >= 10 * 2**20:
        return f"{n / 2**20:.0f} MB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MB"
    if n >= 2**10:
        return f"{n / 2**10:.0f} KB"
    return f"{n:.0f} B"


def available(device: Any = "cpu") -> int:
    """Bytes free now: the GPU's free memory for a CUDA device, else the system's available memory
    (``MemAvailable``; the physical memory where that cannot be read)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def default_budget(device: Any = "cpu") -> int:
    """The default ``--max-memory``: :data:`DEFAULT_SHARE` of what is available now."""
    return int(available(device) * DEFAULT_SHARE)


@dataclass(frozen=True)
class Estimate:
    """Bytes a batch holds: its tensors (``per_image`` times its images, plus ``fixed``, what does not grow
    with the batch, plus the copies some methods run in passes of their own: ``rows`` an image, drawn across
    the batch's images, at most ``cap`` a pass, ``row`` bytes each; and never under ``least``, a
    convolution's weights reordered for its pass: on a small batch, more than the images' tensors), and what
    the process grows by beside them (measured: :mod:`hookviz.methods.footprint` says how). Two phases, one
    after the other: the pass (its tensors, ``slack`` and ``churn`` an image beside them) and the pictures
    (``beside`` once a batch, and an image ``drawn`` bytes and ``per_pixel`` bytes for each pixel of the
    photo they are drawn on: ``pixels``, the batch's largest, the input's own until :meth:`drawn_on` says);
    the pictures reuse at most ``reused`` bytes of what the pass freed."""

    per_image: int
    fixed: int = 0
    rows: int = 0
    row: int = 0
    cap: int = 0
    least: int = 0
    slack: int = 0
    churn: int = 0
    beside: int = 0
    drawn: int = 0
    per_pixel: float = 0.0
    pixels: int = 0
    reused: int = 0

    def tensors(self, images: int) -> int:
        """The tensors the batch's pass allocates at their peak."""
        copies = min(self.cap, self.rows * images) if self.cap else self.rows * images
        return self.fixed + max(self.least, self.per_image * images) + copies * self.row

    def total(self, images: int) -> int:
        """What the process grows by for a batch of ``images``: its two phases, less what they share."""
        pictures = self.beside + images * (self.drawn + int(self.pixels * self.per_pixel))
        passing = self.tensors(images) + self.slack + images * self.churn
        return passing + pictures - min(passing, pictures, self.reused)

    def drawn_on(self, pixels: int) -> Estimate:
        """The same estimate for pictures drawn on photos of ``pixels`` pixels (the batch's largest)."""
        return dataclasses.replace(self, pixels=max(self.pixels, int(pixels)))

    def fitting(self, budget: int, wanted: int) -> int:
        """How many of ``wanted`` images a batch may take under ``budget`` (at least one)."""
        low, high = 1, max(1, wanted)
        while low < high:  # the total grows with the images: the most that fit
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self.total(mid) <= budget else (low, mid - 1)
        return low
