"""EfficientNet-Lite0, the trained classifier ``hookviz[demo]`` ships: the network equals timm's independent
``tf_efficientnet_lite0`` with the same weights; it names the sample photos' objects, its Grad-CAM lies on the
cat, and it runs offline from weights read as tensors only."""

from __future__ import annotations

import io
import json
import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.models import lite
from tests.conftest import invoke, records

SAMPLES = Path(__file__).resolve().parent.parent / "sample_images"
#: The cat photo's eyes, nose and the fur between them (x0, y0, x1, y1 in its 451 x 300 pixels), by hand.
CAT_FACE = (130, 80, 360, 270)

pytestmark = pytest.mark.skipif(
    lite.importlib.util.find_spec(lite.PACKAGE) is None, reason="hookviz[demo] is not installed"
)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No socket can be opened: anything that tries to download fails loudly."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a socket was opened")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_the_network_equals_timms_tf_efficientnet_lite0_with_the_same_weights() -> None:
    timm = pytest.importorskip("timm")
    state = torch.load(lite.packaged_weights(), map_location="cpu", weights_only=True)
    ours = lite.EfficientNetLite0().eval()
    ours.load_state_dict(state)
    ref = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    own = ref.state_dict()
    assert [tuple(v.shape) for v in own.values()] == [tuple(v.shape) for v in state.values()]
    ref.load_state_dict(dict(zip(own, state.values(), strict=True)))
    torch.manual_seed(0)
    for shape in ((2, 3, 224, 224), (1, 3, 225, 231)):  # odd sides: TensorFlow's SAME padding, one-sided
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-4)
    assert sum(p.numel() for p in ours.parameters()) == 4_652_008


def test_it_names_the_sample_photos_and_its_grad_cam_lies_on_the_cat(offline: None, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke("gradcam", str(SAMPLES), "--model", "efficientnet_lite0", "--save-raw", "--out", str(out))
    assert r.exit_code == 0, r.stderr
    assert "RANDOM" not in r.stderr and "_avg_pooling:input" in r.stderr  # the pooling's input, trained
    found = {Path(rec["input"]).stem: rec for rec in records(out)}
    assert 281 <= found["cat"]["predicted"]["index"] <= 285  # a domestic cat
    assert found["coffee"]["predicted"]["name"] in ("espresso", "cup", "coffee mug")
    assert found["rocket"]["predicted"]["name"] in ("missile", "projectile", "space shuttle")
    assert found["cat"]["predicted"]["score"] > 0.3
    full = np.load(next(o for o in found["cat"]["outputs"] if o.endswith(".full.npy")))
    y, x = np.unravel_index(np.nanargmax(full), full.shape)
    x0, y0, x1, y1 = CAT_FACE
    assert x0 <= x < x1 and y0 <= y < y1, (x, y)


def test_its_weights_are_read_as_tensors_only(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    load = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("weights_only"))
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    built = lite.build(lite.NAME, "DEFAULT", lite.Options())
    assert seen == [True] and built.pretrained and built.weights_id.startswith("sha256:")
    assert built.categories[282] == "tiger cat" and built.preprocess == lite.PREPROCESS


def test_without_the_extra_it_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(lite.importlib.util, "find_spec", lambda name: None)
    r = invoke("gradcam", str(SAMPLES / "cat.jpg"), "--model", "efficientnet_lite0", "--out", str(tmp_path))
    assert r.exit_code == 3 and "pip install 'hookviz[demo]'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_fine_tuned_copy_rebuilds_the_head(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tuned = lite.EfficientNetLite0(classes=5)
    torch.save(tuned.state_dict(), tmp_path / "tuned.pt")
    r = invoke("gradcam", str(SAMPLES / "cat.jpg"), "--model", "efficientnet_lite0", "--weights",
               str(tmp_path / "tuned.pt"), "--out", str(tmp_path / "out"), "--json", "-q")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert (
        0 <= rec["predicted"]["index"] < 5
        and rec["predicted"]["name"] == f"class {rec['predicted']['index']}"
    )


def test_the_explorer_on_it_names_the_cat_and_its_map_is_the_command_s(tmp_path: Path) -> None:
    """``hookviz explore sample_images --model efficientnet_lite0``: the API names the cat, its LayerCAM
    view's raw map is ``hookviz gradcam --save-raw``'s, and the map peaks on the cat's face."""
    from hookviz.explore.server import Explorer
    from hookviz.explore.session import Session
    from hookviz.tasks import load_model
    from tests.test_explore import get

    explorer = Explorer(Session(load_model("efficientnet_lite0"), [str(SAMPLES)]))
    threading.Thread(target=explorer.serve_forever, daemon=True).start()
    try:
        names = [item["name"] for item in json.loads(get(explorer, "/api/inputs")[1])]
        cat = names.index(str(SAMPLES / "cat.jpg"))
        top = json.loads(get(explorer, f"/api/predict?input={cat}")[1])["targets"][0]
        assert 281 <= top["index"] <= 285 and top["score"] > 0.3
        view = f"/api/map?input={cat}&method=layercam"
        info = json.loads(get(explorer, view + "&format=json")[1])
        raw = np.load(io.BytesIO(get(explorer, view + "&format=npy")[1]))
    finally:
        explorer.shutdown()
        explorer.server_close()
    out = tmp_path / "out"
    r = invoke(*info["command"].split()[1:-1], str(out))
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    npy = next(o for o in rec["outputs"] if o.endswith(".npy") and not o.endswith(".full.npy"))
    np.testing.assert_allclose(np.load(npy), raw, rtol=1e-5, atol=1e-6)
    full = np.load(next(o for o in rec["outputs"] if o.endswith(".full.npy")))
    y, x = np.unravel_index(np.nanargmax(full), full.shape)
    x0, y0, x1, y1 = CAT_FACE
    assert x0 <= x < x1 and y0 <= y < y1, (x, y)
