"""The package's shape: no import cycle, no module over about 500 lines, and the layers import downwards."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hookviz"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path) -> set[str]:
    """hookviz modules imported when ``path`` is imported (not inside functions or TYPE_CHECKING)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("hookviz"):
                found.add(sub.module)
                found.update(f"{sub.module}.{a.name}" for a in sub.names)
            elif isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names if a.name.startswith("hookviz"))
    return found


def test_no_import_cycle() -> None:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: {d for d in _top_level_imports(p) if d in modules and d != m} for m, p in modules.items()}
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


def test_no_module_over_about_500_lines() -> None:
    sizes = {p.relative_to(PACKAGE.parent): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert max(sizes.values()) <= 520, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_the_layers_import_downwards() -> None:
    """sources → models → methods → jobs → pipeline → render/report → cli: no lower layer imports a higher one
    when it is imported (lazy imports inside functions excluded)."""
    order = ["sources", "models", "methods", "jobs", "pipeline", "report", "cli"]
    rank = {name: i for i, name in enumerate(order)}

    def layer(module: str) -> str | None:
        part = module.split(".")[1] if "." in module else None
        return part if part in rank else None

    for path in PACKAGE.rglob("*.py"):
        mine = layer(_module(path))
        if mine is None:
            continue
        for dep in _top_level_imports(path):
            theirs = layer(dep)
            assert theirs is None or rank[theirs] <= rank[mine], f"{_module(path)} imports {dep}"
