"""The clock of ``hookviz trust --budget``: ``budget`` seconds from the command's start, read before each
batch of the work that takes time (a chunk of perturbed photos through the model, an explanation, a pass of a
method that runs its own), so that a run ends within its budget plus one such batch. :class:`Spent` unwinds
the step under way; :mod:`hookviz.evaluation.trust` keeps what its candidates finished before it."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "Spent"]


class Spent(Exception):
    """The budget ran out in the middle of a step (the battery catches it; it never leaves the battery)."""


class Clock:
    """``budget`` seconds from ``started`` (a :func:`time.monotonic` reading; default now; None: no end)."""

    def __init__(self, budget: float | None, started: float | None = None) -> None:
        self.budget = budget
        begun = time.monotonic() if started is None else started
        self.end = None if budget is None else begun + budget

    def out(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    def check(self) -> None:
        """Raises :class:`Spent` once the budget is spent."""
        if self.out():
            raise Spent(self.said())

    def said(self) -> str:
        return f"the budget of {self.budget:g} s was spent"

    def ticking(self) -> Callable[[int, int], None]:
        """:func:`~hookviz.engine.explain.explain`'s ``progress``: the clock read after each pass of the
        methods that run their own (Integrated Gradients' path, ``--batch`` rows a pass), not after the
        last (the maps are made by then)."""

        def tick(done: int, total: int) -> None:
            if done < total:
                self.check()

        return tick
