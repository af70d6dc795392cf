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

import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from hookviz import methods, render
from hookviz.core.conventions import score_kind
from hookviz.core.layers import default_cam_layer
from hookviz.core.readout import ranking, scorer
from hookviz.engine.features import feature_maps
from hookviz.errors import InputError, UsageError
from hookviz.evaluation.faithfulness import faithfulness, random_maps
from hookviz.io.images import DEFAULT_MAX_PIXELS, encode_png, load_rgb, load_rgb_within
from hookviz.io.inputs import Item
from hookviz.io.outputs import UNSAFE, settings_key
from hookviz.jobs.build import CamSettings
from hookviz.jobs.common import npy_bytes
from hookviz.models.loaded import LoadedModel, probe
from hookviz.run.kinds import input_kind_of
from hookviz.run.pipeline import output_prefix
from hookviz.tasks import make_cam_job

T = TypeVar("T")

#: Views kept made (PNG, raw map, record), least recently used dropped first.
VIEWS_KEPT = 64
#: The largest photo that may be dropped onto the page, in bytes.
MAX_UPLOAD = 32 * 2**20


@dataclass(frozen=True)
class View:
    """One view: which input (its index among the inputs), layer (empty: the default), method and target
    (``top1``, a class index or name), and how it looks."""

    input: int = 0
    layer: str = ""
    method: str = "gradcam"
    target: str = "top1"
    alpha: float = 0.5
    colormap: str = "jet"
    relu: bool = True

    def settings(self) -> CamSettings:
        """The ``gradcam`` settings that make this view."""
        return CamSettings(
            layers=(self.layer,) if self.layer else (), methods=(self.method,), target=self.target,
            alpha=self.alpha, colormap=self.colormap, relu=self.relu, save_raw=True,
        )  # fmt: skip

    def command(self, model: Sequence[str], photo: str, out: str = "out") -> list[str]:
        """The ``hookviz gradcam`` line that writes this view's PNG and raw map (the words of a shell
        command); ``model``: the model options' words (``--model NAME --weights W ...``)."""
        words = ["hookviz", "gradcam", photo, *model]
        words += ["--layer", self.layer] if self.layer else []
        words += ["--method", self.method] if self.method != "gradcam" else []
        words += ["--target", self.target] if self.target != "top1" else []
        words += ["--alpha", f"{self.alpha:g}"] if self.alpha != 0.5 else []
        words += ["--colormap", self.colormap] if self.colormap != "jet" else []
        words += ["--no-relu"] if not self.relu else []
        return [*words, "--save-raw", "--out", out]


class Made:
    """A view as the command writes it: the overlay PNG, the raw map (``--save-raw``, the layer's grid), and
    the record's fields. The maps are computed when the view is made; the picture is drawn when first asked
    for (a script that wants the map alone pays for the map alone)."""

    def __init__(self, job: Any, result: Any, photo: tuple[Any, Any], prefix: str, name: str) -> None:
        self.job, self.result, self.photo, self.prefix, self.name = job, result, photo, prefix, name

    @functools.cached_property
    def _rendered(self) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        rgb, box = self.photo
        return self.job.render(self.result, 0, rgb, box, self.prefix)  # type: ignore[no-any-return]

    @property
    def png(self) -> bytes:
        files, _ = self._rendered
        return next(data for name, data in files if name.endswith(".png") and ".sheet" not in name)

    @property
    def map(self) -> np.ndarray:
        """The map at the layer's grid (the first method, layer and target), float32."""
        key = (self.job.methods[0], self.job.layers[0])
        return np.asarray(self.result.maps[key][0, 0]).astype(np.float32)

    @functools.cached_property
    def npy(self) -> bytes:
        """:attr:`map` as ``--save-raw`` writes it."""
        return npy_bytes(self.map)

    @property
    def record(self) -> dict[str, Any]:
        _, record = self._rendered
        return {"input": self.name, "layers": list(self.job.layers), **record}


class Session:
    """One model and its inputs, with the photos, forward passes and views made kept."""

    def __init__(
        self,
        loaded: LoadedModel,
        specs: Sequence[str],
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        model_words: Sequence[str] | None = None,
    ):
        if loaded.task_name != "classification":
            raise UsageError(
                f"hookviz explore takes classifiers so far; {loaded.name} is a {loaded.task_name} model "
                "(hookviz gradcam explains it)"
            )
        self.loaded, self.max_pixels = loaded, max_pixels
        #: The model options a command needs to load the same model (``--model NAME --weights W ...``).
        self.model_words = list(model_words or ["--model", loaded.name, "--weights", _weights_word(loaded)])
        self.kind = input_kind_of(loaded, list(specs))
        # Only what the inputs name: a symlink in a folder given that leads out of it is left out.
        roots = [Path(spec).expanduser() for spec in specs]
        self.items: list[Item] = [
            item
            for item in self.kind.find(loaded, list(specs))
            if item.path is not None and not item.error and under(item.path, roots)
        ]
        if not self.items:
            raise UsageError(f"no readable input among {', '.join(specs)}; give photos or folders of photos")
        self._read: dict[int, tuple[Any, np.ndarray, Any]] = {}
        self._top: dict[int, list[dict[str, Any]]] = {}
        self._thumbs: dict[int, bytes] = {}
        self._made: OrderedDict[tuple[Any, ...], Made] = OrderedDict()
        # Every model pass runs on one thread of the session's: one at a time, and with the same thread pools
        # each time (a new thread's first pass builds its own OpenMP team: 30-40 ms a view).
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hookviz-explore")
        self._uploads: Path | None = None
        self.calls = probe(loaded)

    def _on_model(self, work: Callable[[], T]) -> T:
        """``work()`` on the session's model thread, waited for."""
        return self._model_thread.submit(work).result()

    # -- what there is -------------------------------------------------------------------------------------
    def inputs(self) -> list[dict[str, Any]]:
        """Each input: its index, its name as given, and its file."""
        return [{"index": i, "name": item.name, "file": str(item.path)} for i, item in enumerate(self.items)]

    def layers(self) -> list[dict[str, Any]]:
        """Each module that runs: name, type, output shape, whether it is the default CAM layer."""
        default = default_cam_layer(self.loaded.model, self.calls)
        found = [
            {
                "name": c.name,
                "type": c.type,
                "shape": list(c.output_shape or ()),
                "default": c.name == default,
            }
            for c in self.calls
            if c.calls and c.name
        ]
        if default not in {c["name"] for c in found}:  # a NAME:input tensor (the pooling's input)
            found.append({"name": default, "type": "tensor", "shape": [], "default": True})
        return found

    def methods(self) -> list[dict[str, Any]]:
        """Each registered method: its name, title, family and cost, and whether ``--method all`` holds it."""
        return [
            {"name": n, "title": methods.get(n).title, "family": methods.get(n).family,
             "cost": methods.get(n).cost, "cheap": n in methods.parse(["all"])}
            for n in methods.names()
            if not methods.get(n).detection_only
        ]  # fmt: skip

    def read(self, index: int) -> tuple[Any, np.ndarray, Any]:
        """Input ``index`` as the pipeline reads it: (the photo, the model's input, the box it saw)."""
        if not 0 <= index < len(self.items):
            raise InputError(f"input {index}: there are {len(self.items)} (0 to {len(self.items) - 1})")
        if index not in self._read:
            self._read[index] = self.kind.read(self.loaded)(
                self.items[index], self.kind.preprocess(self.loaded), self.max_pixels
            )
        return self._read[index]

    def predict(self, index: int, k: int = 5) -> list[dict[str, Any]]:
        """The ``k`` most likely classes of input ``index``: index, name, score (as records read them)."""
        if index not in self._top:
            _, x, _ = self.read(index)
            batch = torch.from_numpy(x)[None].to(self.loaded.device)
            logits = self._on_model(lambda: _no_grad(self.loaded.model, batch)).float().cpu()
            kind = score_kind(self.loaded.model)
            order = ranking(logits)[0].tolist()
            probs = scorer(kind=kind)(logits, torch.zeros(1, dtype=torch.long))[0]
            self._top[index] = [
                {"index": int(i), "name": self.loaded.class_name(int(i)), "score": round(float(probs[i]), 6)}
                for i in order[:50]
            ]
        return self._top[index][:k]

    # -- views ---------------------------------------------------------------------------------------------
    def view(self, view: View, wanted: Callable[[], bool] | None = None, draw: bool = True) -> Made | None:
        """The view's PNG, raw map and record, made by ``hookviz gradcam``'s own job (kept once made); None
        when ``wanted()`` says, once the model is free, that a newer view has been asked for instead.
        ``draw``: draw its picture now, on the model's thread (where OpenCV's and torch's pools are warm)."""
        key = dataclasses.astuple(view)
        if key in self._made:
            self._made.move_to_end(key)
            made = self._made[key]
            if draw:
                self._on_model(lambda: made.png)
            return made
        rgb, x, box = self.read(view.input)

        def compute() -> tuple[Any, Any] | None:
            if wanted is not None and not wanted():
                return None
            job = make_cam_job(self.loaded, view.settings(), calls=self.calls).job
            return job, job.compute(torch.from_numpy(x)[None].to(self.loaded.device))

        done = self._on_model(compute)
        if done is None:
            return None
        job, result = done
        path = self.items[view.input].path
        assert path is not None
        prefix = output_prefix(path, self.loaded.name, settings_key(job.settings()))
        made = Made(job, result, (rgb, box), prefix, self.items[view.input].name)
        if draw:
            self._on_model(lambda: made.png)
        self._made[key] = made
        if len(self._made) > VIEWS_KEPT:
            self._made.popitem(last=False)
        return made

    def add(self, name: str, data: bytes) -> int:
        """A photo dropped onto the page: kept in a private folder of this session's (removed by
        :meth:`close`), read to check it, and listed; its index.

        Raises:
            InputError: too large, or not a photo hookviz can read.
        """
        import tempfile

        if len(data) > MAX_UPLOAD:
            raise InputError(f"{name}: {len(data):,} bytes; a dropped photo may hold {MAX_UPLOAD:,} at most")
        if self._uploads is None:
            self._uploads = Path(tempfile.mkdtemp(prefix="hookviz-explore-"))  # mode 0700: the user's only
        safe = UNSAFE.sub("_", Path(name).name).lstrip("._-")[:80] or "photo"
        path = self._uploads / f"{len(self.items):04d}-{safe}"
        path.write_bytes(data)
        try:
            load_rgb(path, max_pixels=self.max_pixels)
        except InputError:
            path.unlink()
            raise
        self.items.append(Item(f"dropped: {Path(name).name}", path))
        return len(self.items) - 1

    def close(self) -> None:
        """Stop the model's thread; remove the photos dropped onto the page."""
        import shutil

        self._model_thread.shutdown(wait=False)
        if self._uploads is not None:
            shutil.rmtree(self._uploads, ignore_errors=True)

    def trust(self, view: View, steps: int = 16) -> dict[str, Any]:
        """How faithful the view's map is, against chance: deletion and insertion AUC of the map and of a
        seeded random map (the ``evaluate`` command's ``random`` baseline) on this photo."""
        made = self.view(view, draw=False)
        assert made is not None
        _, x, _ = self.read(view.input)
        batch = torch.from_numpy(x)[None].to(self.loaded.device)
        cam = torch.from_numpy(made.map)[None]
        target = made.result.explanation.targets[:1, 0].cpu()
        score = scorer(kind=score_kind(self.loaded.model))
        chance_map = random_maps(1, *cam.shape[-2:], x=batch)
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
        return name, found[0].tensor[0].float().cpu().numpy()

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

    def thumbnail(self, index: int, side: int = 160) -> bytes:
        """Input ``index`` as a small PNG (the strip of inputs), made once."""
        if index not in self._thumbs:
            path = self.items[index].path if 0 <= index < len(self.items) else None
            if path is None:
                raise InputError(f"input {index}: there are {len(self.items)} (0 to {len(self.items) - 1})")
            self._thumbs[index] = encode_png(load_rgb_within(path, side, self.max_pixels)[0])
        return self._thumbs[index]


def _no_grad(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(batch)  # type: ignore[no-any-return]


def _weights_word(loaded: LoadedModel) -> str:
    """What ``--weights`` to give for a model's weights as its label says them."""
    label = loaded.weights
    return "DEFAULT" if label.startswith("DEFAULT") else "none" if label.startswith("none") else label


def under(path: Path, roots: Sequence[Path]) -> bool:
    """Whether ``path``, symlinks resolved, lies inside one of ``roots`` (resolved)."""
    return any(path.resolve().is_relative_to(root.resolve()) for root in roots)
