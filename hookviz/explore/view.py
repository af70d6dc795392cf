"""One view of ``hookviz explore`` (input, layer, method, target, box, frame, look), and a view made: the
PNG and raw map ``hookviz gradcam --save-raw`` writes for the same settings, its record, and for a video or a
volume each frame or slice drawn on its own (the scrubber)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hookviz.errors import InputError
from hookviz.io.images import encode_png
from hookviz.io.outputs import command_words
from hookviz.io.video import ClipFrames
from hookviz.jobs.common import npy_bytes
from hookviz.jobs.settings import CamSettings
from hookviz.render import MIN_CAPTION_WIDTH

#: The library's ``gradcam`` defaults, which a view starts from and its command leaves out.
CAM = CamSettings()


@dataclass(frozen=True)
class View:
    """One view: which input (its index among the inputs), layer (empty: the default), method and target
    (``top1``, a class index or name, ``positive`` for a multi-label head), a detector's ``box`` (1 for its
    best; 0: the photo's summary of boxes), a video's frame or a volume's slice (``frame``, along ``axis``;
    -1: the whole clip's sheet, the volume's three slices), and how it looks."""

    input: int = 0
    layer: str = ""
    method: str = "gradcam"
    target: str = CAM.target
    box: int = 1
    frame: int = -1
    axis: int = 2
    alpha: float = CAM.alpha
    colormap: str = CAM.colormap
    relu: bool = CAM.relu

    def settings(self) -> CamSettings:
        """The ``gradcam`` settings that make this view."""
        return CamSettings(
            layers=(self.layer,) if self.layer else (), methods=(self.method,), target=self.target,
            alpha=self.alpha, colormap=self.colormap, relu=self.relu, save_raw=True,
        )  # fmt: skip

    def made_of(self) -> tuple[Any, ...]:
        """What makes the view's maps (the box, frame and axis only pick among them)."""
        return (self.input, self.layer, self.method, self.target, self.alpha, self.colormap, self.relu)

    def command(self, model: Sequence[str], photo: str, out: str = "out") -> list[str]:
        """The ``hookviz gradcam`` line that writes this view's PNG and raw map (the words of a shell
        command); ``model``: the model options' words (``--model NAME --weights W ...``)."""
        words = [*model]
        words += ["--layer", self.layer] if self.layer else []
        words += ["--method", self.method] if self.method != "gradcam" else []
        words += ["--target", self.target] if self.target != CAM.target else []
        words += ["--alpha", f"{self.alpha:g}"] if self.alpha != CAM.alpha else []
        words += ["--colormap", self.colormap] if self.colormap != CAM.colormap else []
        words += ["--no-relu"] if self.relu != CAM.relu else []
        return command_words(["hookviz", "gradcam"], [photo], [*words, "--save-raw", "--out", out])


@runtime_checkable
class Stills(Protocol):
    """A job that draws one frame of a clip or one slice of a volume with its map (video, volume jobs)."""

    def stills(self, rgb: Any, axis: int = ...) -> int: ...

    def still(self, result: Any, rgb: Any, box: Any, k: int, axis: int = ...) -> np.ndarray: ...


class Made:
    """A view as the command writes it: the overlay PNG, the raw map (``--save-raw``, the layer's grid), and
    the record's fields. The maps are computed when the view is made; the picture is drawn when first asked
    for (a script that wants the map alone pays for the map alone)."""

    def __init__(self, job: Any, result: Any, photo: tuple[Any, Any], prefix: str, name: str) -> None:
        self.job, self.result, self.photo, self.prefix, self.name = job, result, photo, prefix, name
        self.detector = isinstance(result, list)  # a detector's job hands one result per photo

    @functools.cached_property
    def _rendered(self) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        rgb, box = self.photo
        return self.job.render(self.result, 0, rgb, box, self.prefix)

    def png_of(self, view: View) -> bytes:
        """The picture of ``view``: the file ``hookviz gradcam`` writes for it (a detector's box's), or one
        frame or slice of a video's or volume's map."""
        if view.frame >= 0:
            return self.still(view.frame, view.axis)
        files = [(n, data) for n, data in self._rendered[0] if n.endswith(".png")]
        if self.detector:
            own = [data for n, data in files if n.endswith(f".box{view.box}.png")]
            if own or view.box == 0 or not self.boxes:
                return own[0] if own else next(d for n, d in files if n.endswith(".detections.png"))
            raise InputError(f"box {view.box}: the detector found {self.boxes} (1 to {self.boxes})")
        return next(data for n, data in files if ".sheet" not in n)

    def picture_of(self, view: View) -> tuple[int, int] | None:
        """``(width, height)`` of the picture at the top of :meth:`png_of`'s PNG, above its caption (a photo
        narrower than the caption's least width enlarged, as ``gradcam`` draws it); None for a frame, a
        slice or a sheet (the page shows those whole)."""
        rgb, _ = self.photo
        if view.frame >= 0 or not isinstance(rgb, np.ndarray) or isinstance(self.job, Stills):
            return None
        h, w = rgb.shape[:2]
        k = max(1, -(-MIN_CAPTION_WIDTH // max(1, w)))
        return w * k, h * k

    @property
    def png(self) -> bytes:
        return self.png_of(View())

    @property
    def boxes(self) -> int:
        """How many boxes a detector found (0 for other models)."""
        return len(self.result[0].scores) if self.detector else 0

    def map_of(self, view: View) -> np.ndarray:
        """The map at the layer's grid (the first method, layer and target; a detector's box's), float32."""
        key = (self.job.methods[0], self.job.layers[0])
        if self.detector:
            stack = self.result[0].maps[key]
            if not len(stack):
                raise InputError("the detector found no box to explain on this photo")
            return np.asarray(stack[min(max(view.box, 1), len(stack)) - 1]).astype(np.float32)
        return np.asarray(self.result.maps[key][0, 0]).astype(np.float32)

    @property
    def map(self) -> np.ndarray:
        return self.map_of(View())

    def npy_of(self, view: View) -> bytes:
        """:meth:`map_of` as ``--save-raw`` writes it."""
        return npy_bytes(self.map_of(view))

    @property
    def npy(self) -> bytes:
        return self.npy_of(View())

    def record_of(self, view: View) -> dict[str, Any]:
        return self.record

    @property
    def record(self) -> dict[str, Any]:
        _, record = self._rendered
        rgb, _ = self.photo
        stills: dict[str, Any] = {}
        if isinstance(self.job, Stills):  # a clip's frames; a volume's slices along each axis
            stills["stills"] = (
                self.job.stills(rgb)
                if isinstance(rgb, ClipFrames)
                else [self.job.stills(rgb, a) for a in range(3)]
            )
        return {"input": self.name, "layers": list(self.job.layers), **stills, **record}

    def still(self, k: int, axis: int = 2) -> bytes:
        """Frame ``k`` of a video's clip (slice ``k`` along ``axis`` of a volume) with its map, as a PNG."""
        rgb, box = self.photo
        if not isinstance(self.job, Stills):
            raise InputError(f"frame {k}: a photo has no frames (leave frame out)")
        if not 0 <= axis <= 2:
            raise InputError(f"axis {axis}: 0, 1 or 2")
        n = self.job.stills(rgb, axis)
        if not 0 <= k < n:
            raise InputError(f"frame {k}: there are {n} (0 to {n - 1})")
        return encode_png(self.job.still(self.result, rgb, box, k, axis))
