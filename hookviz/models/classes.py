"""Class names: reading them from a file, finding a class by name or index, and how lines name a class."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hookviz.core.targets import Positive
from hookviz.errors import TargetError, UsageError, close_matches

if TYPE_CHECKING:
    from hookviz.models.loaded import LoadedModel


def class_label(name: str | None, index: object) -> str:
    """How captions and lines name a class: ``tabby (281)``, or ``class 281`` when it has no name (a record's
    ``name`` is then ``class 281`` already)."""
    return f"class {index}" if name in (None, f"class {index}") else f"{name} ({index})"


#: A class index as a user types it: ASCII digits (``"²".isdigit()`` is true, and ``int("²")`` fails).
_DIGITS = re.compile(r"^[0-9]+$")
_INDEX = re.compile(r"^(?:class\s+)?(-?[0-9]+)$", re.IGNORECASE)


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
            f"{option} {text!r} is ambiguous: classes {', '.join(map(str, exact))} all have this name; "
            "give an index"
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
                f"{option} {text!r} is ambiguous: it matches {shown}{more}; give the exact name or an index"
            )
    lowered = [c.lower() for c in categories]
    raise TargetError(
        f"{option} {text!r} is not a class{of}{close_matches(low, lowered)}; "
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
                f"{option} {index} is out of range: {loaded.name} has classes 0..{num_classes - 1}"
            )
        return index
    if not loaded.categories:
        raise TargetError(
            f"{option} {text!r}: {loaded.name} has no class names with these weights; "
            "give a class index, or name the classes with --labels FILE"
        )
    return find_class(text, loaded.categories, option, loaded.name)


#: What ``--target`` becomes: None (top-1), ``"topK"``, class indices, or :class:`Positive`.
TargetSpec = str | list[int] | Positive | None


def parse_targets(spec: str, loaded: LoadedModel, num_classes: int, threshold: float = 0.5) -> TargetSpec:
    """``top1`` → None; ``topK`` → ``"topK"``; ``281``, ``tabby`` or ``281,tiger cat`` → class indices;
    ``positive`` → every label whose sigmoid reaches ``threshold`` (a multi-label head's).

    The same class named twice (``281,tabby``) is explained once.

    Raises:
        TargetError: a bad topK, an index out of range, or an unknown class name.
    """
    text = spec.strip().lower()
    if text == "positive":
        return Positive(threshold)
    if text.startswith("top"):
        k = text[3:]
        if num_classes == 1 and not (_DIGITS.match(k) and int(k) == 1):
            raise TargetError(
                f"--target {spec!r}: {loaded.name} has one output, so there is one value to explain; leave "
                "--target out"
            )
        if not _DIGITS.match(k) or not 1 <= int(k) <= num_classes:
            raise TargetError(f"--target {spec!r}: use top1..top{num_classes}, a class index or a class name")
        return None if int(k) == 1 else f"top{int(k)}"
    indices = [parse_target(part, loaded, num_classes) for part in spec.split(",") if part.strip()]
    if not indices:
        raise TargetError(f"--target {spec!r}: give topK, a class index or a class name")
    return list(dict.fromkeys(i for i in indices if i is not None))


def _json_names(data: object, path: Path) -> list[str]:
    """Names from a JSON list of strings, or an object keyed by index 0..n-1 (``{"0": "tench"}``; Keras'
    ``imagenet_class_index.json`` maps each index to ``["n01440764", "tench"]``: the last string is the name).
    """
    where = f"--labels {str(path)!r}"
    if isinstance(data, list) and all(isinstance(n, str) for n in data):
        return list(data)
    if isinstance(data, dict):
        try:
            indexed = {int(k): v for k, v in data.items()}
        except (TypeError, ValueError):
            raise UsageError(f"{where}: a JSON object must be keyed by class index (0, 1, ...)") from None
        if sorted(indexed) != list(range(len(indexed))):
            raise UsageError(f"{where}: the JSON object's keys must be the indices 0..{len(indexed) - 1}")
        names = []
        for i in range(len(indexed)):
            v = indexed[i]
            if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                v = v[-1]
            if not isinstance(v, str):
                raise UsageError(f"{where}: class {i} is not a name (a string, or a list ending in one)")
            names.append(v)
        return names
    raise UsageError(f"{where}: the JSON must be a list of class names or an object keyed by index")


def read_labels(path: str | Path) -> tuple[str, ...]:
    """Class names from a file: one per line (blank lines at the end ignored), a JSON list of strings, or a
    JSON object keyed by index (Keras' ``imagenet_class_index.json``).

    Raises:
        UsageError: the file cannot be read, is empty, or is JSON but not a list of strings.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"--labels {str(path)!r}: cannot read the file ({reason})") from None
    if text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"--labels {str(path)!r}: not valid JSON ({exc.msg}, line {exc.lineno})"
            ) from None
        names = _json_names(data, path)
    else:
        names = [line.strip() for line in text.rstrip("\n\r ").splitlines()]
    if not names:
        raise UsageError(f"--labels {str(path)!r}: the file holds no class names")
    return tuple(names)
