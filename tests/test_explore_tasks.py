"""``hookviz explore`` beyond a classifier's photos: a detector's boxes (listed, clicked, each box's PNG and
raw map the ones ``hookviz gradcam`` writes), a segmenter's classes by their pixels, a multi-label head's
labels, a video's frames and a volume's slices on a scrubber, and the channel view's feature visualisation
and best photos from a ``hookviz channels`` run."""

from __future__ import annotations

import base64
import io
import json
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from hookviz.explore.looks import ChannelsRun
from hookviz.explore.server import Explorer
from hookviz.explore.session import Session
from hookviz.explore.view import View
from hookviz.tasks import load_model
from tests.conftest import PATIENCE, ball_video, invoke, write_image
from tests.test_dense import DETECTOR, FIXTURE, NAMES, photo, scenes
from tests.test_explore import get
from tests.test_report import browser  # noqa: F401 - the browser fixture

PNG = b"\x89PNG\r\n\x1a\n"


def _decoded(png: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)[..., ::-1]


@pytest.fixture(scope="module")
def detector_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Explorer]:
    folder = tmp_path_factory.mktemp("boxes")
    img = next(s[0] for s in scenes(8, seed=21, height=120, width=160, sizes=(9, 18)) if len(s[1]) == 2)
    write_image(folder / "scene.png", photo(img, 2))
    labels = folder / "labels.json"
    labels.write_text(json.dumps(NAMES))
    loaded = load_model(DETECTOR, str(FIXTURE), labels=NAMES)
    words = ["--model", DETECTOR, "--weights", str(FIXTURE), "--labels", str(labels)]
    explorer = Explorer(Session(loaded, [str(folder / "scene.png")], model_words=words))
    threading.Thread(target=explorer.serve_forever, daemon=True).start()
    yield explorer
    explorer.shutdown()
    explorer.server_close()


def test_a_detector_s_boxes_are_each_the_png_and_raw_map_gradcam_writes(
    detector_server: Explorer, tmp_path: Path
) -> None:
    found = json.loads(get(detector_server, "/api/predict?input=0")[1])
    assert found["kind"] == "boxes" and len(found["targets"]) >= 2
    assert {t["name"] for t in found["targets"]} <= set(NAMES[1:])
    info = json.loads(get(detector_server, "/api/map?input=0&method=hirescam&format=json")[1])
    assert [d["box"] for d in info["record"]["detections"]] == [t["xyxy"] for t in found["targets"]]
    words = shlex.split(info["command"])
    out = tmp_path / "out"
    r = invoke(*words[1:-1], str(out))
    assert r.exit_code == 0, r.stderr
    for t in found["targets"]:
        n = t["box"]
        view = f"/api/map?input=0&method=hirescam&box={n}"
        (png,) = out.glob(f"*.box{n}.png")
        assert get(detector_server, view)[1] == png.read_bytes()
        raw = np.load(io.BytesIO(get(detector_server, view + "&format=npy")[1]))
        np.testing.assert_allclose(raw, np.load(png.with_suffix(".npy")), rtol=1e-5, atol=1e-6)
    assert get(detector_server, "/api/map?input=0&method=hirescam&box=99")[0] == 400
    photo_png = _decoded(get(detector_server, "/api/photo?input=0")[1])
    assert photo_png.shape == (240, 320, 3)  # the boxes' pixels
    methods = {m["name"]: m for m in json.loads(get(detector_server, "/api/methods")[1])}
    assert methods["drise"]["applies"] and not methods["scorecam"]["applies"]
    assert "not available for detectors" in methods["scorecam"]["why"]


def _photo_shape(session: Session, layer: str) -> list[int]:
    """The shape of ``layer``'s output in input 0's own pass."""
    from hookviz.engine.features import feature_maps

    _, x, _ = session.read(0)
    (found,) = feature_maps(session.loaded.model, torch.from_numpy(x)[None], [layer], "output")
    return list(found.tensor.shape)


def test_the_layer_picker_shows_the_shapes_of_the_photo_viewed(detector_server: Explorer) -> None:
    """A detector's layers for its photo (240x320) are not those of a test input of the model's size (64x64):
    ``/api/layers?input=`` gives the shapes the photo's own pass has."""
    listed = json.loads(get(detector_server, "/api/layers?input=0")[1])
    default = next(layer for layer in listed if layer["default"])
    assert default["shape"] == _photo_shape(detector_server.session, default["name"])
    tested = next(layer for layer in json.loads(get(detector_server, "/api/layers")[1]) if layer["default"])
    assert tested["shape"] != default["shape"]  # the test input's are other shapes


def test_clicking_a_box_on_the_page_shows_its_map(detector_server: Explorer, browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, PATIENCE)
    browser.set_script_timeout(PATIENCE)
    browser.get(detector_server.url + "&method=hirescam")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#boxsvg rect")) >= 2)
    view = lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view") or ""  # noqa: E731
    wait.until(lambda d: "box=1" in view(d))
    rect = browser.find_elements(By.CSS_SELECTOR, "#boxsvg rect")[1]
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", rect)
    wait.until(lambda d: "box=2" in view(d))
    data = browser.execute_async_script(
        "const done = arguments[0]; const img = document.getElementById('overlay');"
        "fetch(img.src).then(r => r.arrayBuffer()).then(b => done([img.dataset.view,"
        " btoa(String.fromCharCode(...new Uint8Array(b)))]));"
    )
    assert base64.b64decode(data[1]) == get(detector_server, f"/api/map?{data[0]}&format=png")[1]
    assert "box 2:" in browser.find_element(By.CSS_SELECTOR, "#classes li.on").text
    disabled = browser.execute_script(
        "return [...document.querySelectorAll('#method option:disabled')].map(o => o.value)"
    )
    assert "scorecam" in disabled and "hirescam" not in disabled
    # The layer picker says the shapes of the photo viewed.
    name = next(x for x in json.loads(get(detector_server, "/api/layers")[1]) if x["default"])["name"]
    picked = browser.find_element(By.CSS_SELECTOR, "#layer option[value='']").text
    assert "x".join(map(str, _photo_shape(detector_server.session, name))) in picked, picked


def test_a_segmenter_lists_its_classes_by_their_pixels(tmp_path: Path) -> None:
    torch.manual_seed(0)
    loaded = load_model("lraspp_mobilenet_v3_large", "none")
    rng = np.random.default_rng(0)
    path = write_image(tmp_path / "p.png", rng.integers(0, 256, (64, 80, 3), dtype=np.uint8))
    session = Session(loaded, [str(path)])
    found = session.predict(0)
    _, x, _ = session.read(0)
    with torch.no_grad():
        out = loaded.model(torch.from_numpy(x)[None])["out"][0]
    labels = out.argmax(0)
    share = torch.bincount(labels.flatten(), minlength=len(out)).double() / labels.numel()
    assert found["kind"] == "regions"
    got = {t["index"]: t["score"] for t in found["targets"]}
    assert set(got) == {int(c) for c in torch.nonzero(share).flatten()}
    for c, s in got.items():
        assert s == pytest.approx(float(share[c]), abs=1e-5)
    session.close()


def test_a_multi_label_head_lists_every_label_with_its_sigmoid(tmp_path: Path) -> None:
    from tests.test_heads import MULTI

    loaded = load_model(MULTI, "DEFAULT", head="sigmoid", input_size=32, resize="squash")
    path = write_image(tmp_path / "grey.png", np.full((32, 32, 3), 128, np.uint8))
    session = Session(loaded, [str(path)])
    found = session.predict(0)
    _, x, _ = session.read(0)
    with torch.no_grad():
        sig = torch.sigmoid(loaded.model(torch.from_numpy(x)[None]))[0]
    assert found["kind"] == "labels" and len(found["targets"]) == len(sig)
    for t in found["targets"]:
        assert t["score"] == pytest.approx(float(sig[t["index"]]), abs=1e-5)
        assert t["positive"] == (float(sig[t["index"]]) >= 0.5)
    made = session.view(View(target="positive"), draw=False)
    assert made is not None
    positive = sorted(t["index"] for t in found["targets"] if t["positive"])
    assert sorted(m["target"]["index"] for m in made.record["maps"]) == positive
    session.close()


def test_a_video_s_frames_and_a_volume_s_slices_on_the_scrubber(tmp_path: Path) -> None:
    from tests import volume_net

    video = ball_video(tmp_path / "ball.mp4", frames=20)
    session = Session(load_model("r3d_18", "none"), [str(video)])
    listed = session.inputs()
    assert len(listed) > 1 and all(i["group"] == str(video) for i in listed)
    made = session.view(View(input=0))
    assert made is not None and made.record["stills"] == 16
    clip, _, box = session.read(0)
    bare = [_decoded(made.still(k, 0)) for k in (0, 15)]
    see_through = session.view(View(input=0, alpha=0.0))
    assert see_through is not None
    for k, picture in zip((0, 15), bare, strict=True):
        assert picture.shape == clip.frames[k].shape
        # Under a transparent map the still is the clip's own frame k (the ball has moved between them).
        inside = (slice(box.y0, box.y1), slice(box.x0, box.x1))  # the part the model saw (the rest dimmed)
        np.testing.assert_allclose(_decoded(see_through.still(k, 0))[inside], clip.frames[k][inside], atol=1)
    assert np.abs(clip.frames[0][inside].astype(int) - clip.frames[15][inside]).max() > 50
    with pytest.raises(Exception, match="there are 16"):
        made.still(16, 0)
    session.close()

    rng = np.random.default_rng(0)
    v = rng.normal(size=(24, 24, 24)).astype(np.float32)
    v[4:10, 4:10, 4:10] += 3  # a cube: class 0
    np.save(tmp_path / "vol.npy", v)
    net, weights = f"{Path(volume_net.__file__)}:make", Path(volume_net.__file__).parent / "fixtures"
    session = Session(load_model(net, str(weights / "volume_net.safetensors")), [str(tmp_path / "vol.npy")])
    made = session.view(View())
    assert made is not None and made.record["stills"] == [24, 24, 24]
    # The map's hottest slice along each axis runs through the cube.
    raw = np.asarray(made.map)
    peak = np.unravel_index(int(np.argmax(raw)), raw.shape)
    assert all(4 <= 2 * p + 1 <= 10 for p in peak), peak
    assert _decoded(made.still(7, 0)).shape[:2] == _decoded(made.still(20, 0)).shape[:2]
    session.close()


def test_the_channel_view_visualises_a_channel_and_shows_its_best_photos(tmp_path: Path) -> None:
    from hookviz.concepts import visualize as vis

    rng = np.random.default_rng(0)
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(4):
        write_image(folder / f"p{i}.png", rng.integers(0, 256, (48, 48, 3), dtype=np.uint8))
    model = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48"]
    run = tmp_path / "run"
    r = invoke("channels", str(folder), *model, "--layer", "features.4", "--top", "3", "--out", str(run))
    assert r.exit_code == 0, r.stderr
    (written,) = run.glob("channels.*.json")
    data = json.loads(written.read_text())
    session = Session(load_model("tests.conftest:TinyCNN", "none", input_size=48), [str(folder)],
                      channels_run=ChannelsRun(run))  # fmt: skip
    c = data["layers"]["features.4"]["channels"][1]
    best = session.best("features.4", c["channel"])
    assert best["examples"] == c["examples"] and len(best["examples"]) == 3
    assert session.sheet("features.4", c["channel"]) == (run / c["sheet"]).read_bytes()
    # /api/best and /api/sheet answer alike: nothing in the run for a layer or a channel is a missing
    # resource (404; best said 400 where sheet said 404), a layer the model does not have a bad parameter.
    from hookviz.explore.widget import _Host, answer

    kept = {e["channel"] for e in data["layers"]["features.4"]["channels"]}
    other = next(n for n in range(64) if n not in kept)
    asked = [(f"layer=features.2&channel={c['channel']}", 404), (f"layer=features.4&channel={other}", 404),
             ("layer=nope&channel=0", 400)]  # fmt: skip
    for query, status in asked:
        for path in ("best", "sheet"):
            said, _ = answer(_Host(session), f"/api/{path}?{query}")
            assert said["status"] == status, (path, query, said)
    # A sheet named outside the run's folder is not served.
    c["sheet"] = "../photos/p0.png"
    written.write_text(json.dumps(data))
    with pytest.raises(LookupError):
        ChannelsRun(run).sheet("features.4", c["channel"])
    with pytest.raises(Exception, match="no channels.*json"):
        ChannelsRun(folder)

    picture = _decoded(session.visualise("features.4", 2, steps=8))
    loaded = session.loaded
    pre = loaded.preprocess
    direct = vis.visualize(loaded.model, vis.Objective("features.4", channel=2), input_size=(48, 48),
                           mean=pre.mean, std=pre.std, steps=8, size=128)  # fmt: skip
    want = direct.images[0].permute(1, 2, 0).clamp(0, 1).mul(255).numpy()
    assert picture.shape == (128, 128, 3)
    np.testing.assert_allclose(picture.astype(float), want, atol=1.01)
    session.close()


def _by_jobs(loaded: Any, calls: Any) -> dict[str, str]:
    """The methods ``make_cam_job`` refuses for ``loaded``, a job built per method (what ``/api/methods``
    once did), with the line each is refused with."""
    from hookviz import methods
    from hookviz.errors import HookvizError
    from hookviz.jobs.build import CamSettings
    from hookviz.tasks import make_cam_job

    refused = {}
    for name in methods.names():
        try:
            make_cam_job(loaded, CamSettings(methods=(name,)), calls=calls)
        except HookvizError as exc:
            refused[name] = str(exc)
    return refused


@pytest.mark.parametrize(
    "model",
    [
        "classifier",
        "detector",
        "volume",
        *(pytest.param(m, marks=pytest.mark.slow) for m in ("video", "vit")),
    ],
)
def test_the_methods_listed_from_the_registry_are_those_gradcam_builds(model: str) -> None:
    """``/api/methods`` answers from the registry's declared needs, no job built: the same methods apply, and
    each refused one in the same words, as building ``gradcam``'s job for each of them says; a classifier
    with transformer blocks takes the attention methods, one without refuses them."""
    from hookviz.explore.methods import method_list, refusals
    from hookviz.models.loaded import probe
    from tests import volume_net

    net = f"{Path(volume_net.__file__)}:make"
    loaded = {
        "classifier": lambda: load_model("tests.conftest:TinyCNN", "none", input_size=48),
        "detector": lambda: load_model(DETECTOR, str(FIXTURE), labels=NAMES),
        "video": lambda: load_model("r3d_18", "none", input_size=32),
        "volume": lambda: load_model(
            net, str(Path(volume_net.__file__).parent / "fixtures/volume_net.safetensors")
        ),
        "vit": lambda: load_model("timm:vit_little_patch16_reg4_gap_256?img_size=64", "none", input_size=64),
    }[model]()
    calls = probe(loaded)
    found = refusals(loaded, calls)
    assert found == _by_jobs(loaded, calls)
    listed = {m["name"]: m for m in method_list(loaded, calls)}
    assert {n for n, m in listed.items() if not m["applies"]} == set(found) and listed["gradcam"]["applies"]
    assert listed["rollout"]["applies"] is (model == "vit")
    assert listed["drise"]["applies"] is (model == "detector")
