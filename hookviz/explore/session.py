"""What ``hookviz explore`` looks at, as a library: one loaded model over the inputs given, each view
(input, layer, method, target, look) made by the very job ``hookviz gradcam`` runs, so a view's PNG is the
bytes the command writes and its ``.npy`` the command's ``--save-raw`` map. Photos and their forward passes
are read once.

Example:
    >>> session = Session(load_model("efficientnet_lite0"), ["photos/"])
    >>> view = session.view(View(input=0, method="layercam"))
    >>> view.png, view.record["maps"][0]["target"]
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from hookviz import methods, render
from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import traced
from hookviz.core.layers import default_cam_layer
from hookviz.core.readout import scorer
from hookviz.engine.features import feature_maps
from hookviz.errors import HookvizError, InputError, UsageError
from hookviz.evaluation.faithfulness import faithfulness, random_maps
from hookviz.explore import uploads
from hookviz.explore.looks import ChannelsRun, NotFound, visualisation
from hookviz.explore.view import Made, View
from hookviz.explore.watch import Watch
from hookviz.io.images import DEFAULT_MAX_PIXELS, encode_png, load_rgb, load_rgb_within, shrunk
from hookviz.io.inputs import Item
from hookviz.io.outputs import UNSAFE, settings_key
from hookviz.io.video import ClipFrames
from hookviz.jobs.settings import CamSettings
from hookviz.models.loaded import LoadedModel, probe
from hookviz.run.kinds import input_kind_of
from hookviz.run.pipeline import output_prefix
from hookviz.run.verdicts import TrustRun, with_badges
from hookviz.tasks import make_cam_job

T = TypeVar("T")

#: Views kept made (PNG, raw map, record), least recently used dropped first.
VIEWS_KEPT = 64
#: The largest photo that may be dropped onto the page, in bytes.
MAX_UPLOAD = 32 * 2**20


class Session:
    """One model and its inputs, with the photos, forward passes and views made kept."""

    def __init__(
        self,
        loaded: LoadedModel,
        specs: Sequence[str],
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        model_words: Sequence[str] | None = None,
        channels_run: ChannelsRun | None = None,
        trust: TrustRun | None = None,
    ):
        self.loaded, self.max_pixels = loaded, max_pixels
        #: The model options a command needs to load the same model (``--model NAME --weights W ...``).
        self.model_words = list(model_words or ["--model", loaded.name, "--weights", _weights_word(loaded)])
        self.kind = input_kind_of(loaded, list(specs))
        if self.kind.name not in ("photo", "video", "volume"):
            raise UsageError(f"hookviz explore takes photos, videos and volumes; {loaded.name} takes "
                             f"{self.kind.name}s (hookviz gradcam explains them)")  # fmt: skip
        # Only what the inputs name: a symlink in a folder given that leads out of it is left out.
        roots = [Path(spec).expanduser() for spec in specs]
        found = [
            item
            for item in self.kind.find(loaded, list(specs))
            if item.path is not None and not item.error and under(item.path, roots)
        ]
        self.items: list[Item] = [
            item for item in self.kind.items(loaded, found, max_pixels) if not item.error
        ]
        if not self.items:
            raise UsageError(f"no readable input among {', '.join(specs)}; give photos or folders of photos")
        self._read: dict[int, tuple[Any, np.ndarray, Any]] = {}
        self._top: dict[int, dict[str, Any]] = {}
        self._thumbs: dict[int, bytes] = {}
        self._made: OrderedDict[tuple[Any, ...], Made] = OrderedDict()
        # Every model pass runs on one thread of the session's: one at a time, and with the same thread pools
        # each time (a new thread's first pass builds its own OpenMP team: 30-40 ms a view).
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hookviz-explore")
        self._uploads: Path | None = None
        self._dropped: dict[int, str] = {}  # a dropped photo's index: its name as dropped
        self._watch = Watch()
        self._methods: list[dict[str, Any]] | None = None
        self._pictures: dict[tuple[str, int, int], bytes] = {}
        self.channels_run = channels_run
        #: The ``hookviz trust`` run whose verdicts the method list shows (``--trust DIR``).
        self.verdicts = trust
        self.calls = probe(loaded)

    def _on_model(self, work: Callable[[], T]) -> T:
        """``work()`` on the session's model thread, waited for."""
        return self._model_thread.submit(work).result()

    # -- what there is -------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The model as ``/api/model`` says it."""
        lm = self.loaded
        return {"name": lm.name, "weights": lm.weights, "pretrained": lm.pretrained, "task": lm.task_name,
                "kind": self.kind.name, "channels_run": self.channels_run is not None}  # fmt: skip

    def command(self, view: View) -> list[str]:
        """The ``hookviz gradcam`` line that writes ``view``'s PNG (see :meth:`View.command`); a dropped
        photo by its own name (the user's copy; the session's is private and goes with it)."""
        photo = self._dropped.get(view.input) or str(self.items[view.input].path)
        return view.command(self.model_words, photo)

    def inputs(self) -> list[dict[str, Any]]:
        """Each input: its index, its name as given (a video's clip: the video's, its number after it), its
        file (a dropped photo's: its name as dropped, and ``dropped``), and for a clip the video it is cut
        from (``group``)."""
        return [_listed(i, item, self._dropped.get(i)) for i, item in enumerate(self.items)]

    def note(self, index: int) -> str | None:
        """The line saying input ``index``'s file changed on disk and was read again, if it did."""
        return self._watch.note(index)

    def _fresh(self, index: int) -> None:
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
        if self._watch.changed(index, item.path, self._dropped.get(index) or item.name):
            for kept in (self._read, self._top, self._thumbs):
                kept.pop(index, None)
            for key in [k for k in self._made if k[0] == index]:
                self._made.pop(key, None)

    def layers(self, index: int | None = None) -> list[dict[str, Any]]:
        """Each module that runs: name, type, output shape (for input ``index``, as its pass sees it; without
        one, for a test input of the model's size), whether it is the default CAM layer."""
        default = default_cam_layer(self.loaded.model, self.calls)
        calls = self.calls
        if index is not None:
            _, x, _ = self.read(index)
            calls = self._on_model(lambda: traced(self.loaded.model, tuple(x.shape), self.loaded.device))
        found = [
            {
                "name": c.name,
                "type": c.type,
                "shape": list(c.output_shape or ()),
                "default": c.name == default,
            }
            for c in calls
            if c.calls and c.name
        ]
        if default not in {c["name"] for c in found}:  # a NAME:input tensor (the pooling's input)
            found.append({"name": default, "type": "tensor", "shape": [], "default": True})
        return found

    def methods(self) -> list[dict[str, Any]]:
        """Each registered method: its name, title, family and cost, whether ``--method all`` holds it, and
        whether it applies to this model (``why``: the line ``hookviz gradcam`` refuses it with); with a trust
        run, its verdict there (``trust``: :func:`hookviz.run.verdicts.with_badges`)."""
        if self._methods is None:
            listed = [_method(n, self.loaded, self.calls) for n in methods.names()]
            self._methods = with_badges(
                listed, self.verdicts, default_cam_layer(self.loaded.model, self.calls)
            )
        return self._methods

    def read(self, index: int) -> tuple[Any, np.ndarray, Any]:
        """Input ``index`` as the pipeline reads it: (the photo, the model's input, the box it saw)."""
        self._fresh(index)
        if index not in self._read:
            self._read[index] = self.kind.read(self.loaded)(
                self.items[index], self.kind.preprocess(self.loaded), self.max_pixels
            )
        return self._read[index]

    def predict(self, index: int, k: int = 5) -> dict[str, Any]:
        """What input ``index`` can be explained for, as the default view's pass reads it: ``kind``
        ``classes`` (the ``k`` most likely, softmax), ``labels`` (a multi-label head's sigmoids, each
        ``positive`` at 0.5 or more), ``regions`` (a segmenter's classes by their share of the pixels) or
        ``boxes`` (a detector's, numbered from 1 as ``gradcam`` names their files); ``targets`` each with
        index, name and score."""
        self._fresh(index)
        if index not in self._top:
            made = self.view(View(input=index), draw=False)
            assert made is not None
            self._top[index] = _targets(made, self.loaded)
        found = self._top[index]
        return {**found, "targets": found["targets"][: k if found["kind"] == "classes" else 50]}

    # -- views ---------------------------------------------------------------------------------------------
    def view(self, view: View, wanted: Callable[[], bool] | None = None, draw: bool = True) -> Made | None:
        """The view's PNG, raw map and record, made by ``hookviz gradcam``'s own job (kept once made); None
        when ``wanted()`` says, once the model is free, that a newer view has been asked for instead.
        ``draw``: draw its picture now, on the model's thread (where OpenCV's and torch's pools are warm)."""
        self._fresh(view.input)
        key = view.made_of()
        if key in self._made:
            self._made.move_to_end(key)
            made = self._made[key]
            if draw:
                self._on_model(lambda: made.png_of(view))
            return made
        rgb, x, box = self.read(view.input)

        def compute() -> tuple[Any, Any] | None:
            if wanted is not None and not wanted():
                return None
            job = make_cam_job(self.loaded, view.settings(), calls=self.calls, target_option="target=").job
            return job, job.compute(torch.from_numpy(x)[None].to(self.loaded.device))

        done = self._on_model(compute)
        if done is None:
            return None
        job, result = done
        path = self.items[view.input].path
        assert path is not None
        prefix = output_prefix(path, self.loaded.name, settings_key(job.settings()))
        made = Made(job, result, (rgb, box), prefix, self.items[view.input].name)
        self._made[key] = made
        if draw:
            self._on_model(lambda: made.png_of(view))
        if len(self._made) > VIEWS_KEPT:
            self._made.popitem(last=False)
        return made

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
        self._dropped[len(self.items) - 1] = own
        return len(self.items) - 1

    def close(self) -> None:
        """Stop the model's thread; remove the photos dropped onto the page."""
        self._model_thread.shutdown(wait=False)
        uploads.remove(self._uploads)

    def trust(self, view: View, steps: int = 16) -> dict[str, Any]:
        """How faithful the view's map is, against chance: deletion and insertion AUC of the map and of a
        seeded random map (the ``evaluate`` command's ``random`` baseline) on this photo."""
        made = self.view(view, draw=False)
        assert made is not None
        if made.detector or self.kind.name != "photo":
            raise UsageError(f"the trust panel measures photos of classifiers and segmenters, not "
                             f"{'a detector' if made.detector else self.kind.name + 's'} (yet)")  # fmt: skip
        _, x, _ = self.read(view.input)
        batch = torch.from_numpy(x)[None].to(self.loaded.device)
        cam = torch.from_numpy(made.map)[None]
        ex = made.result.explanation
        target = ex.targets[:1, 0].cpu()
        score = scorer(ex.labels, ex.region, ex.score_kind)
        chance_map = random_maps(1, cam.shape[-2], cam.shape[-1], x=batch)
        model = self.loaded.model
        ours, chance = self._on_model(
            lambda: [
                faithfulness(model, batch, m, target, steps=steps, scorer=score) for m in (cam, chance_map)
            ]
        )
        return {
            "deletion_auc": float(ours.deletion_auc[0]), "insertion_auc": float(ours.insertion_auc[0]),
            "random": {"deletion_auc": float(chance.deletion_auc[0]),
                       "insertion_auc": float(chance.insertion_auc[0])},
            "steps": steps,
        }  # fmt: skip

    def channels(self, index: int, layer: str = "") -> tuple[str, np.ndarray]:
        """Input ``index``'s activations ``(C, h, w)`` at ``layer`` (default: the CAM layer), and its name."""
        name = layer or default_cam_layer(self.loaded.model, self.calls)
        module, _, side = name.partition(":")
        _, x, _ = self.read(index)
        batch = torch.from_numpy(x)[None].to(self.loaded.device)
        stage = "input" if side == "input" else "output"
        found = self._on_model(lambda: feature_maps(self.loaded.model, batch, [module], stage))
        return name, to_numpy(found[0].tensor[0], torch.float32)

    def channel_list(self, index: int, layer: str = "") -> dict[str, Any]:
        """The layer's channels for input ``index``, the most active first (mean and peak of each map)."""
        name, acts = self.channels(index, layer)
        means, peaks = acts.reshape(len(acts), -1).mean(axis=1), acts.reshape(len(acts), -1).max(axis=1)
        order = np.argsort(-means, kind="stable")
        each = [{"channel": int(c), "mean": float(means[c]), "max": float(peaks[c])} for c in order]
        return {"layer": name, "shape": list(acts.shape), "channels": each}

    def channel_png(self, index: int, layer: str, channel: int, alpha: float = 0.5) -> bytes:
        """One channel's activation over the photo (scaled to its own range), as a PNG."""
        name, acts = self.channels(index, layer)
        if not 0 <= channel < len(acts):
            raise InputError(f"input channel {channel}: {name} has {len(acts)} (0 to {len(acts) - 1})")
        rgb, _, box = self.read(index)
        return encode_png(
            render.overlay(np.asarray(rgb), acts[channel], box, alpha=alpha, colormap="viridis")
        )

    def layer_name(self, layer: str = "") -> str:
        """``layer`` as given, or the default CAM layer's name."""
        return layer or default_cam_layer(self.loaded.model, self.calls)

    def visualise(self, layer: str, channel: int, steps: int = 128) -> bytes:
        """``channel``'s feature visualisation at ``layer`` (module outputs only), made once, as a PNG."""
        module = self.layer_name(layer).partition(":")[0]
        key = (module, channel, steps)
        if key not in self._pictures:
            self._pictures[key] = self._on_model(lambda: visualisation(self.loaded, module, channel, steps))
        return self._pictures[key]

    def best(self, layer: str, channel: int) -> dict[str, Any]:
        """``channel``'s best inputs in the ``--channels-run`` folder (see :class:`ChannelsRun`)."""
        if self.channels_run is None:
            raise InputError(
                "no channels run given: start explore with --channels-run DIR (a hookviz channels --out)"
            )
        return self.channels_run.best(self.layer_name(layer), channel)

    def sheet(self, layer: str, channel: int) -> bytes:
        """``channel``'s sheet of best photos in the ``--channels-run`` folder."""
        if self.channels_run is None:
            raise NotFound("no channels run given (--channels-run DIR)")
        return self.channels_run.sheet(self.layer_name(layer), channel)

    def photo(self, index: int) -> bytes:
        """Input ``index`` as read (a photo, the size a detector's boxes are measured in), as a PNG."""
        rgb, _, _ = self.read(index)
        if not isinstance(rgb, np.ndarray):
            raise InputError(f"input {index} is a {self.kind.name}, not a photo")
        return encode_png(rgb)

    def thumbnail(self, index: int, side: int = 160) -> bytes:
        """Input ``index`` as a small PNG (the strip of inputs), made once."""
        self._fresh(index)
        if index not in self._thumbs:
            path = self.items[index].path
            assert path is not None
            if self.kind.name == "photo":
                small = load_rgb_within(path, side, self.max_pixels)[0]
            else:
                small, _ = shrunk(_still(self.read(index)[0]), side)
            self._thumbs[index] = encode_png(small)
        return self._thumbs[index]


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


def _method(name: str, loaded: LoadedModel, calls: list[Any]) -> dict[str, Any]:
    """A method as ``/api/methods`` lists it; whether it applies is whether ``gradcam`` builds its job."""
    m = methods.get(name)
    listed = {"name": name, "title": m.title, "family": m.family, "cost": m.cost,
              "cheap": name in methods.parse(["all"]), "applies": True, "why": ""}  # fmt: skip
    try:
        make_cam_job(loaded, CamSettings(methods=(name,)), calls=calls)
    except HookvizError as exc:
        listed |= {"applies": False, "why": str(exc)}
    return listed


def _targets(made: Made, loaded: LoadedModel) -> dict[str, Any]:
    """What a view's pass says the input can be explained for (see :meth:`Session.predict`)."""
    if made.detector:
        found = made.result[0]
        return {
            "kind": "boxes",
            "targets": [
                {"box": k + 1, "index": label, "name": loaded.class_name(label),
                 "score": round(float(found.scores[k]), 6),
                 "xyxy": [round(float(v), 2) for v in found.boxes[k].tolist()]}
                for k, label in enumerate(found.labels.tolist())
            ],
        }  # fmt: skip
    ex = made.result.explanation
    probs = ex.probs[0].float()
    order = torch.argsort(-probs, stable=True).tolist()
    kind = "labels" if ex.score_kind == "sigmoid" else "regions" if ex.labels is not None else "classes"
    if kind == "regions":  # the classes that own pixels, by their share
        present = set(torch.unique(ex.labels[0]).tolist())
        order = [c for c in order if c in present]
    each = [
        {"index": int(c), "name": loaded.class_name(int(c)), "score": round(float(probs[c]), 6)}
        | ({"positive": bool(probs[c] >= 0.5)} if kind == "labels" else {})
        for c in order[:50]
    ]
    return {"kind": kind, "targets": each}


def _weights_word(loaded: LoadedModel) -> str:
    """What ``--weights`` to give for a model's weights as its label says them."""
    label = loaded.weights
    return "DEFAULT" if label.startswith("DEFAULT") else "none" if label.startswith("none") else label


def under(path: Path, roots: Sequence[Path]) -> bool:
    """Whether ``path``, symlinks resolved, lies inside one of ``roots`` (resolved)."""
    return any(path.resolve().is_relative_to(root.resolve()) for root in roots)
