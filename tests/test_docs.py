"""The documentation: the command reference is the app's own (a page drifting from ``--help`` fails), and
the site builds offline with warnings as errors (no broken link, no missing page, every docstring parsed)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

spec = importlib.util.spec_from_file_location("cli_docs", ROOT / "scripts" / "cli_docs.py")
assert spec is not None and spec.loader is not None
cli_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cli_docs)

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: An option's row in ``--help``: its first name after the box's edge (``*`` marks a required one).
ROW = re.compile(r"^[│|]\s+(?:\*\s+)?(--[a-z][a-z0-9-]*)", re.MULTILINE)
#: The first cell of a row of a reference page's tables.
CELL = re.compile(r"^\| ([^|]*) \|", re.MULTILINE)


def test_the_command_reference_is_what_the_app_says() -> None:
    stale = cli_docs.stale(cli_docs.pages())
    assert not stale, f"docs/cli is stale ({stale}): run python scripts/cli_docs.py"


@pytest.mark.parametrize(
    "page", sorted(p.stem for p in (ROOT / "docs" / "cli").glob("*.md") if p.stem != "index")
)
def test_each_reference_page_names_the_options_help_lists(page: str) -> None:
    from typer.testing import CliRunner

    from hookviz.cli import app

    r = CliRunner().invoke(app, [page, "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    rows = set(ROW.findall(r.stdout)) - {"--help"}  # each option's first name, as --help lists it
    text = (ROOT / "docs" / "cli" / f"{page}.md").read_text()
    documented = {f for cell in CELL.findall(text) for f in FLAG.findall(cell)}  # the page's first column
    assert rows and rows <= documented, rows - documented
    assert documented <= set(FLAG.findall(r.stdout)), documented - set(FLAG.findall(r.stdout))


def test_the_site_builds_offline_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)]
    r = run_cli(build, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    for page in ("index.html", "getting-started.html", "gallery.html", "api.html", "cli/gradcam.html"):
        assert (site / page).is_file(), page
    front = (site / "index.html").read_text()
    assert 'href="getting-started.html"' in front  # links a browser follows from file://
    assert "hookviz.run.runner.explain_inputs" in (site / "api.html").read_text()  # read from the docstrings
