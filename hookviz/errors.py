"""The hookviz error hierarchy: every message names the bad value and the fix.

The library raises these; only the CLI turns them into exit codes (``exit_code``):
2 for a bad command line, 3 when the run cannot start (model, weights, output
folder), 4 when ``--method auto`` finds that no map can be trusted, 1 for a single input that failed
inside a batch.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first line (its type's name when it says nothing), at most ``limit`` characters, cut
    at a word's end (``...`` says where): what a one-line error quotes of another library's reason."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if len(line) <= limit:
        return line
    cut = line[: limit - 3]
    cut = cut[: cut.rfind(" ")] if " " in cut else cut
    return cut.rstrip(" ,;:") + "..."


def one_line(text: str) -> str:
    """``text`` as one line of stderr: its line breaks (a file name may hold them) written ``\\n`` and
    ``\\r``, so that an error never looks like two."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class HookvizError(Exception):
    """Base class of every error hookviz raises on purpose."""

    exit_code = 1


class UsageError(HookvizError):
    """An option value that cannot work; fix the command line."""

    exit_code = 2


class ModelNotFoundError(UsageError):
    """The model name is not a torchvision classification model."""


class LayerError(UsageError):
    """A layer name or pattern matches nothing, or the layer cannot be used for this job."""


class TargetError(UsageError):
    """The target class is out of range or unknown."""


class DeviceError(UsageError):
    """The requested device is not available."""


class SetupError(HookvizError):
    """The run cannot start: nothing was processed."""

    exit_code = 3


class WeightsError(SetupError):
    """Weights could not be downloaded or loaded."""


class OutputError(SetupError):
    """The output folder cannot be used."""


class UntrustedError(SetupError):
    """``--method auto``: the model's trust run says that no map here can be trusted; nothing was drawn."""

    exit_code = 4


class InputError(HookvizError):
    """One input could not be processed (the others go on)."""


def close_matches(word: str, choices: Iterable[str], n: int = 3) -> str:
    """Return a "; did you mean 'a' or 'b'?" clause, or "" when nothing is close."""
    found = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    if not found:
        return ""
    return "; did you mean " + " or ".join(repr(f) for f in found) + "?"
