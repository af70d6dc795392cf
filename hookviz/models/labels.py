"""Class names: read from a file (``--labels``: one per line, or a JSON list or mapping) and written on a
line (``tabby (281)``, ``class 281``)."""

from __future__ import annotations

import json
from pathlib import Path

from hookviz.errors import UsageError


def class_label(name: str | None, index: object) -> str:
    """How captions and lines name a class: ``tabby (281)``, or ``class 281`` when it has no name (a record's
    ``name`` is then ``class 281`` already)."""
    return f"class {index}" if name in (None, f"class {index}") else f"{name} ({index})"


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
