"""The user's own code: ``--model net.py:make_net`` or ``--model mypkg.models:Net`` (a function or class
returning an ``nn.Module``; ``--weights`` loads a state_dict into it), and ``--model model.pt`` holding a
whole pickled module, loaded only with ``--trust-pickle`` (unpickling runs code from the file).
"""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from hookviz.errors import SetupError, UsageError, WeightsError, first_line
from hookviz.io.files import file_digest
from hookviz.models.onnx import Scripted
from hookviz.models.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options, seeded
from hookviz.models.weights import (
    apply_state_dict,
    is_torchscript,
    load_state_dict_file,
    values_digest,
)

#: The suffixes of a whole pickled module's file (any other existing file is taken as one too).
PICKLES = (".pt", ".pth", ".pkl", ".bin", ".ckpt")
_MODULE_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_code(spec: str) -> bool:
    """Whether ``spec`` names a function or class in the user's code: ``net.py:make_net``, ``pkg.mod:Net``."""
    head, sep, tail = spec.rpartition(":")
    return bool(sep) and (head.endswith(".py") or bool(_MODULE_PATH.match(spec))) and tail.isidentifier()


def is_pickle(spec: str) -> bool:
    """Whether ``spec`` is a file (of a pickled module, unless another source claims its suffix)."""
    return Path(spec).is_file()


def pickled(spec: str, weights: str, options: Options) -> Built:
    """The whole pickled module in the file ``spec`` (with ``trust_pickle`` only)."""
    return _pickled(Path(spec).expanduser(), weights, options)


def build(spec: str, weights: str, options: Options) -> Built:
    target, _, attr = spec.rpartition(":")
    module, source_file = _import(target)
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))[:10]
        raise SetupError(f"{target}: no function or class {attr!r} (found: {', '.join(found) or 'none'})")
    name = f"{Path(target).stem if target.endswith('.py') else target}:{attr}"

    def make() -> nn.Module:
        try:
            made = factory()
        except Exception as exc:
            raise SetupError(f"{name}() failed: {type(exc).__name__}: {first_line(exc)}") from None
        if not isinstance(made, nn.Module):
            raise SetupError(f"{name}() returned {type(made).__name__}, not a torch.nn.Module")
        return made

    code_id = file_digest(source_file) if source_file is not None else target
    if weights.lower() == WEIGHTS_NONE:
        return Built(seeded(make), name, "none (random init)", False, f"none:{code_id}")
    if weights.upper() == WEIGHTS_DEFAULT:
        # Whatever the factory returns: its own initialisation, or weights it loads itself (from a file the
        # code names, which may be retrained under the same name): the key hashes the values as built.
        model = seeded(make)
        return Built(model, name, f"as built by {name}", True, f"factory:{code_id}:{values_digest(model)}")
    path = Path(weights).expanduser()
    if not path.is_file():
        raise UsageError(f"--weights {weights!r}: no such file, and not DEFAULT or none (for {name})")
    state = load_state_dict_file(path, options.weights_key)
    model = apply_state_dict(seeded(make), state, path, name)
    key = f"[{options.weights_key}]" if options.weights_key else ""
    return Built(model, name, str(path), True, f"sha256:{file_digest(path)}{key}:{code_id}")


def _import(target: str) -> tuple[ModuleType, Path | None]:
    """A module from a file path (its folder importable while it loads) or a dotted module path."""
    try:
        if target.endswith(".py"):
            path = Path(target).expanduser().resolve()
            if not path.is_file():
                raise SetupError(f"--model {target!r}: no such file")
            spec = importlib.util.spec_from_file_location(f"hookviz_user_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise SetupError(f"--model {target!r}: cannot be imported as Python")
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(path.parent))  # so the file can import its neighbours
            try:
                spec.loader.exec_module(module)
            finally:
                sys.path.remove(str(path.parent))
            return module, path
        module = importlib.import_module(target)
        file = getattr(module, "__file__", None)
        return module, Path(file) if file else None
    except SetupError:
        raise
    except Exception as exc:
        raise SetupError(
            f"--model: cannot import {target!r}: {type(exc).__name__}: {first_line(exc)}"
        ) from None


def _scripted(path: Path, weights: str) -> Built:
    """A TorchScript archive: its input-gradient and perturbation methods (see :class:`Scripted`)."""
    if weights.upper() != WEIGHTS_DEFAULT and weights.lower() != WEIGHTS_NONE:
        raise UsageError(f"--weights {weights}: {path.name} holds its own weights; leave --weights out")
    try:
        script = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        raise WeightsError(
            f"{str(path)!r}: not a TorchScript archive torch can load ({first_line(exc)})"
        ) from None
    return Built(Scripted(script.eval()), path.name, f"the archive's own ({path.name})", True,
                 f"sha256:{file_digest(path)}")  # fmt: skip


def _pickled(path: Path, weights: str, options: Options) -> Built:
    if not path.is_file():
        raise UsageError(f"--model {str(path)!r}: no such file")
    if is_torchscript(path):
        return _scripted(path, weights)
    try:
        obj: Any = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        obj = None  # holds Python objects: a whole module (or something else) that needs unpickling
    except Exception as exc:
        raise WeightsError(f"{str(path)!r}: not a readable PyTorch file ({first_line(exc)})") from None
    if obj is not None:
        raise SetupError(
            f"{str(path)!r} holds a state_dict, not a model: name the architecture with --model "
            "(torchvision name, timm:NAME, file.py:FACTORY) and pass this file to --weights"
        )
    if not options.trust_pickle:
        raise SetupError(
            f"{str(path)!r} holds a whole pickled model; loading it runs code from the file. "
            "Pass --trust-pickle if you trust where it came from, or save its state_dict and use "
            "--model file.py:FACTORY --weights STATE"
        )
    try:
        model = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise SetupError(
            f"{str(path)!r}: cannot unpickle the model ({type(exc).__name__}: {first_line(exc)}); its "
            "classes must be importable here (run from the project's folder, or use --model file.py:FACTORY)"
        ) from None
    if not isinstance(model, nn.Module):
        raise SetupError(f"{str(path)!r} holds a {type(model).__name__}, not a torch.nn.Module")
    name, digest = path.name, file_digest(path)
    if weights.lower() == WEIGHTS_NONE:
        raise UsageError("--weights none: a pickled model comes with its weights; drop --weights")
    if weights.upper() == WEIGHTS_DEFAULT:
        return Built(model, name, f"pickled in {path.name}", True, f"pickle:{digest}")
    state_path = Path(weights).expanduser()
    if not state_path.is_file():
        raise UsageError(f"--weights {weights!r}: no such file (for the pickled model {name})")
    model = apply_state_dict(model, load_state_dict_file(state_path, options.weights_key), state_path, name)
    return Built(model, name, str(state_path), True, f"sha256:{file_digest(state_path)}:{digest}")
