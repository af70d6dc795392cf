"""Class names: reading them from a file, finding a model's class by name or index (parsed in
:mod:`hookviz.core.targets`), and how lines name a class."""

from __future__ import annotations

from hookviz.core.targets import Target, find_class, one_class, parse
from hookviz.errors import HookvizError
from hookviz.models.labels import class_label, read_labels
from hookviz.models.loaded import LoadedModel

__all__ = ["class_label", "find_class", "parse_target", "parse_targets", "read_labels"]


def parse_target(
    spec: str | int | None, loaded: LoadedModel, num_classes: int, option: str = "--target"
) -> int | None:
    """One class of ``loaded`` (:func:`hookviz.core.targets.one_class`): ``top1``/None → None (the predicted
    class); an index; or a class name.

    Raises:
        TargetError: index out of range, or a name that is not a class (close matches suggested).
    """
    return one_class(spec, loaded.categories, num_classes, loaded.name, option)


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


def parse_targets(
    spec: str, loaded: LoadedModel, num_classes: int, threshold: float = 0.5, option: str = "--target"
) -> Target:
    """``--target`` for ``loaded`` (:func:`hookviz.core.targets.parse`, with its class names); ``option``
    names the setting in messages (``"target="``: the explorer's field).

    Raises:
        TargetError: a bad topK, an index out of range, or an unknown class name.
    """
    return parse(spec, loaded.categories, num_classes, loaded.name, threshold, option)
