"""How a classifier's outputs are read: one softmax over the classes (the default), independent sigmoids
(a multi-label head), or raw values (a regression head, one output or several), optionally negated.

:class:`Head` wraps a model whose head is not a softmax one; its ``score_kind`` tells the readout
(:func:`hookviz.core.readout.read`) what records report: sigmoid probabilities, or the values themselves.
``--negate`` (regression only) explains what lowers the value: the target is the negated output.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor, nn

from hookviz.core.conventions import declared_kind, score_kind, sign
from hookviz.core.hooks import logits_of
from hookviz.errors import UsageError
from hookviz.models.facade import Facade
from hookviz.models.loaded import LoadedModel

#: What ``--head`` takes (``auto``: found from the model).
HEADS = ("auto", "softmax", "sigmoid", "raw")


class Head(Facade):
    """``model`` with its outputs read as ``kind`` (``sigmoid`` or ``raw``), negated with ``negate``; module
    names stay the model's."""

    def __init__(self, model: nn.Module, kind: str, negate: bool = False) -> None:
        super().__init__(model)
        self.score_kind = kind
        self.sign = -1 if negate else 1

    def forward(self, x: Tensor) -> Tensor:
        out = logits_of(self.wrapped(x))
        return -out if self.sign < 0 else out


def found_head(loaded: LoadedModel) -> str:
    """The head a model says it has: a Hugging Face config's ``problem_type`` (multi-label or regression),
    a single output (regression), else a softmax over classes."""
    own = declared_kind(loaded.model)
    if own is not None:
        return own
    problem = getattr(getattr(loaded.model, "config", None), "problem_type", None)
    if problem == "multi_label_classification":
        return "sigmoid"
    if problem == "regression":
        return "raw"
    heads = len(loaded.categories) or (
        loaded.task.head_classes(loaded.model) if loaded.task is not None else None
    )
    return "raw" if heads == 1 else "softmax"


def with_head(loaded: LoadedModel, head: str = "auto", negate: bool = False) -> LoadedModel:
    """``loaded`` read through ``head`` (``auto``: :func:`found_head`); ``negate`` explains what lowers a
    regression output.

    Raises:
        UsageError: an unknown head, a head for a model that is not a classifier, ``--negate`` without a
            regression head.
    """
    if head not in HEADS:
        raise UsageError(f"--head {head}: use {', '.join(HEADS)}")
    if head != "auto" and loaded.task_name != "classification":
        raise UsageError(f"--head {head} is for classifiers; {loaded.name} is a {loaded.task_name} model")
    if loaded.task_name != "classification" and not negate:
        return loaded
    kind = found_head(loaded) if head == "auto" else head
    if negate and kind != "raw":
        raise UsageError(
            f"--negate explains what lowers a regression output; {loaded.name} is read as {kind} "
            "(give --head raw for a regression head)"
        )
    if kind == "softmax" or (kind == declared_kind(loaded.model) and not negate):
        return loaded
    return dataclasses.replace(loaded, model=Head(loaded.model, kind, negate))


def head_settings(model: Any) -> dict[str, Any]:
    """What records say of a head other than a softmax one (nothing for the default)."""
    kind = score_kind(model)
    if kind in ("softmax", "identity"):
        return {}
    return {"head": kind, **({"negate": True} if sign(model) < 0 else {})}
