"""docs/img's screenshots of pages (hookviz's report and explorer, the notebook widget in JupyterLab, the
monitor's log in TensorBoard), taken in headless Chromium.

Every command runs inside one working folder with relative paths (``photos/``, ``trained.pt``, ``cams/``),
or in the repository's root as docs/ write it, so the pictures' headers, captions and photo names read as a
user's own run would, never a temporary folder's absolute path. The models are the test suite's trained
shapes CNN (trained here as tests/conftest.py's ``trained`` fixture is), the trained shapes detector
(tests/fixtures/) and the packaged EfficientNet-Lite0.

    python scripts/page_pictures.py [NAME ...] [--out docs/img] [--keep /tmp/pages]

NAME: report-verdicts, explore-verdicts, explore, explore-boxes, widget, monitor-tensorboard (default:
all). Needs chromium and chromedriver (``make browser``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The shapes CNN as the command line loads it, from the working folder.
SHAPES = ["--model", "tests.conftest:TinyCNN", "--weights", "trained.pt", "--input-size", "48",
          "--mean", "0,0,0", "--std", "1,1,1", "--device", "cpu"]  # fmt: skip
DETECTOR = ["--model", "examples/shapes_detector.py:make_detector", "--weights",
            "tests/fixtures/shapes_detector.safetensors", "--labels", "examples/shapes_labels.txt",
            "--device", "cpu"]  # fmt: skip
LITE = ["--model", "efficientnet_lite0", "--device", "cpu"]
PATIENCE = 300.0


def env() -> dict[str, str]:
    """This checkout's hookviz and tests first on the path, whatever the working folder."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def hookviz(work: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "hookviz", *args], check=True, cwd=work, env=env())


def shapes_cnn(work: Path) -> None:
    """``trained.pt`` (the trained shapes CNN) and ``photos/`` (16 scenes of one shape each, drawn at 48
    pixels as the model was trained and saved at 96, each pixel doubled: the explorer's strip shows its
    thumbnails at their own size, up to 90 pixels, and a 48-pixel one wraps its name), in ``work``."""
    import numpy as np
    import torch
    from PIL import Image

    from hookviz.io.shapes import shapes_batch
    from tests.conftest import TinyCNN, train_on_shapes

    if (work / "trained.pt").exists():
        return
    torch.manual_seed(0)
    model = train_on_shapes(TinyCNN())
    (work / "photos").mkdir(parents=True, exist_ok=True)
    x, _, _ = shapes_batch(16, np.random.default_rng(5))
    for i, image in enumerate(x):
        rgb = (image.numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8)
        Image.fromarray(rgb.repeat(2, axis=0).repeat(2, axis=1)).save(work / "photos" / f"s{i:02d}.png")
    torch.save(model.state_dict(), work / "trained.pt")


def verdict_run(work: Path) -> None:
    """``cams/``: gradcam with four methods over the photos, and a trust run of the model in cams/trust."""
    shapes_cnn(work)
    if (work / "cams" / "trust" / "trust.json").exists():
        return
    hookviz(work, "gradcam", "photos", *SHAPES, "--method", "gradcam,guidedbackprop,gradcampp,layercam",
            "--out", "cams", "-q")  # fmt: skip
    hookviz(work, "trust", "photos", *SHAPES, "--method", "guidedbackprop,gradcam,gradcampp",
            "--out", "cams/trust")  # fmt: skip


@contextmanager
def chromium(width: int, height: int) -> Iterator[Any]:
    """A headless Chromium whose page area is ``width`` x ``height`` CSS pixels (one device pixel each)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        sys.exit("page_pictures: needs chromium and chromedriver (make browser)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--lang=en-GB"):
        options.add_argument(arg)
    page = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        page.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        yield page
    finally:
        page.quit()


@contextmanager
def explorer(work: Path, *args: str) -> Iterator[str]:
    """``hookviz explore ARGS`` started in ``work``; yields its address (with its token); stopped after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hookviz", "explore", *args, "--no-browser", "-q"],
        cwd=work, env=env(), stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("hookviz: explore at "):
                yield line.split(" at ", 1)[1].strip()
                break
            sys.stderr.write(line)
        else:
            sys.exit(f"page_pictures: hookviz explore stopped (exit {proc.wait()})")
    finally:
        ended(proc)


def ended(proc: subprocess.Popen[Any]) -> None:
    """End a process started in its own session: its whole group, politely first."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def jupyterlab(work: Path) -> Iterator[str]:
    """JupyterLab over ``work`` (127.0.0.1, a token); yields its address; its process group ended after."""
    import secrets
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    token, url = secrets.token_hex(16), f"http://127.0.0.1:{port}"
    environ = {**env(), "JUPYTER_RUNTIME_DIR": str(work.parent / "jupyter-runtime"),
               "JUPYTER_CONFIG_DIR": str(work.parent / "jupyter-config")}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", "--allow-root",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + PATIENCE
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=10) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit("page_pictures: JupyterLab did not start")
                time.sleep(0.5)
        yield f"{url}/lab/tree/widget.ipynb?token={token}"
    finally:
        ended(proc)


def until(page: Any, ready: str, *args: Any) -> None:
    """Wait until the page's script ``ready`` returns true, then for its pictures to be decoded."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(page, PATIENCE).until(lambda d: d.execute_script(ready, *args))
    WebDriverWait(page, PATIENCE).until(
        lambda d: d.execute_script("return Array.from(document.images).every((i) => i.complete);")
    )
    time.sleep(0.5)  # a last layout pass after the pictures' sizes are known


VIEW_SHOWN = "return Boolean(document.getElementById('overlay')?.getAttribute('data-view'));"


def shot(page: Any, target: Path, element: str | None = None) -> None:
    """The page area (or the ``element`` of that CSS selector, as far as it is on screen) as a PNG, lossless:
    a palette of 256 colours bands the photos and the maps' colour ramps."""
    import io

    from PIL import Image
    from selenium.webdriver.common.by import By

    png = (
        page.find_element(By.CSS_SELECTOR, element).screenshot_as_png
        if element
        else page.get_screenshot_as_png()
    )
    img = Image.open(io.BytesIO(png)).convert("RGB")
    img.save(target, optimize=True)
    print(f"{target} {img.width}x{img.height} {target.stat().st_size // 1024} KB")


def report_verdicts(work: Path, target: Path) -> None:
    """The report over cams/, its trust run found in cams/trust: the first cards' two rows of maps, each with
    its method's badge (LayerCAM, not tested, without)."""
    verdict_run(work)
    hookviz(work, "report", "cams")
    with chromium(1285, 1000) as page:
        page.get((work / "cams" / "index.html").as_uri())
        until(page, "return document.querySelectorAll('.card').length > 0;")
        shot(page, target)


def explore_verdicts(work: Path, target: Path) -> None:
    verdict_run(work)
    with explorer(work, "photos", *SHAPES, "--trust", "cams/trust") as url, chromium(940, 700) as page:
        page.get(url + "&input=0&method=guidedbackprop")
        until(page, VIEW_SHOWN)
        shot(page, target)


def explore_lite(work: Path, target: Path) -> None:
    """docs/explore.md's command as written, from the repository's root: LayerCAM on the cat."""
    with explorer(ROOT, "sample_images", *LITE) as url, chromium(1400, 757) as page:
        page.get(url + "&input=1&method=layercam")
        until(page, VIEW_SHOWN)
        shot(page, target)


def explore_boxes(work: Path, target: Path) -> None:
    """The shapes detector on examples/shapes_scene.png, from the repository's root: box 3, the disc."""
    with explorer(ROOT, "examples/shapes_scene.png", *DETECTOR) as url, chromium(975, 750) as page:
        page.get(url + "&input=0&method=hirescam&box=3")
        until(page, VIEW_SHOWN)
        shot(page, target)


KERNEL_IDLE = (
    "const k = window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel;"
    "return k?.status === 'idle';"
)
#: The widget shows a view whose address holds ``arguments[0]``.
WIDGET_SHOWN = (
    "const e = document.querySelector('.hookviz-widget');"
    "return e?.parentElement.dataset.state === 'shown'"
    " && (e.querySelector('img')?.dataset.view || '').includes(arguments[0]);"
)


def widget(work: Path, target: Path) -> None:
    """docs/notebooks.md's cell in JupyterLab, in a folder holding sample_images/: LayerCAM on the cat."""
    import nbformat
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    lab = work / "lab"
    lab.mkdir(exist_ok=True)
    if not (lab / "sample_images").exists():
        shutil.copytree(ROOT / "sample_images", lab / "sample_images")
    code = "import hookviz\nhookviz.widget('sample_images/', model='efficientnet_lite0')"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, lab / "widget.ipynb")
    with jupyterlab(lab) as url, chromium(1000, 780) as page:
        page.get(url)
        until(page, "return !!(window.jupyterapp && document.querySelector('.jp-Notebook'));")
        page.execute_script(
            "window.jupyterapp.shell.collapseLeft(); window.jupyterapp.shell.collapseRight();"
        )
        until(page, KERNEL_IDLE)
        page.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        until(page, WIDGET_SHOWN, "")
        Select(page.find_element(By.CSS_SELECTOR, "[data-pick='input']")).select_by_value("1")
        until(page, WIDGET_SHOWN, "input=1")
        Select(page.find_element(By.CSS_SELECTOR, "[data-pick='method']")).select_by_value("layercam")
        until(page, WIDGET_SHOWN, "method=layercam")
        # JupyterLab's own toasts (its news prompt) are no part of the picture.
        page.execute_script("document.activeElement?.blur(); document.querySelector('.Toastify')?.remove();")
        shot(page, target, ".jp-NotebookPanel-notebook")


#: TensorBoard's images dashboard draws inside shadow roots: at least two of its images decoded.
SHADOW_IMAGES = (
    "const found = []; const walk = (root) => { for (const e of root.querySelectorAll('*')) {"
    " if (e.tagName === 'IMG') found.push(e); if (e.shadowRoot) walk(e.shadowRoot); } }; walk(document);"
    "return found.filter((i) => i.complete && i.naturalWidth > 0).length >= 2;"
)


def monitor_tensorboard(work: Path, target: Path) -> None:
    """examples/monitor_shapes.py's log in TensorBoard, as docs/training.md runs it: the Grad-CAM images."""
    import socket
    import urllib.request

    if not (work / "runs" / "shapes").exists():
        example = str(ROOT / "examples" / "monitor_shapes.py")
        subprocess.run([sys.executable, example, "--log-dir", "runs/shapes"], check=True, cwd=work, env=env())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    tensorboard = Path(sys.executable).with_name("tensorboard")
    proc = subprocess.Popen(
        [str(tensorboard), "--logdir", "runs/shapes", "--host", "127.0.0.1", "--port", str(port)],
        cwd=work, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + PATIENCE
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=10) as answer:
                    if answer.status == 200 and answer.read().strip() not in (b"", b"[]"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("page_pictures: TensorBoard did not start")
            time.sleep(0.5)
        with chromium(1100, 700) as page:
            page.get(f"http://127.0.0.1:{port}/#images&tagFilter=maps%2Fgradcam")
            until(page, SHADOW_IMAGES)
            time.sleep(3)  # the cards' images fade in
            shot(page, target)
    finally:
        ended(proc)


PICTURES: dict[str, Callable[[Path, Path], None]] = {
    "report-verdicts": report_verdicts,
    "explore-verdicts": explore_verdicts,
    "explore": explore_lite,
    "explore-boxes": explore_boxes,
    "widget": widget,
    "monitor-tensorboard": monitor_tensorboard,
}


def asked(pictures: dict[str, Callable[[Path, Path], None]], doc: str) -> argparse.Namespace:
    """The command line of a pictures script: the pictures named (all by default), --out (made), --keep."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(pictures)} (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--keep", type=Path, default=None, help="the working folder, kept (and reused)")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(pictures))
    if unknown:
        parser.error(f"no picture named {', '.join(unknown)}: name some of {', '.join(pictures)}")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.names = args.names or list(pictures)
    return args


def main() -> None:
    args = asked(PICTURES, __doc__ or "")
    out = args.out
    with tempfile.TemporaryDirectory(prefix="hookviz-pages-") as d:
        work = (args.keep or Path(d)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        for name in args.names:
            PICTURES[name](work, out / f"{name}.png")


if __name__ == "__main__":
    main()
