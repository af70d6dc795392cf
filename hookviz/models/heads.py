"""How a classifier's outputs are read: one softmax over the classes (the default), independent sigmoids
(a multi-label head), or raw values (a regression head, one output or several), optionally negated.

:class:`Head` wraps a model whose head is not a softmax one; its ``score_kind`` tells the readout
(:func:`hookviz.core.readout.read`) what records report: sigmoid probabilities, or the values themselves.
``--negate`` (regression only) explains what lowers the value: the target is the negated output.

A model that ends in a softmax (an ONNX, TorchScript or PyTorch classifier exported with it) gives
probabilities: ``--head probabilities`` (found by ``auto``: every row non-negative and summing to 1) reads
them as they are, never through a second softmax; its :class:`Head` gives their logarithm, so the readout's
softmax gives back the probabilities exactly and the gradient methods explain the log-probability.

A model returning several tensors (a tuple, a dict) is explained through one: the first (a dict's ``logits``
or ``out``) unless ``--output N`` (``--output NAME`` for a dict) picks another; a note and the records say
which.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.conventions import declared_kind, score_kind, sign
from hookviz.core.hooks import logits_of, preserved, probe_input
from hookviz.errors import LayerError, UsageError
from hookviz.models.facade import Facade
from hookviz.models.loaded import LoadedModel

#: What ``--head`` takes (``auto``: found from the model).
HEADS = ("auto", "softmax", "sigmoid", "raw", "probabilities")

#: How far a row of probabilities may be from summing to 1 (float32 softmax rows are within 1e-6).
_SUMS_TO_ONE = 1e-4
#: The smallest probability taken the logarithm of (a zero one's log-probability is finite).
_TINY = 1e-30
#: Packages whose classifiers return logits (not probabilities, not a tuple): not probed.
_LOGITS_LIBRARIES = ("torchvision", "timm", "transformers")


class Head(Facade):
    """``model`` with its outputs read as ``kind`` (``softmax``, ``sigmoid``, ``raw`` or ``probabilities``),
    negated with ``negate``, through its output ``output`` (an index of a tuple, a key of a dict; None: the
    tensor :func:`~hookviz.core.hooks.logits_of` finds); module names stay the model's.

    ``probabilities``: the output is already a softmax's; the head gives its logarithm (the log-probability),
    whose softmax, as the readout takes it, is the probabilities themselves."""

    def __init__(
        self, model: nn.Module, kind: str, negate: bool = False, output: int | str | None = None
    ) -> None:
        super().__init__(model)
        #: The head as records name it (``probabilities`` is read by the softmax readout: see above).
        self.reads_as = kind
        self.score_kind = "softmax" if kind == "probabilities" else kind
        self.sign = -1 if negate else 1
        self.output = output

    def forward(self, x: Tensor) -> Tensor:
        out = picked(self.wrapped(x), self.output)
        if self.reads_as == "probabilities":
            out = torch.log(out.clamp_min(_TINY))
        return -out if self.sign < 0 else out


def picked(out: Any, output: int | str | None) -> Tensor:
    """Output ``output`` of a model's tuple (an index) or dict (a key); None: :func:`logits_of`'s choice."""
    if output is None:
        return logits_of(out)
    if isinstance(out, dict):
        return out[output]
    return out[int(output)]


def _outputs(out: Any) -> list[tuple[int | str, Tensor]]:
    """The tensors a model returns, by index (a tuple or list) or key (a dict); one for a tensor."""
    if isinstance(out, dict):
        return [(k, v) for k, v in out.items() if isinstance(v, Tensor)]
    if isinstance(out, (tuple, list)):
        return [(i, v) for i, v in enumerate(out) if isinstance(v, Tensor)]
    return [(0, out)] if isinstance(out, Tensor) else []


def _probe(loaded: LoadedModel) -> Any:
    """The model's output for two inputs (zeros, and a ramp), or None where it is a library's classifier
    (logits, one tensor) or cannot run here (its own errors come, as before, when it is used)."""
    if type(loaded.model).__module__.partition(".")[0] in _LOGITS_LIBRARIES:
        return None
    try:
        x = probe_input(loaded.model, (2, *loaded.input_shape))
        x[1] = torch.linspace(-1.0, 1.0, x[1].numel(), dtype=x.dtype, device=x.device).reshape(x[1].shape)
        with torch.no_grad(), preserved(loaded.model):
            loaded.model.eval()
            return loaded.model(x)
    except Exception:  # a model that cannot run at this size: said where it is used (hookviz.models.probe)
        return None


def are_probabilities(scores: Tensor) -> bool:
    """Whether ``(B, C)`` scores are probabilities: non-negative, each row summing to 1, of two classes or
    more."""
    if scores.dim() != 2 or scores.shape[1] < 2 or not scores.is_floating_point():
        return False
    s = scores.detach().double()
    return bool((s >= 0).all() and ((s.sum(dim=1) - 1).abs() <= _SUMS_TO_ONE).all())


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(["B", *map(str, t.shape[1:])]) + ")"


def _named(key: int | str, named: bool) -> str:
    """A dict's key quoted, a tuple's index in brackets."""
    return repr(key) if named else f"[{key}]"


def _chosen(loaded: LoadedModel, out: Any, output: str | None) -> tuple[int | str | None, str | None]:
    """The output to explain (None: the model returns one tensor) and the note that says which.

    Raises:
        UsageError: ``output`` names none of the model's outputs.
    """
    if out is None:  # not probed (a library's classifier, or it cannot run here): taken as given
        return (int(output) if output is not None and output.isdigit() else output), None
    found = _outputs(out)
    if not isinstance(out, (tuple, list, dict)) or len(found) < 2:
        if output is not None:
            raise UsageError(f"--output {output}: {loaded.name} returns one tensor; leave --output out")
        return None, None
    named = isinstance(out, dict)
    listing = ", ".join(f"{_named(k, named)} {_shape(t)}" for k, t in found)
    what = f"{loaded.name} returns a {type(out).__name__} of {len(found)} tensors: {listing}"
    how = "NAME" if named else "N"
    if output is None:
        try:
            default = logits_of(out)
        except LayerError:
            raise UsageError(f"{what}, none named as class scores; pick one with --output {how}") from None
        key = next(k for k, t in found if t is default)
        return key, f"{what}; explaining {_named(key, named)} (--output {how} picks another)"
    chosen: int | str = output if named or not output.isdigit() else int(output)
    keys = [k for k, _ in found]
    if chosen not in keys:
        raise UsageError(f"--output {output}: {what}; give one of {', '.join(map(str, keys))}")
    return chosen, f"{what}; explaining {_named(chosen, named)}"


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


def with_head(
    loaded: LoadedModel, head: str = "auto", negate: bool = False, output: str | None = None
) -> LoadedModel:
    """``loaded`` read through ``head`` (``auto``: :func:`found_head`, or ``probabilities`` where the model's
    outputs are: one forward pass of two inputs tells), through its output ``output`` where it returns
    several (None: the first, a dict's ``logits``); ``negate`` explains what lowers a regression output.
    A note says which output is explained, and that probabilities are read as they are.

    Raises:
        UsageError: an unknown head, a head or output for a model that is not a classifier, an output the
            model does not return, ``--negate`` without a regression head.
    """
    if head not in HEADS:
        raise UsageError(f"--head {head}: use {', '.join(HEADS)}")
    if head != "auto" and loaded.task_name != "classification":
        raise UsageError(f"--head {head} is for classifiers; {loaded.name} is a {loaded.task_name} model")
    if output is not None and loaded.task_name != "classification":
        raise UsageError(f"--output {output} is for classifiers; {loaded.name} is a {loaded.task_name} model")
    if loaded.task_name != "classification" and not negate:
        return loaded
    kind = found_head(loaded) if head == "auto" else head
    declared = declared_kind(loaded.model)
    out = _probe(loaded)
    chosen, note = _chosen(loaded, out, output)
    notes = [note] if note else []
    if head == "auto" and declared is None and kind == "softmax" and out is not None:
        try:
            scores = picked(out, chosen)
        except (LayerError, KeyError, IndexError):
            scores = None
        if isinstance(scores, Tensor) and are_probabilities(scores):
            kind = "probabilities"
            notes.append(
                f"{loaded.name} gives probabilities (each row non-negative, summing to 1: it ends in a "
                "softmax): they are reported as they are, and gradient methods explain the log-probability "
                "(--head softmax reads them as logits)"
            )
    if negate and kind != "raw":
        raise UsageError(
            f"--negate explains what lowers a regression output; {loaded.name} is read as {kind} "
            "(give --head raw for a regression head)"
        )
    if chosen is None and (kind == "softmax" or (kind == declared and not negate)):
        return loaded
    model = Head(loaded.model, kind, negate, chosen)
    return dataclasses.replace(loaded, model=model, notes=loaded.notes + tuple(notes))


def head_settings(model: Any) -> dict[str, Any]:
    """What records say of a head other than a softmax one (nothing for the default), and of the output
    explained of a model that returns several."""
    kind = str(getattr(model, "reads_as", None) or score_kind(model))
    chosen = getattr(model, "output", None) if isinstance(model, Head) else None
    picked_output = {"output": chosen} if chosen is not None else {}
    if kind in ("softmax", "identity"):
        return picked_output
    if kind == "probabilities":  # what a gradient explains: the log of the probability reported
        return {"head": kind, "explained": "log-probability", **picked_output}
    return {"head": kind, **({"negate": True} if sign(model) < 0 else {}), **picked_output}
