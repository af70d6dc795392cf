"""``hookviz sae features`` and ``hookviz sae explain`` as library calls: ``features.json`` and a sheet of top
patches per feature (the crops of ``hookviz channels``), and per photo the maps of its strongest features over
it and the class probabilities moved by a feature scaled inside the forward pass."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookviz import render
from hookviz.concepts.dataset import Photos, channel_sheet
from hookviz.concepts.examples import Example
from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import logits_of, preserved
from hookviz.errors import InputError, OutputError
from hookviz.io.files import atomic_write
from hookviz.io.images import DEFAULT_MAX_PIXELS, Box, encode_png
from hookviz.io.inputs import Item, read_input
from hookviz.io.outputs import safe_name
from hookviz.models.loaded import LoadedModel
from hookviz.sae import features, quality, store
from hookviz.sae.store import Trained
from hookviz.sae.vectors import readable

FEATURES = "features"


def batches(
    loaded: LoadedModel, items: Sequence[Item], size: int, skipped: list[str]
) -> Iterator[tuple[list[str], torch.Tensor, list[Box]]]:
    """The readable inputs, ``size`` at a time: their names, model inputs and the boxes the model saw."""
    names: list[str] = []
    xs: list[torch.Tensor] = []
    boxes: list[Box] = []
    for item, x, box in readable(items, loaded.preprocess, DEFAULT_MAX_PIXELS, skipped):
        names.append(item.name)
        xs.append(x)
        boxes.append(box)
        if len(xs) == size:
            yield names, torch.stack(xs), boxes
            names, xs, boxes = [], [], []
    if xs:
        yield names, torch.stack(xs), boxes


def describe(
    found: Trained, loaded: LoadedModel, items: Sequence[Item], folder: str | os.PathLike[str], *,
    top: int = 8, detail: int = 32, batch: int = 16,
) -> dict[str, Any]:  # fmt: skip
    """``folder/features/features.json`` and a sheet per detailed feature (the ``detail`` firing most often):
    per feature its top patches (``input``, ``score``, ``box`` in the photo's pixels), its histogram, and for
    the detailed ones the classes whose logits drop most when it is zeroed over its top inputs."""
    folder, skipped = Path(folder), list[str]()
    out_dir = folder / FEATURES
    writable(out_dir)  # refused before any work
    found_ = features.gather(found, loaded.model, batches(loaded, items, batch, skipped), top, loaded.device)
    if found_.inputs == 0:  # nothing to describe: the features.json already there is kept
        first = f" ({skipped[0]})" if skipped else ""
        raise InputError(f"no input could be read{first}; {out_dir / 'features.json'} left as it was: give "
                         "photos, folders or globs")  # fmt: skip
    rate = found_.fired / max(found_.positions, 1)
    detailed = [int(f) for f in np.argsort(-rate, kind="stable")[:detail] if rate[f] > 0]
    photos = Photos()
    entries = []
    by_name = {item.name: item for item in items}
    for f in range(found.shape.width):
        entry: dict[str, Any] = {
            "feature": f, "fired": float(rate[f]),
            "top": [
                {"input": p.input, "score": p.score, "box": list(p.box), "cell": list(p.cell)}
                for p in found_.top[f]
            ],
            "histogram": {"edges": features.EDGES.tolist(), "counts": found_.hist[f].tolist()},
        }  # fmt: skip
        if f in detailed and quality.gives_classes(loaded.model):
            entry["classes"] = _classes(found, loaded, [by_name[p.input] for p in found_.top[f]], f)
        if f in detailed:
            entry["sheet"] = _sheet(found_.top[f], f, loaded.name, found.layer, out_dir, photos)
        entries.append(entry)
    data = {"layer": found.layer, "model": loaded.name, "inputs": found_.inputs, "field": list(found_.rf),
            "skipped": skipped, "features": entries}  # fmt: skip
    store.write_json(out_dir / "features.json", data)
    return data


def writable(folder: Path) -> None:
    """Create ``folder`` where it is not there; one line (exit 3) where it cannot be written to (a read-only
    mount, a file in its place).

    Raises:
        OutputError: the folder cannot be written to.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".hookviz-probe-"):
            pass
    except OSError as e:
        raise OutputError(f"{folder}: cannot write there ({e.strerror or e}); make it writable or copy the "
                          "run folder somewhere writable") from None  # fmt: skip


def _classes(
    found: Trained, loaded: LoadedModel, items: Sequence[Item], f: int, n: int = 3
) -> list[dict[str, Any]]:
    x = torch.stack([torch.as_tensor(read_input(i, loaded.preprocess, DEFAULT_MAX_PIXELS)[1]) for i in items])
    delta = to_numpy(features.ablation(found, loaded.model, x.to(loaded.device), [f])[0])
    order = np.argsort(delta, kind="stable")[:n]
    return [
        {"class": int(c), "name": loaded.class_name(int(c)), "logit_drop": float(-delta[c])} for c in order
    ]


def _sheet(
    patches: Sequence[features.Patch], f: int, model: str, layer: str, out_dir: Path, photos: Photos
) -> str:
    examples = [Example(p.score, p.input, p.peak) for p in patches]
    fields = {p.input: (p.box[3] - p.box[1], p.box[2] - p.box[0]) for p in patches}
    title = f"{model} {layer} feature {f}: its {len(patches)} best inputs by the peak of its code"
    picture = channel_sheet(examples, lambda name: fields[name], photos, title=title)
    name = f"{safe_name(layer)}.f{f}.png"
    atomic_write(out_dir / name, encode_png(picture))
    return f"{FEATURES}/{name}"


def explain_photo(
    found: Trained, loaded: LoadedModel, item: Item, out: str | os.PathLike[str], *, strongest: int = 3,
    feature: int | None = None, scale: float = 0.0, save_raw: bool = False, prefix: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One photo: a picture of where its ``strongest`` features fire over it (their code maps over the patch
    grid, ``grid`` in the record, upsampled onto the part of the photo the model saw; ``save_raw``: those
    maps as ``NAME.sae.npy``, ``(features, photo height, photo width)``, zero outside that part), and, for
    ``feature``, the class probabilities with the reconstruction in place and with that feature's code scaled
    by ``scale``. ``prefix``: the start of its files' names (default the photo's stem)."""
    out = Path(out)
    rgb, x, box = read_input(item, loaded.preprocess, DEFAULT_MAX_PIXELS)
    xt = torch.as_tensor(x)[None].to(loaded.device)
    maps = features.code_maps(found, loaded.model, xt)[0]
    peaks = maps.flatten(1).max(1).values
    best = [int(f) for f in torch.argsort(peaks, descending=True, stable=True)[:strongest] if peaks[f] > 0]
    record: dict[str, Any] = {
        "input": item.name, "grid": list(maps.shape[1:]), "size": list(rgb.shape[:2]),
        "features": [{"feature": f, "peak": float(peaks[f])} for f in best],
    }  # fmt: skip
    stem = out / (prefix or safe_name(Path(item.name).stem))
    if best:
        picked = to_numpy(maps[best].float())
        title = f"{loaded.name} {found.layer}: the strongest features of {Path(item.name).name}"
        picture = render.overlay_row(rgb, box, picked, [f"feature {f}" for f in best], title, 0.5, "jet")
        atomic_write(stem.with_name(f"{stem.name}.sae.png"), encode_png(picture))
        record["picture"] = str(stem.with_name(f"{stem.name}.sae.png"))
        if save_raw:
            record["raw"] = _save_raw(picked, box, rgb.shape[:2], stem.with_name(f"{stem.name}.sae.npy"))
    if feature is not None:
        record["scaled"] = _moved(found, loaded, xt, feature, scale, bool(maps[feature].max() > 0))
    return record


def _save_raw(maps: np.ndarray, box: Box, size: tuple[int, ...], path: Path) -> str:
    """The maps upsampled onto ``box`` of a photo of ``size`` (zero outside it), saved as ``path``."""
    full = np.zeros((len(maps), size[0], size[1]), np.float32)
    for i, m in enumerate(maps):
        full[i, box.y0 : box.y1, box.x0 : box.x1] = render.upsample(m, box)
    buffer = io.BytesIO()
    np.save(buffer, full)
    atomic_write(path, buffer.getvalue())
    return str(path)


def _moved(
    found: Trained, loaded: LoadedModel, x: torch.Tensor, f: int, scale: float, active: bool, n: int = 5
) -> dict[str, Any]:
    """The ``n`` classes ``f`` scaled moves most, before and after; where ``f`` is not active on the photo
    (scaling it changes nothing), the photo's top ``n`` classes, ``active`` false."""
    with preserved(loaded.model), torch.no_grad():
        loaded.model.eval()
        with quality.replaced(loaded.model, found):
            kept = logits_of(loaded.model(x)).float()
        with quality.replaced(loaded.model, found, features.scaled(f, scale)):
            moved_out = logits_of(loaded.model(x)).float()
    cosine = float(torch.nn.functional.cosine_similarity(kept.flatten(), moved_out.flatten(), dim=0))
    if not quality.gives_classes(loaded.model) or kept.ndim != 2:  # an image embedding: no classes
        return {"feature": f, "scale": scale, "active": active, "output_cosine": cosine, "classes": []}
    before, after = kept.softmax(1)[0], moved_out.softmax(1)[0]
    moved = torch.argsort((after - before).abs() if active else before, descending=True, stable=True)[:n]
    return {
        "feature": f, "scale": scale, "active": active, "output_cosine": cosine,
        "classes": [{"class": int(c), "name": loaded.class_name(int(c)), "before": float(before[c]),
                     "after": float(after[c])} for c in moved],
    }  # fmt: skip
