"""The explorer's inputs panel: the inputs found, each read once (and again when its file changes on disk),
their thumbnails, and the photos dropped onto the page."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hookviz.errors import InputError, UsageError
from hookviz.explore import uploads
from hookviz.explore.watch import Watch
from hookviz.io.images import encode_png, load_rgb, load_rgb_within, shrunk
from hookviz.io.inputs import Item
from hookviz.io.outputs import UNSAFE
from hookviz.io.video import ClipFrames
from hookviz.models.loaded import LoadedModel
from hookviz.run.kinds import InputKind

#: The largest photo that may be dropped onto the page, in bytes.
MAX_UPLOAD = 32 * 2**20


class Inputs:
    """The inputs of one model's session, read as the pipeline reads them. ``forget(index)`` is called when
    an input's file changed on disk (what other panels made of it is dropped)."""

    def __init__(self, loaded: LoadedModel, kind: InputKind, specs: Sequence[str], max_pixels: int) -> None:
        self.loaded, self.kind, self.max_pixels = loaded, kind, max_pixels
        # Only what the inputs name: a symlink in a folder given that leads out of it is left out.
        roots = [Path(spec).expanduser() for spec in specs]
        found = [
            item
            for item in kind.find(loaded, list(specs))
            if item.path is not None and not item.error and under(item.path, roots)
        ]
        self.items: list[Item] = [item for item in kind.items(loaded, found, max_pixels) if not item.error]
        if not self.items:
            raise UsageError(f"no readable input among {', '.join(specs)}; give photos or folders of photos")
        self.forget: list[Callable[[int], None]] = []
        self._read: dict[int, tuple[Any, np.ndarray, Any]] = {}
        self._thumbs: dict[int, bytes] = {}
        self._uploads: Path | None = None
        self.dropped: dict[int, str] = {}  # a dropped photo's index: its name as dropped
        self._watch = Watch()

    def listed(self) -> list[dict[str, Any]]:
        """Each input: its index, its name as given (a video's clip: the video's, its number after it), its
        file (a dropped photo's: its name as dropped, and ``dropped``), and for a clip the video it is cut
        from (``group``)."""
        return [_listed(i, item, self.dropped.get(i)) for i, item in enumerate(self.items)]

    def note(self, index: int) -> str | None:
        """The line saying input ``index``'s file changed on disk and was read again, if it did."""
        return self._watch.note(index)

    def fresh(self, index: int) -> None:
        """Check input ``index``'s file: changed since it was read, what was made of it is dropped (read
        again when next asked for).

        Raises:
            InputError: no such input.
            Gone: its file was deleted or moved away.
        """
        if not 0 <= index < len(self.items):
            raise InputError(f"input {index}: there are {len(self.items)} (0 to {len(self.items) - 1})")
        item = self.items[index]
        assert item.path is not None
        if self._watch.changed(index, item.path, self.dropped.get(index) or item.name):
            self._read.pop(index, None)
            self._thumbs.pop(index, None)
            for forget in self.forget:
                forget(index)

    def read(self, index: int) -> tuple[Any, np.ndarray, Any]:
        """Input ``index`` as the pipeline reads it: (the photo, the model's input, the box it saw)."""
        self.fresh(index)
        if index not in self._read:
            self._read[index] = self.kind.read(self.loaded)(
                self.items[index], self.kind.preprocess(self.loaded), self.max_pixels
            )
        return self._read[index]

    def photo(self, index: int) -> bytes:
        """Input ``index`` as read (a photo, the size a detector's boxes are measured in), as a PNG."""
        rgb, _, _ = self.read(index)
        if not isinstance(rgb, np.ndarray):
            raise InputError(f"input {index} is a {self.kind.name}, not a photo")
        return encode_png(rgb)

    def thumbnail(self, index: int, side: int = 160) -> bytes:
        """Input ``index`` as a small PNG (the strip of inputs), made once."""
        self.fresh(index)
        if index not in self._thumbs:
            path = self.items[index].path
            assert path is not None
            if self.kind.name == "photo":
                small = load_rgb_within(path, side, self.max_pixels)[0]
            else:
                small, _ = shrunk(_still(self.read(index)[0]), side)
            self._thumbs[index] = encode_png(small)
        return self._thumbs[index]

    def add(self, name: str, data: bytes) -> int:
        """A photo dropped onto the page: kept in a private folder of this session's (removed by
        :meth:`close`), read to check it, and listed; its index.

        Raises:
            InputError: too large, or not a photo hookviz can read.
        """
        if len(data) > MAX_UPLOAD:
            raise InputError(f"{name}: {len(data):,} bytes; a dropped photo may hold {MAX_UPLOAD:,} at most")
        if self._uploads is None:
            self._uploads = uploads.make()
        own = Path(name).name or "photo"
        safe = UNSAFE.sub("_", own).lstrip("._-")[:80] or "photo"
        path = self._uploads / f"{len(self.items):04d}-{safe}"
        path.write_bytes(data)
        try:
            load_rgb(path, max_pixels=self.max_pixels)
        except InputError as exc:
            path.unlink()
            # Its message names the private copy: the page is told the photo's own name.
            raise InputError(str(exc).replace(str(path), own).replace(path.name, own)) from None
        taken = {item.name for item in self.items}
        listed, n = f"dropped: {own}", 2
        while listed in taken:  # a second photo dropped under the same name: both reachable by name
            listed, n = f"dropped: {own} ({n})", n + 1
        self.items.append(Item(listed, path))
        self.dropped[len(self.items) - 1] = own
        return len(self.items) - 1

    def close(self) -> None:
        """Remove the photos dropped onto the page."""
        uploads.remove(self._uploads)


def _still(read: Any) -> np.ndarray:
    """A clip's middle frame, or a volume's middle slice (along its last axis) in grey, as RGB."""
    if isinstance(read, ClipFrames):
        frames = read.frames
        return np.asarray(frames[len(frames) // 2])
    grey = read.grey()
    plane = np.asarray(grey[..., grey.shape[-1] // 2])
    return np.ascontiguousarray(np.repeat(plane[..., None], 3, axis=-1))


def _listed(index: int, item: Item, dropped: str | None = None) -> dict[str, Any]:
    """An input as ``/api/inputs`` lists it (a clip named after its video and its number; a dropped photo by
    its own name, never the private copy's path)."""
    if dropped is not None:
        return {"index": index, "name": item.name, "file": dropped, "dropped": True}
    listed = {"index": index, "name": item.name, "file": str(item.path)}
    if item.clip is not None:
        clip = item.clip
        listed |= {"name": f"{item.name} clip {clip.number + 1}/{clip.of}", "group": item.name}
    return listed


def under(path: Path, roots: Sequence[Path]) -> bool:
    """Whether ``path``, symlinks resolved, lies inside one of ``roots`` (resolved)."""
    return any(path.resolve().is_relative_to(root.resolve()) for root in roots)
