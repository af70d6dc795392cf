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

    words = page.split("-", 1) if page.startswith("sae-") else [page]  # a group's command: sae-train
    r = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
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


#: A Markdown example that cannot run offline says why, on the line before its block.
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->$")
#: Runs one page's examples in order, in one namespace (a later block reads an earlier one's names).
RUN_BLOCKS = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for line, code in json.load(sys.stdin):
    try:
        exec(compile(code, f"{sys.argv[1]}:{line}", "exec"), namespace)
    except BaseException:
        print(f"{sys.argv[1]}, the example at line {line}:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def _examples(page: Path) -> list[tuple[int, str, str | None]]:
    """Each ```python block of a page: its first line's number, its code, and why it is not run (None when
    it is; "" when its not-run comment gives no reason)."""
    found: list[tuple[int, str, str | None]] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            skip = NOT_RUN.match(before)
            found.append((i + 2, "\n".join(lines[i + 1 : end]) + "\n", skip.group(1) if skip else None))
            i = end
        i += 1
    return found


PAGES = sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if _examples(p))


def test_every_example_not_run_says_why() -> None:
    skipped = {(p.name, line): why for p in PAGES for line, _, why in _examples(p) if why is not None}
    assert all(skipped.values()), [k for k, why in skipped.items() if not why]
    ran = sum(why is None for p in PAGES for _, _, why in _examples(p))
    assert ran >= len(skipped)  # most examples run


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_python_examples_of_each_page_run(page: Path, tmp_path: Path) -> None:
    """A page's ```python blocks run, in order, from a folder holding the sample photos (``cat.jpg``) and
    ``sample_images/``, offline (models built with ``weights=None``, or shipped with their weights)."""
    import json
    import shutil

    blocks = [(line, code) for line, code, why in _examples(page) if why is None]
    if not blocks:
        pytest.skip(f"every example of {page.name} says why it is not run")
    shutil.copytree(ROOT / "sample_images", tmp_path / "sample_images")
    for photo in (ROOT / "sample_images").glob("*.jpg"):
        shutil.copy(photo, tmp_path / photo.name)
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "TORCH_HOME": str(tmp_path / "hub"),
        "HF_HUB_OFFLINE": "1", "HOOKVIZ_SERVER": "none",
    }  # fmt: skip
    r = run_cli(
        [sys.executable, "-c", RUN_BLOCKS, page.name], input=json.dumps(blocks), cwd=tmp_path, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
