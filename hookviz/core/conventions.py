"""What a model may declare to hookviz, as protocols: how its scores are read (``score_kind``), whether a
regression is negated (``sign``), the layers its CAM defaults to (``default_layers`` and why,
``layers_note``); and what an input drawn frame by frame offers (``frames``). hookviz's own wrappers (heads,
prompt scorers, other libraries' detectors and segmenters) declare them as attributes, and so may a user's
model; every reader goes through the protocols and functions here, so each convention is named once and read
one way.

Example:
    >>> class Regressor(nn.Module):
    ...     score_kind = "raw"  # read as a regression value, not a softmax
    >>> score_kind(Regressor())
    'raw'
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

#: How scores become what records report: ``softmax`` (the default), ``sigmoid`` (independent labels),
#: ``raw`` (a regression value), ``identity`` (a similarity, reported as it is).
SCORE_KINDS = ("softmax", "sigmoid", "raw", "identity")


@runtime_checkable
class Scored(Protocol):
    """A model that says how its outputs are read."""

    score_kind: str


@runtime_checkable
class Signed(Protocol):
    """A regression head that may be negated (``-1``: explain what lowers it)."""

    sign: int


@runtime_checkable
class Layered(Protocol):
    """A model (another library's, wrapped) that names the layers its CAM defaults to, and why."""

    default_layers: tuple[str, ...]
    layers_note: str


@runtime_checkable
class Framed(Protocol):
    """An input drawn on frame by frame (a video's clip, a volume's slices): ``frames`` ``(T, H, W, 3)``."""

    @property
    def frames(self) -> Any: ...


def score_kind(model: Any, default: str = "softmax") -> str:
    """How ``model``'s outputs are read (``default`` when it does not say)."""
    return str(model.score_kind) if isinstance(model, Scored) and model.score_kind else default


def declared_kind(model: Any) -> str | None:
    """The score kind ``model`` declares, or None when it declares none."""
    return str(model.score_kind) if isinstance(model, Scored) and model.score_kind else None


def sign(model: Any) -> int:
    """``-1`` for a negated regression head, else ``1``."""
    return int(model.sign) if isinstance(model, Signed) else 1


def default_layers(model: Any) -> tuple[tuple[str, ...], str]:
    """The layers ``model`` names for its CAM and why (``((), "")`` when it names none)."""
    if isinstance(model, Layered):
        return tuple(model.default_layers), str(model.layers_note)
    return (), ""
