"""A dictionary's run folder: ``sae.safetensors`` (the library's tensors and the normalisation's mean),
``config.json`` (model, layer, shape, normalisation, versions, the model weights' fingerprint, whether it
finished) and, while training, ``checkpoint.pt``; every file written to a temp name and renamed."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.core.layout import Layout
from hookviz.errors import UsageError
from hookviz.io.files import atomic_write
from hookviz.io.outputs import finite
from hookviz.sae import dictionary
from hookviz.sae.dictionary import Norm, Shape

CONFIG, WEIGHTS, CHECKPOINT, METRICS = "config.json", "sae.safetensors", "checkpoint.pt", "metrics.json"
FORMAT = "hookviz-sae/1"


def fingerprint(model: nn.Module) -> str:
    """The first 16 hex digits of a SHA-256 over the model's parameters and buffers (names and values)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(to_numpy(t.detach().float().contiguous()).tobytes())
    return h.hexdigest()[:16]


@dataclass
class Trained:
    """A dictionary ready to use: the library's module (eval mode), its shape, normalisation, layer and
    layout, and its config as written."""

    sae: nn.Module
    shape: Shape
    norm: Norm
    layer: str
    layout: Layout
    config: dict[str, Any]


def layout_json(layout: Layout) -> dict[str, Any]:
    return {"kind": layout.kind, "prefix": layout.prefix, "grid": list(layout.grid) if layout.grid else None}


def layout_from(data: dict[str, Any]) -> Layout:
    grid = data.get("grid")
    return Layout(
        str(data["kind"]), int(data.get("prefix", 0)), (int(grid[0]), int(grid[1])) if grid else None
    )


def read_config(folder: Path) -> dict[str, Any] | None:
    path = folder / CONFIG
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a readable hookviz sae config ({e}); give another folder") from None
    return data if isinstance(data, dict) else None


def read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(finite(data), indent=2, sort_keys=True, allow_nan=False) + "\n")


def tensors_of(sae: nn.Module, norm: Norm) -> dict[str, Tensor]:
    state = {k: v.detach().cpu().contiguous() for k, v in sae.state_dict().items()}
    extra = {f"extra.{k}": v.cpu() for k, v in dictionary.extra_state(sae).items()}
    return {**state, **extra, "norm.mean": norm.mean.detach().cpu().contiguous()}


def save_weights(folder: Path, sae: nn.Module, norm: Norm) -> None:
    from safetensors.torch import save

    atomic_write(folder / WEIGHTS, save(tensors_of(sae, norm)))


def build_from(
    tensors: dict[str, Tensor], shape: Shape, device: torch.device | str = "cpu"
) -> tuple[nn.Module, Norm]:
    """The library's module for ``shape`` holding ``tensors`` (as :func:`tensors_of` wrote them)."""
    sae = dictionary.build(shape, device)
    state = {k: v for k, v in tensors.items() if not k.startswith(("extra.", "norm."))}
    sae.load_state_dict(state)
    sae = sae.to(device).eval()  # the dictionary fused first: an imported one's atoms replace it after
    extra = {k.removeprefix("extra."): v.to(device) for k, v in tensors.items() if k.startswith("extra.")}
    dictionary.load_extra(sae, extra)
    return sae, Norm(tensors["norm.mean"].float(), 1.0)


def finished_config(folder: Path) -> dict[str, Any]:
    """A finished run folder's config.json; one line (exit 2) where the folder holds no finished dictionary
    (checked before a model is loaded for it)."""
    config = read_config(folder)
    ours = config is not None and config.get("format") == FORMAT
    if config is not None and ours and config.get("status") != "finished":  # killed: no weights yet
        raise UsageError(f"{folder}: its training has not finished (it was interrupted); rerunning the same "
                         "hookviz sae train command resumes it from its checkpoint")  # fmt: skip
    if config is None or not ours or not (folder / WEIGHTS).is_file():
        raise UsageError(f"{folder}: no hookviz dictionary here (config.json and sae.safetensors); train one "
                         "with hookviz sae train")  # fmt: skip
    return config


def load(folder: Path, device: torch.device | str = "cpu") -> Trained:
    """A finished run folder's dictionary; one line (exit 2) where the folder holds none."""
    config = finished_config(folder)
    shape = Shape(str(config["arch"]), int(config["d"]), int(config["width"]), int(config["k"]))
    sae, norm = build_from(weights_of(folder), shape, device)
    norm = Norm(norm.mean, float(config["norm"]["scale"]))
    return Trained(sae, shape, norm, str(config["layer"]), layout_from(config["layout"]), config)


def weights_of(folder: Path) -> dict[str, Tensor]:
    """The tensors of ``folder``'s sae.safetensors; one line (exit 2) naming it and the fix where it cannot
    be read (truncated, overwritten)."""
    from safetensors.torch import load_file

    try:
        tensors: dict[str, Tensor] = load_file(str(folder / WEIGHTS))
    except Exception as e:  # safetensors' own error, an OSError: the file is not whole
        raise UsageError(f"{folder / WEIGHTS}: unreadable ({type(e).__name__}: {e}); train it again with "
                         "hookviz sae train --overwrite") from None  # fmt: skip
    return tensors


def check_model(config: dict[str, Any], folder: Path, print_: str) -> None:
    """Refuse a folder whose dictionary was trained on another model (its weights' fingerprint differs)."""
    theirs = config.get("fingerprint")
    if theirs is not None and theirs != print_:
        raise UsageError(
            f"{folder} holds a dictionary of another model ({config.get('model')}, weights fingerprint "
            f"{theirs}, this model's {print_}); give that model, or another folder"
        )


def save_checkpoint(folder: Path, state: dict[str, Any]) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(folder / CHECKPOINT, buf.getvalue())


def load_checkpoint(folder: Path, notes: list[str] | None = None) -> dict[str, Any] | None:
    """The run folder's checkpoint; None where there is none, or where it cannot be read (a run killed while
    the disk filled, a file cut short): then it is removed, the run starts over and ``notes`` says so."""
    path = folder / CHECKPOINT
    if not path.is_file():
        return None
    try:
        loaded: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch's reader raises RuntimeError, pickle's errors, OSError: none is usable
        path.unlink(missing_ok=True)
        if notes is not None:
            notes.append(f"{path} was unreadable ({type(e).__name__}); removed, training starts over")
        return None
    return loaded
