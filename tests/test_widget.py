"""hookviz.widget: the explorer's routes over the kernel's comm (answers equal to the explorer server's),
one line outside a kernel, and the front end driven in headless Chromium in JupyterLab on a live kernel."""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.errors import UsageError
from hookviz.explore.server import Explorer
from hookviz.explore.session import Session
from hookviz.explore.view import View
from hookviz.tasks.api import load_model
from tests.conftest import PATIENCE, TinyCNN, started, write_image
from tests.test_report import browser  # noqa: F401 - the browser fixture

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("anywidget")


@pytest.fixture
def weighed(tmp_path: Path) -> tuple[Path, Path]:
    """A TinyCNN's weights in a file (the kernel loads the same model) and a folder of two photos."""
    torch.manual_seed(5)
    weights = tmp_path / "tiny.pt"
    torch.save(TinyCNN().state_dict(), weights)
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(2)
    for name in ("a.png", "b.png"):
        write_image(photos / name, rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    return weights, photos


def _session(weighed: tuple[Path, Path]) -> Session:
    return Session(load_model("tests.conftest:TinyCNN", str(weighed[0]), input_size=48), [str(weighed[1])])


def test_the_widget_answers_as_the_explorer_does(weighed: tuple[Path, Path]) -> None:
    from hookviz.explore.widget import _Host, answer

    host = _Host(_session(weighed))
    explorer = Explorer(_session(weighed))
    threading.Thread(target=explorer.serve_forever, daemon=True).start()
    try:
        for path in ("/api/inputs", "/api/layers?input=1", "/api/predict?input=1&k=3",
                     "/api/map?input=1&method=layercam", "/api/map?input=0&box=-3"):  # fmt: skip
            message, buffers = answer(host, path)
            url = f"http://127.0.0.1:{explorer.server_address[1]}{path}&token={explorer.token}"
            url = url.replace("inputs&token", "inputs?token")
            try:
                with urllib.request.urlopen(url, timeout=120) as r:
                    status, body = r.status, r.read()
            except urllib.error.HTTPError as exc:
                status, body = exc.code, exc.read()
            assert message["status"] == status, path
            if buffers:
                assert buffers[0] == body  # the same PNG bytes
            else:
                assert message["json"] == json.loads(body)
        message, _ = answer(host, "/api/map?input=0&box=-3")
        assert message["status"] == 400 and "box='-3'" in message["error"]
        assert answer(host, "/etc/passwd")[0]["status"] == 404
    finally:
        explorer.shutdown()
        explorer.server_close()
        explorer.session.close()
        host.session.close()


def test_the_widget_s_shell_line_loads_the_same_model(weighed: tuple[Path, Path]) -> None:
    """The caption's `hookviz gradcam` line must draw the map shown: the options the widget was given."""
    from hookviz.explore.widget import model_words

    loaded = load_model("tests.conftest:TinyCNN", str(weighed[0]), input_size=48)
    words = model_words(loaded, str(weighed[0]), {"input_size": 48, "mean": (0.5, 0.5, 0.5), "negate": False})
    assert words == ["--model", "tests.conftest:TinyCNN", "--weights", str(weighed[0]), "--input-size", "48",
                     "--mean", "0.5,0.5,0.5"]  # fmt: skip


def test_without_a_kernel_it_is_one_line(weighed: tuple[Path, Path]) -> None:
    import hookviz

    with pytest.raises(UsageError, match=r"needs a notebook kernel .*hookviz explore PHOTOS"):
        hookviz.widget(str(weighed[1]), model="tests.conftest:TinyCNN", weights="none")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """JupyterLab on 127.0.0.1 with a token, over ``tmp_path/lab``; its process group ended after."""
    pytest.importorskip("jupyterlab")
    work = tmp_path / "lab"
    work.mkdir()
    port, token = _free_port(), secrets.token_hex(16)
    environ = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "PYTHONPATH": str(ROOT),
               "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}  # fmt: skip
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               "--allow-root", f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={work}",
               "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with started(command, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = (
            time.monotonic() + PATIENCE
        )  # a loaded laptop starts JupyterLab slowly: wait on it answering
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=10) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("JupyterLab did not start") from None
                time.sleep(0.5)
        yield f"{url}/lab/tree/widget.ipynb?token={token}", work


@pytest.mark.slow
def test_the_widget_in_jupyterlab_shows_the_maps_the_explorer_makes(
    lab: tuple[str, Path],
    weighed: tuple[Path, Path],
    browser: Any,  # noqa: F811
) -> None:
    nbformat = pytest.importorskip("nbformat")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    url, work = lab
    code = (
        "import hookviz\n"
        f"w = hookviz.widget({str(weighed[1])!r}, model='tests.conftest:TinyCNN',\n"
        f"                   weights={str(weighed[0])!r}, input_size=48)\nw"
    )
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, work / "widget.ipynb")
    browser.get(url)
    wait = WebDriverWait(browser, PATIENCE)
    wait.until(
        lambda d: d.execute_script("return !!(window.jupyterapp && document.querySelector('.jp-Notebook'))")
    )
    # The kernel must be idle before the cell runs (a kernel still starting drops the command).
    wait.until(lambda d: d.execute_script(
        "const w = window.jupyterapp.shell.currentWidget;"
        "return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status === 'idle')"))  # fmt: skip
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    state = lambda d: d.execute_script(  # noqa: E731
        "const e = document.querySelector('.hookviz-widget'); return e && e.parentElement.dataset.state"
    )
    wait.until(lambda d: state(d) in ("shown", "error"))
    assert state(browser) == "shown", browser.find_element(By.CSS_SELECTOR, ".hookviz-widget .status").text
    Select(browser.find_element(By.CSS_SELECTOR, "[data-pick='input']")).select_by_value("1")
    wait.until(lambda d: "input=1" in (d.find_element(By.CSS_SELECTOR, ".hookviz-widget img").get_attribute(
        "data-view") or ""))  # fmt: skip
    Select(browser.find_element(By.CSS_SELECTOR, "[data-pick='method']")).select_by_value("layercam")
    view = lambda d: d.find_element(By.CSS_SELECTOR, ".hookviz-widget img").get_attribute("data-view") or ""  # noqa: E731
    wait.until(lambda d: "method=layercam" in view(d) and state(d) == "shown")
    shown = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const img = document.querySelector('.hookviz-widget img');"
        "fetch(img.src).then(r => r.arrayBuffer()).then(b => {"
        " let s = ''; for (const x of new Uint8Array(b)) s += String.fromCharCode(x); done(btoa(s)); });"
    )
    caption = browser.find_element(By.CSS_SELECTOR, ".hookviz-widget .caption").text
    assert "layercam" in caption and "hookviz gradcam" in caption
    # The picture the widget shows is the one the explorer (and hookviz gradcam) makes for the same view.
    from PIL import Image

    session = _session(weighed)
    try:
        view_made = View(input=1, method="layercam")
        made = session.view(view_made)
        assert made is not None
        want = np.asarray(Image.open(io.BytesIO(made.png_of(view_made))).convert("RGB")).astype(int)
    finally:
        session.close()
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(shown))).convert("RGB")).astype(int)
    assert got.shape == want.shape and np.abs(got - want).mean() < 1.0
