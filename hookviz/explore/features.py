"""The explorer's features panel, beside the channels: a ``hookviz sae`` run folder's dictionary of one layer
of the session's model (``--sae DIR``): its features as ``hookviz sae features`` described them
(``features/features.json``: how often each fires, its top patches with their boxes in the photo's pixels, its
histogram, the classes its ablation lowers, its sheet of crops), and a feature's code over the photo on the
page, computed live with the session's model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookviz import render
from hookviz.core.arrays import to_numpy
from hookviz.errors import InputError, UsageError
from hookviz.explore.inputs import Inputs
from hookviz.explore.looks import NotFound
from hookviz.explore.params import Query
from hookviz.io.images import encode_png
from hookviz.models.loaded import LoadedModel
from hookviz.sae import features
from hookviz.sae.api import load_sae
from hookviz.sae.store import Trained


class SaeRun:
    """A ``hookviz sae`` run folder that ``hookviz sae features`` described: its ``features.json``, read
    once; the dictionary itself is loaded for a session's model by :meth:`dictionary`."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).expanduser().resolve()
        path = self.folder / "features" / "features.json"
        if not path.is_file():
            raise UsageError(f"--sae {folder}: no features/features.json in it; write it with "
                             f"`hookviz sae features {folder} PHOTOS` (the run's model)")  # fmt: skip
        try:
            self.data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--sae {folder}: features/features.json cannot be read ({exc})") from None
        self.by_feature = {int(f["feature"]): f for f in self.data.get("features", [])}

    def dictionary(self, loaded: LoadedModel) -> Trained:
        """The run's dictionary for ``loaded``'s model (refused, one line, for another model's run)."""
        return load_sae(self.folder, loaded)


class Features:
    """The features panel of one session: the ``--sae`` run (None: the panel says how to give one)."""

    def __init__(
        self,
        loaded: LoadedModel,
        inputs: Inputs,
        on_model: Callable[[Callable[[], Any]], Any],
        run: SaeRun | None = None,
    ) -> None:
        self.loaded, self.inputs, self.on_model, self.run = loaded, inputs, on_model, run
        self.found = run.dictionary(loaded) if run is not None else None

    def _run(self) -> SaeRun:
        if self.run is None:
            raise InputError("no SAE run given: start explore with --sae DIR (a hookviz sae train --out, "
                             "described by hookviz sae features)")  # fmt: skip
        return self.run

    def _feature(self, feature: int) -> dict[str, Any]:
        run = self._run()
        if feature not in run.by_feature:
            raise InputError(f"feature {feature}: the dictionary has features 0 to {len(run.by_feature) - 1}")
        return run.by_feature[feature]

    def listed(self, index: int | None = None) -> dict[str, Any]:
        """The dictionary's layer and its features that fire, the most often first: over the run's inputs
        (``features.json``), or with ``index`` on that input, each with its share of the input's positions
        (``here``), its mean code there (``mean``, the tie-break) and its peak."""
        data = self._run().data
        firing = sorted((f for f in data.get("features", []) if f.get("fired", 0) > 0),
                        key=lambda f: -float(f["fired"]))  # fmt: skip
        each = [{"feature": f["feature"], "fired": f["fired"], "sheet": "sheet" in f} for f in firing]
        if index is not None:
            each = self._on_input(index)
        return {
            "layer": data.get("layer"), "model": data.get("model"), "inputs": data.get("inputs"),
            "field": data.get("field"), "width": len(data.get("features", [])), "features": each,
        } | ({} if index is None else {"input": index})  # fmt: skip

    def _on_input(self, index: int) -> list[dict[str, Any]]:
        """The features that fire on input ``index``, the most often (share of its positions) first."""
        run, grid = self._run(), self._codes(self.inputs.read(index)[1])
        flat = grid.reshape(len(grid), -1)
        here, means, peaks = (flat > 0).mean(axis=1), flat.mean(axis=1), flat.max(axis=1)
        order = np.lexsort((-means, -here))
        return [
            {"feature": int(f), "here": float(here[f]), "mean": float(means[f]), "peak": float(peaks[f]),
             "fired": run.by_feature.get(int(f), {}).get("fired", 0.0),
             "sheet": "sheet" in run.by_feature.get(int(f), {})}
            for f in order if here[f] > 0
        ]  # fmt: skip

    def _codes(self, x: np.ndarray) -> np.ndarray:
        """Every feature's code over the model's input ``x``: ``(width, h, w)``, the layer's grid."""
        found = self.found
        assert found is not None
        batch = torch.as_tensor(x)[None].to(self.loaded.device)
        code = self.on_model(lambda: features.code_maps(found, self.loaded.model, batch)[0])
        return to_numpy(code.float())

    def feature(self, feature: int) -> dict[str, Any]:
        """One feature as ``features.json`` holds it (top patches, histogram, classes), its sheet a flag."""
        entry = dict(self._feature(feature))
        entry["sheet"] = "sheet" in entry
        return entry

    def sheet(self, feature: int) -> bytes:
        """The feature's sheet of crops as ``hookviz sae features`` wrote it; only a file inside the run."""
        run, given = self._run(), self._feature(feature).get("sheet")
        path = (run.folder / str(given)).resolve() if given else None
        if path is None or not path.is_relative_to(run.folder) or not path.is_file():
            raise NotFound(f"feature {feature}: no sheet in the SAE run (only the --detail features get one)")
        return path.read_bytes()

    def png(self, index: int, feature: int, alpha: float = 0.5) -> bytes:
        """Feature ``feature``'s code over input ``index`` (its map over the layer's grid, upsampled onto the
        part of the photo the model saw), scaled to its own peak, as a PNG."""
        self._feature(feature)
        rgb, x, box = self.inputs.read(index)
        grid = self._codes(x)[feature]
        top = float(grid.max()) or 1.0
        return encode_png(
            render.overlay(np.asarray(rgb), grid / top, box, alpha=alpha, colormap="viridis", scaled=True)
        )


def routes(
    session: Any,
    send_json: Callable[[Any], None],
    send: Callable[[int, bytes, str], None],
    input_of: Callable[[Query], int],
) -> dict[str, Callable[[Query], None]]:
    """The panel's API for the explorer's server (a session without the panel, a VLM's, has none):
    ``/api/features?input=`` (without ``input``: over the run's inputs), ``/api/feature?feature=``,
    ``/api/feature-sheet?feature=`` (PNG) and
    ``/api/feature-map?input=&feature=&alpha=`` (PNG)."""
    panel: Features | None = getattr(session, "panel_features", None)
    if panel is None:
        return {}

    def feature(q: Query) -> int:
        return q.whole("feature", 0, 0)

    png = "image/png"
    return {
        "/api/features": lambda q: send_json(panel.listed(input_of(q) if "input" in q.one else None)),
        "/api/feature": lambda q: send_json(panel.feature(feature(q))),
        "/api/feature-sheet": lambda q: send(200, panel.sheet(feature(q)), png),
        "/api/feature-map": lambda q: send(
            200, panel.png(input_of(q), feature(q), q.number("alpha", 0.5, 0.0, 1.0)), png
        ),
    }
