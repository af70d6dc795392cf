"""What ``--target`` explains, as one typed value parsed in one place: :class:`Top` (each input's top K
classes), :class:`Classes` (the same classes for every input), :class:`Positive` (a multi-label head's
labels over a threshold) or :class:`Labelled` (each input's own label). The value goes as it is from the
option to the explain pass (no torch here: the command line parses it before loading a model).

Example:
    >>> parse("top5", ["cat", "dog"] * 5, 10)
    Top(k=5)
    >>> parse("dog,1", ["cat", "dog"], 2)
    Classes(ids=(1,))
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hookviz.errors import TargetError, close_matches

__all__ = ["Classes", "Labelled", "Positive", "Target", "Top", "find_class", "one_class", "parse", "said"]


@dataclass(frozen=True)
class Top:
    """Each input's ``k`` likeliest classes (``top1``: its predicted class)."""

    k: int = 1


@dataclass(frozen=True)
class Classes:
    """The same classes, by index, for every input (each once, in the order named)."""

    ids: tuple[int, ...]


@dataclass(frozen=True)
class Positive:
    """``--target positive``: every label of a multi-label head whose sigmoid reaches ``threshold`` (an image
    with none: its likeliest label)."""

    threshold: float = 0.5


@dataclass(frozen=True)
class Labelled:
    """``--target label``: each input's own class, as its data set labels it (a table's target column, a
    WebDataset sample's ``.cls``); an input without one fails alone."""


#: What ``--target`` is, once parsed.
Target = Top | Classes | Positive | Labelled

#: A class index as a user types it: ASCII digits (``"²".isdigit()`` is true, and ``int("²")`` fails).
_DIGITS = re.compile(r"^[0-9]+$")
_INDEX = re.compile(r"^(?:class\s+)?(-?[0-9]+)$", re.IGNORECASE)


def said(target: Target) -> str | list[int] | dict[str, float]:
    """How records and output keys write a target: ``top1``, ``top5``, ``[281, 282]``, ``{"positive": t}``,
    ``label``."""
    if isinstance(target, Top):
        return f"top{target.k}"
    if isinstance(target, Classes):
        return list(target.ids)
    if isinstance(target, Positive):
        return {"positive": target.threshold}
    return "label"


def _said(option: str, value: object) -> str:
    """``--target 1000`` on the command line; ``target=1000`` where ``option`` is a field (``"target="``:
    the explorer's query)."""
    return f"{option}{value}" if option.endswith("=") else f"{option} {value}"


def find_class(text: str, categories: Sequence[str], option: str = "--target", model: str = "") -> int:
    """The index of a class name: exact match first, then case-insensitive exact, then a unique partial match.

    ImageNet has both ``cardigan`` (474) and ``Cardigan`` (264, a corgi), so an exact match must win
    over a case-insensitive one; ``corgi`` matches one class only and is accepted.

    Raises:
        TargetError: no class matches, or several match equally well (the candidates are listed).
    """
    of = f" of {model}" if model else ""
    exact = [i for i, c in enumerate(categories) if c == text]
    if len(exact) > 1:
        raise TargetError(
            f"{_said(option, repr(text))} is ambiguous: classes {', '.join(map(str, exact))} all have this "
            "name; give an index"
        )
    if exact:
        return exact[0]
    low = text.lower()
    for rule in (lambda c: c.lower() == low, lambda c: low in c.lower()):
        hits = [i for i, c in enumerate(categories) if rule(c)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            shown = ", ".join(f"{categories[i]!r} ({i})" for i in hits[:8])
            more = f" and {len(hits) - 8} more" if len(hits) > 8 else ""
            raise TargetError(
                f"{_said(option, repr(text))} is ambiguous: it matches {shown}{more}; give the exact name or "
                "an index"
            )
    lowered = [c.lower() for c in categories]
    raise TargetError(
        f"{_said(option, repr(text))} is not a class{of}{close_matches(low, lowered)}; "
        "give a class index or a class name"
    )


def one_class(
    spec: str | int | None,
    categories: Sequence[str] | None,
    num_classes: int,
    model: str = "",
    option: str = "--target",
) -> int | None:
    """One class: ``top1``/None → None (the predicted class); an index (``281``, ``class 281``); or a class
    name (see :func:`find_class`).

    Raises:
        TargetError: index out of range, or a name that is not a class (close matches suggested).
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("top1", "")):
        return None
    text = str(spec).strip()
    by_index = _INDEX.match(text)
    if by_index:  # "281", or "class 281" as captions write a class without a name
        index = int(by_index.group(1))
        if not 0 <= index < num_classes:
            raise TargetError(
                f"{_said(option, index)} is out of range: {model} has classes 0..{num_classes - 1}"
            )
        return index
    if not categories:
        raise TargetError(
            f"{_said(option, repr(text))}: {model} has no class names with these weights; "
            "give a class index, or name the classes with --labels FILE"
        )
    return find_class(text, categories, option, model)


def parse(
    spec: str,
    categories: Sequence[str] | None,
    num_classes: int,
    model: str = "",
    threshold: float = 0.5,
    option: str = "--target",
) -> Target:
    """``top1``, ``topK``, ``281``, ``tabby``, ``281,tiger cat``, ``positive`` (every label whose sigmoid
    reaches ``threshold``) or ``label`` as a :data:`Target`; ``categories``: the model's class names (None:
    by index only); ``option`` names the setting in messages (``"target="``: the explorer's field).

    The same class named twice (``281,tabby``) is explained once.

    Raises:
        TargetError: a bad topK, an index out of range, or an unknown class name.
    """
    text = spec.strip().lower()
    if text == "positive":
        return Positive(threshold)
    if text == "label":
        return Labelled()
    if text.startswith("top"):
        k = text[3:]
        if num_classes == 1 and not (_DIGITS.match(k) and int(k) == 1):
            raise TargetError(
                f"{_said(option, repr(spec))}: {model} has one output, so there is one value to explain; "
                f"leave {option.rstrip('=')} out"
            )
        if not _DIGITS.match(k) or not 1 <= int(k) <= num_classes:
            raise TargetError(
                f"{_said(option, repr(spec))}: use top1..top{num_classes}, a class index or a class name"
            )
        return Top(int(k))
    found = [
        one_class(part, categories, num_classes, model, option) for part in spec.split(",") if part.strip()
    ]
    if not found:
        raise TargetError(f"{_said(option, repr(spec))}: give topK, a class index or a class name")
    ids = tuple(dict.fromkeys(i for i in found if i is not None))
    return Classes(ids) if ids else Top(1)
