"""Class names: reading them from a file, finding a class by name or index, and how lines name a class."""

from __future__ import annotations

import re
from collections.abc import Sequence

from hookviz.core.targets import Labelled, Positive
from hookviz.errors import HookvizError, TargetError, close_matches
from hookviz.models.labels import class_label, read_labels
from hookviz.models.loaded import LoadedModel

__all__ = ["class_label", "find_class", "parse_target", "parse_targets", "read_labels"]


#: A class index as a user types it: ASCII digits (``"²".isdigit()`` is true, and ``int("²")`` fails).
_DIGITS = re.compile(r"^[0-9]+$")
_INDEX = re.compile(r"^(?:class\s+)?(-?[0-9]+)$", re.IGNORECASE)


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


def parse_target(
    spec: str | int | None, loaded: LoadedModel, num_classes: int, option: str = "--target"
) -> int | None:
    """``top1``/None → None (the predicted class); an index; or a class name (see :func:`find_class`).

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
                f"{_said(option, index)} is out of range: {loaded.name} has classes 0..{num_classes - 1}"
            )
        return index
    if not loaded.categories:
        raise TargetError(
            f"{_said(option, repr(text))}: {loaded.name} has no class names with these weights; "
            "give a class index, or name the classes with --labels FILE"
        )
    return find_class(text, loaded.categories, option, loaded.name)


def label_class(label: str | None, loaded: LoadedModel, num_classes: int) -> int | str:
    """``--target label``: an input's own class from its label (a table row's target column, a shard sample's
    ``.cls``: an index or a name), or the one line saying why it has none (the pipeline puts the input's name
    before it)."""
    if label is None or not label.strip():
        return "no label to explain (a table's target column or a shard sample's .cls)"
    try:
        found = parse_target(label.strip(), loaded, num_classes, "label")
    except HookvizError as exc:
        return str(exc)
    return found if found is not None else f"label {label!r} names no class"


#: What ``--target`` becomes: None (top-1), ``"topK"``, class indices, or :class:`Positive`.
TargetSpec = str | list[int] | Positive | Labelled | None


def parse_targets(
    spec: str, loaded: LoadedModel, num_classes: int, threshold: float = 0.5, option: str = "--target"
) -> TargetSpec:
    """``top1`` → None; ``topK`` → ``"topK"``; ``281``, ``tabby`` or ``281,tiger cat`` → class indices;
    ``positive`` → every label whose sigmoid reaches ``threshold`` (a multi-label head's). ``option``
    names the setting in messages (``"target="``: the explorer's field).

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
                f"{_said(option, repr(spec))}: {loaded.name} has one output, so there is one value to "
                f"explain; leave {option.rstrip('=')} out"
            )
        if not _DIGITS.match(k) or not 1 <= int(k) <= num_classes:
            raise TargetError(
                f"{_said(option, repr(spec))}: use top1..top{num_classes}, a class index or a class name"
            )
        return None if int(k) == 1 else f"top{int(k)}"
    indices = [parse_target(part, loaded, num_classes, option) for part in spec.split(",") if part.strip()]
    if not indices:
        raise TargetError(f"{_said(option, repr(spec))}: give topK, a class index or a class name")
    return list(dict.fromkeys(i for i in indices if i is not None))
