"""The photos of a ``hookviz trust`` run: read as ``gradcam`` reads them, with annotations each photo's
objects as one mask in the model's input frame; the photos left out (not annotated, or with nothing to
localise) and those that failed, each with why."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookviz.errors import HookvizError, InputError, UsageError
from hookviz.io.annotation import Annotations, input_mask
from hookviz.models.loaded import LoadedModel
from hookviz.run.kinds import input_kind_of

__all__ = ["MIN_SIDE", "Photos", "outside_said", "read_photos"]


@dataclass(frozen=True)
class Photos:
    """The photos read for a trust run: the batch, their names, where their objects lie (with
    annotations), the inputs that could not be read, with why, the photos the annotations do not name, and
    those whose annotated objects lie outside what the model saw, with where (both left out of a run with
    annotations: nothing to localise; not a failure)."""

    batch: list[torch.Tensor]
    names: list[str]
    masks: list[np.ndarray] | None
    failed: dict[str, str]
    unannotated: list[str] = dataclasses.field(default_factory=list)
    outside: dict[str, str] = dataclasses.field(default_factory=dict)


#: A photo smaller than this on a side is refused: upscaled to the model's input, its maps say nothing.
MIN_SIDE = 8


def read_photos(
    loaded: LoadedModel,
    inputs: Sequence[str],
    max_photos: int,
    max_pixels: int,
    annotations: Annotations | None = None,
    out: Path | None = None,
) -> Photos:
    """The first ``max_photos`` readable photos by name (with annotations: those annotated, each with the
    union of its objects in the model's input frame).

    Raises:
        UsageError: not photos; one photo given; annotations that name none of the photos, or whose objects
            lie outside what the model saw on all but one.
        InputError: no photo found (an empty folder), or fewer than two readable ones (exit 1, as any input
            failure).
    """
    kind = input_kind_of(loaded, list(inputs))
    if kind.name != "photo":
        raise UsageError(f"hookviz trust takes photos; {loaded.name} takes {kind.name}s")
    found_all = kind.find(loaded, list(inputs), exclude=out)  # in out: hookviz's own outputs left out
    items = sorted(kind.items(loaded, found_all, max_pixels), key=lambda i: str(i.path))
    if not items:
        raise InputError(f"no photos found in {', '.join(inputs)} (an empty folder?); hookviz trust needs 2 "
                         "or more, 16 give answers worth reading")  # fmt: skip
    failed = {i.name: str(i.error) for i in items if i.error}
    read = kind.read(loaded)
    found = Photos([], [], [] if annotations is not None else None, failed)
    for item in [i for i in items if not i.error]:
        if len(found.batch) == max_photos:  # the first max_photos of len(items)
            break
        try:
            if annotations is not None and annotations.regions(item.path or item.name) is None:
                found.unannotated.append(item.name)
                continue
            rgb, x, box = read(item, kind.preprocess(loaded), max_pixels)
            if min(rgb.shape[:2]) < MIN_SIDE:
                raise InputError(f"{rgb.shape[1]}x{rgb.shape[0]} pixels: too small for the tests (at least "
                                 f"{MIN_SIDE} on a side)")  # fmt: skip
            if annotations is not None and found.masks is not None:
                mask = _object_mask(annotations, item, rgb, box, tuple(np.asarray(x).shape[-2:]))
                if isinstance(mask, str):  # readable, and nothing to localise: left out, not failed
                    found.outside[item.name] = mask
                    continue
                found.masks.append(mask)
        except HookvizError as exc:
            failed[item.name] = str(exc)
            continue
        found.batch.append(torch.from_numpy(np.asarray(x)))
        found.names.append(item.name)
    _enough(found, inputs, annotations, [max_photos, len(items)])
    return found


def _enough(found: Photos, inputs: Sequence[str], annotations: Annotations | None, of: list[int]) -> None:
    if len(found.batch) >= 2:
        return
    if annotations is not None and found.unannotated and not found.names:
        names = sorted(annotations.by_name)
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        photo = found.unannotated[0]
        source = annotations.where or annotations.source
        raise UsageError(f"the annotations ({source}) name none of the photos "
                         f"(they name {names[0]!r}{more}; the photos are {photo!r} and the like): give these "
                         "photos' annotations")  # fmt: skip
    if found.outside and not found.failed:
        raise UsageError(f"{outside_said(found.outside)}; hookviz trust needs 2 photos or more with an "
                         "object to localise: give these photos' boxes or masks")  # fmt: skip
    said = f"{len(found.batch)} readable photo" + ("" if len(found.batch) == 1 else "s")
    if len(found.batch) == of[0] < of[1]:  # max_photos below 2 (the library's trust; the CLI refuses it)
        said = f"max_photos={of[0]} took the first {of[0]} of the {of[1]} photos found"
    error = InputError if found.failed else UsageError  # inputs that failed: exit 1, as any input failure
    first = next(iter(found.failed.items()), None)
    bad = f"; {len(found.failed)} could not be read ({first[0]}: {first[1]})" if first else ""
    bad += f"; {outside_said(found.outside)}" if found.outside else ""
    raise error(
        f"hookviz trust needs 2 photos or more for an interval ({said} among {', '.join(inputs)}"
        f"{bad}); 16 give answers worth reading"
    )


def _object_mask(
    annotations: Annotations, item: Any, rgb: np.ndarray, box: Any, size: tuple[int, ...]
) -> np.ndarray | str:
    """Every annotated object of the photo (any class) as one mask in the model's input frame, or where its
    objects lie when none is in that frame (outside the photo, or outside the part of it the model saw)."""
    regions = annotations.regions(item.path or item.name) or []
    h, w = rgb.shape[:2]
    drawn = np.zeros((h, w), bool)
    for r in regions:
        drawn |= r.draw(h, w)
    if not drawn.any():
        return f"no annotated object within its {w}x{h} pixels"
    mask = input_mask(drawn, box, (int(size[0]), int(size[1])))
    if not mask.any():
        return (
            "its annotated objects lie outside the centre crop the model saw (--resize squash shows it all)"
        )
    return mask


def outside_said(outside: dict[str, str]) -> str:
    """The photos left out because their objects lie outside what the model saw, each named with where."""
    listed = "; ".join(f"{name} ({why})" for name, why in outside.items())
    return f"{len(outside)} photo(s) left out, their annotations outside what the model saw: {listed}"
