"""The dictionary itself, from a maintained library: overcomplete's SAEs (MIT; docs/sae.md says why),
built by architecture name, with the training losses the field uses around them (TopK's auxiliary loss for
dead features, Matryoshka's nested prefixes, JumpReLU's L0 penalty) and the normalisation of the vectors."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.errors import SetupError, UsageError

#: The architectures ``--arch`` offers: overcomplete's TopKSAE, BatchTopKSAE, JumpSAE; Matryoshka is a
#: BatchTopKSAE trained with nested prefix losses (overcomplete has no Matryoshka class).
ARCHS = ("topk", "batchtopk", "matryoshka", "jumprelu")
#: JumpReLU's L0 penalty per ``k`` active features, against a reconstruction error of about 1 per coordinate.
JUMP_PENALTY = 0.5
#: The width of the kernel that gives JumpReLU's thresholds a gradient, on vectors of unit variance.
JUMP_BANDWIDTH = 0.05


def library() -> types.SimpleNamespace:
    """The SAE classes of overcomplete (``TopKSAE``, ``BatchTopKSAE``, ``JumpSAE``, ``heaviside``), imported
    without running the package files ``overcomplete/__init__.py`` and ``overcomplete/sae/__init__.py``: the
    first imports the library's plotting helpers (matplotlib, scikit-image, OpenCV), which fail in
    overcomplete 0.3.0 on matplotlib 3.9 or later (``matplotlib.cm.get_cmap`` is gone); the second imports
    every solver (scikit-learn, SciPy: seconds). See :func:`library_module`."""
    if not _LOADED:
        topk, batch, jump = (library_module(n) for n in ("topk_sae", "batchtopk_sae", "jump_sae"))
        _LOADED.append(types.SimpleNamespace(
            TopKSAE=topk.TopKSAE, BatchTopKSAE=batch.BatchTopKSAE, JumpSAE=jump.JumpSAE,
            heaviside=jump.heaviside,
        ))  # fmt: skip
    return _LOADED[0]


def library_module(name: str) -> types.ModuleType:
    """``overcomplete.sae.NAME``, its packages stood in for by bare modules while it loads, then removed (so a
    later ``import overcomplete`` runs as it would)."""
    if f"overcomplete.sae.{name}" in sys.modules:
        return sys.modules[f"overcomplete.sae.{name}"]
    spec = importlib.util.find_spec("overcomplete")
    if spec is None or not spec.submodule_search_locations:
        raise SetupError("hookviz sae needs the overcomplete library: pip install 'hookviz[sae]'")
    root = next(iter(spec.submodule_search_locations))
    stood_in = [n for n in ("overcomplete", "overcomplete.sae") if n not in sys.modules]
    for package_name in stood_in:
        package = types.ModuleType(package_name)
        package.__path__ = [root if package_name == "overcomplete" else f"{root}/sae"]
        sys.modules[package_name] = package
    try:
        base = importlib.import_module("overcomplete.sae.base")
        if "overcomplete.sae" in stood_in:
            sys.modules["overcomplete.sae"].SAE = base.SAE  # type: ignore[attr-defined]  # batchtopk_sae's import
        return importlib.import_module(f"overcomplete.sae.{name}")
    finally:
        for package_name in stood_in:
            sys.modules.pop(package_name, None)


_LOADED: list[types.SimpleNamespace] = []


def package_version(name: str) -> str:
    """An installed distribution's version (``unknown`` for a source tree not installed)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Shape:
    """What a dictionary is: its architecture, the vectors' size ``d``, its ``width`` (features) and ``k``
    (features active per vector: TopK's k, BatchTopK's mean, JumpReLU's L0 target scale)."""

    arch: str
    d: int
    width: int
    k: int

    def check(self) -> None:
        if self.arch == "relu" and self.k == self.width:  # an imported ReLU SAE (hookviz.sae.interchange)
            return
        if self.arch not in ARCHS:
            raise UsageError(f"--arch {self.arch}: choose one of {', '.join(ARCHS)}")
        if self.width < 2:
            raise UsageError(f"--width gives {self.width} features: a dictionary needs 2 at least")
        if 2 * self.width * self.d > MAX_PARAMETERS:  # checked before anything is allocated
            gib = 2 * self.width * self.d * 16 / 2**30  # weights, gradients and Adam's two moments
            raise UsageError(
                f"--width gives {self.width} features of {self.d}-wide vectors: {gib:.3g} GiB to train, over "
                f"the {MAX_PARAMETERS * 16 / 2**30:.0f} GiB taken; give a smaller --width (8x is usual)"
            )
        if not 1 <= self.k < self.width:
            raise UsageError(
                f"--k {self.k} with {self.width} features: k must be at least 1 and below the width "
                "(a few dozen active features out of thousands is usual)"
            )


#: The most weights (encoder and dictionary) a dictionary may have: 2^31, 32 GiB to train in float32.
MAX_PARAMETERS = 2**31


def parse_width(text: str, d: int) -> int:
    """``8x`` (eight times the vectors' size) or a number of features."""
    spec = text.strip().lower()
    try:
        width = round(float(spec[:-1]) * d) if spec.endswith("x") else int(spec)
    except ValueError:
        raise UsageError(
            f"--width {text}: give a multiple of the layer's size (8x) or a count (4096)"
        ) from None
    return width


def build(shape: Shape, device: torch.device | str = "cpu") -> nn.Module:
    """The library's SAE for ``shape``: a linear encoder with a ReLU, then the architecture's sparsity; a
    dictionary of unit-norm atoms (``model.get_dictionary()``, ``(width, d)``)."""
    shape.check()
    lib = library()
    if shape.arch in ("topk", "relu"):  # relu: an imported ReLU SAE, TopK keeping every feature
        sae = lib.TopKSAE(shape.d, shape.width, top_k=shape.k, device=str(device))
    elif shape.arch in ("batchtopk", "matryoshka"):
        sae = lib.BatchTopKSAE(shape.d, shape.width, top_k=shape.k, device=str(device))
    else:
        sae = lib.JumpSAE(shape.d, shape.width, bandwidth=JUMP_BANDWIDTH, device=str(device))
    return sae


def batch_k(sae: nn.Module, shape: Shape, batch: int) -> None:
    """BatchTopK keeps ``k`` per vector on average: the library's ``top_k`` counts over the whole batch."""
    if shape.arch in ("batchtopk", "matryoshka"):
        sae.top_k = shape.k * batch  # type: ignore[assignment]


def extra_state(sae: nn.Module) -> dict[str, Tensor]:
    """What the library keeps outside ``state_dict``: BatchTopK's running threshold."""
    t = getattr(sae, "running_threshold", None)
    return {"running_threshold": t.detach().reshape(1)} if isinstance(t, Tensor) else {}


def load_extra(sae: nn.Module, tensors: dict[str, Tensor]) -> None:
    """The tensors of :func:`extra_state` back into ``sae``; ``fused_dictionary`` (an imported SAE's atoms,
    whatever their norms) replaces the dictionary an eval-mode module uses."""
    if "running_threshold" in tensors:
        sae.running_threshold = tensors["running_threshold"].reshape(())
    if "fused_dictionary" in tensors:
        sae.dictionary._fused_dictionary = tensors["fused_dictionary"]  # type: ignore[union-attr]


def encode(sae: nn.Module, x: Tensor) -> Tensor:
    """The codes ``(N, width)`` of normalised vectors (the model in eval mode: BatchTopK's running
    threshold, the dictionary fused)."""
    return sae.encode(x)[1]  # type: ignore[operator]


def decode(sae: nn.Module, z: Tensor) -> Tensor:
    return sae.decode(z)  # type: ignore[operator]


def dictionary_of(sae: nn.Module) -> Tensor:
    """The atoms ``(width, d)``, unit norm."""
    return sae.get_dictionary()  # type: ignore[operator]


def loss(
    sae: nn.Module, shape: Shape, x: Tensor, since_fired: Tensor, dead_after: int
) -> tuple[Tensor, Tensor]:
    """The training loss on normalised vectors ``x`` and the codes: reconstruction (mean squared error), plus
    for TopK and BatchTopK the auxiliary loss of Gao et al. (2024) that makes dead features (none fired in
    ``dead_after`` vectors) model the residual, for Matryoshka the mean over nested prefixes of the
    dictionary, for JumpReLU an L0 penalty (its threshold's gradient through the library's kernel)."""
    pre, z, x_hat = sae(x)
    mse = (x - x_hat).square().sum(-1).mean() / x.shape[1]
    if shape.arch == "matryoshka":
        atoms = dictionary_of(sae)
        sizes = sorted({max(1, shape.width // m) for m in (16, 8, 4, 2)} | {shape.width})
        mse = torch.stack(
            [(x - z[:, :m] @ atoms[:m]).square().sum(-1).mean() / x.shape[1] for m in sizes]
        ).mean()
    if shape.arch == "jumprelu":
        lib = library()
        gate = lib.heaviside(torch.relu(pre), torch.exp(sae.thresholds), sae.kernel_fn, sae.bandwidth)  # type: ignore[arg-type]
        return mse + JUMP_PENALTY * gate.sum(-1).mean() / shape.k, z
    dead = since_fired >= dead_after
    if bool(dead.any()):
        mse = mse + _aux_k(sae, x - x_hat.detach(), pre, dead, x.shape[1]) / 32
    return mse, z


def _aux_k(sae: nn.Module, residual: Tensor, pre: Tensor, dead: Tensor, d: int) -> Tensor:
    """The residual reconstructed by the ``d/2`` strongest dead features only, its error relative to the
    residual's variance (Gao et al. 2024, section A.2)."""
    k_aux = min(max(d // 2, 1), int(dead.sum()))
    masked = torch.where(dead, torch.relu(pre), torch.zeros_like(pre))
    top = torch.topk(masked, k_aux, dim=-1)
    z_aux = torch.zeros_like(masked).scatter(-1, top.indices, top.values)
    guess = z_aux @ dictionary_of(sae)
    scale = (residual - residual.mean(0)).square().sum(-1).mean().clamp_min(1e-8)
    return (residual - guess).square().sum(-1).mean() / scale


@dataclass(frozen=True)
class Norm:
    """The vectors' normalisation: centred on their mean, scaled so their mean squared norm is ``d`` (each
    coordinate of unit variance on average), estimated on the first buffer of training vectors."""

    mean: Tensor
    scale: float

    @classmethod
    def fit(cls, x: Tensor) -> Norm:
        mean = x.mean(0)
        sq = (x - mean).square().sum(-1).mean()
        return cls(mean.detach().clone(), float((x.shape[1] / sq.clamp_min(1e-12)).sqrt()))

    def apply(self, x: Tensor) -> Tensor:
        return (x - self.mean.to(x.device, x.dtype)) * self.scale

    def undo(self, x: Tensor) -> Tensor:
        return x / self.scale + self.mean.to(x.device, x.dtype)


def summary(shape: Shape) -> dict[str, Any]:
    return {"arch": shape.arch, "d": shape.d, "width": shape.width, "k": shape.k}
