"""What ``hookviz explore`` looks at, as a library: one loaded model over the inputs given, each view
(input, layer, method, target, look) made by the very job ``hookviz gradcam`` runs, so a view's PNG is the
bytes the command writes and its ``.npy`` the command's ``--save-raw`` map. Photos and their forward passes
are read once.

A session is its panels, each a module of its own: the inputs (:mod:`.inputs`: read once, watched, dropped
onto the page), the maps (:mod:`.maps`: the views, predictions, the trust panel), the layers and channels
(:mod:`.channels`), a sparse dictionary's features (:mod:`.features`) and the methods (:mod:`.methods`,
from the registry's declared needs). The members below are what the page's API asks (:mod:`.server`), each
one line to its panel.

Example:
    >>> session = Session(load_model("efficientnet_lite0"), ["photos/"])
    >>> view = session.view(View(input=0, method="layercam"))
    >>> view.png, view.record["maps"][0]["target"]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from hookviz.core.layers import default_cam_layer
from hookviz.errors import UsageError
from hookviz.explore.channels import Channels
from hookviz.explore.features import Features, SaeRun
from hookviz.explore.inputs import MAX_UPLOAD, Inputs, under
from hookviz.explore.looks import ChannelsRun
from hookviz.explore.maps import VIEWS_KEPT, Maps
from hookviz.explore.methods import method_list
from hookviz.io.images import DEFAULT_MAX_PIXELS
from hookviz.models.loaded import LoadedModel, probe
from hookviz.run.kinds import prepared
from hookviz.run.verdicts import TrustRun, with_badges

__all__ = ["MAX_UPLOAD", "VIEWS_KEPT", "Session", "under"]

T = TypeVar("T")


class Session:
    """One model and its inputs: the panels, and the one thread every model pass runs on."""

    def __init__(
        self,
        loaded: LoadedModel,
        specs: Sequence[str],
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        model_words: Sequence[str] | None = None,
        channels_run: ChannelsRun | None = None,
        trust: TrustRun | None = None,
        sae_run: SaeRun | None = None,
    ):
        self.loaded, self.max_pixels = loaded, max_pixels
        self.kind, loaded = prepared(loaded, list(specs))
        self.loaded = loaded
        if self.kind.name not in ("photo", "video", "volume"):
            raise UsageError(f"hookviz explore takes photos, videos and volumes; {loaded.name} takes "
                             f"{self.kind.name}s (hookviz gradcam explains them)")  # fmt: skip
        self.panel_inputs = Inputs(loaded, self.kind, specs, max_pixels)
        # Every model pass runs on one thread of the session's: one at a time, and with the same thread pools
        # each time (a new thread's first pass builds its own OpenMP team: 30-40 ms a view).
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hookviz-explore")
        self.calls = probe(loaded)
        words = list(model_words or ["--model", loaded.name, "--weights", _weights_word(loaded)])
        self.maps = Maps(loaded, self.panel_inputs, self.calls, self._on_model, words)
        self.panel_channels = Channels(loaded, self.panel_inputs, self.calls, self._on_model, channels_run)
        self.panel_features = Features(loaded, self.panel_inputs, self._on_model, sae_run)
        self._methods: list[dict[str, Any]] | None = None
        #: The ``hookviz trust`` run whose verdicts the method list shows (``--trust DIR``).
        self.verdicts = trust

    def _on_model(self, work: Callable[[], T]) -> T:
        """``work()`` on the session's model thread, waited for."""
        return self._model_thread.submit(work).result()

    @property
    def items(self) -> list[Any]:
        return self.panel_inputs.items

    @property
    def channels_run(self) -> ChannelsRun | None:
        return self.panel_channels.channels_run

    def describe(self) -> dict[str, Any]:
        """The model as ``/api/model`` says it."""
        lm = self.loaded
        return {"name": lm.name, "weights": lm.weights, "pretrained": lm.pretrained, "task": lm.task_name,
                "kind": self.kind.name, "channels_run": self.channels_run is not None,
                "sae_run": self.panel_features.run is not None}  # fmt: skip

    def methods(self) -> list[dict[str, Any]]:
        """Each registered method and whether it applies to this model (:func:`.methods.method_list`); with a
        trust run, its verdict there (``trust``: :func:`hookviz.run.verdicts.with_badges`)."""
        if self._methods is None:
            listed = method_list(self.loaded, self.calls)
            self._methods = with_badges(
                listed, self.verdicts, default_cam_layer(self.loaded.model, self.calls)
            )
        return self._methods

    def close(self) -> None:
        """Stop the model's thread; remove the photos dropped onto the page."""
        self._model_thread.shutdown(wait=False)
        self.panel_inputs.close()

    # -- the page's API, each to its panel -------------------------------------------------------------------
    def inputs(self) -> list[dict[str, Any]]:
        return self.panel_inputs.listed()

    def note(self, index: int) -> str | None:
        return self.panel_inputs.note(index)

    def read(self, index: int) -> tuple[Any, Any, Any]:
        return self.panel_inputs.read(index)

    def photo(self, index: int) -> bytes:
        return self.panel_inputs.photo(index)

    def thumbnail(self, index: int, side: int = 160) -> bytes:
        return self.panel_inputs.thumbnail(index, side)

    def add(self, name: str, data: bytes) -> int:
        return self.panel_inputs.add(name, data)

    def command(self, view: Any) -> list[str]:
        return self.maps.command(view)

    def predict(self, index: int, k: int = 5) -> dict[str, Any]:
        return self.maps.predict(index, k)

    def view(self, view: Any, wanted: Callable[[], bool] | None = None, draw: bool = True) -> Any:
        return self.maps.view(view, wanted, draw)

    def trust(self, view: Any, steps: int = 16) -> dict[str, Any]:
        return self.maps.trust(view, steps)

    def layers(self, index: int | None = None) -> list[dict[str, Any]]:
        return self.panel_channels.layers(index)

    def layer_name(self, layer: str = "") -> str:
        return self.panel_channels.layer_name(layer)

    def channel_list(self, index: int, layer: str = "") -> dict[str, Any]:
        return self.panel_channels.channel_list(index, layer)

    def channel_png(self, index: int, layer: str, channel: int, alpha: float = 0.5) -> bytes:
        return self.panel_channels.channel_png(index, layer, channel, alpha)

    def visualise(self, layer: str, channel: int, steps: int = 128) -> bytes:
        return self.panel_channels.visualise(layer, channel, steps)

    def best(self, layer: str, channel: int) -> dict[str, Any]:
        return self.panel_channels.best(layer, channel)

    def sheet(self, layer: str, channel: int) -> bytes:
        return self.panel_channels.sheet(layer, channel)


def _weights_word(loaded: LoadedModel) -> str:
    """What ``--weights`` to give for a model's weights as its label says them."""
    label = loaded.weights
    return "DEFAULT" if label.startswith("DEFAULT") else "none" if label.startswith("none") else label
