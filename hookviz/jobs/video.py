"""Where and when a video classifier looks: the CAM job over clips.

Each clip (a batch row) gets, per method x layer x target: an overlay video (VP8 WebM, captioned, at the
sampled frame rate), and with ``--save-raw`` the map at the layer's resolution ``(t, h, w)`` and at the
frames' ``(T, H, W)`` (NaN outside the crop); one contact sheet per clip shows evenly spaced frames of every
map. A map ``(t, h, w)`` is interpolated linearly in time to the clip's ``T`` sampled frames, then
bilinearly in space onto each frame's crop box (trilinear, separable), and coloured on one scale per clip
(frame by frame scaling would hide *when* the model looks). Records carry the clip's frames and time span
and the map's share of its mass in each frame (``time_mass``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hookviz import render
from hookviz.core.arrays import to_numpy
from hookviz.errors import UsageError
from hookviz.io.images import Box, encode_png
from hookviz.io.video import encode_webm
from hookviz.jobs.cam import CamBatch, CamJob
from hookviz.jobs.common import check_finite, full_map, npy_bytes, scored_class, weights_note
from hookviz.methods import REGISTRY
from hookviz.methods import title as method_title

#: Frames of a clip shown on its contact sheet.
SHEET_FRAMES = 8


def video_methods() -> list[str]:
    """The methods that apply to 5-D activations: those computed from a layer's activations and gradients
    alone, at the layer's resolution (the others mask or differentiate the input's pixels)."""

    return [
        name
        for name, spec in REGISTRY.items()
        if spec.resolution == "layer" and spec.needs <= {"activations", "layer_gradients"}
    ]


def refuse_methods(methods: tuple[str, ...], allowed: list[str], model: str, cells: str) -> None:
    """Refuse the first of ``methods`` not ``allowed`` for ``model`` (``"a video model"``), as one that masks
    or differentiates the input's ``cells`` (pixels, voxels).

    Raises:
        UsageError: naming the method and the ones that apply.
    """
    refused = [m for m in methods if m not in allowed]
    if refused:
        raise UsageError(
            f"--method {refused[0]} does not apply to {model} (it masks or differentiates the "
            f"input's {cells}); use one of {', '.join(allowed)}"
        )


def in_time(cam: np.ndarray, frames: int) -> np.ndarray:
    """``(frames, h, w)`` from a map ``(t, h, w)``: linear interpolation along time (align_corners=False,
    as :func:`torch.nn.functional.interpolate`), each frame at the centre of its share of the clip."""
    t = cam.shape[0]
    if t == frames:
        return cam.astype(np.float32)
    pos = (np.arange(frames) + 0.5) * t / frames - 0.5
    pos = np.clip(pos, 0, t - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, t - 1)
    w = (pos - lo).astype(np.float32)[:, None, None]
    return (cam[lo] * (1 - w) + cam[hi] * w).astype(np.float32)


@dataclass(kw_only=True)
class VideoCamJob(CamJob):
    """:class:`CamJob` for a video model: its ``render`` takes a clip
    (:class:`hookviz.io.video.ClipFrames`)."""

    kind: str = "gradcam"
    #: Each clip's class probabilities by output prefix, for the whole video's prediction.
    clip_probs: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        refuse_methods(self.methods, video_methods(), "a video model", "pixels")
        if self.params.fuse is not None:
            raise UsageError(
                "--fuse is for photos; a video model's layers differ in time steps: leave it out"
            )
        if self.params.metrics:
            raise UsageError("--metrics is for photos; `hookviz evaluate` measures a video model's maps")

    pictures = (".webm",)

    def _sheet_name(self, stem: str) -> str | None:
        return f"{stem}.frames.png"  # the contact sheet, always

    def _clip_files(
        self, base: str, video: list[np.ndarray], clip: Any, cam: np.ndarray, over_time: np.ndarray, box: Box
    ) -> list[tuple[str, bytes]]:
        """One map's overlay video, and its raw maps (``--save-raw``: the clip's grid, and each frame's)."""
        files = [(f"{base}.webm", encode_webm(_even(video), clip.fps))]
        if self.params.save_raw:
            files.append((f"{base}.npy", npy_bytes(cam.astype(np.float32))))
            full = np.stack([full_map(m, clip.frames[0], box) for m in over_time])
            files.append((f"{base}.full.npy", npy_bytes(full)))
        return files

    def stills(self, rgb: Any, axis: int = 0) -> int:
        """How many stills :meth:`still` draws of a clip: its sampled frames."""
        return len(rgb.frames)

    def still(self, result: CamBatch, rgb: Any, box: Box, k: int, axis: int = 0) -> np.ndarray:
        """Frame ``k`` of the first image's clip with its first map over it, on the clip's one colour scale
        (the frame the overlay video shows at that time)."""
        (method, layer), maps = next(iter(result.maps.items()))
        over_time = in_time(maps[0, 0], len(rgb.frames))
        unit = self._unit(over_time, result.scales[(method, layer)], method)
        return render.overlay(
            rgb.frames[k], unit[k], box, alpha=self.params.alpha, colormap=self.params.colormap, scaled=True
        )

    def render(
        self, result: CamBatch, index: int, rgb: Any, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        clip, look = rgb, self.params  # a ClipFrames
        frames: np.ndarray = clip.frames
        lm, ex = self.loaded, result.explanation
        check_finite(ex, index)
        self.clip_probs[stem] = to_numpy(ex.probs[index])
        pred, p_score = int(ex.predicted[index]), float(ex.predicted_score[index])
        n = len(frames)
        shown = sorted({round(v) for v in np.linspace(0, n - 1, min(SHEET_FRAMES, n))})
        stamps = [_stamp(clip.clip.indices[k], clip.times[k]) for k in range(n)]
        files: list[tuple[str, bytes]] = []
        records = []
        rows: list[tuple[str, list[np.ndarray]]] = [
            ("frames", [frames[k][box.y0 : box.y1, box.x0 : box.x1] for k in shown])
        ]
        for (method, layer), maps in result.maps.items():
            for j, suffix in enumerate(self._target_suffixes()):
                cam = maps[index, j]  # (t, h, w)
                over_time = in_time(cam, n)
                unit = self._unit(over_time, result.scales[(method, layer)], method)
                tgt, t_score = int(ex.targets[index, j]), float(ex.target_scores[index, j])
                head = [
                    f"{lm.name} | {method_title(method)} at {layer} | {weights_note(lm)}",
                    f"clip {clip.clip.number + 1}/{clip.clip.of} "
                    f"predicted: {lm.describe(pred)} p={p_score:.3f}",
                    f"explained: {lm.describe(tgt)} p={t_score:.3f}",
                ]
                pictures = [
                    render.overlay(
                        frames[k], unit[k], box, alpha=look.alpha, colormap=look.colormap, scaled=True
                    )
                    for k in range(n)
                ]
                video = [
                    render.caption(render.enlarge_small(p), [*head, stamps[k]])
                    for k, p in enumerate(pictures)
                ]
                base = self._name(stem, method, layer, suffix)
                files += self._clip_files(base, video, clip, cam, over_time, box)
                rows.append(
                    (f"{method_title(method)} at {layer} | {lm.describe(tgt)} p={t_score:.3f}",
                     [pictures[k][box.y0 : box.y1, box.x0 : box.x1] for k in shown])
                )  # fmt: skip
                mass = np.clip(np.nan_to_num(over_time), 0, None).reshape(n, -1).sum(axis=1)
                records.append(
                    {
                        **self._map_record(f"{base}.webm", method, layer, tgt, t_score, cam),
                        "shape": list(cam.shape),
                        # The share of the map's (positive) mass in each sampled frame: when it looks.
                        "time_mass": [round(float(v), 4) for v in mass / max(float(mass.sum()), 1e-30)],
                        **self._sign_fields(ex, method, layer, index),
                    }
                )
        title = (
            f"{lm.name} | clip {clip.clip.number + 1}/{clip.clip.of} | predicted {lm.describe(pred)} "
            f"p={p_score:.3f} | {weights_note(lm)}"
        )
        sheet = render.sheet(rows, [stamps[k] for k in shown], title=title, cell=160)
        files.append((f"{stem}.frames.png", encode_png(sheet)))
        return files, self._fields(ex, index, records, clip=_clip_fields(clip))


def _stamp(frame: int, seconds: float | None) -> str:
    return f"frame {frame}" + (f" {seconds:.2f}s" if seconds is not None else "")


def _clip_fields(clip: Any) -> dict[str, Any]:
    """A clip's place in its video: number, frames sampled, first and last frame, and times in seconds."""
    idx = list(clip.clip.indices)
    times = clip.times
    return {
        "number": clip.clip.number + 1,
        "of": clip.clip.of,
        "frames": [idx[0], idx[-1]],
        "indices": idx,
        "seconds": [round(times[0], 4), round(times[-1], 4)]
        if times[0] is not None and times[-1] is not None
        else None,
        "fps": round(clip.fps, 4),
        **_uneven(idx, times, clip.fps),
    }


def _uneven(idx: list[int], times: Any, fps: float) -> dict[str, Any]:
    """A ``sampling`` note when the clip's frames span another time than the rate says (a variable frame
    rate): clips are sampled by frame index, so such a file's clips cover unequal times."""
    if len(idx) < 2 or times[0] is None or times[-1] is None or not fps:
        return {}
    expected, actual = (len(idx) - 1) / fps, float(times[-1] - times[0])
    if abs(actual - expected) <= 0.25 * expected + 1e-3:
        return {}
    return {
        "sampling": f"by frame index: the file's frame rate varies, so this clip spans {actual:.2f} s where "
        f"its rate says {expected:.2f} s"
    }


def _even(frames: list[np.ndarray]) -> list[np.ndarray]:
    """Frames cropped to even sizes (VP8 wants them) and to the first frame's size."""
    h, w = frames[0].shape[:2]
    h, w = h - h % 2, w - w % 2
    return [f[:h, :w] for f in frames]


def video_summary(
    name: str, records: list[dict[str, Any]], probs: list[np.ndarray], loaded: Any
) -> dict[str, Any]:
    """The whole video's prediction from its clips: the mean of their class probabilities (Kinetics'
    video-level evaluation), with how many clips agree, and the class explained when every clip explained
    the same one (``--target``), with its mean probability."""
    mean = np.mean(np.stack(probs), axis=0)
    top = int(mean.argmax())
    votes = sum(1 for r in records if (r.get("predicted") or {}).get("index") == top)
    summary: dict[str, Any] = {
        **scored_class(loaded, top, float(mean[top])),
        "clips": len(records),
        "clips_agreeing": votes,
    }
    explained = {(r.get("target") or {}).get("index") for r in records}
    if len(explained) == 1 and (t := explained.pop()) is not None:  # one class explained in every clip
        summary["target"] = scored_class(loaded, t, float(mean[t]))
    return summary
