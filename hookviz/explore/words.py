"""``hookviz explore`` over a vision-language model: each photo's answer to the prompt is generated once (with
every default method's maps from one pass); the target picker lists the answer's words, and a view is one
method's map of one word, the PNG ``hookviz vlm`` writes for it.

Example:
    >>> session = VlmSession(load_vlm("hf:llava"), ["photos/"], "USER: <image> what is this ? ASSISTANT:")
    >>> session.predict(0)["targets"]  # the answer's tokens, with their probabilities
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from hookviz.errors import InputError, UsageError
from hookviz.explore.view import View
from hookviz.explore.watch import Watch
from hookviz.io.images import DEFAULT_MAX_PIXELS, encode_png, load_rgb, load_rgb_within
from hookviz.io.inputs import Item, expand_inputs
from hookviz.io.outputs import command_words
from hookviz.methods.registry import TOKEN_METHODS
from hookviz.vlm.faithful import word_faithfulness
from hookviz.vlm.pictures import render_words
from hookviz.vlm.words import DEFAULT_METHODS, Vlm, WordMaps, explain_words

T = TypeVar("T")


class MadeWords:
    """One photo's word maps as ``hookviz vlm`` draws them; a view picks a method and a token."""

    def __init__(self, wm: WordMaps, rgb: np.ndarray, name: str, model: str) -> None:
        self.wm, self.rgb, self.name, self.model = wm, rgb, name, model
        #: Each view drawn (the page asks for its PNG, then its record): drawn once.
        self._views: dict[tuple[Any, ...], tuple[list[tuple[str, bytes]], dict[str, Any]]] = {}

    def token(self, view: View) -> int:
        n = len(self.wm.answer.tokens)
        given = view.target
        k = 0 if given in ("top1", "") else int(given) if given.isascii() and given.isdigit() else -1
        if not 0 <= k < n:
            raise InputError(f"target {view.target!r}: the answer has {n} tokens (0 to {n - 1})")
        return k

    def _drawn(self, view: View) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        key = (view.method, self.token(view), view.alpha, view.colormap)
        if key not in self._views:
            if len(self._views) >= 64:  # a dragged slider: the oldest views go first
                self._views.pop(next(iter(self._views)))
            self._views[key] = self._draw(view)
        return self._views[key]

    def _draw(self, view: View) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        one = WordMaps(
            self.wm.answer,
            self.wm.placement,
            {view.method: self.wm.maps[view.method]},
            self.wm.layer,
            self.wm.prompt,
        )
        return render_words(
            one,
            self.rgb,
            "view",
            self.model,
            tokens=[self.token(view)],
            alpha=view.alpha,
            colormap=view.colormap,
            save_raw=True,
        )

    def png_of(self, view: View) -> bytes:
        files, _ = self._drawn(view)
        return next(data for name, data in files if name.endswith(".png") and not name.endswith(".words.png"))

    def npy_of(self, view: View) -> bytes:
        files, _ = self._drawn(view)
        return next(data for name, data in files if name.endswith(".npy"))

    def record_of(self, view: View) -> dict[str, Any]:
        _, record = self._drawn(view)
        return {"input": self.name, **record}


class VlmSession:
    """A vision-language model, the prompt, and the photos; each photo's maps made once, on one thread."""

    def __init__(
        self,
        vlm: Vlm,
        specs: Sequence[str],
        prompt: str,
        *,
        max_new_tokens: int = 16,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        model_words: Sequence[str] | None = None,
    ) -> None:
        self.vlm, self.prompt, self.max_new_tokens, self.max_pixels = vlm, prompt, max_new_tokens, max_pixels
        self.model_words = list(model_words or ["--model", vlm.name])
        roots = [Path(spec).expanduser().resolve() for spec in specs]
        self.items: list[Item] = [
            item
            for item in expand_inputs(list(specs))
            if item.path is not None
            and not item.error
            and any(item.path.resolve().is_relative_to(r) for r in roots)
        ]
        if not self.items:
            raise UsageError(f"no readable photo among {', '.join(specs)}; give photos or folders of photos")
        self.channels_run = None
        self._made: dict[int, MadeWords] = {}
        self._thumbs: dict[int, bytes] = {}
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hookviz-explore")
        self._watch = Watch()

    def _on_model(self, work: Callable[[], T]) -> T:
        return self._model_thread.submit(work).result()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.vlm.name,
            "weights": self.vlm.name,
            "pretrained": True,
            "task": "vision-language",
            "kind": "photo",
            "channels_run": False,
            "prompt": self.prompt,
        }

    def inputs(self) -> list[dict[str, Any]]:
        return [{"index": i, "name": item.name, "file": str(item.path)} for i, item in enumerate(self.items)]

    def note(self, index: int) -> str | None:
        """The line saying input ``index``'s file changed on disk and was read again, if it did."""
        return self._watch.note(index)

    def _fresh(self, index: int) -> None:
        """Input ``index``'s maps and thumbnail dropped when its file changed since (see :class:`Watch`)."""
        if not 0 <= index < len(self.items):
            raise InputError(f"input {index}: there are {len(self.items)} (0 to {len(self.items) - 1})")
        item = self.items[index]
        assert item.path is not None
        if self._watch.changed(index, item.path, item.name):
            self._made.pop(index, None)
            self._thumbs.pop(index, None)

    def layers(self, index: int | None = None) -> list[dict[str, Any]]:
        """The decoder layer LLaVA-CAM and tokengrad read (`hookviz vlm --layer` takes the others)."""
        depth = len(self.vlm.family.language_model(self.vlm.model).layers)
        return [{"name": "", "type": f"decoder layer {(depth - 1) // 2}", "shape": [], "default": True}]

    def methods(self) -> list[dict[str, Any]]:
        """The registered token methods; the defaults apply (relevancy is asked for by name)."""
        return [
            {
                "name": m.name,
                "title": m.title,
                "family": "vision-language",
                "cost": "one pass for all words",
                "cheap": True,
                "applies": m.default,
                "why": "" if m.default else f"hookviz vlm --method {m.name} ({m.cost})",
            }
            for m in TOKEN_METHODS.values()
        ]

    def _read(self, index: int) -> MadeWords:
        self._fresh(index)
        if index not in self._made:
            item = self.items[index]
            assert item.path is not None
            rgb = load_rgb(item.path, max_pixels=self.max_pixels)
            wm = self._on_model(
                lambda: explain_words(
                    self.vlm, rgb, self.prompt, max_new_tokens=self.max_new_tokens, methods=DEFAULT_METHODS
                )
            )
            self._made[index] = MadeWords(wm, rgb, item.name, self.vlm.name)
        return self._made[index]

    def predict(self, index: int, k: int = 5) -> dict[str, Any]:
        """The answer's tokens: index, text, probability (``kind`` ``tokens``), and the answer itself."""
        wm = self._read(index).wm
        targets = [
            {"index": i, "name": t, "score": round(p, 6)}
            for i, (t, p) in enumerate(zip(wm.answer.tokens, wm.answer.probs, strict=True))
        ]
        return {"kind": "tokens", "answer": wm.answer.text, "targets": targets}

    def view(
        self, view: View, wanted: Callable[[], bool] | None = None, draw: bool = True
    ) -> MadeWords | None:
        if view.method not in DEFAULT_METHODS:
            raise InputError(f"method {view.method!r}: explore shows {', '.join(DEFAULT_METHODS)}")
        made = self._read(view.input)
        made.token(view)
        return made

    def command(self, view: View) -> list[str]:
        """The ``hookviz vlm`` line whose outputs hold ``view``'s PNG (the word's file for the method)."""
        item = self.items[view.input]
        words = [
            *self.model_words,
            "--prompt",
            self.prompt,
            "--max-new-tokens",
            str(self.max_new_tokens),
            "--method",
            view.method,
        ]
        words += ["--alpha", f"{view.alpha:g}"] if view.alpha != 0.5 else []
        words += ["--colormap", view.colormap] if view.colormap != "jet" else []
        return command_words(["hookviz", "vlm"], [str(item.path)], [*words, "--save-raw", "--out", "out"])

    def trust(self, view: View, steps: int = 8) -> dict[str, Any]:
        made = self._read(view.input)
        return self._on_model(
            lambda: word_faithfulness(self.vlm, made.wm, view.method, made.token(view), steps=steps)
        )

    def thumbnail(self, index: int, side: int = 160) -> bytes:
        self._fresh(index)
        if index not in self._thumbs:
            path = self.items[index].path
            assert path is not None
            self._thumbs[index] = encode_png(load_rgb_within(path, side, self.max_pixels)[0])
        return self._thumbs[index]

    def photo(self, index: int) -> bytes:
        return encode_png(self._read(index).rgb)

    def _no_channels(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError("the channel view is for vision models; a vision-language model's maps are per word")

    channel_list = channel_png = visualise = best = sheet = _no_channels

    def layer_name(self, layer: str = "") -> str:
        return layer

    def add(self, name: str, data: bytes) -> int:
        raise UsageError(
            "drop photos onto a vision model's explorer; give this one its photos on the command line"
        )

    def close(self) -> None:
        self._model_thread.shutdown(wait=False)
