"""``hookviz explore``: each view is the PNG and raw map ``hookviz gradcam`` writes for it (its "copy as
command" line run proves it), the server is private (token, Host, nothing outside its inputs), and the page
works in a real browser: picking a method shows the API's picture, a permalink reopens the view, and a hostile
file name is text."""

from __future__ import annotations

import base64
import io
import json
import shlex
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hookviz.explore.server import Explorer
from hookviz.explore.session import Session
from hookviz.tasks import load_model
from tests.conftest import PATIENCE, invoke, write_image
from tests.test_report import HOSTILE, browser  # noqa: F401 - the browser fixture

MODEL = ["--model", "tests.conftest:TinyCNN", "--weights", "none"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Explorer]:
    folder = tmp_path_factory.mktemp("explore") / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png", HOSTILE):
        write_image(folder / name, rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    (folder.parent / "secret.txt").write_text("not for the browser")
    (folder / "link.png").symlink_to(folder.parent / "secret.txt")  # a symlink out: never listed or served
    session = Session(load_model("tests.conftest:TinyCNN", "none", input_size=48), [str(folder)],
                      model_words=[*MODEL, "--input-size", "48"])  # fmt: skip
    explorer = Explorer(session)
    thread = threading.Thread(target=explorer.serve_forever, daemon=True)
    thread.start()
    yield explorer
    explorer.shutdown()
    explorer.server_close()


def get(server: Explorer, path: str, *, token: bool = True, headers: dict[str, str] | None = None) -> Any:
    """``(status, body bytes)`` of a GET to the explorer (the token in the query unless said)."""
    port = server.server_address[1]
    sep = "&" if "?" in path else "?"
    url = f"http://127.0.0.1:{port}{path}" + (f"{sep}token={server.token}" if token else "")
    try:
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=PATIENCE) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_it_answers_only_with_the_token_and_its_own_host(server: Explorer) -> None:
    assert get(server, "/api/inputs", token=False)[0] == 403
    assert get(server, "/api/inputs?token=wrong", token=False)[0] == 403
    assert get(server, "/api/inputs", headers={"Host": "evil.example:80"})[0] == 403  # DNS rebinding
    bearer = {"Authorization": f"Bearer {server.token}"}
    assert get(server, "/api/inputs", token=False, headers=bearer)[0] == 200
    cookie = {"Cookie": f"hookviz_explore={server.token}"}
    assert get(server, "/api/inputs", token=False, headers=cookie)[0] == 200
    status, page = get(server, "/")
    assert status == 200 and b"hookviz explore" in page and server.url.startswith("http://127.0.0.1:")


def test_nothing_outside_its_inputs_is_served(server: Explorer) -> None:
    names = [item["name"] for item in json.loads(get(server, "/api/inputs")[1])]
    assert len(names) == 3 and not any("link" in n or "secret" in n for n in names)
    for bad in ("../secret.txt", "/etc/passwd", "3", "link.png", names[0] + "/.."):
        assert get(server, f"/api/map?input={urllib.request.quote(bad)}")[0] == 404, bad
        assert get(server, f"/api/thumb?input={urllib.request.quote(bad)}")[0] == 404, bad
    assert get(server, "/api/../../etc/passwd")[0] == 404 and get(server, "/secret.txt")[0] == 404


def choose(page: Any, select: str, value: str) -> None:
    """Choose ``value`` in the page's ``select`` once the page can take it: the option listed and enabled
    and the list's handler bound (the page fills its lists one request after another; on a busy machine
    the strip of inputs shows well before the methods are listed)."""
    from selenium.webdriver.support.ui import Select, WebDriverWait

    ready = (
        "const s = document.getElementById(arguments[0]);"
        "const o = s && Array.from(s.options).find((o) => o.value === arguments[1]);"
        "return Boolean(o && !o.disabled && s.onchange);"
    )
    WebDriverWait(page, PATIENCE).until(lambda d: d.execute_script(ready, select, value))
    Select(page.find_element("id", select)).select_by_value(value)


def test_a_view_is_the_png_and_raw_map_its_command_writes(server: Explorer, tmp_path: Path) -> None:
    view = "/api/map?input=1&layer=features.4&method=layercam&target=2&alpha=0.7&colormap=viridis"
    status, png = get(server, view)
    assert status == 200 and png[:8] == b"\x89PNG\r\n\x1a\n"
    raw = np.load(io.BytesIO(get(server, view + "&format=npy")[1]), allow_pickle=False)
    info = json.loads(get(server, view + "&format=json")[1])
    assert info["record"]["method"] == "layercam" and info["record"]["target"]["index"] == 2
    words = shlex.split(info["command"])
    assert words[:2] == ["hookviz", "gradcam"] and "--layer" in words and "--alpha" in words
    out = tmp_path / "out"
    r = invoke(*words[1:-1], str(out))  # the command as given, into a folder of the test's
    assert r.exit_code == 0, r.stderr
    written = {p.name: p for p in out.iterdir()}
    (png_file,) = [p for n, p in written.items() if n.endswith(".png")]
    assert png_file.read_bytes() == png  # the very bytes
    (npy_file,) = [p for n, p in written.items() if n.endswith(".npy") and not n.endswith(".full.npy")]
    np.testing.assert_allclose(np.load(npy_file), raw, rtol=1e-6, atol=1e-7)


def test_a_view_asked_for_twice_is_made_once(server: Explorer) -> None:
    view = "/api/map?input=0&method=gradcampp"
    started = time.perf_counter()
    first = get(server, view)[1]
    once = time.perf_counter() - started
    started = time.perf_counter()
    assert get(server, view)[1] == first
    assert time.perf_counter() - started < max(once, 0.05)


def test_the_page_shows_the_views_the_api_makes(server: Explorer, browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    def shown() -> tuple[str, bytes]:
        """The view the page shows (its query) and the bytes of its picture."""
        WebDriverWait(browser, PATIENCE).until(
            lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view")
        )
        data = browser.execute_async_script(
            "const done = arguments[0]; const img = document.getElementById('overlay');"
            "fetch(img.src).then(r => r.arrayBuffer()).then(b => done([img.dataset.view,"
            " btoa(String.fromCharCode(...new Uint8Array(b)))]));"
        )
        return data[0], base64.b64decode(data[1])

    wait = WebDriverWait(browser, PATIENCE)
    browser.set_script_timeout(PATIENCE)
    browser.get(server.url)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#strip button")) == 3)
    strip = [span.text for span in browser.find_elements(By.CSS_SELECTOR, "#strip span")]
    assert any(HOSTILE in name for name in strip)  # a hostile name is text, not markup
    assert browser.execute_script("return window.pwned === undefined")
    browser.find_elements(By.CSS_SELECTOR, "#strip button")[1].click()
    choose(browser, "method", "layercam")
    view = lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view") or ""  # noqa: E731
    wait.until(lambda d: "method=layercam" in view(d))
    query, picture = shown()
    assert "input=1" in query and picture == get(server, f"/api/map?{query}&format=png")[1]
    command = browser.find_element(By.ID, "command").get_attribute("value")
    assert command.startswith("hookviz gradcam ") and "--method layercam" in command
    # The permalink (no token in it: the cookie holds it) reopens the same view.
    link = browser.find_element(By.ID, "permalink").get_attribute("href")
    assert "token" not in link
    browser.get("about:blank")
    browser.get(link)
    wait.until(lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view"))
    assert (
        Select(browser.find_element(By.ID, "method")).first_selected_option.get_attribute("value")
        == "layercam"
    )
    assert shown() == (query, picture)


def test_trust_and_channels_on_a_trained_model(trained: Any, tmp_path: Path) -> None:
    """On the shapes CNN: Grad-CAM's map of a disc beats a random map at deletion and insertion, and the
    channel view lists the layer's channels by activation, each map drawn over the photo."""
    import torch

    from hookviz.explore.view import View
    from hookviz.io.shapes import SHAPES, draw_shape
    from tests.conftest import tiny_loaded

    img, _ = draw_shape(1, 48, np.random.default_rng(7))
    photo = write_image(tmp_path / "disc.png", (img * 255).round().astype(np.uint8))
    session = Session(tiny_loaded(trained.model.eval()), [str(photo)])
    assert session.predict(0, 3)["targets"][0]["name"] == SHAPES[1]
    t = session.trust(View(layer="features.6"))
    chance = t["random"]
    assert t["deletion_auc"] < chance["deletion_auc"] and t["insertion_auc"] > chance["insertion_auc"]
    found = session.channel_list(0, "features.10")
    means = [c["mean"] for c in found["channels"]]
    assert found["shape"][0] == len(means) == 64 and means == sorted(means, reverse=True)
    _, x, _ = session.read(0)
    with torch.no_grad():
        acts = trained.model.features(torch.from_numpy(x)[None])[0]  # features.10: the last of them
    assert found["channels"][0]["channel"] == int(
        acts.mean((1, 2)).argmax()
    )  # the same activations, recomputed
    png = session.channel_png(0, "features.10", found["channels"][0]["channel"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_page_compares_measures_and_lists_channels(server: Explorer, browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, PATIENCE)
    browser.get(server.url + "&input=0&layer=features.4")
    view = lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view") or ""  # noqa: E731
    wait.until(lambda d: "layer=features.4" in view(d))
    browser.find_element(By.ID, "pin").click()
    choose(browser, "method", "gradcampp")
    wait.until(lambda d: "method=gradcampp" in view(d))
    browser.find_element(By.ID, "pin").click()
    figures = browser.find_elements(By.CSS_SELECTOR, "#grid figure")
    assert len(figures) == 2 and "gradcampp" in figures[1].text and "gradcam " in figures[0].text
    browser.find_element(By.ID, "measure").click()
    wait.until(lambda d: "random" in d.find_element(By.ID, "trust").text)
    browser.find_element(By.ID, "listchannels").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chanlist button"))
    first = browser.find_elements(By.CSS_SELECTOR, "#chanlist button")[0]
    first.click()
    wait.until(
        lambda d: d.find_element(By.ID, "channel").get_attribute("data-channel") == first.text.split(":")[0]
    )
    status, data = get(server, "/api/channels?input=0&layer=features.4")
    assert status == 200 and json.loads(data)["channels"][0]["channel"] == int(first.text.split(":")[0])


def post(server: Explorer, data: bytes, headers: dict[str, str], token: bool = True) -> tuple[int, bytes]:
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/api/upload" + (f"?token={server.token}" if token else "")
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=PATIENCE) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_refused_upload_is_answered_and_its_connection_serves_the_next_request(server: Explorer) -> None:
    """A refused POST (no token, another path) reads the body it was sent before answering: unread, the body
    was parsed as the next request on the kept-alive connection (a 400), or reset the connection under the
    answer (the client saw no status at all)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=60)
    try:
        body = b"x" * 200_000
        for path, headers in (("/api/upload", {"X-Hookviz": "1"}), (f"/api/nope?token={server.token}", {})):
            conn.request("POST", path, body=body, headers=headers)
            answer = conn.getresponse()
            assert answer.status in (403, 404) and b"error" in answer.read()
            conn.request("GET", f"/api/model?token={server.token}")
            answer = conn.getresponse()
            assert answer.status == 200 and json.loads(answer.read())["name"]
    finally:
        conn.close()


def test_a_dropped_photo_is_checked_kept_privately_and_explained(server: Explorer, tmp_path: Path) -> None:
    """(Last in this file: it adds an input to the shared server.)"""
    from hookviz.io.images import encode_png

    photo = encode_png(np.random.default_rng(3).integers(0, 256, (40, 40, 3), dtype=np.uint8))
    ours = {"X-Hookviz": "1", "X-Filename": "..%2F..%2Fevil%20name.png"}
    assert post(server, photo, ours, token=False)[0] == 403
    assert post(server, photo, {"X-Filename": "a.png"})[0] == 404  # a plain form from another page
    assert post(server, b"not a picture", ours)[0] == 400
    status, body = post(server, photo, ours)
    assert status == 200, body
    item = json.loads(body)
    assert item["name"] == "dropped: evil name.png" and item["index"] == 3
    kept = Path(item["file"])
    assert kept.parent.name.startswith("hookviz-explore-") and (kept.parent.stat().st_mode & 0o077) == 0
    assert ".." not in kept.name and kept.read_bytes() == photo
    assert get(server, "/api/map?input=3")[0] == 200
    server.session.close()
    assert not kept.parent.exists()
