"""The options of the input kinds beyond photos: what the model's output is (``--task``), the input size
of a photo or a volume (``--input-size``), and a video's clip sampling."""

from __future__ import annotations

from typing import Annotated

import typer

from hookviz.cli.app import MODEL, VIDEO

MaybeInputs = Annotated[
    list[str] | None,
    typer.Argument(
        help="image files, folders (searched recursively), globs, or - to read paths from stdin (none with "
        "--input).",
        show_default=False,
    ),
]
InputOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input",
        metavar="NAME=PATH",
        help="one input of a model that takes several (RGB + depth, two views), repeated, in the model's "
        "order (by name when its forward() names them): folders paired by file path or stem, or a file each.",
        rich_help_panel=MODEL,
    ),
]

TaskOpt = Annotated[
    str | None,
    typer.Option(
        "--task",
        help="what the model's output is, where the model and inputs do not tell: volume or video for a 3-D "
        "CNN (default: volume when every input is a volume), or a registered task.",
        rich_help_panel=MODEL,
    ),
]


def _input_size(value: str | None) -> int | tuple[int, ...] | None:
    """``--input-size``: one side (a square photo), or ``D,H,W`` (a volume's three sides)."""
    if value is None:
        return None
    try:
        sides = tuple(int(v) for v in str(value).replace("x", ",").split(",") if v.strip())
    except ValueError:
        sides = ()
    if len(sides) not in (1, 3) or min(sides) < 1:
        raise typer.BadParameter(f"{value!r}: give one side (224), or D,H,W for a volume (96,96,64)")
    return sides[0] if len(sides) == 1 else sides


InputSize = Annotated[
    str | None,
    typer.Option(
        "--input-size",
        callback=_input_size,
        help="model input side (default: the weights'); D,H,W for a volume model (default: each volume's "
        "own).",
        rich_help_panel=MODEL,
    ),
]

ClipLen = Annotated[
    int | None,
    typer.Option(
        "--clip-len",
        min=1,
        help="video: frames per clip (default: the weights', 16 for r3d_18).",
        rich_help_panel=VIDEO,
    ),
]
FrameStride = Annotated[
    int | None,
    typer.Option(
        "--frame-stride",
        min=1,
        help="video: take every Nth frame (default: resample to the weights' frame rate, 15 fps for most).",
        rich_help_panel=VIDEO,
    ),
]
ClipsOpt = Annotated[
    str | None,
    typer.Option(
        "--clips",
        metavar="N|all",
        help="video: N evenly spaced clips per video, or all of them back to back (default: the weights').",
        rich_help_panel=VIDEO,
    ),
]
