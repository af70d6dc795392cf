"""hookviz on Ray Data: :class:`Explainer` is a callable class for ``Dataset.map_batches``, so a cluster
explains a data set where it lives (``pip install 'hookviz[ray]'``; Ray is never required otherwise).

Each actor loads the model once and runs ``hookviz gradcam``'s run (:class:`hookviz.run.Run`) on each batch
of rows: the pictures (and raw maps, or a Zarr store) written under ``out`` as the command writes them, each
record appended to ``out/manifest.jsonl``, and the rows returned are those ``--records parquet`` writes, a row
per input x target x method x layer. torchrun stays the way for GPU jobs on a fixed set of machines (docs: "A
data set in the cloud").

Example::

    import ray
    from hookviz.ray import Explainer

    ds = ray.data.read_parquet("s3://bucket/index.parquet")          # a column of paths or URLs
    rows = ds.map_batches(Explainer, fn_constructor_kwargs={"model": "resnet50", "out": "s3-mounted/out",
                          "methods": ("gradcam", "layercam")}, concurrency=4, batch_size=32, num_gpus=1)
    rows.write_parquet("s3://bucket/run/records")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hookviz.errors import UsageError
from hookviz.io.inputs import Item
from hookviz.io.outputs import Output
from hookviz.io.sinks import COLUMNS, data_sinks, record_rows
from hookviz.io.stores import PATH_COLUMNS, Blob, is_url
from hookviz.jobs.settings import CamSettings
from hookviz.models.loaded import resolve_device
from hookviz.run.events import Record
from hookviz.run.runner import Run
from hookviz.tasks import load_model, make_cam_job


class Explainer:
    """Explain each row's image (its ``column``: a local path or a URL) with ``model``; see the module.

    Args:
        model: as ``--model``; ``weights``, ``input_size``, ``device`` and the other keyword arguments of
            :func:`hookviz.load_model` in ``load``.
        out: where pictures and the manifest go (a folder every actor can write: a shared file system).
        methods, layers, target: as ``--method``, ``--layer``, ``--target``; ``settings`` replaces all three
            (a :class:`hookviz.jobs.settings.CamSettings`).
        column: the rows' path column (default: the first of path, url, uri, image, file, filename).
        maps: a Zarr store for the raw maps (a path or URL ending in ``.zarr``), as ``--maps``.
    """

    def __init__(
        self,
        model: str,
        out: str,
        *,
        methods: Sequence[str] = (),
        layers: Sequence[str] = (),
        target: str = "top1",
        settings: CamSettings | None = None,
        column: str | None = None,
        maps: str | None = None,
        device: str = "auto",
        **load: Any,
    ) -> None:
        self.loaded = load_model(model, device=resolve_device(device), **load)
        chosen = settings or CamSettings(methods=tuple(methods), layers=tuple(layers), target=target)
        self.job = make_cam_job(self.loaded, chosen if maps is None else _raw(chosen)).job
        store, _ = data_sinks(Path(out), maps, None)
        self.output = Output(Path(out), maps=store)
        self.output.prepare()
        self.column = column

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        """One batch of rows (Ray's ``dict`` of columns) as record rows (a ``dict`` of columns)."""
        column = self.column or next((c for c in PATH_COLUMNS if c in batch), None)
        if column is None or column not in batch:
            raise UsageError(
                f"hookviz.ray.Explainer: the rows have no {column or 'path'} column ({list(batch)})"
            )
        items = [_item(str(value)) for value in batch[column]]
        job = lambda loaded, context: self.job  # noqa: E731  (built once, by the actor)
        run = Run(self.loaded, items, job, out=self.output, batch_size=max(1, len(items)), torchrun=False)
        rows = [row for event in run if isinstance(event, Record) for row in record_rows(event.record)]
        return {name: [row.get(name) for row in rows] for name, _ in COLUMNS}


def _item(value: str) -> Item:
    return Item(value, None, blob=Blob(value, value)) if is_url(value) else Item(value, Path(value))


def _raw(settings: CamSettings) -> CamSettings:
    return dataclasses.replace(settings, save_raw=True)
