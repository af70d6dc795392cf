"""``hookviz report``: the static page over a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hookviz.cli.app import guarded
from hookviz.cli.flags import Debug
from hookviz.cli.runner import warn
from hookviz.report import build_report

TrustDirs = Annotated[list[Path] | None, typer.Option("--trust", help="the --out folder of a hookviz trust "
    "run of the run's model: each map shows its method's verdict (one in OUT or its subfolders is found "
    "without it). Repeatable.")]  # fmt: skip


def report(
    out: Annotated[Path, typer.Argument(help="the --out folder of a run (it holds manifest.jsonl).")],
    title: Annotated[str | None, typer.Option("--title", help="the page's title.")] = None,
    trust: TrustDirs = None,
    debug: Debug = False,
) -> None:
    """Write OUT/index.html: one static page to browse, filter and sort a run's maps (opens from file://)."""
    with guarded(debug):
        typer.echo(str(build_report(out, title=title, warn=warn, trust=trust or ())))
