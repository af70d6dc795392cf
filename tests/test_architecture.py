"""The package's shape, read from its own source: every module belongs to a layer, a module imports only from
its layer and the layers below, no import cycle, an import inside a function only where it loads a heavy
package the importing module does not (``hookviz --help`` stays fast), modules of 450 lines at most and
functions that read in one breath."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hookviz"

#: The layers, lowest first: a module imports only from its own layer and those before it.
LAYERS = [
    "foundation",  # errors, options, the collector held over a start
    "core",  # hooks, taps, layout, layers, readout, the attention probe, memory estimates
    "io",  # files, images, videos, inputs, annotations, outputs, timing, synthetic shapes
    "summary",  # shapes, parameters, FLOPs of every layer
    "render",  # arrays to pictures
    "models",  # sources, loading, class names, scores
    "methods",  # the registry and every formula
    "engine",  # the explain pass, the detection pass, feature capture
    "evaluation",  # the metric families, their tables
    "training",  # gradient flow, clipping, DropBlock
    "concepts",  # what a channel means: dataset examples, TCAV, feature visualisation
    "sae",  # what a layer has learned: sparse dictionaries trained from hooks, their features
    "jobs",  # adapters from a command's settings to the pipeline
    "tasks",  # the task registry
    "report",  # the HTML page over a run's manifest (the run builds it at its end)
    "run",  # the pipeline, torchrun, the runner
    "vlm",  # generative vision-language models: their families, word maps, pictures, runs
    "explore",  # hookviz explore: the live page and its API
    "serve",  # the warm server
    "cli",  # the command line
    "entry",  # the public API (hookviz, hookviz.lightning), ``python -m hookviz``, the served client
]
RANK = {name: i for i, name in enumerate(LAYERS)}
FOUNDATION = {"hookviz.errors", "hookviz.options", "hookviz.startup"}
ENTRY = {"hookviz", "hookviz.__main__", "hookviz.serve.client", "hookviz.lightning", "hookviz.ray"}
#: Third-party packages slow to import: a function may import a hookviz module that loads one of these.
HEAVY = {
    "torch", "torchvision", "cv2", "matplotlib", "transformers", "timm", "scipy", "PIL", "numpy",
    "safetensors", "huggingface_hub", "typer", "rich",
}  # fmt: skip


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> str:
    if module in ENTRY:
        return "entry"
    if module in FOUNDATION:
        return "foundation"
    part = module.split(".")[1]
    assert part in RANK, f"{module} belongs to no layer: put it in one of {', '.join(LAYERS)}"
    return part


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


@functools.cache
def _imports(module: str) -> tuple[tuple[str, bool, int], ...]:
    """``(imported, at the top, line)`` for every import of ``module`` (TYPE_CHECKING blocks left out):
    hookviz modules by name (``from hookviz.x import y`` imports ``hookviz.x.y`` when that is a module),
    third-party packages by their top name."""
    tree = ast.parse(MODULES[module].read_text())
    found: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, top: bool) -> None:
        if _type_checking(node):
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            for name in subs or [node.module]:
                found.append((name, top, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, top, node.lineno) for a in node.names)
        inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, True)
    return tuple(found)


def _own(name: str) -> str | None:
    """The hookviz module ``name`` loads (``hookviz.x.y`` of a function, its module), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _loaded_at_import(module: str) -> set[str]:
    """The hookviz modules importing ``module`` loads: its own top-level imports, its packages', followed."""
    seen, todo = {module}, [module]
    while todo:
        current = todo.pop()
        parents = [".".join(current.split(".")[:i]) for i in range(1, current.count(".") + 1)]
        follow = [own for name, top, _ in _imports(current) if top and (own := _own(name)) is not None]
        for nxt in [*follow, *(p for p in parents if p in MODULES)]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@functools.cache
def _loads(module: str) -> frozenset[str]:
    """The heavy packages importing ``module`` loads (its top-level imports, followed, and its packages').
    A search over the import graph, each module once (following every path instead grows without bound on
    a graph with cycles)."""
    return frozenset(
        name.split(".")[0]
        for reached in _loaded_at_import(module)
        for name, top, _ in _imports(reached)
        if top and name.split(".")[0] in HEAVY
    )


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)


def test_no_import_cycle() -> None:
    """No cycle among the imports, those inside functions included (a deferred import hides none)."""
    graph = {
        m: {own for name, _, _ in _imports(m) if (own := _own(name)) is not None and own != m}
        for m in MODULES
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = [*stack[stack.index(d) :], d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_layers_import_downwards() -> None:
    """Every import of a hookviz module, at the top or inside a function, goes to the importer's layer or one
    below it."""
    wrong = []
    for module in MODULES:
        mine = RANK[_layer(module)]
        for name, _, line in _imports(module):
            own = _own(name) if name.startswith("hookviz") else None
            if own is not None and RANK[_layer(own)] > mine:
                wrong.append(f"{module}:{line} ({_layer(module)}) imports {own} ({_layer(own)})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow  # imports every module in fresh processes (about 50 s): make test runs it
def test_an_import_inside_a_function_only_defers_a_heavy_package() -> None:
    """hookviz's own imports sit at the top of the file; one inside a function must load a heavy package that
    the importing module does not (the command line loads torch only when a command runs)."""
    hidden = []
    for module in MODULES:
        for name, top, line in _imports(module):
            own = _own(name) if name.startswith("hookviz") else None
            if own is None or top:
                continue
            if not _loads(own) - _loads(module):
                hidden.append(
                    f"{module}:{line} imports {own} inside a function and loads nothing heavy by it"
                )
    assert not hidden, "\n".join(hidden)


def test_no_module_over_450_lines() -> None:
    sizes = {p.relative_to(PACKAGE.parent): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert max(sizes.values()) <= 450, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from a function's first statement after its docstring to its end (its signature and docstring
    not counted: a command's options are declarations)."""
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return int(node.end_lineno or 0) - body[0].lineno + 1


def test_functions_read_in_one_breath() -> None:
    """No function body over 60 lines; a command's signature at most 40 (its own options: the groups it
    shares are declared once, in :mod:`hookviz.cli.options`) and its body at most 40."""
    long = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        commands = (
            {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
            if module.startswith("hookviz.cli.")
            else set()
        )
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                limit = 40 if node.name in commands else 60
                if _body_lines(node) > limit:
                    long.append(f"{module}.{node.name}: {_body_lines(node)} lines (at most {limit})")
                signature = node.body[0].lineno - node.lineno
                if node.name in commands and signature > 40:
                    long.append(f"{module}.{node.name}: a signature of {signature} lines (at most 40)")
    assert not long, "\n".join(long)


def test_options_reach_the_library_as_typed_objects() -> None:
    """No command reads its options back from ``locals()`` by string keys."""
    found = [m for m, path in MODULES.items() if "locals()" in path.read_text()]
    assert not found, found


#: What a model may declare to hookviz (:mod:`hookviz.core.conventions`): read through its functions only.
CONVENTIONS = ("score_kind", "sign", "default_layers", "layers_note", "pool", "by_name", "frames", "kind")


def test_conventions_are_declared_not_probed() -> None:
    """hookviz reads its own conventions as fields or through :mod:`hookviz.core.conventions`, never by
    ``getattr(obj, "own_attr", default)``."""
    probes = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            ):
                continue
            if (
                len(node.args) == 3
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in CONVENTIONS
            ):
                probes.append(f"{module}:{node.lineno} getattr(..., {node.args[1].value!r}, ...)")
    assert not probes, "\n".join(probes)


def test_the_job_protocol_is_not_probed() -> None:
    """The pipeline and the runner use the job's members, never ``getattr(job, ...)``."""
    for module in ("hookviz.run.pipeline", "hookviz.run.files", "hookviz.run.runner", "hookviz.cli.runner"):
        text = MODULES[module].read_text()
        assert "getattr(job" not in text and "getattr(self.job" not in text, module


def test_tensors_reach_numpy_through_one_function() -> None:
    """``tensor.numpy()`` fails on a GPU tensor (and on one with a graph, or bfloat16): every move to NumPy
    goes through :func:`hookviz.core.arrays.to_numpy`, so that ``--device cuda`` works where the CPU did."""
    calls = []
    for module, path in MODULES.items():
        if module == "hookviz.core.arrays":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "numpy"
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id in ("np", "numpy"))
            ):
                calls.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    assert not calls, "use hookviz.core.arrays.to_numpy:\n" + "\n".join(calls)
