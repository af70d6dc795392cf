"""Feature visualisation by optimisation (Olah et al. 2017): the image that drives a channel, a neuron or a
direction of a layer most.

The image is parameterised as lucent and Lucid do it: a spectrum scaled by ``1 / frequency`` (so that
the optimiser moves every frequency alike), turned into pixels by an inverse real FFT, its colours
decorrelated with ImageNet's colour correlation (a square root of it), squashed into ``[0, 1]`` by a
sigmoid. Each step sees it through random transformations (padding, jitter, scale, rotation, jitter again:
transformation robustness), normalised as the model expects and enlarged to the model's input size when
smaller. The forward pass stops at the layer (an exception from its hook): the rest of the network never
runs. Several images can be pushed apart by a diversity term (the cosine similarity of their Gram matrices
at the layer). Deterministic for a seed (one ``torch.Generator`` draws the transformations).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz import render
from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import HookGroup, preserved
from hookviz.errors import LayerError, UsageError
from hookviz.io.images import encode_png

#: ImageNet's colour correlation, a square root of it (Lucid's constants), normalised by its largest column.
_COLOUR = np.asarray([[0.26, 0.09, 0.02], [0.27, 0.00, -0.05], [0.27, -0.09, 0.03]], dtype=np.float32)
COLOUR = _COLOUR / np.max(np.linalg.norm(_COLOUR, axis=0))
#: The random scales and rotations (degrees) of the standard transformations; zero rotation five times over.
SCALES = tuple(1 + (i - 5) / 50 for i in range(11))
ANGLES = tuple(range(-10, 11)) + (0,) * 5


@dataclass(frozen=True)
class Objective:
    """What to maximise at ``layer``: a ``channel``'s mean, one position of it (``neuron``: ``(y, x)``, map
    cells), or the mean projection on a ``direction`` (a vector of the layer's channels)."""

    layer: str
    channel: int | None = None
    neuron: tuple[int, int] | None = None
    direction: Tensor | None = None

    def __post_init__(self) -> None:
        if (self.channel is None) == (self.direction is None):
            raise UsageError("give a channel (--channel C) or a direction (--direction FILE), one of them")
        if self.neuron is not None and self.channel is None:
            raise UsageError("--neuron Y,X names a position of a channel: give --channel too")

    def value(self, act: Tensor) -> Tensor:
        """Per image ``(B,)``: the objective on the layer's output ``act`` (``(B, C, H, W)``, or a
        transformer's ``(B, tokens, C)``)."""
        maps = act if act.dim() == 4 else act.transpose(1, 2).unsqueeze(-1)  # tokens as a column of cells
        if self.direction is not None:
            d = self.direction.to(maps)
            if d.numel() != maps.shape[1]:
                raise UsageError(
                    f"--direction has {d.numel()} values; layer {self.layer!r} has {maps.shape[1]}"
                )
            return torch.einsum("bchw,c->bhw", maps, d / d.norm()).mean(dim=(1, 2))
        assert self.channel is not None
        if not 0 <= self.channel < maps.shape[1]:
            raise UsageError(
                f"--channel {self.channel}: layer {self.layer!r} has {maps.shape[1]} (0-{maps.shape[1] - 1})"
            )
        one = maps[:, self.channel]
        if self.neuron is None:
            return one.mean(dim=(1, 2))
        y, x = self.neuron
        if not (0 <= y < one.shape[1] and 0 <= x < one.shape[2]):
            raise UsageError(f"--neuron {y},{x}: the map is {one.shape[1]}x{one.shape[2]}")
        return one[:, y, x]


@dataclass(frozen=True)
class Visualisation:
    """The images ``(B, 3, H, W)`` in ``[0, 1]``, the objective per image on each untransformed image at the
    end, and the objective's mean along the way (per step, on the transformed images)."""

    images: Tensor
    objective: list[float]
    history: list[float]


class _Stop(Exception):
    """Raised by the layer's hook: nothing after the layer needs to run."""


class FourierImage(nn.Module):
    """Images parameterised by their scaled spectrum, colours decorrelated, in ``[0, 1]``."""

    def __init__(
        self, batch: int, size: tuple[int, int], generator: torch.Generator, sd: float = 0.01
    ) -> None:
        super().__init__()
        h, w = size
        fy = np.fft.fftfreq(h)[:, None]
        fx = np.fft.fftfreq(w)[: w // 2 + 2 if w % 2 else w // 2 + 1]
        freqs = np.sqrt(fx * fx + fy * fy)
        self.size = size
        scale = 1.0 / np.maximum(freqs, 1.0 / max(h, w))
        self.scale: Tensor
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32)[None, None, ..., None])
        init = torch.randn((batch, 3, *freqs.shape, 2), generator=generator) * sd
        self.spectrum = nn.Parameter(init)

    def forward(self) -> Tensor:
        spectrum = torch.view_as_complex((self.scale * self.spectrum).contiguous())
        pixels = (
            torch.fft.irfftn(spectrum, s=self.size, norm="ortho")[:, :, : self.size[0], : self.size[1]] / 4
        )
        colour = torch.as_tensor(COLOUR, device=pixels.device)
        return torch.sigmoid(torch.einsum("bchw,dc->bdhw", pixels, colour))


def _transform(x: Tensor, g: torch.Generator) -> Tensor:
    """Pad 12 with grey, jitter 8, scale, rotate, jitter 4: one draw of each for the batch."""

    def pick(options: Sequence[float]) -> float:
        return float(options[int(torch.randint(len(options), (1,), generator=g))])

    def jitter(t: Tensor, d: int) -> Tensor:
        dy, dx = (int(v) for v in torch.randint(d, (2,), generator=g))
        return t[:, :, dy : t.shape[2] - d + dy, dx : t.shape[3] - d + dx]

    x = jitter(F.pad(x, (12, 12, 12, 12), value=0.5), 8)
    s = pick(SCALES)
    x = F.interpolate(x, scale_factor=s, mode="bilinear", align_corners=False) if s != 1 else x
    angle = math.radians(pick(ANGLES))
    if angle:
        c, n = math.cos(angle), math.sin(angle)
        theta = torch.tensor([[c, -n, 0.0], [n, c, 0.0]], dtype=x.dtype, device=x.device)
        grid = F.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return jitter(x, 4)


def visualize(
    model: nn.Module,
    objective: Objective,
    *,
    size: int | tuple[int, int] = 128,
    input_size: tuple[int, int] | None = None,
    mean: Sequence[float] = (0.485, 0.456, 0.406),
    std: Sequence[float] = (0.229, 0.224, 0.225),
    steps: int = 512,
    lr: float = 0.05,
    seed: int = 0,
    images: int = 1,
    diversity: float = 0.0,
    transforms: bool = True,
) -> Visualisation:
    """Optimise ``images`` pictures of ``size`` so that ``objective`` is as large as it gets.

    ``input_size``: what the model takes (a smaller picture is enlarged to it, as lucent enlarges to 224);
    ``mean``/``std``: its normalisation. The model is left as found (eval mode during, parameters frozen
    by not asking for their gradients).

    Raises:
        LayerError: the layer does not run. UsageError: a bad objective or setting.
    """
    if steps < 1 or images < 1:
        raise UsageError("--steps and --images: at least 1")
    size = (size, size) if isinstance(size, int) else size
    modules = dict(model.named_modules())
    if objective.layer not in modules:
        raise LayerError(f"no layer {objective.layer!r} in the model")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    image = FourierImage(images, size, g).to(device)
    opt = torch.optim.Adam(image.parameters(), lr=lr)
    m = torch.tensor(mean, device=device).view(1, -1, 1, 1)
    s = torch.tensor(std, device=device).view(1, -1, 1, 1)
    kept: list[Tensor] = []

    def stop(module: nn.Module, args: object, output: object) -> None:
        first = (
            output if isinstance(output, Tensor) else output[0] if isinstance(output, (tuple, list)) else None
        )
        if not isinstance(first, Tensor):
            raise LayerError(f"layer {objective.layer!r} gives no tensor")
        kept.append(first)
        raise _Stop

    def layer_output(x: Tensor) -> Tensor:
        kept.clear()
        x = (x - m) / s
        if input_size is not None and tuple(x.shape[-2:]) != tuple(input_size):
            x = F.interpolate(x, size=input_size, mode="bilinear", align_corners=True)
        try:
            model(x)
        except _Stop:
            return kept[0]
        raise LayerError(f"layer {objective.layer!r} did not run in the forward pass")

    history: list[float] = []
    with preserved(model), HookGroup() as hooks:  # modes and requires_grad restored after
        model.eval().requires_grad_(False)
        hooks.add(modules[objective.layer].register_forward_hook(stop))
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            pixels = image()
            act = layer_output(_transform(pixels, g) if transforms else pixels)
            value = objective.value(act)
            loss = -value.mean()
            if diversity and images > 1:
                loss = loss + diversity * _similarity(act)
            loss.backward()
            opt.step()
            history.append(float(value.detach().mean()))
        with torch.no_grad():
            final = image().detach()
            scores = objective.value(layer_output(final))
    return Visualisation(final.cpu(), [float(v) for v in scores], history)


def _similarity(act: Tensor) -> Tensor:
    """The mean cosine similarity of each image's Gram matrix with the others' (lucent's diversity)."""
    maps = act if act.dim() == 4 else act.transpose(1, 2).unsqueeze(-1)
    flat = maps.flatten(2)
    gram = torch.bmm(flat, flat.transpose(1, 2)).flatten(1)
    gram = F.normalize(gram, dim=1)
    sim = gram @ gram.T
    b = act.shape[0]
    return (sim.sum() - sim.diagonal().sum()) / (b * (b - 1))


def load_direction(path: str | Path) -> Tensor:
    """A direction of a layer's channels from a ``.npy`` file: a vector of finite numbers, not all zero (a
    ``(1, C)`` or ``(C, 1, 1)`` array is a vector too; float32).

    Raises:
        UsageError: a missing or unreadable file, an array of more than one axis, of other values than
            numbers, with a NaN or infinity, or of zeros only.
    """
    hint = "save one with numpy.save(PATH, vector), a value per channel of the layer"
    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"--direction {path}: no such file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise UsageError(f"--direction {path}: not a .npy array of numbers ({exc}); {hint}") from None
    if not isinstance(arr, np.ndarray) or not np.issubdtype(arr.dtype, np.number) or arr.dtype.kind == "c":
        raise UsageError(f"--direction {path}: not an array of real numbers; {hint}")
    if sum(d > 1 for d in arr.shape) > 1:
        raise UsageError(f"--direction {path}: a {arr.shape} array is not a vector; {hint}")
    vector = arr.astype(np.float32).ravel()
    if not vector.size or not np.isfinite(vector).all():
        raise UsageError(f"--direction {path}: empty or holds NaN or infinity; {hint}")
    if not np.any(vector):
        raise UsageError(f"--direction {path}: every value is 0, which points nowhere; {hint}")
    return torch.from_numpy(vector)


def direction_digest(vector: Tensor) -> str:
    """16 hex digits of a direction's values (its outputs' key changes with them)."""
    return hashlib.sha256(to_numpy(vector).tobytes()).hexdigest()[:16]


def dead_note(result: Visualisation, what: str) -> str | None:
    """A note when the objective stayed 0 all along: the unit gave nothing to any picture tried (a dead
    ReLU), so the picture shows the start, not what the unit sees."""
    if any(result.objective) or any(result.history):
        return None
    return (
        f"{what} stayed at 0 over every step: it does not respond to any picture tried (a dead unit after "
        "its ReLU?); the picture shows where the optimisation started, not what the unit sees. Try another "
        "channel or the layer before its activation"
    )


def picture(images: Tensor, title: str) -> bytes:
    """The pictures ``(B, 3, H, W)`` in ``[0, 1]`` side by side under ``title``, as PNG bytes."""
    rows = [(to_numpy(t.permute(1, 2, 0)) * 255).round().astype(np.uint8) for t in images]
    row = np.concatenate([np.pad(a, ((2, 2), (2, 2), (0, 0)), constant_values=255) for a in rows], axis=1)
    return encode_png(render.caption(render.enlarge_small(row), [title], top=True))
