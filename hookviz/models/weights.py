"""Weights files, read in one place: state_dicts and checkpoint dicts (``weights_only=True``, always),
``.safetensors``, TorchScript archives recognised and refused, and loading a state into a module.
"""

from __future__ import annotations

import hashlib
import pickle
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookviz.core.arrays import to_numpy
from hookviz.errors import WeightsError

_CHECKPOINT_KEYS = ("state_dict", "model", "model_state_dict", "net", "network")


def values_digest(model: nn.Module) -> str:
    """16 hex digits of SHA-256 over every parameter's and buffer's name, dtype, shape and bytes (the model as
    built: a factory that loads its own checkpoint gets another digest when the checkpoint changes)."""
    h = hashlib.sha256()
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        data = t.detach().cpu().contiguous().reshape(-1)
        h.update(to_numpy(data.view(torch.uint8)).tobytes() if data.numel() else b"")
    return h.hexdigest()[:16]


def is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive (a zip holding compiled ``code/`` and ``constants.pkl``)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
    return any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names)


def load_state_dict_file(path: str | Path, key: str | None = None) -> dict[str, torch.Tensor]:
    """Read a state_dict safely: ``.safetensors`` (never code), or ``torch.load(weights_only=True)`` of a
    bare state_dict or a checkpoint dict.

    Accepts ``{"state_dict": ...}``, ``{"model": ...}`` (and a few other common names) checkpoints,
    or the dict under ``key`` when given (``ema``, ``model_ema``: dotted keys reach nested dicts), and
    strips the ``module.`` (DataParallel/DDP) and ``_orig_mod.`` (``torch.compile``) prefixes.

    Raises:
        WeightsError: the file is a TorchScript archive (Python hooks cannot run inside TorchScript),
            is not a PyTorch file, holds code-carrying objects, or holds no state_dict (the keys
            found are listed).
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        return _read_safetensors(path, key)
    if is_torchscript(path):
        raise WeightsError(
            f"{str(path)!r} is a TorchScript archive: Python hooks do not run inside TorchScript, so "
            "hookviz cannot look inside it; save the eager model's state_dict instead "
            "(torch.save(model.state_dict(), path)), or give the archive as --model (its input-gradient and "
            "perturbation methods run)"
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        global_line = next((line for line in lines if "GLOBAL" in line), None)
        if global_line is not None:
            raise WeightsError(
                f"{path}: refused: the file holds Python objects other than tensors, and unpickling them "
                f"could run code ({global_line}); re-save it with torch.save(model.state_dict(), path)"
            ) from None
        after = [
            line.strip() for line in text.split("WeightsUnpickler error:", 1)[-1].splitlines() if line.strip()
        ]
        raise WeightsError(
            f"{path}: not a readable PyTorch weights file ({after[0] if after else type(exc).__name__})"
        ) from None
    except Exception as exc:  # a damaged file can make the unpickler raise almost anything
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WeightsError(f"{path}: not a readable PyTorch weights file ({first})") from None
    if key is not None:
        node: Any = obj
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                found = ", ".join(repr(k) for k in list(node)[:12]) if isinstance(node, Mapping) else "none"
                raise WeightsError(f"{path}: --weights-key {key!r}: no key {part!r} (keys found: {found})")
            node = node[part]
        obj = node
    elif isinstance(obj, Mapping):
        for name in _CHECKPOINT_KEYS:
            if isinstance(obj.get(name), Mapping):
                obj = obj[name]
                break
    if not isinstance(obj, Mapping) or not any(isinstance(v, torch.Tensor) for v in obj.values()):
        if isinstance(obj, Mapping):
            found = ", ".join(f"{k!r} ({type(v).__name__})" for k, v in list(obj.items())[:12])
            raise WeightsError(
                f"{path}: holds no state_dict (a mapping of names to tensors); keys found: {found}; "
                "pick the one holding the weights with --weights-key KEY"
            )
        raise WeightsError(f"{path}: holds a {type(obj).__name__}, not a state_dict (names to tensors)")
    return _strip_prefixes(obj)


def _read_safetensors(path: Path, key: str | None) -> dict[str, torch.Tensor]:
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError:  # pragma: no cover - safetensors is a dependency
        raise WeightsError(
            "reading .safetensors needs the safetensors package: pip install safetensors"
        ) from None
    try:
        state = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise WeightsError(f"{path}: not a readable safetensors file ({exc})") from None
    if key is not None:  # a flat file: the key selects a prefix (``model_ema.``)
        state = {k[len(key) + 1 :]: v for k, v in state.items() if k.startswith(f"{key}.")}
        if not state:
            raise WeightsError(f"{path}: --weights-key {key!r}: no tensor name starts with {key + '.'!r}")
    return _strip_prefixes(state)


def _strip_prefixes(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    out = {}
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        for prefix in ("module.", "_orig_mod."):
            while name.startswith(prefix):
                name = name[len(prefix) :]
        out[name] = value
    return out


def strip_wrapper_prefix(state: dict[str, torch.Tensor], own: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``state`` without a wrapper prefix that every key shares (``model.`` from Lightning and other training
    frameworks, ``net.``, ``backbone.``, ``module.``, several levels deep), when the rest fits the model's
    own names; otherwise ``state`` unchanged (the mismatch is then reported as it is)."""

    def fits(names: Iterable[str]) -> bool:
        needed = {k for k in own if not k.endswith("num_batches_tracked")}
        return needed <= set(names) <= set(own)

    current = state
    while current and not fits(current):
        heads = {k.split(".", 1)[0] for k in current}
        if len(heads) != 1 or not all("." in k for k in current):
            return state
        (head,) = heads
        current = {k[len(head) + 1 :]: v for k, v in current.items()}
        if fits(current):
            return current
    return current if fits(current) else state


def classifier_key(model: nn.Module) -> str | None:
    """The weight of the layer that produces the class scores: the last Linear (or Conv2d, for squeezenet)."""
    last = [name for name, module in model.named_modules() if isinstance(module, (nn.Linear, nn.Conv2d))]
    return f"{last[-1]}.weight" if last else None


def classifier_out(model: nn.Module) -> int | None:
    key = classifier_key(model)
    return int(model.state_dict()[key].shape[0]) if key else None


def apply_state_dict(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    path: Path,
    name: str,
    rebuild: Callable[[int], nn.Module] | None = None,
    key: str | None = None,
    per_class: int = 1,
) -> nn.Module:
    """Load ``state`` into ``model`` strictly, after the differences that do not matter.

    BatchNorm's ``num_batches_tracked`` may be missing (no forward pass reads it). A head with another
    number of classes (a fine-tuned checkpoint) is met by ``rebuild(num_classes)``, when given.

    Raises:
        WeightsError: missing, unexpected or mis-shaped keys (the first of each named).
    """
    state = strip_wrapper_prefix(state, model.state_dict())
    key = key or classifier_key(model)
    if (
        rebuild is not None
        and key
        and key in state
        and state[key].shape[0] != model.state_dict()[key].shape[0]
    ):
        model = rebuild(int(state[key].shape[0]) // per_class)
    own = model.state_dict()
    for k, v in own.items():
        if k.endswith("num_batches_tracked") and k not in state:
            state[k] = v
    wrong = [k for k in state if k in own and own[k].shape != state[k].shape]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if wrong or missing or unexpected:
        parts = []
        if wrong:
            k = wrong[0]
            parts.append(
                f"{len(wrong)} shape mismatch(es), e.g. {k} is {tuple(state[k].shape)} in the file, "
                f"{tuple(own[k].shape)} in {name}"
            )
        if missing:
            parts.append(f"{len(missing)} missing key(s), e.g. {', '.join(missing[:3])}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s), e.g. {', '.join(unexpected[:3])}")
        raise WeightsError(
            f"{path} does not fit {name}: {'; '.join(parts)}; was it saved from another architecture? "
            "pass the matching --model"
        )
    model.load_state_dict(state)
    return model
