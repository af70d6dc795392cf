"""TCAV (Kim et al. 2018): how much a human concept (a folder of examples) matters to a class at a layer.

A concept activation vector (CAV) is the normal of a linear boundary between the layer's activations
(flattened) on the concept's examples and on a random folder's: by default the classifier captum's TCAV uses
(scikit-learn's ``SGDClassifier(alpha=0.01, max_iter=1000, tol=1e-3)`` on a shuffled two-thirds, scored on
the rest), or the difference of the two means (``method="mean"``). An input's sensitivity is the gradient of
the class's logit at the layer dotted with the CAV; the TCAV score is the share of the class's inputs with a
positive one (``sign_count``), and ``magnitude`` their mean (captum's two scores).

One CAV depends on the random folder it was trained against, so a concept is scored against each of several
random folders, and so is each random folder against another (the null); a two-sided t-test of the two
lists of sign counts says whether the concept's score is more than chance (p below ``alpha``). With the same
seed (Python's ``random`` for the split, NumPy's for the classifier) the CAVs and scores equal captum's.
"""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import capture, logits_of, preserved
from hookviz.errors import HookvizError, LayerError, SetupError, UsageError
from hookviz.io.inputs import expand_inputs, read_input
from hookviz.io.outputs import settings_key
from hookviz.models.classes import parse_target
from hookviz.models.loaded import LoadedModel, feature_layers, num_classes
from hookviz.models.settings import model_settings

METHODS = ("linear", "mean")


def layer_activations(model: nn.Module, batches: Iterable[Tensor], layer: str) -> Tensor:
    """``(N, F)``: the layer's output on every input of ``batches``, flattened (float32, CPU)."""
    parts = []
    with preserved(model), capture(model, [layer]) as cap:
        model.eval()
        with torch.no_grad():
            for x in batches:
                cap.captured.outputs.clear()
                model(x)
                found = cap.captured.outputs.get(layer)
                if not found:
                    raise LayerError(f"layer {layer!r} did not run in the forward pass")
                parts.append(found[0].detach().float().flatten(1).cpu())
    return torch.cat(parts)


def layer_gradients(model: nn.Module, batches: Iterable[Tensor], layer: str, target: int) -> Tensor:
    """``(N, F)``: the gradient of the ``target`` logit with respect to the layer's output, flattened."""
    parts = []
    with preserved(model), capture(model, [], grad_layers=[layer]) as cap:
        model.eval()
        for x in batches:
            cap.captured.taps.clear()
            cap.captured.grads.clear()
            with torch.no_grad():
                out = model(x)
            logits = logits_of(out)
            if logits.dim() != 2:
                raise UsageError(
                    "tcav explains a classifier's class: this model's output is not (B, classes)"
                )
            torch.autograd.grad(logits[:, target].sum(), cap.captured.taps[layer][0])
            parts.append(cap.captured.grads[layer][0].detach().float().flatten(1).cpu())
    return torch.cat(parts)


@dataclass
class Seeds:
    """The random state CAVs are trained with, shared in training order (as captum's global ones are)."""

    seed: int = 0
    python: random.Random = field(init=False)
    numpy: np.random.RandomState = field(init=False)

    def __post_init__(self) -> None:
        self.python = random.Random(self.seed)
        self.numpy = np.random.RandomState(self.seed)


@dataclass(frozen=True)
class Cav:
    """A concept's direction against another folder, and how well a classifier told them apart (held out;
    NaN for ``mean``)."""

    vector: Tensor
    accuracy: float
    #: Held-out examples, and the share of the larger folder among them (what guessing one folder scores).
    held: int = 0
    chance: float = 0.5


def train_cav(concept: Tensor, other: Tensor, *, method: str = "linear", seeds: Seeds | None = None) -> Cav:
    """The direction from ``other``'s activations towards ``concept``'s (``(N, F)`` each).

    Raises:
        UsageError: an unknown method, or a folder of fewer than two examples.
        SetupError: ``linear`` without scikit-learn.
    """
    if method not in METHODS:
        raise UsageError(f"--cav {method!r}: choose one of {', '.join(METHODS)}")
    if len(concept) < 2 or len(other) < 2:
        raise UsageError(
            "a concept and a random folder need two examples each at least (30 or more is usual)"
        )
    if method == "mean":
        return Cav(concept.mean(0) - other.mean(0), float("nan"))
    try:
        from sklearn.linear_model import SGDClassifier
    except ImportError as exc:
        raise SetupError(
            "--cav linear needs scikit-learn: pip install 'hookviz[tcav]' (or pass --cav mean)"
        ) from exc
    seeds = seeds or Seeds()
    rows = [(x, 0) for x in concept] + [(x, 1) for x in other]
    seeds.python.shuffle(rows)  # captum's split: a shuffle, the first third held out
    test = int(0.33 * len(rows))
    held, train = rows[:test], rows[test:]
    lm = SGDClassifier(alpha=0.01, max_iter=1000, tol=1e-3, random_state=seeds.numpy)
    lm.fit(to_numpy(torch.stack([x for x, _ in train])), np.array([y for _, y in train]))
    accuracy, chance = float("nan"), 0.5
    if held:
        labels = np.array([y for _, y in held])
        predicted = lm.predict(to_numpy(torch.stack([x for x, _ in held])))
        accuracy = float(np.mean(predicted == labels))
        chance = float(max(labels.mean(), 1 - labels.mean()))
    # the boundary's normal points to class 1 (the other folder): the concept's direction is its opposite
    vector = -torch.from_numpy(np.asarray(lm.coef_[0], dtype=np.float32))
    return Cav(vector, accuracy, len(held), chance)


def scores(gradients: Tensor, cav: Cav) -> tuple[float, float]:
    """``(sign_count, magnitude)``: the share of inputs whose sensitivity (gradient . CAV) is positive, and
    the sensitivities' mean (captum's ``magnitude``)."""
    s = gradients.float() @ cav.vector.float()
    return float((s > 0).float().mean()), float(s.mean())


@dataclass(frozen=True)
class ConceptScore:
    """One concept (or the null) at one layer: a score per random folder, their test against the null."""

    concept: str
    sign_counts: list[float]
    magnitudes: list[float]
    accuracies: list[float]
    p_value: float | None = None
    significant: bool | None = None
    #: Whether its CAVs tell the concept from the random folders better than chance (None: not measured,
    #: ``--cav mean``). A concept whose CAVs are at chance has no direction to score: never significant.
    meaningful: bool | None = None

    @property
    def mean(self) -> float:
        return float(np.mean(self.sign_counts))

    @property
    def std(self) -> float:
        return float(np.std(self.sign_counts))


@dataclass(frozen=True)
class TcavResult:
    layer: str
    target: int
    inputs: int
    concepts: list[ConceptScore]
    null: ConceptScore


def tcav(
    model: nn.Module,
    inputs: Callable[[], Iterable[Tensor]],
    layer: str,
    target: int,
    concepts: Mapping[str, Callable[[], Iterable[Tensor]]],
    randoms: Sequence[Callable[[], Iterable[Tensor]]],
    *,
    method: str = "linear",
    seed: int = 0,
    alpha: float = 0.05,
) -> TcavResult:
    """TCAV scores of each concept for ``target`` at ``layer``, each against every random folder, and their
    significance against random-vs-random CAVs (the null: folder ``i`` against folder ``i + 1``, cyclic).

    ``inputs``, each of ``concepts`` and of ``randoms``: a callable giving batches of model inputs (called
    once). CAVs are trained in order (each concept against random folders 0, 1, ..., then the null pairs).

    Raises:
        UsageError: fewer than two random folders, or a bad method.
    """
    if len(randoms) < 2:
        raise UsageError("--random: give two random folders at least (five or more for a meaningful test)")
    grads = layer_gradients(model, inputs(), layer, target)
    acts = {name: layer_activations(model, make(), layer) for name, make in concepts.items()}
    rand = [layer_activations(model, make(), layer) for make in randoms]
    seeds = Seeds(seed)

    def against(concept: Tensor, others: list[Tensor]) -> tuple[list[float], list[float], list[Cav]]:
        signs, mags, cavs = [], [], []
        for other in others:
            cav = train_cav(concept, other, method=method, seeds=seeds)
            s, m = scores(grads, cav)
            signs.append(s)
            mags.append(m)
            cavs.append(cav)
        return signs, mags, cavs

    measured = {name: against(a, rand) for name, a in acts.items()}
    null_signs: list[float] = []
    null_mags: list[float] = []
    null_cavs: list[Cav] = []
    for i in range(len(rand)):
        s, m, c = against(rand[i], [rand[(i + 1) % len(rand)]])
        null_signs += s
        null_mags += m
        null_cavs += c
    null = ConceptScore("(random)", null_signs, null_mags, [c.accuracy for c in null_cavs])
    out = []
    for name, (signs, mags, cavs) in measured.items():
        p, significant = _significance(signs, null.sign_counts, alpha)
        meaningful = above_chance(cavs, alpha)
        if meaningful is False:
            significant = False
        out.append(ConceptScore(name, signs, mags, [c.accuracy for c in cavs], p, significant, meaningful))
    return TcavResult(layer, target, len(grads), out, null)


def above_chance(cavs: Sequence[Cav], alpha: float = 0.05) -> bool | None:
    """Whether ``cavs`` (one concept against each random folder) separate it from the random folders better
    than guessing the larger folder does: a one-sided binomial test of their held-out hits, pooled, at
    ``alpha`` (Kim et al. discard CAVs at chance). None when no accuracy was measured (``--cav mean``)."""
    from scipy.stats import binomtest

    held = [c for c in cavs if c.held and c.accuracy == c.accuracy]
    if not held:
        return None
    n = sum(c.held for c in held)
    hits = round(sum(c.accuracy * c.held for c in held))
    chance = sum(c.chance * c.held for c in held) / n
    return bool(binomtest(hits, n, min(chance, 1.0), alternative="greater").pvalue < alpha)


def _significance(signs: list[float], null: list[float], alpha: float) -> tuple[float | None, bool | None]:
    """A two-sided t-test (Student's, as Kim et al. and captum's tutorial) of the sign counts against the
    null's; None where both lists are constant and equal (no variance to test)."""
    from scipy.stats import ttest_ind

    if np.std(signs) == 0 and np.std(null) == 0:
        same = float(np.mean(signs)) == float(np.mean(null))
        return (1.0, False) if same else (0.0, True)
    with warnings.catch_warnings():  # a constant list (every input positive) is a fine sample here
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttest_ind(signs, null).pvalue)
    return p, bool(p < alpha)


def as_json(result: TcavResult) -> dict[str, Any]:
    def one(c: ConceptScore) -> dict[str, Any]:
        return {
            "concept": c.concept,
            "sign_count": round(c.mean, 6),
            "sign_count_std": round(c.std, 6),
            "magnitude": round(float(np.mean(c.magnitudes)), 6),
            "p_value": None if c.p_value is None else round(c.p_value, 6),
            "significant": c.significant,
            "meaningful": c.meaningful,
            "cav_accuracy": _round(float(np.mean(c.accuracies))) if c.accuracies else None,
            "runs": [
                {"sign_count": round(s, 6), "magnitude": round(m, 6), "cav_accuracy": _round(a)}
                for s, m, a in zip(c.sign_counts, c.magnitudes, c.accuracies, strict=True)
            ],
        }

    return {
        "layer": result.layer,
        "target": result.target,
        "inputs": result.inputs,
        "concepts": [one(c) for c in result.concepts],
        "null": one(result.null),
    }


def _round(v: float) -> float | None:
    return None if v != v else round(v, 6)


def photo_batches(
    specs: Sequence[str], loaded: LoadedModel, size: int, max_pixels: int, said: list[str]
) -> Iterator[Tensor]:
    """The photos ``specs`` name (files, folders, globs), as batches of the model's inputs on its device; one
    that cannot be read is left out and said in ``said``.

    Raises:
        UsageError: no image found.
    """
    items = [i for i in expand_inputs(specs) if i.error is None and i.path is not None]
    if not items:
        raise UsageError(f"{', '.join(specs)}: no image found")
    chunk: list[np.ndarray] = []
    for item in items:
        try:
            _, x, _ = read_input(item, loaded.preprocess, max_pixels)
        except HookvizError as exc:
            said.append(f"left out: {exc}")
            continue
        chunk.append(x)
        if len(chunk) == size:
            yield torch.from_numpy(np.stack(chunk)).to(loaded.device)
            chunk = []
    if chunk:
        yield torch.from_numpy(np.stack(chunk)).to(loaded.device)


def distinct_folders(concepts: Mapping[str, str], randoms: Sequence[str]) -> None:
    """Refuse a folder given twice (by its real path) or inside another given folder: a concept scored
    against itself, or one random folder counted five times, gives a t-test of nothing.

    Raises:
        UsageError: naming the two roles that share a folder.
    """
    seen: list[tuple[str, str, str]] = []
    roles = [*((f"--concept {n}", f) for n, f in concepts.items()), *(("--random", f) for f in randoms)]
    for role, spec in roles:
        real = os.path.realpath(os.path.expanduser(spec))
        for other_role, other_spec, other in seen:
            if real == other or real.startswith(other + os.sep) or other.startswith(real + os.sep):
                how = "the same folder as" if real == other else "overlaps"
                raise UsageError(
                    f"{role} {spec} is {how} {other_role} {other_spec}: give each folder once, the concept's "
                    "examples apart from every random folder"
                )
        seen.append((role, spec, real))


@dataclass(frozen=True)
class TcavAsked:
    """What a TCAV run over folders of photos is asked (``hookviz tcav``'s options).

    Attributes:
        inputs: the photos of the class (files, folders, globs); ``target``: the class (an index or a name).
        concepts: each concept's folder of examples, by name; ``randoms``: the folders of random examples.
        layers: the layers (default: the CAM layer); ``method``, ``seed``, ``alpha``: as :func:`tcav`'s.
    """

    inputs: Sequence[str]
    target: str
    concepts: Mapping[str, str]
    randoms: Sequence[str]
    layers: Sequence[str] | None = None
    method: str = "linear"
    seed: int = 0
    alpha: float = 0.05


def tcav_settings(
    loaded: LoadedModel, asked: TcavAsked, target: int, layers: Sequence[str]
) -> dict[str, Any]:
    """What changes a TCAV result: the model as it reads inputs, the folders (real paths), the class
    (``target``, its index), the layers (resolved) and test (its key names ``tcav.KEY.json``)."""

    def real(specs: Sequence[str]) -> list[str]:
        return [os.path.realpath(os.path.expanduser(x)) for x in specs]

    return {
        **model_settings(loaded),
        "inputs": real(asked.inputs),
        "target": target,
        "layers": list(layers),
        "cav": asked.method,
        "seed": asked.seed,
        "alpha": asked.alpha,
        "concepts": dict(zip(asked.concepts, real(list(asked.concepts.values())), strict=True)),
        "random": real(asked.randoms),
    }


def tcav_plan(loaded: LoadedModel, asked: TcavAsked) -> tuple[list[str], int, dict[str, Any]]:
    """The layers, the class index and the settings of a TCAV run, checked before any work.

    Raises:
        TargetError, LayerError, UsageError: a bad class, layer or folder.
    """
    distinct_folders(asked.concepts, asked.randoms)
    names, _ = feature_layers(loaded, asked.layers)
    index = parse_target(asked.target, loaded, num_classes(loaded))
    if index is None:
        raise UsageError(f"--target {asked.target}: name one class (an index or a name)")
    return names, index, tcav_settings(loaded, asked, index, names)


def tcav_report(
    loaded: LoadedModel, asked: TcavAsked, *, batch: int = 8, max_pixels: int = 80_000_000
) -> tuple[dict[str, Any], list[str]]:
    """:func:`tcav` at every layer (default: the CAM layer) over folders of photos, as ``tcav.KEY.json`` holds
    it, and what was left out (unreadable photos), each said once.

    Raises:
        TargetError, LayerError, UsageError: a bad class, layer or folder.
    """
    names, index, settings = tcav_plan(loaded, asked)
    said: list[str] = []

    def read(specs: Sequence[str]) -> Callable[[], Iterable[Tensor]]:
        return lambda: photo_batches(specs, loaded, batch, max_pixels, said)

    made = {name: read([folder]) for name, folder in asked.concepts.items()}
    against = [read([folder]) for folder in asked.randoms]
    photos, m = read(asked.inputs), asked
    results = [
        tcav(loaded.model, photos, layer, index, made, against, method=m.method, seed=m.seed, alpha=m.alpha)
        for layer in names
    ]
    for r in results:
        for c in r.concepts:
            if c.meaningful is False:
                said.append(
                    f"{c.concept} at {r.layer}: its CAVs tell it from the random folders no better than "
                    f"chance (accuracy {np.mean(c.accuracies):.2f}): not meaningful, whatever its score"
                )
    data = {
        "key": settings_key(settings),
        "settings": settings,
        "target": {"index": index, "name": loaded.class_name(index)},
        "layers": [as_json(r) for r in results],
    }
    return data, list(dict.fromkeys(said))
