"""Layer names resolved once into sites: what ``--layer`` names (a module name, a glob, ``NAME:input``, a
functional pooling's input, see :mod:`hookviz.core.taps`), validated, de-duplicated, each found module and
its layout kept, so the hooks (:class:`hookviz.core.hooks.capture`) and the explain pass take them as they
are, with no second lookup.

A :class:`Site` is resolved from one ``named_modules()`` walk and, for its shape and layout, the shapes one
traced forward pass saw (:func:`hookviz.core.trace.trace_shapes`). A site belongs to the model it was
resolved on; a name (a ``str``) is accepted wherever a site is and resolved on the spot (:func:`bind`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from torch import nn

from hookviz.core import taps
from hookviz.core.layout import Layout, channel_axis, layout_for
from hookviz.core.trace import ModuleCall, Trace, pool_of
from hookviz.errors import LayerError, close_matches


@dataclass(frozen=True)
class Site:
    """One tensor a hook takes, resolved once.

    Attributes:
        name: the tensor's name as given (``layer4``, ``avgpool:input``, ``head.mean:input``): the key of
            every map, record and file name.
        path: the module hooked: the one whose output or first input it is, or whose own ``forward`` calls
            the functional pooling ("" for the model itself).
        stage: ``"output"`` (a forward hook) or ``"input"`` (a forward-pre hook, or a functional pooling's
            input).
        module: the module at ``path`` (not compared: two sites of one name are equal).
        function: the functional pooling taking the tensor (``adaptive_avg_pool2d``), else None.
        shape: its shape in the traced pass (batch of 1), None where not traced or not a tensor.
        runs: how often it ran in the traced pass (-1: not traced).
        layout: how it holds its map (:class:`hookviz.core.layout.Layout`), computed once from the trace;
            None where not traced or without a map.
        traced_on: the shape of the input the trace ran on, less its batch axis (None: unknown).
    """

    name: str
    path: str
    stage: str
    module: nn.Module = field(compare=False, repr=False)
    function: str | None = None
    shape: tuple[int, ...] | None = None
    runs: int = -1
    layout: Layout | None = None
    traced_on: tuple[int, ...] | None = None

    @property
    def ref(self) -> taps.Ref:
        """The parsed tensor name (:class:`hookviz.core.taps.Ref`)."""
        return taps.Ref(self.name, self.path, self.stage, self.function)

    @property
    def channels(self) -> int:
        """Channels of its map, on the axis its layout holds them (a 2-D or 3-D convolution's: after the batch
        axis; channels-last blocks' and tokens': the last, the embedding width); needs a traced layout."""
        if self.layout is None or self.shape is None:
            raise LayerError(f"{self.name!r} has no traced map, so no channels")
        return int(self.shape[channel_axis(self.layout)])

    def holds(self, shape: Sequence[int], input_shape: Sequence[int]) -> bool:
        """Whether its traced layout holds for a tensor of ``shape`` captured from an input of
        ``input_shape`` (any batch size): the traced shape, and for tokens (whose patch grid the input's
        shape decides) the traced input's shape."""
        if self.layout is None or self.shape is None or tuple(shape[1:]) != self.shape[1:]:
            return False
        return len(shape) != 3 or self.traced_on == tuple(input_shape[1:])

    def layout_at(
        self,
        shape: Sequence[int],
        input_shape: Sequence[int],
        trace: Callable[[], Sequence[ModuleCall]] | None = None,
    ) -> Layout:
        """Its layout for a tensor of ``shape`` from an input of ``input_shape``: the traced one where it
        :meth:`holds`, else decided from ``shape`` with its module (tokens: with ``trace()``, a pass traced
        on that input, for their patch grid).

        Raises:
            LayerError: the tensor has no spatial map.
        """
        if self.layout is not None and self.holds(shape, input_shape):
            return self.layout
        return self.decide(shape, trace() if trace is not None and len(shape) == 3 else None)

    def decide(self, shape: Sequence[int], calls: Sequence[ModuleCall] | None = None) -> Layout:
        """Its layout for a tensor of ``shape`` (:func:`hookviz.core.layout.layout_for`), from its module.

        Raises:
            LayerError: the tensor has no spatial map.
        """
        return layout_for(None if self.stage == "input" else self.module, self.name, shape, calls)


def is_pattern(text: str) -> bool:
    """Whether a layer spec is a glob (``*``, ``?`` or ``[``) rather than a module name."""
    return any(c in text for c in "*?[")


def module_names(model: nn.Module) -> list[str]:
    """Names of every submodule in ``named_modules`` order (the root, named "", excluded)."""
    return [name for name, _ in model.named_modules() if name]


def listing(model_name: str) -> str:
    """Where the user finds the layers' names."""
    return f"`hookviz layers --model {model_name}` lists them"


def _globbed(
    modules: dict[str, nn.Module],
    pattern: str,
    model_name: str,
    kinds: tuple[type[nn.Module], ...] | None = None,
) -> list[str]:
    """The module names ``pattern`` names (a glob's matches, or the one name), in network order."""
    names = [n for n in modules if n]
    if is_pattern(pattern):
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if kinds is not None:
            hits = [n for n in hits if isinstance(modules[n], kinds)]
        if not hits:
            kind = f" {'/'.join(k.__name__ for k in kinds)}" if kinds else ""
            raise LayerError(
                f"pattern {pattern!r} matches no{kind} layer in {model_name}; {listing(model_name)}"
            )
        return hits
    if pattern in modules and pattern:
        return [pattern]
    near = close_matches(pattern, names)
    raise LayerError(f"no layer {pattern!r} in {model_name}{near} ({listing(model_name)})")


def resolve_layers(
    model: nn.Module,
    patterns: Iterable[str],
    *,
    model_name: str = "the model",
    kinds: tuple[type[nn.Module], ...] | None = None,
) -> list[str]:
    """Turn layer names and glob patterns into module names, in network order, each once.

    A pattern with ``*``, ``?`` or ``[`` is a glob over ``named_modules()`` names (and, when
    ``kinds`` is given, matches only modules of those types); a plain name must exist exactly.

    Raises:
        LayerError: a name does not exist (close matches are suggested) or a pattern matches nothing.
    """
    modules = dict(model.named_modules())
    chosen: set[str] = set()
    for pattern in patterns:
        chosen.update(_globbed(modules, pattern, model_name, kinds))
    return [n for n in modules if n in chosen]


def one_module(model: nn.Module, spec: str, model_name: str = "the model") -> str:
    """The one module ``spec`` names: a module name, or a glob matching exactly one.

    Raises:
        LayerError: an unknown name, a glob matching none or several.
    """
    found = resolve_layers(model, [spec], model_name=model_name)
    if len(found) > 1:
        shown = ", ".join(found[:4]) + (" ..." if len(found) > 4 else "")
        raise LayerError(f"--layer {spec}: takes one layer, and the pattern matches {len(found)} ({shown})")
    return found[0]


def outermost(names: Sequence[str]) -> list[str]:
    """``names`` without those nested inside another of them (``layer4.0`` goes when ``layer4`` is there)."""
    kept = set(names)
    return [n for n in names if not any(n.startswith(f"{other}.") for other in kept if other != n)]


class _Resolver:
    """One model's modules and traced calls, walked and indexed once, for every name resolved on them."""

    def __init__(self, model: nn.Module, calls: Sequence[ModuleCall] | None, model_name: str | None) -> None:
        self.modules = dict(model.named_modules())
        self.calls = calls
        self.by_name = {c.name: c for c in calls or ()}
        self.model_name = model_name
        self.input_shape = calls.input_shape if isinstance(calls, Trace) else None

    def site(self, name: str) -> Site:
        """``name`` (a module's output, ``NAME:input`` or a functional pooling's input) as a site, its shape
        and runs from the trace (none without one); no layout yet.

        Raises:
            LayerError: no such module, or no such functional pooling in the traced pass.
        """
        ref = taps.parse(name, self.modules)
        if ref is None:
            self._unknown(name)
        shape: tuple[int, ...] | None = None
        runs = -1 if self.calls is None else 0
        if ref.function is not None and self.calls is not None:
            pool = pool_of(self.calls)
            if pool is None or pool.name != name:
                found = f"; the head's pooling input is {pool.name!r}" if pool is not None else ""
                raise LayerError(
                    f"{name!r}: {self.model_name} makes no such functional global pooling call{found}"
                )
            shape, runs = pool.shape, 1
        elif (call := self.by_name.get(ref.module)) is not None:
            shape, runs = (call.input_shape if ref.stage == "input" else call.output_shape), call.calls
        module = self.modules[ref.module]
        return Site(name, ref.module, ref.stage, module, ref.function, shape, runs, None, self.input_shape)

    def _unknown(self, name: str) -> NoReturn:
        if self.model_name is None:  # a hook's own name, given from Python: no model name, no listing
            raise LayerError(f"no layer {name!r} in the model{close_matches(name, self.modules)}")
        names = [n for n in self.modules if n]
        if not taps.is_input(name):
            near = close_matches(name, names)
            raise LayerError(f"no layer {name!r} in {self.model_name}{near} ({listing(self.model_name)})")
        head = taps.base(name)
        near = close_matches(head, names)
        raise LayerError(
            f"no layer {head!r} in {self.model_name}{near}, and {name!r} is not a global "
            f"pooling's input ({listing(self.model_name)}; NAME:input takes a module's input)"
        )

    def laid_out(self, site: Site) -> Site:
        """``site`` with its layout, when it ran once or more with a tensor shape that has a map."""
        if site.runs < 1 or site.shape is None:
            return site
        with contextlib.suppress(LayerError):
            return dataclasses.replace(site, layout=site.decide(site.shape, self.calls))
        return site

    def cam(self, name: str) -> Site:
        """``name`` as a CAM tensor: it exists, runs once, and has a spatial map (its layout).

        Raises:
            LayerError: a pattern, an unknown name, a layer that does not run or runs twice, or one with no
                spatial map (a pooled vector, a classifier head).
        """
        if is_pattern(name):
            raise LayerError(f"--layer takes module names, not patterns ({name!r})")
        site = self.site(name)
        if site.runs == 0:
            raise LayerError(
                f"layer {name!r} does not run in {self.model_name}'s forward pass; pick another layer"
            )
        if site.shape is None:
            raise LayerError(f"{name!r} is not a tensor; pick another layer")
        try:
            layout = site.decide(site.shape, self.calls)
        except LayerError as exc:
            raise LayerError(f"{exc} ({listing(str(self.model_name))})") from None
        if site.runs > 1:
            raise LayerError(
                f"layer {name!r} runs {site.runs} times per forward pass, so its gradient is ambiguous; "
                "pick a layer that runs once (e.g. its parent block)"
            )
        return dataclasses.replace(site, layout=layout)


def sites_of(
    model: nn.Module,
    names: Iterable[str | Site],
    calls: Sequence[ModuleCall] | None = None,
    model_name: str = "the model",
) -> list[Site]:
    """``names`` as sites, each once, in the order given; a :class:`Site` is taken as it is.

    With ``calls`` (a traced pass on the input the sites will see), each site has its shape, runs and
    layout; without, it has its module alone (and the layout is decided where its tensor is captured).
    Nothing is walked when every name is a site already.

    Raises:
        LayerError: an unknown name (close matches are suggested).
    """
    return _sites(model, names, calls, model_name)


def _sites(
    model: nn.Module, names: Iterable[str | Site], calls: Sequence[ModuleCall] | None, model_name: str | None
) -> list[Site]:
    given = list(names)
    resolver = _Resolver(model, calls, model_name) if any(isinstance(n, str) for n in given) else None
    found: dict[str, Site] = {}
    for n in given:
        if isinstance(n, Site):
            found.setdefault(n.name, n)
        elif n not in found:
            assert resolver is not None
            site = resolver.site(n)
            found[n] = resolver.laid_out(site) if calls is not None else site
    return list(found.values())


def bind(model: nn.Module, names: Iterable[str | Site]) -> list[Site]:
    """The sites a hook takes, each once: a site as it is, a name resolved on ``model`` (:func:`sites_of`,
    with no trace: the module alone).

    Raises:
        LayerError: an unknown name.
    """
    return _sites(model, names, None, None)


def cam_sites(
    model: nn.Module, specs: Sequence[str], calls: Sequence[ModuleCall], model_name: str = "the model"
) -> list[Site]:
    """``--layer``'s names and globs as CAM tensors, validated and laid out once, each given once: a name as
    it is, a glob as the layers it matches that can be CAM tensors (in network order), in the order given.

    Raises:
        LayerError: a bad name (a pattern where one name is due, an unknown one, one that does not run or
            runs twice, one without a spatial map), a glob matching no layer that can be one.
    """
    resolver = _Resolver(model, calls, model_name)
    chosen: dict[str, Site] = {}
    for spec in specs:
        if not is_pattern(spec):
            if spec not in chosen:
                chosen[spec] = resolver.cam(spec)
            continue
        found = []
        for name in _globbed(resolver.modules, spec, model_name):
            with contextlib.suppress(LayerError):
                found.append(chosen.get(name) or resolver.cam(name))
        if not found:
            raise LayerError(
                f"pattern {spec!r} matches no layer of {model_name} with a spatial map that runs once; "
                f"{listing(model_name)}"
            )
        for site in found:
            chosen.setdefault(site.name, site)
    return list(chosen.values())


def cam_layer(model: nn.Module, name: str, calls: Sequence[ModuleCall], model_name: str = "the model") -> str:
    """Check that ``name`` can be a CAM tensor: a module (its output) or ``NAME:input`` that exists, runs
    once, and has a spatial map (:func:`cam_sites`).

    Raises:
        LayerError: a pattern, an unknown name, a layer that does not run or runs twice, or one with
        no spatial map (a pooled vector, a classifier head).
    """
    return _Resolver(model, calls, model_name).cam(name).name


def cam_layers(
    model: nn.Module, specs: Sequence[str], calls: Sequence[ModuleCall], model_name: str = "the model"
) -> list[str]:
    """The names of :func:`cam_sites`."""
    return [s.name for s in cam_sites(model, specs, calls, model_name)]


def channels(model: nn.Module, name: str, calls: Sequence[ModuleCall]) -> int:
    """How many channels CAM tensor ``name``'s map has (tokens: the embedding width)."""
    (site,) = sites_of(model, [name], calls)
    return site.channels
