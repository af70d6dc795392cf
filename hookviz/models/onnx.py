"""``--model FILE.onnx``: an ONNX model run by onnxruntime (the extra ``hookviz[onnx]``), as a module
hookviz can explain without gradients.

Each module path the exporter recorded in the nodes' metadata (``features.4``: torch's exporters write it)
is a :class:`Tap`, a child module at that path whose "output" is the tensor the module produced in the graph
(the last node of its scope). Forward runs the graph in segments cut at the taps that have hooks: up to a
tap (its tensor handed to the tap, where hooks read it and may replace it, as Ablation-CAM does), then the
rest of the graph from the (possibly edited) tensor and the input. So the activation methods (Eigen-CAM,
Score-CAM and its family, Ablation-CAM) and the perturbation ones (occlusion, RISE) run on the deployed file;
the gradient methods cannot (an ONNX graph has no backward here) and are refused before anything runs.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hookviz.core.arrays import to_numpy
from hookviz.errors import SetupError, UsageError, WeightsError, first_line
from hookviz.io.files import file_digest
from hookviz.io.images import Preprocess
from hookviz.models.facade import Facade
from hookviz.models.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options, missing_extra
from hookviz.models.ultralytics import OnnxYolo, onnx_detector

#: The method families that need only forward passes (what runs on an ONNX model).
FORWARD_ONLY = frozenset({"activation-only", "perturbation", "pixel-perturbation", "control"})


class Tap(nn.Module):
    """A tensor of the graph (the output of the module path it is named after), as a module hooks can take."""

    def __init__(self, tensor: str, shape: tuple[int | None, ...]) -> None:
        super().__init__()
        self.tensor, self.shape = tensor, shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Scope(nn.Module):
    """A module path's container (``features`` holding ``features.4``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # never called: the graph runs, not the scopes
        raise RuntimeError("a scope of an ONNX model is not called")


class OnnxModel(nn.Module):
    """An ONNX file run by onnxruntime (see the module's docstring)."""

    def __init__(self, path: Path, proto: Any) -> None:
        super().__init__()
        import onnxruntime

        self.path, self.proto, self._ort = path, proto, onnxruntime
        self.input_name = proto.graph.input[0].name
        self.output_names = [o.name for o in proto.graph.output]
        self._sessions: dict[tuple[str, ...], list[Any]] = {}
        self._order = {out: i for i, node in enumerate(proto.graph.node) for out in node.output}
        first = proto.graph.input[0].type.tensor_type.shape.dim
        #: A batch size the graph was exported for (None: any); photos then run one batch of it at a time.
        self.fixed_batch = int(first[0].dim_value) if first and first[0].dim_value else None
        #: The height and width the graph was exported for (None: symbolic, any size).
        self.fixed_size = (
            (int(first[2].dim_value), int(first[3].dim_value))
            if len(first) == 4 and first[2].dim_value and first[3].dim_value
            else None
        )
        for module_path, (tensor, shape) in _taps(proto).items():
            self._place(module_path, Tap(tensor, shape))

    def _place(self, path: str, tap: Tap) -> None:
        parent: nn.Module = self
        parts = path.split(".")
        for part in parts[:-1]:
            if part not in parent._modules:
                parent.add_module(part, Scope())
            parent = parent.get_submodule(part)
        if parts[-1] in parent._modules:  # a scope that is also a module's output: keep its children
            for name, child in parent.get_submodule(parts[-1]).named_children():
                tap.add_module(name, child)
        parent.add_module(parts[-1], tap)

    def _session(self, proto: Any) -> Any:
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        return self._ort.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def _segments(self, taps: tuple[str, ...]) -> list[Any]:
        """Sessions running the graph up to each tap in turn, then to the outputs (cached per set of taps)."""
        if taps not in self._sessions:
            import onnx.utils

            extractor = onnx.utils.Extractor(self.proto)
            made, inputs = [], [self.input_name]
            for tensor in [*taps, None]:
                outputs = [tensor] if tensor is not None else self.output_names
                made.append(self._session(extractor.extract_model(list(inputs), outputs)))
                if tensor is not None:
                    inputs.append(tensor)
            self._sessions[taps] = made
        return self._sessions[taps]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise UsageError(
                "an ONNX model has no gradients here; use a method that needs forward passes only"
            )
        active = sorted(
            (m for m in self.modules() if isinstance(m, Tap) and (m._forward_hooks or m._forward_pre_hooks)),
            key=lambda m: self._order.get(m.tensor, 0),
        )
        values = {self.input_name: to_numpy(x).astype(np.float32)}
        tensors = list(dict.fromkeys(t.tensor for t in active))  # two scopes may end on one tensor
        segments = self._segments(tuple(tensors))
        for tensor, session in zip(tensors, segments, strict=False):
            out = torch.from_numpy(self._run(session, tensor, values))
            for tap in (t for t in active if t.tensor == tensor):
                out = tap(out)
            values[tensor] = to_numpy(out)
        result = self._run(segments[-1], self.output_names[0], values)
        return torch.from_numpy(np.ascontiguousarray(result)).to(x.device)

    def _run(self, session: Any, output: str, values: dict[str, np.ndarray]) -> np.ndarray:
        """One segment over the batch: at once, or a fixed batch size at a time where the graph fixes it (a
        feed of batch 1 beside larger ones, the input beside Ablation-CAM's copies of a layer, is shared)."""
        feeds = {i.name: values[i.name] for i in session.get_inputs()}
        n = max(len(v) for v in feeds.values())
        step = self.fixed_batch or n
        if step >= n and all(len(v) == n for v in feeds.values()):
            return session.run([output], feeds)[0]
        if n % step:
            raise UsageError(f"{self.path.name} takes batches of {step}; run it with --batch-size {step}")

        def part(v: np.ndarray, i: int) -> np.ndarray:
            return v[i : i + step] if len(v) == n else np.repeat(v, step, axis=0)

        parts = [
            session.run([output], {k: part(v, i) for k, v in feeds.items()})[0] for i in range(0, n, step)
        ]
        return np.concatenate(parts)


def _scopes(node: Any) -> list[str]:
    """The module paths a node belongs to, outermost first: from torch's exporter's metadata, or from the
    node's name, the TorchScript exporter's: ``/features/features.4/Relu`` (full paths) or
    ``/model.2/cv1/conv/Conv`` (each part under the last: ``model.2.cv1.conv``, ultralytics' exports)."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                found = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                break
            return [s for s in found[:-1] if s]
    scopes: list[str] = []
    for part in [p for p in node.name.split("/") if p][:-1]:  # a part is a full path or relative to the last
        outer = scopes[-1] if scopes else ""
        scopes.append(part if not outer or part.startswith(f"{outer}.") else f"{outer}.{part}")
    return scopes


#: The scope torch's exporter gives the nodes its own passes add (no module's: a dynamic size's
#: ``sym_size_int``).
_SYNTHETIC = "_empty_nn_module_stack_from_metadata_hook"


def _taps(proto: Any) -> dict[str, tuple[str, tuple[int | None, ...]]]:
    """Each module path with the tensor that leaves it (its last node's first output) and its shape.

    Only a scope whose tensor has a batch axis and more (``(B, C, H, W)`` maps, ``(B, N, D)`` tokens,
    ``(B, C)`` scores) is a layer: torch's exporter also records scopes of its own passes
    (``_empty_nn_module_stack_from_metadata_hook``) whose tensor is a scalar (a ``sym_size_int``, the
    dynamic batch's size), which no hook can take."""
    shapes = {
        v.name: tuple((d.dim_value or None) for d in v.type.tensor_type.shape.dim)
        for v in [*proto.graph.value_info, *proto.graph.output]
        if v.type.tensor_type.HasField("shape")
    }
    found: dict[str, tuple[str, tuple[int | None, ...]]] = {}
    for node in proto.graph.node:
        for scope in _scopes(node):
            if node.output:
                found[scope] = (node.output[0], shapes.get(node.output[0], ()))
    return {
        scope: (tensor, shape)
        for scope, (tensor, shape) in found.items()
        if _SYNTHETIC not in scope and (tensor not in shapes or len(shape) >= 2)
    }


@lru_cache(maxsize=1)
def _onnx() -> Any:
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        raise missing_extra("onnxruntime and onnx", "onnx")
    import onnx

    return onnx


def build(spec: str, weights: str, options: Options) -> Built:
    onnx = _onnx()
    path = Path(spec).expanduser()
    if weights.upper() != WEIGHTS_DEFAULT and weights.lower() != WEIGHTS_NONE:
        raise UsageError(f"--weights {weights}: {path.name} holds its own weights; leave --weights out")
    try:
        proto = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
        onnx.checker.check_model(proto)
    except Exception as exc:  # a truncated or foreign file: onnx's own reasons vary
        raise WeightsError(f"{path}: not an ONNX model onnx can read ({first_line(exc, 160)})") from None
    _check_input(path, proto)
    model = OnnxModel(path, proto)
    try:
        model._segments(())
    except Exception as exc:  # an opset or operator onnxruntime cannot run
        raise SetupError(f"{path.name}: onnxruntime cannot run it ({first_line(exc, 160)})") from None
    meta = {prop.key: prop.value for prop in proto.metadata_props}
    if meta.get("author") == "Ultralytics":
        return onnx_detector(model, meta, head_inputs(proto))
    preprocess, size_note = Preprocess(), None
    if model.fixed_size is None:
        size_note = (
            f"{path.name} takes any input size (its height and width are symbolic): give --input-size N, "
            "the side it was trained at"
        )
    elif model.fixed_size[0] != model.fixed_size[1]:
        h, w = model.fixed_size
        raise UsageError(
            f"{path.name} takes {h}x{w} inputs only, and hookviz feeds square ones: export it at a "
            "square size or with a dynamic height and width"
        )
    else:  # a fixed square input: its size
        side = model.fixed_size[0]
        preprocess = Preprocess(crop_size=side, resize_size=round(side * 256 / 224))
    return Built(model, path.name, f"the file's own ({path.name})", True, f"sha256:{file_digest(path)}",
                 preprocess=preprocess, input_size_note=size_note)  # fmt: skip


def _check_input(path: Path, proto: Any) -> None:
    """Refuse, in one line, a graph hookviz cannot feed a photo: one of several inputs, or channels last.

    Raises:
        UsageError: the graph takes several inputs, or ``(N, H, W, C)`` ones.
    """
    weights = {init.name for init in proto.graph.initializer}  # older exports list them as inputs too
    inputs = [i.name for i in proto.graph.input if i.name not in weights]
    if len(inputs) > 1:
        raise UsageError(
            f"{path.name} takes {len(inputs)} inputs ({', '.join(inputs)}), and hookviz feeds one (the "
            "photo): export the model with its image as its only input"
        )
    dims = [d.dim_value or None for d in proto.graph.input[0].type.tensor_type.shape.dim]
    if len(dims) == 4 and dims[3] in (1, 3, 4) and dims[1] not in (1, 3, 4):
        h, w, c = (str(d) if d is not None else "?" for d in dims[1:])
        raise UsageError(
            f"{path.name} takes channels-last inputs (N, {h}, {w}, {c}: NHWC), and hookviz feeds "
            f"channels-first ones (N, {c}, H, W): export it from a model that takes (N, C, H, W)"
        )


def head_inputs(proto: Any) -> tuple[str, ...]:
    """The top-level modules whose outputs the graph's last top-level module reads (a detection head's
    scales: ``model.15``, ``model.18``, ``model.21``), in the order it reads them."""
    taps = _taps(proto)
    top = {tensor: scope for scope, (tensor, _) in taps.items() if "." not in scope.partition(".")[2]}
    scopes = [_scopes(node)[:1] for node in proto.graph.node]
    last = next((s[0] for s in reversed(scopes) if s), None)
    read = [
        top[name]
        for node, scope in zip(proto.graph.node, scopes, strict=True)
        if scope and scope[0] == last
        for name in node.input
        if name in top and top[name] != last
    ]
    return tuple(dict.fromkeys(read))


#: The method families that run on a TorchScript module: those that read the input alone ...
INPUT_ONLY = frozenset({"input-gradient", "pixel-perturbation", "control"})
#: ... but for the ones that reach inside with hooks (guided ReLUs, every bias's gradient).
INSIDE = frozenset({"guidedbackprop", "guidedgradcam", "fullgrad"})


class Scripted(nn.Module):
    """A TorchScript module (``torch.jit.load``): differentiable, but Python hooks do not run inside it, so
    its one layer is its input (:class:`Tap` ``input``): the input-gradient and perturbation methods run."""

    def __init__(self, script: nn.Module, shape: tuple[int | None, ...] = ()) -> None:
        super().__init__()
        self.input = Tap("input", shape)
        self._script = [script]  # kept out of the module tree: its submodules take no Python hooks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._script[0](self.input(x))


def refuse_unavailable(model: nn.Module, methods: list[str], families: dict[str, str]) -> None:
    """One line naming the methods a deployed model can run (an ONNX graph: forward passes only; TorchScript:
    the input alone), when any of ``methods`` needs more (through the heads wrapping it: ``--head``)."""
    while isinstance(model, Facade) and not isinstance(model, OnnxYolo):
        model = model.wrapped
    if isinstance(model, (OnnxModel, OnnxYolo)):
        allowed, why, hint = (
            FORWARD_ONLY,
            "needs gradients, which an ONNX model has not",
            "scorecam: Grad-CAM's forward-only cousin",
        )
    elif isinstance(model, Scripted):
        allowed, why, hint = (
            INPUT_ONLY,
            "needs a layer, and Python hooks do not run inside TorchScript",
            "saliency, integratedgradients: the input's gradient",
        )
    else:
        return
    inside = INSIDE if isinstance(model, Scripted) else frozenset()
    wrong = [m for m in methods if families.get(m) not in allowed or m in inside]
    if wrong:
        ok = sorted(m for m, f in families.items() if f in allowed and m not in inside)
        if hint.partition(":")[0].split(", ")[0] not in ok:  # a detector: its own methods, no cousin to name
            hint = "drise: each box's own, from masked photos" if "drise" in ok else ok[0]
        raise UsageError(f"--method {wrong[0]} {why}; use one of {', '.join(ok)} ({hint})")
