"""Targets beyond class indices and ``topK`` (no torch here: the CLI parses them before loading a model)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Positive:
    """``--target positive``: every label of a multi-label head whose sigmoid reaches ``threshold`` (an image
    with none: its likeliest label)."""

    threshold: float = 0.5


@dataclass(frozen=True)
class Labelled:
    """``--target label``: each input's own class, as its data set labels it (a table's target column, a
    WebDataset sample's ``.cls``); an input without one fails alone."""
