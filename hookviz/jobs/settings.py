"""The settings of each job family, one frozen dataclass each, every default stated here once: the command
line's option groups take their defaults from these fields, the Python API, Ray and the explorer build them,
and a job holds its settings whole (it copies no field).

No torch here: the command line reads these defaults before it loads a model.

Example:
    >>> CamSettings(methods=("gradcam", "layercam"), target="top3").alpha
    0.5
    >>> settings_of(CamSettings, {"methd": "layercam"})
    Traceback (most recent call last):
    hookviz.errors.UsageError: CamSettings has no setting 'methd'; did you mean 'methods'?
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hookviz.errors import UsageError
from hookviz.methods import MethodOptions
from hookviz.options import Colormap, Fuse, Normalize, Region

__all__ = ["CamSettings", "check_keywords", "check_names", "checked_init", "settings_of"]

T = TypeVar("T")


def check_names(cls: type, names: Any, where: str = "", others: Collection[str] = ()) -> None:
    """Refuse a name that is not a field of the dataclass ``cls`` (a misspelt setting from Python), naming
    the closest field, or the closest of ``others`` (names taken beside, such as :class:`hookviz.Run`'s).

    Raises:
        UsageError: ``CamSettings has no setting 'methd'; did you mean 'methods'?``
    """
    known = [f.name for f in dataclasses.fields(cls)]
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(str(name), [*known, *sorted(others)], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(known)}"
            raise UsageError(f"{where or cls.__name__} has no setting {name!r}{hint}")


def names_of(text: str | Any) -> tuple[str, ...]:
    """A comma list given as one string (``"gradcam,layercam"``) as its names; a sequence as a tuple."""
    if isinstance(text, str):
        return tuple(part.strip() for part in text.split(",") if part.strip())
    return tuple(text)


def settings_of(cls: type[T], given: Mapping[str, Any] | T | None = None, **more: Any) -> T:
    """``cls`` built from a mapping (a dict, a JSON object; a group inside it may be a mapping too) and
    keyword overrides, or an instance with the overrides replaced; an unknown name is refused with the
    closest one (:func:`check_names`)."""
    check_names(cls, more)
    if isinstance(given, cls):
        return dataclasses.replace(given, **more)  # type: ignore[type-var]
    if given is not None and not isinstance(given, Mapping):
        raise UsageError(f"settings: give a {cls.__name__} or a mapping of names to values, not {given!r}")
    values = {**(given or {}), **more}
    check_names(cls, values)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        group = f.default_factory
        if isinstance(values.get(f.name), Mapping) and dataclasses.is_dataclass(group):
            values[f.name] = settings_of(group, values[f.name])
    return cls(**values)


@dataclass(frozen=True, kw_only=True)
class CamSettings:
    """Everything ``hookviz gradcam`` takes beyond the model and the run, keyword-only.

    ``layers``: empty for the default tensor, ``("auto",)`` for ``--layer auto``; ``methods``: empty for the
    task's default (Grad-CAM; HiResCAM for a detector); ``target``: as ``--target`` (``top1``, ``top5``,
    an index, a name, a comma list, ``positive``, ``label``). A job built from these holds them with its
    decisions filled in (the layers chosen, the methods parsed, the method settings completed).
    """

    layers: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    target: str = "top1"
    alpha: float = 0.5
    colormap: str = Colormap.jet.value
    relu: bool = True
    save_raw: bool = False
    #: How a map becomes colours: ``image`` (each map min-max), ``batch`` (one scale per method and layer
    #: across the batch), ``none`` (the fixed scale ``[0, vmax]``).
    normalize: str = Normalize.image.value
    vmax: float | None = None
    fuse: str | None = None
    sheet: bool | None = None
    #: Deletion and insertion AUCs for every map (in its record, caption and the sheet).
    metrics: bool = False
    eigen_smooth: bool = False
    aug_smooth: bool = False
    #: Segmentation: explain a class's pixels (``class``) or every pixel (``all``).
    region: str = Region.class_.value
    #: ``--channels topK``: the class's map through each of the K channels that add most to its Grad-CAM.
    channel_terms: int = 0
    #: ``--layer auto`` ranks the candidates on this many of the first images (the command line's 8).
    probe_images: int = 8
    #: Detectors: the boxes explained.
    score_threshold: float = 0.5
    #: ``--target positive``: the sigmoid a label must reach (a multi-label head).
    threshold: float = 0.5
    max_boxes: int = 10
    #: The method settings (``--seed``, ``--samples``, ``--masked-batch``; ``compare``: Finer-CAM's classes,
    #: indices or names, resolved with the model).
    options: MethodOptions = field(default_factory=MethodOptions)

    def __post_init__(self) -> None:
        fix = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731  (frozen)
        fix("layers", names_of(self.layers))
        fix("methods", names_of(self.methods))
        if not 0.0 <= self.alpha <= 1.0:
            raise UsageError(f"alpha {self.alpha}: must be in [0, 1] (as --alpha)")
        if self.probe_images < 1:
            raise UsageError(f"probe_images {self.probe_images}: must be at least 1 (as --probe)")
        fix("normalize", Normalize.parse(self.normalize, "--normalize").value)
        fix("region", Region.parse(self.region, "--region").value)
        fix("colormap", Colormap.parse(self.colormap, "--colormap").value)
        if self.fuse is not None:
            fix("fuse", Fuse.parse(self.fuse, "--fuse").value)


def check_keywords(where: str, names: Any, known: Collection[str], settings: Collection[str] = ()) -> None:
    """Refuse a keyword not ``known`` (:class:`hookviz.Run`'s), naming the closest of them or of ``settings``.

    Raises:
        UsageError: ``Run has no keyword 'skip_exsting'; did you mean 'skip_existing'?``
    """
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(str(name), [*sorted(known), *settings], n=1)
            said = f" (a setting: CamSettings({close[0]}=...))" if close and close[0] in settings else ""
            raise UsageError(
                f"{where} has no keyword {name!r}" + (f"; did you mean {close[0]!r}{said}?" if close else "")
            )


def checked_init(init: Any, check: Any) -> Any:
    """``init`` calling ``check(keywords)`` first (a misspelt keyword refused, the closest named)."""

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **values: Any) -> None:
        check(values)
        init(self, *args, **values)

    return checked


setattr(CamSettings, "__init__", checked_init(CamSettings.__init__, lambda v: check_names(CamSettings, v)))  # noqa: B010
