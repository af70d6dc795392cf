"""Write the command-line reference of the documentation (docs/cli/COMMAND.md) from the app itself: each
command's options as Typer reads them (names, panel, type, default, help), in the order ``--help`` lists them.

    python scripts/cli_docs.py          # rewrite docs/cli/
    python scripts/cli_docs.py --check  # exit 1 when a page differs from what the app says (tests run this)
"""

from __future__ import annotations

import enum
import inspect
import sys
import typing
from pathlib import Path
from typing import Annotated, Any

from typer.models import ArgumentInfo, OptionInfo

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli"


def _info(annotation: Any) -> tuple[Any, Any]:
    """The base type and the Typer parameter info of an ``Annotated`` annotation (None for a plain one)."""
    if typing.get_origin(annotation) is Annotated:
        base, *extras = typing.get_args(annotation)
        return base, next((e for e in extras if isinstance(e, (OptionInfo, ArgumentInfo))), None)
    return annotation, None


def _type(base: Any, name: str) -> str:
    """How a value is written: a choice list, a number, a path, text; several with ``...``."""
    if name == "methods":
        return "a method or family ([methods](../methods.md))"
    args = [a for a in typing.get_args(base) if a is not type(None)]
    many = typing.get_origin(base) is list or any(typing.get_origin(a) is list for a in args)
    inner = args[0] if args else base
    while typing.get_args(inner) and typing.get_origin(inner) is not None:
        inner = next(a for a in typing.get_args(inner) if a is not type(None))
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        text = " \\| ".join(f"`{m.value}`" for m in inner)
    else:
        text = {bool: "flag", int: "integer", float: "number", Path: "path", str: "text"}.get(inner, "text")
    return f"{text} ..." if many else text


def _default(value: Any, base: Any) -> str:
    if value is inspect.Parameter.empty or value is ...:
        return "required"
    if value is None or value is False or value == []:
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value}`"


def _flags(name: str, info: Any) -> str:
    if isinstance(info, ArgumentInfo):
        return f"`{name.upper()}`"
    # In ``Annotated``, Typer takes an option's first name in the place of its default.
    first = [info.default] if isinstance(info.default, str) and info.default.startswith("-") else []
    decls = [d for d in (*first, *(info.param_decls or ())) if d.startswith("-")]
    decls = decls or [f"--{name.replace('_', '-')}"]
    return ", ".join(f"`{d}`" for d in decls)


def rows(callback: Any) -> list[tuple[str, str, str, str, str]]:
    """``(panel, flags, type, default, help)`` for each parameter of a command, in its order."""
    signature = inspect.signature(callback)
    hints = typing.get_type_hints(callback, include_extras=True)
    found = []
    for p in signature.parameters.values():
        base, info = _info(hints.get(p.name, p.annotation))
        if info is None:
            continue
        panel = info.rich_help_panel or ("Arguments" if isinstance(info, ArgumentInfo) else "Options")
        help_text = " ".join((info.help or "").split()).replace("|", "\\|")
        found.append((panel, _flags(p.name, info), _type(base, p.name), _default(p.default, base), help_text))
    return found


def page(name: str, callback: Any) -> str:
    """One command's reference page."""
    doc = inspect.getdoc(callback) or ""
    lines = [f"# hookviz {name}", "", doc, "", "```sh", f"hookviz {name} --help", "```", ""]
    panels: dict[str, list[tuple[str, str, str, str, str]]] = {}
    for row in rows(callback):
        panels.setdefault(row[0], []).append(row)
    for panel, found in panels.items():
        lines += [f"## {panel}", "", "| option | value | default | what it does |", "|---|---|---|---|"]
        lines += [f"| {flags} | {kind} | {default} | {text} |" for _, flags, kind, default, text in found]
        lines.append("")
    lines.append(
        "*Generated from the app by `scripts/cli_docs.py`; a test fails when it drifts from `--help`.*"
    )
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """Every command's page, by file name, in the order ``hookviz --help`` lists the commands."""
    from hookviz.cli import app

    found, titles = {}, {}
    for command in app.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        found[f"{name}.md"], titles[f"{name}.md"] = page(name, command.callback), name
    for group in app.registered_groups:  # hookviz sae ...: a page per command, GROUP-NAME.md
        for command in group.typer_instance.registered_commands:
            name = f"{group.name} {command.name or command.callback.__name__.replace('_', '-')}"
            file = f"{name.replace(' ', '-')}.md"
            found[file], titles[file] = page(name, command.callback), name
    found["index.md"] = (
        "\n".join(
            [
                "# Command reference",
                "",
                "Every command, its options and their defaults, as `--help` gives them.",
                "",
            ]
            + [f"- [`hookviz {titles[n]}`]({n})" for n in found]
        )
        + "\n"
    )
    return found


def stale(wanted: dict[str, str]) -> list[str]:
    """The pages of docs/cli that differ from ``wanted`` (missing, changed or left over)."""
    have = {p.name: p.read_text() for p in OUT.glob("*.md")} if OUT.is_dir() else {}
    return sorted(n for n in wanted.keys() | have.keys() if wanted.get(n) != have.get(n))


def main(argv: list[str]) -> int:
    wanted = pages()
    if "--check" in argv:
        if old := stale(wanted):
            print(
                f"docs/cli is out of date ({', '.join(old)}): run python scripts/cli_docs.py", file=sys.stderr
            )
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.md"):
        if old.name not in wanted:
            old.unlink()
    for name, text in wanted.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(wanted)} pages in {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
