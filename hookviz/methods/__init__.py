"""The method registry: every map hookviz can make is one function plus one registration.

A registration says what the method is (name, title, family, paper), what it needs from the explain pass
(activations, layer gradients, input gradients, masked forward passes), whether its map depends on the
class, and what it costs. Everything else is generated from this table: the CLI's ``--method`` choices and
help, ``--method all``, sheet order, titles in captions and the report, the cost note, the docs' method
table (``python -m hookviz.methods``). The model to follow is timm's ``register_model``.

A method's function takes a :class:`hookviz.methods.compute.LayerPass` (the pass's activations, gradients,
targets and shared work at one layer) and returns maps ``(B, T, h, w)``::

    from hookviz.methods import register_method

    @register_method("absgrad", title="|gradient| CAM", family="gradient-weighted",
                     needs={"activations", "layer_gradients"}, cost="the shared backward passes")
    def absgrad(p):
        return torch.stack([(g.abs() * p.activations).sum(1) for g in p.gradients], dim=1)

This module imports no torch (``hookviz --help`` stays fast): built-in methods name their function by
``"module:function"``, resolved when first used.
"""

from hookviz.methods import catalogue as _catalogue  # noqa: F401  (registers the built-in methods)
from hookviz.methods.registry import (
    ALL,
    BASELINES,
    FAMILIES,
    HEAD_FUSIONS,
    NEEDS,
    REGISTRY,
    SELECTORS,
    Method,
    MethodOptions,
    Passes,
    get,
    names,
    parse,
    passes,
    register_method,
    table,
    title,
    unregister,
)

__all__ = [
    "ALL",
    "BASELINES",
    "FAMILIES",
    "HEAD_FUSIONS",
    "NEEDS",
    "REGISTRY",
    "SELECTORS",
    "Method",
    "MethodOptions",
    "Passes",
    "get",
    "names",
    "parse",
    "passes",
    "register_method",
    "table",
    "title",
    "unregister",
]
