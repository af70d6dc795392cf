"""The fixed choices of hookviz as Enums, shared by the CLI (shown as choice lists) and the library.

Torch-free, so ``hookviz --help`` can import it. Each Enum's values are what the command line takes;
``Enum(value)`` is how the library validates a string, so a typo fails the same way in both places.
"""

from __future__ import annotations

from enum import Enum

from hookviz.errors import UsageError


class Choice(str, Enum):
    """A string choice: compares equal to its value and prints as it."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: str | Choice, option: str) -> Choice:
        """``cls(value)``, or a :class:`~hookviz.errors.UsageError` naming the option and the choices."""

        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise UsageError(f"{option} {value!r}: choose one of {choices}") from None


class Normalize(Choice):
    """How a CAM becomes colours: per map, per batch, or one fixed scale (``--vmax``)."""

    image = "image"
    batch = "batch"
    none = "none"


class Fuse(Choice):
    mean = "mean"
    max = "max"


class Stage(Choice):
    """Which side of a layer to capture."""

    input = "input"
    output = "output"
    both = "both"


class Resize(Choice):
    """How a photo becomes a model input (see :class:`hookviz.io.images.Preprocess`)."""

    crop = "crop"
    squash = "squash"
    #: Shorter side to the input size, aspect kept, nothing cut (torchvision's segmentation transform).
    shorter = "shorter"
    #: The photo as it is, in [0, 1]: the model resizes and normalises it itself (detectors).
    model = "model"
    #: Both sides by the one scale nearer 1 of those that reach the input size (DPT's keep_aspect_ratio).
    fit = "fit"


class Task(Choice):
    """What a model's output is: class scores, a per-pixel class map, or boxes."""

    classification = "classification"
    segmentation = "segmentation"
    detection = "detection"
    video = "video"


class Region(Choice):
    """Which pixels a segmentation map explains: those assigned to the class, or all of them."""

    class_ = "class"
    all = "all"


class Colormap(Choice):
    """OpenCV's built-in colormaps (and gray)."""

    jet = "jet"
    turbo = "turbo"
    viridis = "viridis"
    inferno = "inferno"
    magma = "magma"
    plasma = "plasma"
    hot = "hot"
    parula = "parula"
    bone = "bone"
    gray = "gray"


class SummaryFormat(Choice):
    table = "table"
    markdown = "markdown"
    json = "json"
    csv = "csv"
