"""Videos as model inputs: what a file holds, which frames make each clip, and a clip as a tensor.

A video is never read whole: :func:`probe` opens it for its frame count, rate and size; :func:`read_clip`
decodes one clip, keeping only the frames it samples (memory is one clip's frames, whatever the video's
length). A folder of frames (images, in natural order: ``f2`` before ``f10``) is a video too.

Clips are sampled as torchvision's Kinetics evaluation does: the video resampled to the weights'
``frame_rate`` (frame ``floor(k * fps / frame_rate)``), ``clip_len`` consecutive resampled frames per clip,
``clips`` evenly spaced clips (``None``: every clip, back to back). :class:`VideoPreprocess` is the
weights' ``VideoClassification`` transform: a bilinear resize of the uint8 frames without antialiasing (to
a fixed size, or the shorter side), the centre crop, ``mean``/``std``; the clip comes out ``(3, T, H, W)``.

Every array that leaves this module is RGB ``uint8`` (frames ``(T, H, W, 3)``) or float32 (inputs).
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hookviz.errors import InputError, UsageError
from hookviz.io.images import DEFAULT_MAX_PIXELS, Box, image_suffixes, load_rgb, photo_box, quote

#: Containers read as videos (animated GIFs too, for a video model).
VIDEO_SUFFIXES = frozenset({".mp4", ".m4v", ".avi", ".mov", ".mkv", ".webm", ".gif", ".mpg", ".mpeg", ".wmv"})
KINETICS_MEAN = (0.43216, 0.394666, 0.37645)
KINETICS_STD = (0.22803, 0.22145, 0.216989)


@dataclass(frozen=True)
class VideoInfo:
    """What :func:`probe` learns without decoding: ``frames`` (as the container says), ``fps`` (None for
    a folder of frames), the frame size, and the frame files of a folder."""

    frames: int
    fps: float | None
    width: int
    height: int
    files: tuple[Path, ...] = ()
    #: Seeking by frame number is not exact (a variable frame rate, a container that guesses its frame
    #: count): clips are then decoded from the first frame on.
    sequential: bool = False


@dataclass(frozen=True)
class Clip:
    """One clip of a video: its ``number`` among ``of`` clips and the frame ``indices`` it samples."""

    number: int
    of: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class ClipFrames:
    """A decoded clip as the pipeline hands it to a job's ``render``: the sampled ``frames`` ``(T, H, W, 3)``,
    each one's time in seconds (None for a folder of frames), the clip, and the frames per second the
    overlay video plays at (the sampled rate)."""

    frames: np.ndarray
    times: list[float | None]
    clip: Clip
    fps: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.frames.shape[1:])


@dataclass(frozen=True)
class VideoPreprocess:
    """How a clip becomes a model input: torchvision's ``VideoClassification``, frame for frame.

    ``resize``: one size (the shorter side) or ``(h, w)`` (every frame to that size, aspect not kept: the
    ResNet-3D family's 128 x 171); ``crop``: the centre square. ``clip_len`` frames sampled at
    ``frame_rate`` (None: every frame), or every ``frame_stride``-th frame when that is set; ``clips``
    evenly spaced clips per video (None: all of them, back to back).
    """

    clip_len: int = 16
    resize: tuple[int, ...] = (128, 171)
    crop: int = 112
    mean: tuple[float, float, float] = KINETICS_MEAN
    std: tuple[float, float, float] = KINETICS_STD
    frame_rate: float | None = 15.0
    frame_stride: int | None = None
    clips: int | None = 1

    def __post_init__(self) -> None:
        if self.clip_len < 1:
            raise UsageError(f"--clip-len {self.clip_len}: must be at least 1")
        if self.frame_stride is not None and self.frame_stride < 1:
            raise UsageError(f"--frame-stride {self.frame_stride}: must be at least 1")
        if self.clips is not None and self.clips < 1:
            raise UsageError(f"--clips {self.clips}: give a positive number, or all")
        if len(self.resize) not in (1, 2) or min(self.resize) < 1 or self.crop < 1:
            raise UsageError(f"video sizes must be positive, got resize {self.resize}, crop {self.crop}")

    def sampled(
        self, clip_len: int | None = None, frame_stride: int | None = None, clips: int | str | None = None
    ) -> VideoPreprocess:
        """A copy with the user's sampling (``clips="all"``: every clip); None keeps the weights'."""
        changes: dict[str, object] = {}
        if clip_len is not None:
            changes["clip_len"] = clip_len
        if frame_stride is not None:
            changes["frame_stride"] = frame_stride
        if clips is not None:
            changes["clips"] = None if clips == "all" else int(clips)
        return replace(self, **changes)  # type: ignore[arg-type]

    def step(self, fps: float | None) -> float:
        """Original frames per sampled frame."""
        if self.frame_stride is not None:
            return float(self.frame_stride)
        if fps is None or self.frame_rate is None or not fps > 0:
            return 1.0
        return max(1.0, fps / self.frame_rate)

    kind: ClassVar[str] = "video"
    sides: ClassVar[str] = "N"

    def shape(self, preprocess: Any) -> tuple[int, ...]:
        """A clip's ``(3, T, H, W)``: ``clip_len`` frames of the preprocessing's square."""
        return (3, self.clip_len, preprocess.crop_size, preprocess.crop_size)

    def key(self) -> dict[str, Any]:
        return {"video": self.settings()}

    def settings(self) -> dict[str, object]:
        return {
            "clip_len": self.clip_len,
            "resize": list(self.resize),
            "crop": self.crop,
            "mean": [round(float(v), 6) for v in self.mean],
            "std": [round(float(v), 6) for v in self.std],
            "frame_rate": self.frame_rate,
            "frame_stride": self.frame_stride,
            "clips": self.clips or "all",
            "resampler": "torch bilinear, no antialias",
        }

    def _plan(self, height: int, width: int) -> tuple[int, int, int, int, int, int]:
        if len(self.resize) == 2:
            rh, rw = self.resize
        else:
            side = self.resize[0]
            # torchvision's resize of the shorter side: the longer one int(side * long / short)
            if height <= width:
                rh, rw = side, int(side * width / height)
            else:
                rh, rw = int(side * height / width), side
        c = min(self.crop, rh, rw)
        return rh, rw, round((rh - c) / 2.0), round((rw - c) / 2.0), c, c

    def box(self, height: int, width: int) -> Box:
        """The region of a ``height`` x ``width`` frame that the model sees."""
        return photo_box(height, width, self._plan(height, width))

    def __call__(self, frames: np.ndarray) -> tuple[np.ndarray, Box]:
        """``(3, T, h, w)`` float32 from ``(T, H, W, 3)`` uint8 frames, and the box each frame is cut to."""
        import torch
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as TF

        from hookviz.core.arrays import to_numpy

        _t, height, width = frames.shape[:3]
        rh, rw, top, left, h, w = self._plan(height, width)
        vid = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
        # Resized as uint8 (rounded), then scaled: the order of torchvision's VideoClassification.
        vid = TF.resize(vid, [rh, rw], interpolation=InterpolationMode.BILINEAR, antialias=False)
        vid = vid[:, :, top : top + h, left : left + w].float() / 255.0
        mean = torch.tensor(self.mean).view(1, 3, 1, 1)
        std = torch.tensor(self.std).view(1, 3, 1, 1)
        vid = (vid - mean) / std
        x = to_numpy(vid.permute(1, 0, 2, 3).contiguous())
        return x, photo_box(height, width, (rh, rw, top, left, h, w))


def _natural(path: Path) -> list[object]:
    return [int(p) if p.isdigit() else p.lower() for p in re.split(r"(\d+)", path.name)]


def frame_files(folder: Path) -> list[Path]:
    """The image files directly in ``folder``, in natural order (hidden files left out)."""
    suffixes = image_suffixes()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    files = [
        Path(e.path)
        for e in entries
        if not e.name.startswith(".")
        and (suffix := Path(e.name).suffix.strip().lower()) in suffixes
        and suffix not in VIDEO_SUFFIXES  # an animated GIF is a video of its own
        and e.is_file()
    ]
    return sorted(files, key=_natural)


#: OpenCV's FFmpeg backend prints a line to the process's stderr when it opens a WebM writer with a
#: four-character code (WebM has none; the codec is still VP8/VP9): held back while a writer opens.
_STDERR_LOCK = threading.Lock()


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    with _STDERR_LOCK:
        try:
            saved = os.dup(2)
        except OSError:
            yield
            return
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _capture(path: Path) -> Any:
    import cv2

    if not path.exists():
        raise InputError(f"{quote(path)}: no such file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{quote(path)}: permission denied")
    with _quiet_stderr():  # FFmpeg's own complaints about a broken file: our one line says it
        cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    if not cap.isOpened():
        if _video_signature(path):
            raise InputError(
                f"{quote(path)}: a video file that cannot be read: damaged or truncated (an interrupted "
                "download or copy?); fetch or re-encode it"
            )
        raise InputError(
            f"{quote(path)}: cannot open as a video (not a video file, or an unsupported codec); "
            "convert it to mp4 or webm"
        )
    return cap


def _video_signature(path: Path) -> bool:
    """Whether the file starts as a video container does (MP4/MOV ``ftyp``, Matroska/WebM, AVI, GIF)."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return (
        head[4:8] in (b"ftyp", b"moov", b"mdat", b"wide", b"free")
        or head.startswith(b"\x1a\x45\xdf\xa3")
        or (head.startswith(b"RIFF") and head[8:12] == b"AVI ")
        or head.startswith((b"GIF87a", b"GIF89a"))
    )


def probe(path: Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> VideoInfo:
    """Frame count, rate and size of a video file or folder of frames, without decoding it.

    The container's frame count is checked by seeking to its last frame and comparing that frame's time
    with the rate's; where they disagree (a variable frame rate, a truncated file, a guessed count) the
    frames are counted by decoding them (one at a time) and clips are read from the start, never by
    seeking, so a clip always holds the frames its indices name.

    Raises:
        InputError: not a video, no frames, or frames larger than ``max_pixels``.
    """
    import cv2

    path = Path(path)
    if path.is_dir():
        files = frame_files(path)
        if not files:
            raise InputError(f"{quote(path)}: a folder with no image files, so no frames to read")
        first = load_rgb(files[0], max_pixels)
        return VideoInfo(len(files), None, int(first.shape[1]), int(first.shape[0]), tuple(files))
    cap = _capture(path)
    try:
        frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = float(cap.get(cv2.CAP_PROP_FPS))
        width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        sequential = frames <= 0 or not fps > 0 or not _seekable(cap, frames, fps)
        if sequential:  # count by decoding (each frame dropped as it is read)
            cap.release()
            cap = _capture(path)
            frames = 0
            while cap.grab():
                frames += 1
    finally:
        cap.release()
    if frames <= 0 or width <= 0 or height <= 0:
        raise InputError(f"{quote(path)}: the video has no frames to read (empty or truncated)")
    if width * height > max_pixels:
        raise InputError(
            f"{quote(path)}: frames are {width}x{height} = {width * height:,} px, over the limit of "
            f"{max_pixels:,} px; downscale it or raise --max-pixels"
        )
    return VideoInfo(frames, fps if math.isfinite(fps) and fps > 0 else None, width, height, (), sequential)


def _seekable(cap: Any, frames: int, fps: float) -> bool:
    """Whether the last frame the container announces can be read where its rate puts it in time."""
    import cv2

    if frames == 1:
        return True
    cap.set(cv2.CAP_PROP_POS_FRAMES, frames - 1)
    if not cap.grab():
        return False
    ms = float(cap.get(cv2.CAP_PROP_POS_MSEC))
    return math.isfinite(ms) and abs(ms - (frames - 1) * 1000.0 / fps) <= 1500.0 / fps


def plan_clips(info: VideoInfo, p: VideoPreprocess) -> list[Clip]:
    """The clips of a video: ``p.clips`` evenly spaced from the first to the last (one: the middle clip; None:
    every clip, back to back), each ``p.clip_len`` sampled frames.

    A video shorter than one clip gives one clip whose frames repeat (spread evenly over the video).
    """
    step = p.step(info.fps)
    available = math.floor((info.frames - 1) / step) + 1  # resampled frames
    if available < p.clip_len:
        idx = np.linspace(0, info.frames - 1, p.clip_len)
        return [Clip(0, 1, tuple(round(v) for v in idx))]
    last = available - p.clip_len  # the latest start
    if p.clips is None:
        starts = list(range(0, last + 1, p.clip_len))
    elif p.clips == 1:  # the middle clip (torchvision's sampler would take the first)
        starts = [last // 2]
    else:  # as torchvision's UniformClipSampler: the first and the last clip, and evenly between them
        starts = sorted({round(float(v)) for v in np.linspace(0, last, p.clips)})
    return [
        Clip(
            n,
            len(starts),
            tuple(min(info.frames - 1, math.floor((s + i) * step)) for i in range(p.clip_len)),
        )
        for n, s in enumerate(starts)
    ]


def read_clip(
    path: Path, clip: Clip, info: VideoInfo | None = None, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[np.ndarray, list[float | None]]:
    """The clip's frames ``(T, H, W, 3)`` RGB uint8 and each frame's time in seconds (None without a rate).

    Decodes from the nearest seek point to the clip's last frame, keeping only the frames it samples.

    Raises:
        InputError: the video ends before the clip (a truncated file) or a frame cannot be decoded.
    """
    import cv2

    path = Path(path)
    wanted = sorted(set(clip.indices))
    if path.is_dir():
        files = info.files if info is not None and info.files else tuple(frame_files(path))
        got = {i: load_rgb(files[i], max_pixels) for i in wanted}
        shapes = {f.shape for f in got.values()}
        if len(shapes) > 1:
            raise InputError(
                f"{quote(path)}: the frames differ in size ({sorted(shapes)[:2]}); resize them alike"
            )
        frames = np.stack([got[i] for i in clip.indices])
        return frames, [None] * len(clip.indices)
    cap = _capture(path)
    got_frames: dict[int, np.ndarray] = {}
    times: dict[int, float | None] = {}
    try:
        pos = 0
        if wanted[0] > 0 and not (info is not None and info.sequential):
            cap.set(cv2.CAP_PROP_POS_FRAMES, wanted[0])
            pos = int(cap.get(cv2.CAP_PROP_POS_FRAMES))
            if pos != wanted[0]:  # an inexact seek: from the start
                cap.release()
                cap = _capture(path)
                pos = 0
        fps = float(cap.get(cv2.CAP_PROP_FPS)) or None
        want = set(wanted)
        while pos <= wanted[-1]:
            if pos in want:
                ok, bgr = cap.read()
            else:
                ok, bgr = cap.grab(), None
            if not ok:
                raise InputError(
                    f"{quote(path)}: the video ends at frame {pos} but clip {clip.number + 1} needs frame "
                    f"{wanted[-1]} (a truncated file?); re-encode it, or choose fewer --clips"
                )
            if bgr is not None:
                got_frames[pos] = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
                ms = float(cap.get(cv2.CAP_PROP_POS_MSEC))
                times[pos] = ms / 1000.0 if fps and math.isfinite(ms) else None
            pos += 1
    finally:
        cap.release()
    frames = np.stack([got_frames[i] for i in clip.indices])
    return frames, [times[i] for i in clip.indices]


def clip_suffix(clip: Clip) -> str:
    """What a clip adds to its video's output names: ``.clip03`` (1-based)."""
    return f".clip{clip.number + 1:02d}"


def encode_webm(frames: Sequence[np.ndarray] | np.ndarray, fps: float) -> bytes:
    """RGB frames as a VP8 WebM (what browsers play), through a temp file (OpenCV writes only to files)."""
    import tempfile

    import cv2

    height, width = frames[0].shape[:2]
    with tempfile.TemporaryDirectory(prefix="hookviz-webm-") as tmp:
        name = os.path.join(tmp, "v.webm")
        with _quiet_stderr():
            writer = cv2.VideoWriter(name, cv2.VideoWriter.fourcc(*"VP80"), float(fps), (width, height))
        if not writer.isOpened():
            raise InputError("this OpenCV cannot write WebM (VP8); install opencv-python-headless from PyPI")
        try:
            for f in frames:
                writer.write(cv2.cvtColor(np.ascontiguousarray(f), cv2.COLOR_RGB2BGR))
        finally:
            writer.release()
        with open(name, "rb") as fh:
            return fh.read()
