"""The explorer API's query parameters, each checked once: a bad one is refused with one line naming the
parameter, the value given and what is allowed (numbers in ASCII digits only: ``int()`` reads an Arabic-Indic
zero, U+0660, as 0)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

from hookviz.errors import UsageError

#: A map's view: what ``/api/map`` and ``/api/trust`` take (``box`` only from a detector's session, ``frame``
#: from a video's or a volume's, ``axis`` from a volume's: :func:`meaningful`).
VIEW = ("input", "layer", "method", "target", "box", "frame", "axis", "alpha", "colormap", "relu")
#: What each endpoint takes, beside ``token`` (the secret, taken everywhere): ``supersede``, the page's views;
#: ``v``, a thumbnail, a channel's or a feature's map asked for again after its photo changed.
TAKES: dict[str, tuple[str, ...]] = {
    "/api/inputs": (), "/api/methods": (), "/api/model": (), "/api/layers": ("input",),
    "/api/predict": ("input", "k"), "/api/thumb": ("input", "v"), "/api/photo": ("input",),
    "/api/map": (*VIEW, "format", "supersede"), "/api/trust": VIEW,
    "/api/channels": ("input", "layer"), "/api/channel": ("input", "layer", "channel", "alpha", "v"),
    "/api/visualize": ("layer", "channel", "steps"), "/api/best": ("layer", "channel"),
    "/api/sheet": ("layer", "channel"), "/api/features": ("input",), "/api/feature": ("feature",),
    "/api/feature-sheet": ("feature",), "/api/feature-map": ("input", "feature", "alpha", "v"),
}  # fmt: skip

_WHOLE = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class BadParameter(UsageError):
    """A query parameter the API cannot take (the server answers 400)."""


class Query:
    """A request's parameters: each given once, each one its endpoint takes (``takes``; ``None``: any).

    Raises:
        BadParameter: a parameter given twice, or one the endpoint does not take.
    """

    def __init__(
        self,
        query: dict[str, list[str]],
        takes: Sequence[str] | None = None,
        path: str = "the API",
        why: dict[str, str] | None = None,
    ) -> None:
        for name, values in query.items():
            if len(values) > 1:
                shown = "its values not shown" if name == "token" else ", ".join(repr(v) for v in values)
                raise BadParameter(f"{name} given {len(values)} times ({shown}); give it once")
            if takes is not None and name != "token" and name not in takes:
                said = (why or {}).get(name) or f"{path} does not take it"
                listed = f"{path} takes {', '.join(takes)} and token" if takes else f"{path} takes only token"
                raise BadParameter(f"{name}={values[0]!r}: {said}; {listed}")
        self.one = {name: values[0] for name, values in query.items()}

    def text(self, name: str, default: str = "") -> str:
        return self.one.get(name, default)

    def whole(self, name: str, default: int, low: int, high: int | None = None, what: str = "") -> int:
        """A whole number from ``low`` (to ``high``), in ASCII digits."""
        given = self.one.get(name)
        if given is None:
            return default
        span = f"from {low}" if high is None else f"from {low} to {high}"
        value = int(given) if _WHOLE.fullmatch(given) else None
        if value is None or value < low or (high is not None and value > high):
            raise BadParameter(f"{name}={given!r}: a whole number {span} in ASCII digits{what}")
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        """A finite number from ``low`` to ``high``, in ASCII digits."""
        given = self.one.get(name)
        if given is None:
            return default
        value = float(given) if _NUMBER.fullmatch(given) else math.nan
        if not low <= value <= high:  # NaN too
            raise BadParameter(f"{name}={given!r}: a number from {low:g} to {high:g} in ASCII digits")
        return value

    def flag(self, name: str, default: bool) -> bool:
        given = self.one.get(name)
        if given is None:
            return default
        if given.lower() in _YES + _NO:
            return given.lower() in _YES
        raise BadParameter(f"{name}={given!r}: 1 or 0 (true or false, yes or no, on or off)")

    def choice(self, name: str, default: str, allowed: Iterable[str], what: str = "") -> str:
        given = self.one.get(name)
        if given is None:
            return default
        names = list(allowed)
        if given not in names:
            raise BadParameter(f"{name}={given!r}: {what or 'one of'} {_listed(names)}")
        return given


def method(query: Query, names: Sequence[str], default: str = "gradcam") -> str:
    """The one method a view shows (a list ``a,b`` is ``hookviz gradcam``'s, one file each: refused)."""
    given = query.text("method", default)
    if "," in given:
        raise BadParameter(f"method={given!r}: a view shows one method; give one of {_listed(names)} "
                           "(hookviz gradcam --method a,b writes one picture each)")  # fmt: skip
    return query.choice("method", default, names)


def target(query: Query) -> str:
    """The one class a view explains: ``top1``, ``positive``, a class index or a name; a number only in
    ASCII digits. ``topK`` (K > 1) and lists ``a,b`` are ``hookviz gradcam``'s, one file each: refused."""
    given = query.text("target", "top1").strip() or "top1"
    number = given[3:] if given.lower().startswith("top") else given
    if number.isdigit() and not number.isascii():
        raise BadParameter(f"target={given!r}: topK, positive, a class index (ASCII digits) or a class name")
    if "," in given or (number.isdigit() and number != given and int(number) > 1):
        raise BadParameter(f"target={given!r}: a view shows one class; give top1, positive, a class index "
                           "or a class name (hookviz gradcam --target topK: one picture each)")  # fmt: skip
    return given


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


def meaningful(path: str, task: str, kind: str, model: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """What ``path`` takes from a session of a ``task`` model over ``kind`` inputs, and why each view
    parameter that means nothing there is left out (a default given is refused too: it would read as
    though it chose something)."""
    takes = TAKES[path]
    why = {}
    if task != "detection":
        why["box"] = f"boxes are a detector's; {model} is a {task} model"
    if kind not in ("video", "volume"):
        why["frame"] = f"a frame picks a video's frame or a volume's slice; these inputs are {kind}s"
    if kind != "volume":
        why["axis"] = f"an axis picks a volume's slices; these inputs are {kind}s"
    return tuple(n for n in takes if n not in why), {n: w for n, w in why.items() if n in takes}
