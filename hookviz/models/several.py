"""Models that take several inputs (RGB + depth, two views, a siamese pair): called by the inputs' names or
in the order given, the inputs laid side by side along the channels of one tensor, so every method and the
pipeline see one input; module names stay the model's own.

How many bands each input takes is found by calling the model (three, one, four, two, in that order of
preference); which inputs a layer sees is found by changing one input at a time and watching the layer
(:func:`branches`), so a map is drawn over the input its branch sees.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from hookviz.core.hooks import capture, logits_of, preserved
from hookviz.errors import SetupError, UsageError
from hookviz.io.images import IMAGENET_MEAN, IMAGENET_STD
from hookviz.io.samples import SeveralPreprocess
from hookviz.models.facade import Facade
from hookviz.models.loaded import LoadedModel

#: Bands tried for each input, in order of preference.
BANDS = (3, 1, 4, 2)


class Several(Facade):
    """Runs ``model`` on the inputs laid side by side along the channels of ``x``: ``model(rgb=...,
    depth=...)`` when its ``forward`` names them, else ``model(first, second, ...)`` in the order given."""

    def __init__(self, model: nn.Module, names: Sequence[str], bands: Sequence[int], by_name: bool) -> None:
        super().__init__(model)
        self.names, self.bands, self.by_name = tuple(names), tuple(int(b) for b in bands), by_name

    def split(self, x: Tensor) -> tuple[Tensor, ...]:
        return tuple(torch.split(x, list(self.bands), dim=1))

    def forward(self, x: Tensor) -> object:
        parts = self.split(x)
        if self.by_name:
            return self.wrapped(**dict(zip(self.names, parts, strict=True)))
        return self.wrapped(*parts)


def by_name(model: nn.Module, names: Sequence[str]) -> bool:
    """Whether ``model.forward`` has a parameter for each name (else the inputs go in the order given)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return all(n in params for n in names)


def several(model: nn.Module, names: Sequence[str], side: int) -> Several:
    """``model`` as a :class:`Several` of ``names``, each input's bands found by calling it on zeros of
    ``side`` pixels (the first combination, in :data:`BANDS` order, that it takes).

    Raises:
        SetupError: no combination runs (the last error said), or a name the model does not take.
    """
    named = by_name(model, names)
    last: Exception | None = None
    with preserved(model), torch.no_grad():
        model.eval()
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        for combo in itertools.product(BANDS, repeat=len(names)):
            wrapped = Several(model, names, combo, named)
            try:
                logits_of(wrapped(torch.zeros(1, sum(combo), side, side, device=device)))
            except Exception as exc:  # a wrong band count raises whatever the model's first layer raises
                last = exc
                continue
            return wrapped
    how = f"by name ({', '.join(names)})" if named else f"in the order {', '.join(names)}"
    first = (str(last).strip().splitlines() or [type(last).__name__])[0][:200] if last else ""
    raise SetupError(
        f"the model cannot be called with {len(names)} inputs {how} of 1 to 4 bands at {side} px ({first}); "
        "check the --input names and order against its forward()"
    )


def branches(model: Several, x: Tensor, layers: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The inputs each layer sees: those whose change (one input at a time replaced by seeded noise) changes
    the layer's output (a layer that sees none, the first input)."""
    with preserved(model), torch.no_grad():
        model.eval()

        def outputs(inp: Tensor) -> dict[str, Tensor]:
            with capture(model, layers) as cap:
                model(inp)
            return {layer: cap.captured.outputs[layer][-1] for layer in layers}

        base = outputs(x)
        seen: dict[str, list[str]] = {layer: [] for layer in layers}
        start = 0
        for name, b in zip(model.names, model.bands, strict=True):
            changed = x.clone()
            noise = torch.randn(
                changed[:, start : start + b].shape, generator=torch.Generator().manual_seed(0)
            )
            changed[:, start : start + b] = noise.to(x.device, x.dtype)
            start += b
            for layer, value in outputs(changed).items():
                if not torch.equal(value, base[layer]):
                    seen[layer].append(name)
    return {layer: tuple(names) or (model.names[0],) for layer, names in seen.items()}


def with_several(
    loaded: LoadedModel,
    mean: Sequence[float] | Mapping[str, Sequence[float]] | None = None,
    std: Sequence[float] | Mapping[str, Sequence[float]] | None = None,
) -> LoadedModel:
    """``loaded`` (its model a :class:`Several`) with each input's preprocessing: the model's size and resize,
    its normalisation for three-band inputs (ImageNet's when it has none of three), 0 and 1 for the others;
    ``mean``/``std`` by input name, or one list for every input of as many bands.

    Raises:
        UsageError: a name that is no input, values that do not fit an input's bands.
    """
    model = loaded.model
    assert isinstance(model, Several)
    for option, values in (("--mean", mean), ("--std", std)):
        if values is not None and not isinstance(values, Mapping) and len(values) not in model.bands:
            raise UsageError(
                f"{option} has {len(values)} value(s) and the inputs take {', '.join(map(str, model.bands))} "
                f"band(s); give {option} NAME=... per input"
            )
    base = loaded.preprocess
    own_mean = base.mean if len(base.mean) == 3 else IMAGENET_MEAN
    own_std = base.std if len(base.std) == 3 else IMAGENET_STD
    each = []
    for name, b in zip(model.names, model.bands, strict=True):
        m = _given(mean, name, b, "--mean", model.names) or (own_mean if b == 3 else (0.0,) * b)
        s = _given(std, name, b, "--std", model.names) or (own_std if b == 3 else (1.0,) * b)
        each.append(replace(base, channels=b, mean=tuple(m), std=tuple(s)))
    packed = replace(
        base,
        channels=sum(model.bands),
        mean=tuple(v for p in each for v in p.mean),
        std=tuple(v for p in each for v in p.std),
    )
    return replace(loaded, preprocess=packed, inputs=SeveralPreprocess(model.names, tuple(each)))


def _given(
    values: Sequence[float] | Mapping[str, Sequence[float]] | None,
    name: str,
    bands: int,
    option: str,
    names: Sequence[str],
) -> tuple[float, ...] | None:
    if values is None:
        return None
    if isinstance(values, Mapping):
        unknown = [k for k in values if k not in names]
        if unknown:
            raise UsageError(
                f"{option} {unknown[0]}=...: no input of that name; the inputs are {', '.join(names)}"
            )
        if name not in values:
            return None
        got = tuple(float(v) for v in values[name])
        if len(got) != bands:
            raise UsageError(
                f"{option} {name}=...: input {name} takes {bands} band(s), got {len(got)} value(s)"
            )
        return got
    got = tuple(float(v) for v in values)
    return got if len(got) == bands else None
