"""``hookviz explore``: each view is the PNG and raw map ``hookviz gradcam`` writes for it (its "copy as
command" line run proves it), the server is private (token, Host, nothing outside its inputs), and the page
works in a real browser: picking a method shows the API's picture, a permalink reopens the view, and a hostile
file name is text."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import itertools
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hookviz.errors import InputError, UsageError
from hookviz.explore.server import Explorer
from hookviz.explore.session import Session
from hookviz.tasks import load_model
from tests.conftest import PATIENCE, ROOT, invoke, run_cli, started, write_image
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
    cookie = {"Cookie": f"hookviz_explore={server.token}"}  # a cookie goes to every port: never taken
    assert get(server, "/api/inputs", token=False, headers=cookie)[0] == 403
    status, page = get(server, "/", token=False)  # the page holds no secret: a permalink opens it
    assert status == 200 and b"hookviz explore" in page and server.url.startswith("http://127.0.0.1:")
    assert get(server, "/", token=False, headers={"Host": "evil.example:80"})[0] == 403


def _sent(server: Explorer, path: str, headers: list[tuple[str, str]]) -> tuple[int, Any]:
    """``(status, JSON)`` of a GET sending ``headers`` as given, a name twice too (``Host`` among them)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=PATIENCE)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders()
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def test_the_auth_scheme_is_any_case_and_repeated_or_differing_credentials_are_refused(
    server: Explorer,
) -> None:
    """``bearer T`` was refused (the scheme is case-insensitive); of two ``Authorization`` or ``Host`` headers
    the first was taken; a query token and a header token that differ were taken (the query's) whichever was
    right: all three are one line, 400, and never repeat a value given."""
    host = ("Host", f"127.0.0.1:{server.server_address[1]}")
    for scheme in ("bearer", "BEARER", "Bearer"):
        status, _ = _sent(server, "/api/inputs", [host, ("Authorization", f"{scheme} {server.token}")])
        assert status == 200, scheme
    right, wrong = ("Authorization", f"Bearer {server.token}"), ("Authorization", "Bearer wrong")
    for two in ([right, wrong], [wrong, right], [right, right]):
        assert _sent(server, "/api/inputs", [host, *two]) == (
            400,
            {"error": "Authorization header given 2 times; give it once"},
        )
    evil = ("Host", "evil.example:80")
    for hosts in ([host, evil], [evil, host]):
        status, body = _sent(server, f"/api/inputs?token={server.token}", hosts)
        assert (status, body) == (400, {"error": "Host header given 2 times; give it once"})
    for query, header in ((server.token, wrong), ("wrong", right)):
        status, body = _sent(server, f"/api/inputs?token={query}", [host, header])
        assert status == 400 and "differ" in body["error"] and server.token not in body["error"]
    assert _sent(server, f"/api/inputs?token={server.token}", [host, right])[0] == 200  # the same: taken


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
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#method option[value=layercam]"))  # listed after
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
    # The permalink (no token in it: the page's origin keeps it) reopens the same view.
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


def test_the_token_stays_with_its_own_server(server: Explorer, browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """Browsers do not keep cookies apart by port: a token in a cookie went to every other server on 127.0.0.1
    (a dev server, Jupyter, a hostile process), and a second explorer's overwrote the first's, whose tab then
    answered 403. The page keeps it in its own origin and sends it as a header."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    heard: list[str] = []

    class Elsewhere(BaseHTTPRequestHandler):  # another local server: what does the browser send it?
        def do_GET(self) -> None:
            heard.append(f"{self.path}\n{self.headers}")
            body = b"<!doctype html><title>elsewhere</title><img src='/pixel.png'>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    photo = write_image(tmp_path / "c.png", np.random.default_rng(1).integers(0, 256, (48, 64, 3), np.uint8))
    second = Explorer(Session(load_model("tests.conftest:TinyCNN", "none", input_size=48), [str(photo)]))
    elsewhere = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    for s in (second, elsewhere):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        wait = WebDriverWait(browser, 60)
        view = lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view") or ""  # noqa: E731
        browser.get(server.url)
        wait.until(lambda d: view(d))
        first = browser.current_window_handle
        browser.switch_to.new_window("tab")
        browser.get(second.url)  # a second explorer, side by side
        wait.until(lambda d: view(d))
        browser.get(f"http://127.0.0.1:{elsewhere.server_address[1]}/")
        wait.until(lambda d: len(heard) >= 2)  # the page and its picture
        assert not any(server.token in h or second.token in h for h in heard), heard
        # Both explorers still answer their tabs.
        browser.get(second.url.split("?")[0] + "?input=0&method=layercam")  # a permalink: no token in it
        wait.until(lambda d: "method=layercam" in view(d) or d.find_element(By.ID, "status").text)
        assert browser.find_element(By.ID, "status").text == "" and "method=layercam" in view(browser)
        browser.close()
        browser.switch_to.window(first)
        Select(browser.find_element(By.ID, "method")).select_by_value("gradcampp")
        wait.until(lambda d: "method=gradcampp" in view(d) or d.find_element(By.ID, "status").text)
        assert browser.find_element(By.ID, "status").text == "" and "method=gradcampp" in view(browser)
    finally:
        for s in (second, elsewhere):
            s.shutdown()
            s.server_close()
        second.session.close()


def test_the_page_scales_the_map_to_its_pane(server: Explorer, browser: Any) -> None:  # noqa: F811
    """A 48x64 photo's view (a 128 px PNG over a caption band) fills most of its pane's width, enlarged by a
    whole factor with square pixels; the caption band is cut off under the map and shown beside it, at its
    own size (it was drawn at the PNG's own size: 128 px in a pane of 900 and more, under its caption)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    before = browser.get_window_size()
    browser.set_window_size(1400, 900)
    try:
        browser.get(server.url + "&input=0&method=gradcam")
        shown = lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view")  # noqa: E731
        WebDriverWait(browser, 60).until(shown)
        size = browser.execute_script(
            "const box = (id) => document.getElementById(id)?.getBoundingClientRect();"
            "const img = document.getElementById('overlay');"
            "const map = document.getElementById('mapbox') ? box('mapbox') : img.getBoundingClientRect();"
            "return [img.getBoundingClientRect().width, map.height, box('view').width, img.naturalWidth,"
            " img.naturalHeight, getComputedStyle(img).imageRendering, box('capclip')?.height,"
            " map.bottom <= innerHeight, document.getElementById('capbox')?.hidden]"
        )
    finally:
        browser.set_window_size(before["width"], before["height"])
    shown_w, shown_h, pane, png_w, png_h, rendering, band, on_screen, folded = size
    assert png_w == 128 and png_h > 96  # the PNG: the 64 px wide photo enlarged twice, its caption under it
    assert shown_w >= 0.6 * pane, size  # the map is what the eye lands on
    scale = shown_w / png_w
    assert scale == int(scale) and shown_h == pytest.approx(96 * scale, abs=0.5)  # the caption cut off
    assert rendering == "pixelated" and on_screen and not folded
    assert band == pytest.approx(png_h - 96, abs=0.5)  # the caption, beside it at its own size


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
    wait.until(lambda d: "(random " in d.find_element(By.ID, "trust").text)
    browser.find_element(By.ID, "listchannels").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chanlist button"))
    first = browser.find_elements(By.CSS_SELECTOR, "#chanlist button")[0]
    first.click()
    wait.until(
        lambda d: d.find_element(By.ID, "channel").get_attribute("data-channel") == first.text.split(":")[0]
    )
    status, data = get(server, "/api/channels?input=0&layer=features.4")
    assert status == 200 and json.loads(data)["channels"][0]["channel"] == int(first.text.split(":")[0])


def picture_shown(server: Explorer, page: Any, selector: str) -> tuple[dict[str, str], bytes]:
    """The query of the picture the ``<img>`` at ``selector`` shows, asked for with the server's token (taken
    out of the query), and its bytes, once it is loaded."""
    from selenium.webdriver.support.ui import WebDriverWait

    ready = f"const i = document.querySelector('{selector}'); return i.complete && i.naturalWidth > 0;"
    WebDriverWait(page, PATIENCE).until(lambda d: d.execute_script(ready))
    page.set_script_timeout(PATIENCE)
    data = page.execute_async_script(
        f"const done = arguments[0]; const img = document.querySelector('{selector}');"
        "fetch(img.src).then(r => r.arrayBuffer()).then(b => done([img.src,"
        " btoa(String.fromCharCode(...new Uint8Array(b)))]));"
    )
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(data[0]).query))
    assert query.pop("token", None) == server.token, data[0]
    return query, base64.b64decode(data[1])


def test_the_channel_map_follows_the_photo_picked(server: Explorer, browser: Any) -> None:  # noqa: F811
    """A channel clicked in the channels panel shows its map over the photo; another photo picked in the strip
    shows that photo's map of the same channel (the very bytes /api/channel gives for it, not the first
    photo's, which differ), and picking the first again shows the first's again."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, PATIENCE)
    browser.get(server.url + "&input=0&layer=features.4")
    wait.until(
        lambda d: "layer=features.4" in (d.find_element(By.ID, "overlay").get_attribute("data-view") or "")
    )
    browser.find_element(By.ID, "listchannels").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chanlist button"))
    button = browser.find_elements(By.CSS_SELECTOR, "#chanlist button")[0]
    channel = button.get_attribute("data-channel")
    button.click()
    maps = {i: get(server, f"/api/channel?input={i}&layer=features.4&channel={channel}")[1] for i in (0, 1)}
    assert maps[0] != maps[1]  # the two photos' maps of the channel differ: the checks below can fail
    asked = lambda i: {"input": str(i), "layer": "features.4", "channel": channel}  # noqa: E731
    assert picture_shown(server, browser, "#channel") == (asked(0), maps[0])
    src = lambda d: d.find_element(By.ID, "channel").get_attribute("src")  # noqa: E731
    for i in (1, 0):
        browser.find_element(By.CSS_SELECTOR, f'#strip button[data-input="{i}"]').click()
        WebDriverWait(browser, 120).until(lambda d: f"input={i}&" in src(d))
        assert picture_shown(server, browser, "#channel") == (asked(i), maps[i])


@pytest.fixture(scope="module")
def contrasted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Explorer]:
    """An explorer over two photos unlike each other (a smooth dark gradient, a bright coloured checkerboard):
    a layer's channels rank differently on them."""
    folder = tmp_path_factory.mktemp("contrasted") / "photos"
    folder.mkdir()
    ramp = np.linspace(0, 90, 48, dtype=np.float32)
    smooth = np.stack([ramp[None, :].repeat(48, 0), ramp[:, None].repeat(48, 1), np.full((48, 48), 40.0)], -1)
    write_image(folder / "a_smooth.png", smooth.astype(np.uint8))
    cells = (np.indices((48, 48)).sum(0) // 1 % 2).astype(bool)
    checker = np.where(cells[..., None], [255, 230, 20], [10, 40, 250]).astype(np.uint8)
    write_image(folder / "b_checker.png", checker)
    session = Session(load_model("tests.conftest:TinyCNN", "none", input_size=48), [str(folder)])
    explorer = Explorer(session)
    threading.Thread(target=explorer.serve_forever, daemon=True).start()
    try:
        yield explorer
    finally:
        explorer.shutdown()
        explorer.server_close()
        session.close()


def hooked_means(session: Session, index: int, layer: str) -> np.ndarray:
    """Each channel's mean activation at ``layer`` on input ``index``, taken here by a forward hook of the
    test's own on that module (the statistic the docs name for the channels' ranking)."""
    import torch

    from hookviz.core.arrays import to_numpy

    seen: list[torch.Tensor] = []
    module = dict(session.loaded.model.named_modules())[layer]
    handle = module.register_forward_hook(lambda m, i, out: seen.append(out.detach().clone()))
    try:
        _, x, _ = session.read(index)
        with torch.no_grad():
            session.loaded.model(torch.from_numpy(x)[None])
    finally:
        handle.remove()
    (out,) = seen
    return to_numpy(out[0].double().mean(dim=(1, 2)), torch.float64)


def test_the_channel_list_is_the_photo_s_own_ranking(contrasted: Explorer) -> None:
    """/api/channels ranks the layer's channels for the photo asked for, by their mean activation: each
    channel's mean is the one a forward hook of the test's own measures on that photo, the order is theirs
    from the largest, and the two photos (unlike each other) rank them differently."""
    orders = {}
    for i in (0, 1):
        status, body = get(contrasted, f"/api/channels?input={i}&layer=features.6")
        assert status == 200
        listed = json.loads(body)
        order = [c["channel"] for c in listed["channels"]]
        means = hooked_means(contrasted.session, i, "features.6")
        assert listed["layer"] == "features.6" and sorted(order) == list(range(len(means))) == list(range(32))
        np.testing.assert_allclose(
            [c["mean"] for c in listed["channels"]], means[order], rtol=1e-5, atol=1e-6
        )
        ranked = np.argsort(-means, kind="stable")  # the ranking, recomputed: equal up to ties of the mean
        np.testing.assert_allclose(means[order], means[ranked], rtol=1e-5, atol=1e-6)
        assert means[ranked[0]] > means[ranked[-1]] + 1e-3  # a ranking, not a tie of every channel
        orders[i] = order
    assert orders[0][:8] != orders[1][:8]  # another photo, another ranking: the page's check below can fail


#: A page script that holds the answers to the page's ``fetch`` of ``window.hold`` (a path and an input)
#: until ``window.release()``; ``window.landed`` counts the held answers the page has read (its code after
#: reading one has run by then: it is counted in a task after the page's own continuation).
HOLD = """
let open; window.landed = 0; window.hold = arguments[0];
const gate = new Promise((resolve) => { open = resolve; }); window.release = open;
const real = window.fetch.bind(window);
window.fetch = async (url, options) => {
  const held = window.hold && String(url).startsWith(window.hold[0]) && String(url).includes(window.hold[1]);
  const r = await real(url, options);
  if (!held) return r;
  await gate;
  const json = r.json.bind(r);
  r.json = async () => { const j = await json(); setTimeout(() => { window.landed += 1; }, 0); return j; };
  return r;
};
"""


def test_the_channel_list_follows_the_photo_picked(contrasted: Explorer, browser: Any) -> None:  # noqa: F811
    """The channels listed for one photo are listed again for each photo picked: the list shown is the
    picked photo's ranking (its /api/channels order, which differs from the other's), the old list dimmed
    while the new one is on its way, and a slow answer for a photo no longer picked, coming after the newer
    one, is dropped. The trust panel's figures of one photo go when another is picked."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    server = contrasted
    ranked = {
        i: [
            str(c["channel"])
            for c in json.loads(get(server, f"/api/channels?input={i}&layer=features.6")[1])["channels"]
        ]
        for i in (0, 1)
    }
    assert ranked[0] != ranked[1]
    wait = WebDriverWait(browser, PATIENCE)
    browser.set_script_timeout(PATIENCE)
    browser.get(server.url + "&input=0&layer=features.6")
    view = lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view") or ""  # noqa: E731
    wait.until(lambda d: "layer=features.6" in view(d))
    listed = "return [...document.querySelectorAll('#chanlist button')].map((b) => b.dataset.channel);"
    fresh = (  # the photo of the list shown, once no newer one is on its way
        "const l = document.getElementById('chanlist');"
        "return l.classList.contains('stale') ? null : l.dataset.input;"
    )
    browser.find_element(By.ID, "measure").click()
    wait.until(lambda d: "(random " in d.find_element(By.ID, "trust").text)
    browser.find_element(By.ID, "listchannels").click()
    wait.until(lambda d: d.execute_script(fresh) == "0")
    assert browser.execute_script(listed) == ranked[0]
    browser.find_elements(By.CSS_SELECTOR, "#chanlist button")[0].click()
    # Photo 1 picked, its list held back: the page shows photo 0's list dimmed, never as photo 1's.
    browser.execute_script(HOLD, ["/api/channels?", "input=1&"])
    browser.find_element(By.CSS_SELECTOR, '#strip button[data-input="1"]').click()
    wait.until(lambda d: "input=1&" in (d.find_element(By.ID, "channel").get_attribute("src") or ""))
    assert browser.execute_script(fresh) is None and "listing" in browser.find_element(By.ID, "chanfor").text
    assert "(random " not in browser.find_element(By.ID, "trust").text  # photo 0's figures are gone
    # Photo 0 picked again: its list; then photo 1's late answer comes, and is dropped.
    _a_late_answer_is_dropped(browser, (fresh, listed), ranked, 0, 1, also=lambda d: "input=0" in view(d))
    assert "b_checker.png" in browser.find_element(By.ID, "chanfor").text
    # Another layer picked: its channels for this photo; the channel shown, another layer's, goes.
    other = [
        str(c["channel"])
        for c in json.loads(get(server, "/api/channels?input=1&layer=features.2")[1])["channels"]
    ]
    choose(browser, "layer", "features.2")
    wait.until(
        lambda d: d.execute_script(fresh) == "1" and "features.2 on" in d.find_element(By.ID, "chanfor").text
    )
    assert browser.execute_script(listed) == other and len(other) == 16
    assert not browser.find_element(By.ID, "channel").is_displayed()


def test_the_classes_shown_are_the_photo_s_own(contrasted: Explorer, browser: Any) -> None:  # noqa: F811
    """The classes listed are the photo's picked: a slow /api/predict answer for a photo no longer picked,
    coming after the newer one, is dropped (the list keeps the picked photo's probabilities)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    server, wait = contrasted, WebDriverWait(browser, PATIENCE)
    scores = {
        i: {
            str(c["index"]): c["score"]
            for c in json.loads(get(server, f"/api/predict?input={i}&k=10")[1])["targets"]
        }
        for i in (0, 1)
    }
    assert max(abs(scores[0][k] - scores[1][k]) for k in scores[0]) > 0.01  # the check below can fail
    shown = (  # each listed class's index and the probability the page prints for it
        "return [...document.querySelectorAll('#classes li')].filter((li) => li.dataset.target !== 'top1')"
        ".map((li) => [li.dataset.target, li.textContent.trim().split(/\\s+/).pop()]);"
    )

    def listed() -> dict[str, float]:
        return {k: float(v) for k, v in browser.execute_script(shown)}

    browser.get(server.url + "&input=0")
    wait.until(lambda d: "input=0" in (d.find_element(By.ID, "overlay").get_attribute("data-view") or ""))
    wait.until(lambda d: len(listed()) == len(scores[0]))
    browser.execute_script(HOLD, ["/api/predict?", "input=1&"])
    browser.find_element(By.CSS_SELECTOR, '#strip button[data-input="1"]').click()
    browser.execute_script("document.getElementById('classes').replaceChildren();")  # to see photo 0's come
    browser.find_element(By.CSS_SELECTOR, '#strip button[data-input="0"]').click()
    wait.until(lambda d: len(listed()) == len(scores[0]))  # photo 0's answer, shown; photo 1's still held
    browser.execute_script("window.release();")
    wait.until(lambda d: d.execute_script("return window.landed") == 1)
    wait.until(lambda d: "input=0" in (d.find_element(By.ID, "overlay").get_attribute("data-view") or ""))
    got = listed()
    assert got.keys() == scores[0].keys()
    assert all(abs(got[k] - scores[0][k]) <= 6e-4 for k in got), (got, scores)


BAD = [  # (query, the parameter, the value as the answer quotes it, what it must say is allowed)
    ("/api/map?input=0&box=-3", "box", "'-3'", "a detector's"),
    ("/api/map?input=0&axis=9", "axis", "'9'", "a volume's"),
    ("/api/map?input=0&relu=banana", "relu", "'banana'", "1 or 0"),
    ("/api/map?input=0&alpha=nan", "alpha", "'nan'", "from 0 to 1"),
    ("/api/map?input=0&alpha=1.5", "alpha", "'1.5'", "from 0 to 1"),
    ("/api/map?input=0&frame=x", "frame", "'x'", "these inputs are photos"),
    ("/api/map?input=0&method=gradcam%2Clayercam", "method", "'gradcam,layercam'", "one method"),
    ("/api/map?input=0&method=nope", "method", "'nope'", "layercam"),
    ("/api/map?input=0&colormap=nope", "colormap", "'nope'", "viridis"),
    ("/api/map?input=0&format=gif", "format", "'gif'", "png, npy or json"),
    ("/api/map?input=0&target=%D9%A3", "target", "'\u0663'", "ASCII digits"),  # an Arabic-Indic 3
    ("/api/map?input=%D9%A0", "input", "'\u0660'", "ASCII digits"),  # an Arabic-Indic 0
    ("/api/map?input=0&box=%D9%A1", "box", "'\u0661'", "a detector's"),
    ("/api/map?input=0&boxx=1", "boxx", "'1'", "/api/map does not take it; /api/map takes input, layer"),
    ("/api/map?input=0&box=1&box=2", "box", "'1', '2'", "once"),
    # A detector's box and a volume's axis mean nothing on a classifier's photo: refused, never ignored.
    ("/api/map?input=0&box=2", "box", "'2'", "TinyCNN is a classification model; /api/map takes input"),
    ("/api/map?input=0&box=0", "box", "'0'", "a detector's"),
    ("/api/trust?input=0&axis=0", "axis", "'0'", "these inputs are photos"),
    # The explorer names its own field, not the command line's option.
    ("/api/map?input=0&target=1000", "target=1000", "1000", "out of range"),
    # A view shows one map: topK (K > 1) and lists are the command line's, refused, never cut to the first.
    ("/api/map?input=0&target=top99", "target='top99'", "top99", "one class"),
    ("/api/map?input=0&target=top1000", "target='top1000'", "top1000", "give top1"),
    ("/api/map?input=0&target=1%2C2", "target='1,2'", "1,2", "one class"),
    ("/api/map?input=0&target=tabby", "target='tabby'", "tabby", "a class index"),
    ("/api/map?input=0&target=1&token=x", "token", "2 times", "once"),
    ("/api/channel?input=0&channel=abc", "channel", "'abc'", "from 0"),
    ("/api/visualize?channel=0&steps=1e9", "steps", "'1e9'", "from 1 to 2048"),
    ("/api/predict?input=0&k=0", "k", "'0'", "from 1 to 1000"),
]


@pytest.mark.parametrize(("path", "name", "value", "allowed"), BAD, ids=[b[0].split("?")[1] for b in BAD])
def test_a_bad_parameter_is_one_400_naming_it_its_value_and_what_is_allowed(
    server: Explorer, path: str, name: str, value: str, allowed: str
) -> None:
    status, body = get(server, path)
    error = json.loads(body)["error"]
    assert status == 400, (status, error)
    assert name in error and value in error and allowed in error
    assert "\n" not in error and "invalid literal" not in error and "could not convert" not in error
    assert not error.startswith("-")  # the explorer's field first, never the command line's option


def test_a_token_given_twice_is_refused_and_never_repeated(server: Explorer) -> None:
    """Two tokens, the right one among them, were taken (the first was checked): which one is meant is not
    the server's to guess. The answer never repeats a value given."""
    for tokens in ([server.token, "wrong"], ["wrong", server.token], [server.token, server.token]):
        status, body = get(server, "/api/inputs?" + "&".join(f"token={t}" for t in tokens), token=False)
        assert status == 400 and json.loads(body) == {"error": "token given 2 times; give it once"}
    assert get(server, f"/api/inputs?token={server.token}", token=False)[0] == 200


def test_box_frame_and_axis_are_refused_on_photos_even_at_their_defaults(server: Explorer) -> None:
    """A classifier's photos have no box, frame or axis: ``box=1&frame=-1&axis=2`` (the defaults, which the
    page sent on every view) were taken silently, as though they chose something. The page now sends them
    only to a detector's, or a video's or volume's, session."""
    for given, name in (("box=1", "box"), ("frame=-1", "frame"), ("axis=2", "axis")):
        status, body = get(server, f"/api/map?input=0&{given}")
        error = json.loads(body)["error"]
        assert status == 400 and error.startswith(f"{name}='") and "\n" not in error, error
        assert error.endswith("; /api/map takes input, layer, method, target, alpha, colormap, relu, format, "
                              "supersede and token"), error  # fmt: skip
    view = "input=0&layer=features.4&method=gradcam&target=top1&alpha=0.5&colormap=jet&relu=1"
    assert get(server, f"/api/map?{view}&format=png&supersede=1")[0] == 200  # all the page sends a photo
    assert get(server, f"/api/trust?{view}")[0] == 200


@pytest.mark.parametrize(
    ("path", "error"),
    [
        (
            "/api/photo?input=0&box=1",
            "box='1': /api/photo does not take it; /api/photo takes input and token",
        ),
        (
            "/api/thumb?input=0&axis=2",
            "axis='2': /api/thumb does not take it; /api/thumb takes input, v and token",
        ),
        ("/api/model?input=0", "input='0': /api/model does not take it; /api/model takes only token"),
        ("/api/inputs?k=5", "k='5': /api/inputs does not take it; /api/inputs takes only token"),
        (
            "/api/predict?input=0&target=1",
            "target='1': /api/predict does not take it; /api/predict takes input, k and token",
        ),
        (
            "/api/best?layer=features.4&channel=0&alpha=1",
            "alpha='1': /api/best does not take it; /api/best takes layer, channel and token",
        ),
    ],
)
def test_a_parameter_an_endpoint_does_not_take_is_one_400_naming_what_it_takes(
    server: Explorer, path: str, error: str
) -> None:
    status, body = get(server, path)
    assert (status, json.loads(body)) == (400, {"error": error})


def test_best_and_sheet_answer_the_same_request_alike(server: Explorer) -> None:
    """``/api/best`` and ``/api/sheet`` without a channels run: 400 and 404 for the same request. Now both 400
    for a bad parameter (a layer the model does not have, a channel that is no number) and both 404 for a
    missing resource (no ``--channels-run``)."""
    for query, status, said in (
        ("layer=features.4&channel=0", 404, "no channels run given: start explore with --channels-run DIR"),
        ("layer=nope&channel=0", 400, "layer='nope': tests.conftest:TinyCNN has no such layer"),
        ("layer=features.4&channel=-1", 400, "channel='-1': a whole number from 0"),
    ):
        answers = [get(server, f"/api/{path}?{query}") for path in ("best", "sheet")]
        for got, body in answers:
            assert got == status and json.loads(body)["error"].startswith(said), (query, got, body)


def test_the_page_s_own_address_is_not_checked_as_api_parameters(server: Explorer) -> None:
    """The page reads its address's parameters itself (a permalink's view): a bad one is the page's to show,
    the page is served (the API answers it 400 when the page asks)."""
    assert get(server, "/?box=-3&utm_source=x")[0] == 200


def test_a_body_whose_length_is_not_a_number_is_answered_and_nothing_is_printed(
    server: Explorer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``Content-Length`` of ``abc`` (or in chunks) is one line, 400 (411), and the connection closed: it
    dropped the connection with a traceback on the server's terminal."""
    import socket

    port = server.server_address[1]
    for length, want in (("Content-Length: abc", 400), ("Content-Length: -5", 400),
                         ("Transfer-Encoding: chunked", 411)):  # fmt: skip
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            head = (f"POST /api/upload?token={server.token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    f"X-Hookviz: 1\r\n{length}\r\n\r\n")  # fmt: skip
            sock.sendall(head.encode("utf-8") + b"5\r\nhello\r\n0\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):  # the server closes the connection after its answer
                answer += chunk
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.split()[1] == str(want).encode(), answer
        error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
        assert "Content-Length" in error and ("abc" in error or "'-5'" in error or "chunks" in error)
    assert "Traceback" not in capsys.readouterr().err


def test_the_standard_library_s_own_refusals_answer_the_api_s_json(
    server: Explorer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A query over the server's limit (414), too many headers (431) or a method not served (501) answered
    Python's HTML error page; now the API's one line of JSON, and the connection closed."""
    import socket

    port = server.server_address[1]
    host = f"Host: 127.0.0.1:{port}\r\n"
    many = "".join(f"X-H{i}: {i}\r\n" for i in range(120))
    for head, want, says in (
        (f"GET /api/inputs?token={server.token}&q={'x' * 70_000} HTTP/1.1\r\n{host}\r\n", 414, "shorten"),
        (f"GET /api/inputs?token={server.token} HTTP/1.1\r\n{host}{many}\r\n", 431, "headers"),
        (f"PUT /api/inputs?token={server.token} HTTP/1.1\r\n{host}Content-Length: 0\r\n\r\n", 501, "PUT"),
    ):
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(head.encode("ascii"))
            answer = b""
            while chunk := sock.recv(65536):  # the server closes the connection after its answer
                answer += chunk
        status_line, _, rest = answer.partition(b"\r\n")
        headers, _, body = rest.partition(b"\r\n\r\n")
        assert status_line.split()[1] == str(want).encode(), answer[:300]
        assert b"application/json" in headers and b"<html" not in body.lower()
        error = json.loads(body)["error"]
        assert says in error and "\n" not in error, error
    assert "Traceback" not in capsys.readouterr().err


def test_a_photo_changed_on_disk_is_read_again_and_one_deleted_is_gone(
    tmp_path: Path,
    browser: Any,  # noqa: F811
) -> None:
    """A photo rewritten while the page is open: the next view is of the new photo (and its shell line
    writes it), with a note the page shows, and the channels listed are listed again for it; one touched
    (the same bytes) is not read again; one deleted is a 410."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    rng = np.random.default_rng(5)
    path = write_image(tmp_path / "p.png", rng.integers(0, 256, (48, 48, 3), dtype=np.uint8))
    session = Session(load_model("tests.conftest:TinyCNN", "none", input_size=48), [str(path)],
                      model_words=[*MODEL, "--input-size", "48"])  # fmt: skip
    explorer = Explorer(session)
    threading.Thread(target=explorer.serve_forever, daemon=True).start()
    try:
        browser.get(explorer.url + "&input=0&layer=features.4")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view"))
        view = "/api/map?input=0&layer=features.4"
        channels = lambda: [  # noqa: E731
            str(c["channel"])
            for c in json.loads(get(explorer, "/api/channels?input=0&layer=features.4")[1])["channels"]
        ]
        listed = "return [...document.querySelectorAll('#chanlist button')].map((b) => b.dataset.channel);"
        browser.find_element(By.ID, "listchannels").click()
        before = channels()
        wait.until(lambda d: d.execute_script(listed) == before)
        old = get(explorer, view)[1]
        assert "note" not in json.loads(get(explorer, view + "&format=json")[1])
        touched = path.stat().st_mtime_ns + 5_000_000_000
        import os

        os.utime(path, ns=(touched, touched))  # the same bytes, another time: the same photo
        assert get(explorer, view)[1] == old
        assert "note" not in json.loads(get(explorer, view + "&format=json")[1])
        write_image(path, rng.integers(0, 256, (40, 56, 3), dtype=np.uint8))
        status, new = get(explorer, view)
        assert status == 200 and new != old
        info = json.loads(get(explorer, view + "&format=json")[1])
        assert "p.png changed on disk" in info["note"]
        Select(browser.find_element(By.ID, "colormap")).select_by_value("viridis")  # the page's next view
        wait.until(lambda d: "p.png changed on disk" in d.find_element(By.ID, "changed").text)
        after = channels()
        assert after != before  # the new photo ranks them otherwise: the check below can fail
        wait.until(lambda d: d.execute_script(listed) == after)  # listed again, for the new photo
        # The strip's thumbnail asked for again, with the token: the new photo's (56x40; the old one 48x48; a
        # refused request shows nothing, 0x0).
        size = "const i = document.querySelector('#strip img'); return [i.naturalWidth, i.naturalHeight];"
        wait.until(lambda d: d.execute_script(size) == [56, 40])
        query, thumbnail = picture_shown(explorer, browser, "#strip img")
        assert "v" in query and thumbnail == get(explorer, "/api/thumb?input=0")[1]
        out = tmp_path / "out"
        r = invoke(*shlex.split(info["command"])[1:-1], str(out))
        assert r.exit_code == 0, r.stderr
        (written,) = out.glob("*.png")
        assert written.read_bytes() == new  # the shell line writes what the page shows
        thumb = get(explorer, "/api/thumb?input=0")[1]
        from tests.test_explore_tasks import _decoded

        assert _decoded(thumb).shape[:2] == (40, 56)  # the new photo's thumbnail (the old one: 48x48)
        path.unlink()
        for api in (view, "/api/thumb?input=0", "/api/predict?input=0"):
            status, body = get(explorer, api)
            assert status == 410 and "p.png: its file is gone" in json.loads(body)["error"], api
    finally:
        explorer.shutdown()
        explorer.server_close()
        session.close()


def test_every_address_the_page_builds_for_the_api_carries_the_token() -> None:
    """Each ``/api/`` address in the page goes out with the token: through ``authed(...)`` (an ``<img>`` or a
    link, which send no header; a thumbnail asked for again after its photo changed was once sent bare and
    refused), ``api(...)``, or ``fetch(...)`` with the ``AUTH`` header; the page names no API address
    otherwise."""
    import re

    page = (ROOT / "hookviz" / "explore" / "page.html").read_text()
    found = [(m.start(), page[max(0, m.start() - 8) : m.start()]) for m in re.finditer(r"/api/", page)]
    assert len(found) > 20  # the page's addresses: the check below reads them all
    for at, before in found:
        assert before.endswith(('authed("', ' api("', 'fetch("')), page[at - 60 : at + 60]
        if before.endswith('fetch("'):
            call = page[at : page.index(";", at)]
            assert "AUTH" in call, call


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
    status, body = post(server, photo, {"X-Filename": "a.png"})  # a plain form from another page
    assert status == 403 and json.loads(body) == {
        "error": "an upload needs the header X-Hookviz: 1 (the "
        "explorer's page sends it; a form from another site cannot, which guards against cross-site requests)"
    }
    status, body = post(server, b"not a picture", ours)
    assert status == 400 and b"evil name.png" in body and b"hookviz-explore-" not in body
    status, body = post(server, photo, ours)
    assert status == 200, body
    item = json.loads(body)
    # The answer names the photo as dropped (an opaque index and its name), never the private copy's path.
    assert item == {"index": 3, "name": "dropped: evil name.png", "file": "evil name.png", "dropped": True}
    assert b"hookviz-explore-" not in get(server, "/api/inputs")[1]
    kept = server.session.items[3].path
    assert kept is not None
    assert kept.parent.name.startswith("hookviz-explore-") and (kept.parent.stat().st_mode & 0o077) == 0
    assert ".." not in kept.name and kept.read_bytes() == photo
    assert get(server, "/api/map?input=3")[0] == 200
    answer = get(server, "/api/map?input=3&format=json")[1]
    command = json.loads(answer)["command"]
    # The shell line names the photo as dropped (the user's file), and nothing in the answer the private copy.
    assert shlex.split(command)[2] == "evil name.png" and b"hookviz-explore-" not in answer
    # A second photo dropped under the same name is listed under a name of its own: both reachable by name.
    other = encode_png(np.random.default_rng(4).integers(0, 256, (40, 40, 3), dtype=np.uint8))
    second = json.loads(post(server, other, ours)[1])
    assert second["name"] == "dropped: evil name.png (2)" and second["index"] == 4
    by_name = get(server, "/api/photo?input=" + urllib.parse.quote("dropped: evil name.png (2)"))
    assert by_name == get(server, "/api/photo?input=4") and by_name != get(server, "/api/photo?input=3")
    server.session.close()
    assert not kept.parent.exists()


@contextlib.contextmanager
def explore_process(tmp_path: Path, *flags: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``hookviz explore`` on a photo in a process group of its own, its temporary folder ``tmp_path/tmp``;
    the process and the address it printed. Its group is killed on the way out if it still runs."""
    photo = write_image(tmp_path / "a.png", np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env |= {"TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "hookviz", "explore", str(photo), *MODEL, "--input-size", "48",
           "--no-browser", "--device", "cpu", *flags]  # fmt: skip
    with started(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            said: list[str] = []
            while not said or "explore at " not in said[-1]:
                line = lines.get(timeout=PATIENCE)
                assert line is not None, f"it stopped before listening: {''.join(said)}"
                said.append(line)
            yield proc, said[-1].split("explore at ", 1)[1].strip()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=PATIENCE)
            reader.join(timeout=PATIENCE)  # the reader reaches the end of stderr before the pipe is closed


def _upload(url: str, data: bytes) -> dict[str, Any]:
    base, token = url.split("/?token=")
    request = urllib.request.Request(f"{base}/api/upload?token={token}", data=data, method="POST",
                                     headers={"X-Hookviz": "1", "X-Filename": "dropped.png"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as r:
        return dict(json.loads(r.read()))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_explorer_removes_its_dropped_photos(tmp_path: Path, sig: signal.Signals) -> None:
    """An IDE's stop button, systemd (SIGTERM) or a closed terminal (SIGHUP) removed nothing: only Ctrl-C did.
    And a dead explorer's folder (killed, so nothing ran) goes at the next start: only that one."""
    from hookviz.io.images import encode_png

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with started([sys.executable, "-c", ""]) as dead:
        dead.wait()
    left = tmp / f"hookviz-explore-{dead.pid}-abc123"  # a killed explorer's
    running = tmp / f"hookviz-explore-{os.getpid()}-def456"  # a running one's (this process's id)
    for folder in (left, running):
        folder.mkdir(mode=0o700)
        (folder / "0001-photo.png").write_bytes(b"kept")
    with explore_process(tmp_path) as (proc, url):
        assert not left.exists() and (running / "0001-photo.png").read_bytes() == b"kept"
        photo = encode_png(np.random.default_rng(3).integers(0, 256, (40, 40, 3), dtype=np.uint8))
        assert _upload(url, photo)["dropped"] is True  # the answer names no private path: look for it
        (folder,) = [d for d in tmp.iterdir() if d.name.startswith(f"hookviz-explore-{proc.pid}-")]
        (kept,) = folder.iterdir()
        assert kept.read_bytes() == photo
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig
    assert not kept.parent.exists() and running.exists()


def test_only_a_dead_explorers_own_folders_are_swept(tmp_path: Path) -> None:
    from hookviz.explore import uploads

    with started([sys.executable, "-c", ""]) as dead:
        dead.wait()
    gone = tmp_path / f"hookviz-explore-{dead.pid}-x1"
    alive = tmp_path / f"hookviz-explore-{os.getpid()}-x2"
    older = tmp_path / "hookviz-explore-x3yz"  # no process id in its name: whose it was is unknown
    other = tmp_path / "elsewhere"
    for folder in (gone, alive, older, other):
        folder.mkdir()
    link = tmp_path / f"hookviz-explore-{dead.pid}-x4"
    link.symlink_to(other)
    theirs = tmp_path / f"hookviz-explore-{dead.pid}-x5"  # another user's
    theirs.mkdir()
    if os.getuid() == 0:
        os.chown(theirs, 65534, 65534)
    else:
        theirs.rmdir()
    assert uploads.sweep(tmp_path) == [gone]
    assert not gone.exists() and alive.is_dir() and older.is_dir() and link.is_symlink() and other.is_dir()
    assert theirs.is_dir() or os.getuid() != 0


def _explore_fails(tmp_path: Path, *flags: str) -> tuple[int, str]:
    """The exit code and stderr of ``hookviz explore`` that is expected to stop at once (its process group
    killed if it does not)."""
    photo = write_image(tmp_path / "a.png", np.random.default_rng(0).integers(0, 256, (48, 64, 3), np.uint8))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "hookviz", "explore", str(photo), *MODEL, "--no-browser", *flags]
    done = run_cli(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return done.returncode, done.stderr


def test_a_port_in_use_or_an_address_not_its_own_is_one_line(tmp_path: Path) -> None:
    """Both were "internal error" (exit 70)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = _explore_fails(tmp_path, "--port", str(port))
    assert code == 2 and err.splitlines() == [
        f"hookviz: error: --port {port}: in use on 127.0.0.1 (another server listens there); give another "
        "port, or --port 0 for a free one"
    ]
    foreign = "203.0.113.77"  # TEST-NET-3: documentation only
    with socket.socket() as probe, contextlib.suppress(OSError):
        probe.bind((foreign, 0))
        pytest.skip(f"{foreign} is this machine's")
    code, err = _explore_fails(tmp_path, "--host", foreign)
    assert code == 2 and err.splitlines() == [
        f"hookviz: error: --host {foreign}: cannot listen there (Cannot assign requested address); give one "
        "of this machine's addresses: 127.0.0.1 (this machine only) or 0.0.0.0 (every network)"
    ]


def _own_address() -> str | None:
    """One of this machine's IPv4 addresses other than loopback (the one a route out leaves by), if any."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # a UDP "connect" sends nothing: it only picks the route
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_listening_everywhere_answers_its_own_addresses_and_names_only(server: Explorer) -> None:
    """``--host 0.0.0.0`` warned that other machines could reach it, but the Host check refused every request
    addressed to the machine's IP or name. A foreign name is still refused (DNS rebinding)."""
    import socket

    everywhere = Explorer(server.session, host="0.0.0.0", allow_hosts=["Box.lan"])
    threading.Thread(target=everywhere.serve_forever, daemon=True).start()
    try:
        port = everywhere.server_address[1]
        assert everywhere.url == f"http://127.0.0.1:{port}/?token={everywhere.token}"

        def status(host: str, via: str = "127.0.0.1") -> int:
            url = f"http://{via}:{port}/api/model?token={everywhere.token}"
            request = urllib.request.Request(url, headers={"Host": host})
            try:
                with urllib.request.urlopen(request, timeout=60) as r:
                    return int(r.status)
            except urllib.error.HTTPError as exc:
                exc.close()
                return int(exc.code)

        for own in (socket.gethostname(), socket.getfqdn(), "box.lan", "192.0.2.7", "[fd00::2]", "localhost"):
            assert status(f"{own}:{port}") == 200, own
        for foreign in ("evil.example", "localhost.evil.example", f"{socket.gethostname()}.evil.example",
                        "127.0.0.1@evil.example", "evil.example/127.0.0.1", ""):  # fmt: skip
            assert status(f"{foreign}:{port}" if foreign else "") == 403, foreign
        address = _own_address()
        if address is not None:  # a real request to the machine's own address, as another machine sends it
            assert status(f"{address}:{port}", via=address) == 200
    finally:
        everywhere.shutdown()
        everywhere.server_close()


def test_an_ipv6_address_listens_and_prints_a_usable_address(server: Explorer) -> None:
    v6 = Explorer(server.session, host="::1")
    threading.Thread(target=v6.serve_forever, daemon=True).start()
    try:
        assert v6.url.startswith("http://[::1]:")
        with urllib.request.urlopen(v6.url.replace("/?", "/api/model?"), timeout=60) as r:
            assert r.status == 200 and json.loads(r.read())["name"]
    finally:
        v6.shutdown()
        v6.server_close()


@dataclass
class SaeExplorer:
    """An explorer of eight random photos with a ``hookviz sae`` run of its model (--sae), described."""

    folder: Path
    run: Path
    loaded: Any
    data: dict[str, Any]
    session: Session
    explorer: Explorer


@pytest.fixture(scope="module")
def sae_explorer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaeExplorer]:
    from hookviz.explore.features import SaeRun
    from hookviz.io.inputs import expand_inputs
    from hookviz.sae.api import load_sae, train_sae
    from hookviz.sae.training import TrainSettings
    from hookviz.sae.views import describe

    folder = tmp_path_factory.mktemp("sae-explore") / "photos"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(8):
        write_image(folder / f"p{i}.png", rng.integers(0, 256, (48, 48, 3), dtype=np.uint8))
    loaded = load_model("tests.conftest:TinyCNN", "none", input_size=48)
    items, run = expand_inputs([str(folder)]), folder.parent / "sae"
    quick = TrainSettings(width="2x", k=4, vectors=3000, batch=256, lr=2e-3, buffer=1024)
    train_sae(loaded, items, "features.10", run, quick)
    data = describe(load_sae(run, loaded), loaded, items, run, detail=2)
    session = Session(loaded, [str(folder)], sae_run=SaeRun(run))
    explorer = Explorer(session)
    threading.Thread(target=explorer.serve_forever, daemon=True).start()
    try:
        yield SaeExplorer(folder, run, loaded, data, session, explorer)
    finally:
        explorer.shutdown()
        explorer.server_close()
        session.close()


def test_the_features_panel_answers_with_the_token_and_refuses_without(sae_explorer: SaeExplorer) -> None:
    """A ``hookviz sae`` run of the session's model (--sae): /api/features lists the features that fire, the
    most firing first, as features.json says; /api/feature gives one's top patches; its sheet is the file the
    command wrote; /api/feature-map draws its code over the photo (the feature's own code, recomputed here,
    peaks inside the map's brightest cell); each refused without the token; an unknown feature is one 400;
    a session without --sae says how to give one."""
    import torch

    from hookviz.explore.features import SaeRun
    from hookviz.sae import features
    from hookviz.sae.api import load_sae

    folder, run, loaded, data = sae_explorer.folder, sae_explorer.run, sae_explorer.loaded, sae_explorer.data
    session, explorer = sae_explorer.session, sae_explorer.explorer
    status, body = get(explorer, "/api/features")
    assert status == 200
    listed = json.loads(body)
    firing = sorted((f for f in data["features"] if f["fired"] > 0), key=lambda f: -f["fired"])
    assert [f["feature"] for f in listed["features"]] == [f["feature"] for f in firing]
    assert listed["layer"] == "features.10" and listed["width"] == 128 and listed["inputs"] == 8
    detailed = next(f for f in data["features"] if "sheet" in f)
    f = detailed["feature"]
    status, body = get(explorer, f"/api/feature?feature={f}")
    assert status == 200 and json.loads(body)["top"] == detailed["top"]
    assert json.loads(body)["sheet"] is True
    assert get(explorer, f"/api/feature-sheet?feature={f}") == (
        200,
        (run / detailed["sheet"]).read_bytes(),
    )
    status, png = get(explorer, f"/api/feature-map?input=0&feature={f}&alpha=1")
    assert status == 200
    from hookviz.io.images import decode_png

    picture = decode_png(png)
    assert picture.shape[:2] == (48, 48)
    _, x, box = session.read(0)  # the centre crop the model saw, the map upsampled onto it
    code = features.code_maps(load_sae(run, loaded), loaded.model, torch.from_numpy(x)[None])[0, f]
    r, c = divmod(int(code.argmax()), code.shape[1])
    y = box.y0 + int((r + 0.5) * box.height / code.shape[0])
    x_ = box.x0 + int((c + 0.5) * box.width / code.shape[1])
    green = picture[..., 1].astype(float)  # alpha 1: viridis alone, green from 1 (zero) to 231 (the peak)
    assert green[y, x_] >= 0.8 * green.max() > 150
    for path in ("/api/features", f"/api/feature?feature={f}", f"/api/feature-sheet?feature={f}",
                 f"/api/feature-map?input=0&feature={f}"):  # fmt: skip
        assert get(explorer, path, token=False)[0] == 403, path
    status, body = get(explorer, "/api/feature?feature=999")
    assert status == 400 and "features 0 to 127" in json.loads(body)["error"]
    assert json.loads(get(explorer, "/api/model")[1])["sae_run"] is True
    bare = Session(loaded, [str(folder)])
    with pytest.raises(InputError, match="--sae DIR"):
        bare.panel_features.listed()
    bare.close()
    with pytest.raises(UsageError, match="hookviz sae features"):
        SaeRun(folder)


def test_the_feature_map_follows_the_photo_picked(sae_explorer: SaeExplorer, browser: Any) -> None:  # noqa: F811
    """A feature clicked in the panel shows its code over the photo on the page; another photo picked in the
    strip shows that photo's map of the same feature (the very bytes /api/feature-map gives for it, not the
    first photo's, which differ), and picking the first again shows the first's again."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    explorer, wait = sae_explorer.explorer, WebDriverWait(browser, PATIENCE)
    browser.set_script_timeout(PATIENCE)
    browser.get(explorer.url + "&input=0")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#strip button")) == 8)
    wait.until(lambda d: d.find_element(By.ID, "overlay").get_attribute("data-view"))
    browser.find_element(By.ID, "listfeatures").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#featurelist button"))
    button = browser.find_elements(By.CSS_SELECTOR, "#featurelist button")[0]
    feature = button.get_attribute("data-feature")
    button.click()

    def shown() -> tuple[str, bytes]:
        """The feature map's query and the bytes of its picture, once it is loaded."""
        ready = "const i = document.getElementById('featuremap'); return i.complete && i.naturalWidth > 0;"
        wait.until(lambda d: d.execute_script(ready))
        data = browser.execute_async_script(
            "const done = arguments[0]; const img = document.getElementById('featuremap');"
            "fetch(img.src).then(r => r.arrayBuffer()).then(b => done([img.src,"
            " btoa(String.fromCharCode(...new Uint8Array(b)))]));"
        )
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(data[0]).query)
        return f"input={query['input'][0]}&feature={query['feature'][0]}", base64.b64decode(data[1])

    maps = {i: get(explorer, f"/api/feature-map?input={i}&feature={feature}")[1] for i in (0, 3)}
    assert maps[0] != maps[3]  # the two photos' maps of the feature differ: the check below can fail
    assert shown() == (f"input=0&feature={feature}", maps[0])
    src = lambda d: d.find_element(By.ID, "featuremap").get_attribute("src")  # noqa: E731
    browser.find_elements(By.CSS_SELECTOR, "#strip button")[3].click()
    WebDriverWait(browser, 120).until(lambda d: "input=3&" in src(d))
    assert shown() == (f"input=3&feature={feature}", maps[3])
    browser.find_elements(By.CSS_SELECTOR, "#strip button")[0].click()
    WebDriverWait(browser, 120).until(lambda d: "input=0&" in src(d))
    assert shown() == (f"input=0&feature={feature}", maps[0])


def test_the_features_listed_for_a_photo_are_those_firing_on_it(sae_explorer: SaeExplorer) -> None:
    """/api/features?input= lists the features that fire on that photo, the most often there first (the
    share of its positions, then the mean code): each one's share, mean and peak are its code's over the
    photo, recomputed here from the dictionary; another photo lists others."""
    import torch

    from hookviz.core.arrays import to_numpy
    from hookviz.sae import features
    from hookviz.sae.api import load_sae

    found = load_sae(sae_explorer.run, sae_explorer.loaded)
    listed = {}
    for i in (0, 5):
        status, body = get(sae_explorer.explorer, f"/api/features?input={i}")
        assert status == 200
        answer = json.loads(body)
        assert answer["input"] == i and answer["layer"] == "features.10" and answer["width"] == 128
        _, x, _ = sae_explorer.session.read(i)
        code = features.code_maps(found, sae_explorer.loaded.model, torch.from_numpy(x)[None])[0]
        flat = to_numpy(code.float()).reshape(128, -1)
        here, means, peaks = (flat > 0).mean(1), flat.mean(1), flat.max(1)
        got = [f["feature"] for f in answer["features"]]
        assert sorted(got) == [f for f in range(128) if here[f] > 0] and len(got) >= 4  # TopK: k=4 fire
        assert list(here[got]) == sorted(here[got], reverse=True)
        for a, b in itertools.pairwise(got):  # within a share, the larger mean code first
            assert here[a] > here[b] or means[a] >= means[b] - 1e-6
        np.testing.assert_allclose([f["here"] for f in answer["features"]], here[got], atol=1e-9)
        np.testing.assert_allclose([f["mean"] for f in answer["features"]], means[got], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose([f["peak"] for f in answer["features"]], peaks[got], rtol=1e-5, atol=1e-7)
        run = {f["feature"]: f["fired"] for f in sae_explorer.data["features"]}
        assert [f["fired"] for f in answer["features"]] == [run[f] for f in got]  # the run's, beside
        listed[i] = got
    assert listed[0] != listed[5]


def test_the_feature_list_follows_the_photo_picked(sae_explorer: SaeExplorer, browser: Any) -> None:  # noqa: F811
    """The features listed for one photo are listed again for each photo picked (its /api/features?input=
    order, which differs from the other's); a slow answer for a photo no longer picked is dropped."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    explorer, wait = sae_explorer.explorer, WebDriverWait(browser, PATIENCE)
    ranked = {
        i: [str(f["feature"]) for f in json.loads(get(explorer, f"/api/features?input={i}")[1])["features"]][
            :64
        ]
        for i in (0, 3)
    }
    assert ranked[0] != ranked[3]
    browser.set_script_timeout(PATIENCE)
    browser.get(explorer.url + "&input=0")
    wait.until(
        lambda d: (d.find_element(By.ID, "overlay").get_attribute("data-view") or "").startswith("input=0")
    )
    listed = "return [...document.querySelectorAll('#featurelist button')].map((b) => b.dataset.feature);"
    fresh = (
        "const l = document.getElementById('featurelist');"
        "return l.classList.contains('stale') ? null : l.dataset.input;"
    )
    browser.find_element(By.ID, "listfeatures").click()
    wait.until(lambda d: d.execute_script(fresh) == "0")
    assert browser.execute_script(listed) == ranked[0]
    browser.execute_script(HOLD, ["/api/features?", "input=3"])
    browser.find_element(By.CSS_SELECTOR, '#strip button[data-input="3"]').click()
    wait.until(lambda d: "listing" in d.find_element(By.ID, "featurestatus").text)
    assert browser.execute_script(fresh) is None  # photo 0's list, dimmed while photo 3's is on its way
    _a_late_answer_is_dropped(browser, (fresh, listed), ranked, 0, 3)
    assert "p3.png" in browser.find_element(By.ID, "featurestatus").text


def test_an_sae_run_s_model_options_are_the_explorer_s(sae_explorer: SaeExplorer, tmp_path: Path) -> None:
    """--sae DIR: the options `sae train` was given (its --input-size) are the explorer's where the command
    line does not give them again, as `sae features` and `explain` take them: the dictionary read at the grid
    it was trained on (an outside tester's explorer ran a 64-pixel run's dictionary on 224-pixel grids)."""
    import shutil

    from hookviz.cli.explore import _session
    from hookviz.cli.options import ModelOptions, RunOptions

    run = tmp_path / "sae"
    shutil.copytree(sae_explorer.run, run)
    config = json.loads((run / "config.json").read_text())
    config["options"] = {"model": "tests.conftest:TinyCNN", "weights": "none", "input_size": [40]}
    (run / "config.json").write_text(json.dumps(config))
    plain = RunOptions(device="cpu", quiet=True)
    given = ModelOptions(model="tests.conftest:TinyCNN", weights="none")
    again = dataclasses.replace(given, input_size=(56,))
    sessions = [_session([str(sae_explorer.folder)], m, plain, None, None, sae=s)
                for m, s in ((given, run), (given, None), (again, run))]  # fmt: skip
    try:
        assert [s.loaded.input_shape[-2:] for s in sessions] == [(40, 40), (224, 224), (56, 56)]
    finally:
        for s in sessions:
            s.close()


def _a_late_answer_is_dropped(
    page: Any,
    scripts: tuple[str, str],
    ranked: dict[int, list[str]],
    first: int,
    then: int,
    also: Callable[[Any], bool] = lambda d: True,
) -> None:
    """Photo ``first`` picked again while ``then``'s list is held back: ``first``'s list, and ``then``'s
    answer, released late, dropped; ``then`` picked again (nothing held): its own ranking. ``scripts``: the
    page's photo the list shown is for, and the list; ``also``: what else it shows before the release."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    fresh, listed = scripts
    wait = WebDriverWait(page, PATIENCE)
    page.find_element(By.CSS_SELECTOR, f'#strip button[data-input="{first}"]').click()
    wait.until(lambda d: d.execute_script(fresh) == str(first) and also(d))
    page.execute_script("window.release();")
    wait.until(lambda d: d.execute_script("return window.landed") == 1)
    assert page.execute_script(fresh) == str(first) and page.execute_script(listed) == ranked[first]
    page.execute_script("window.hold = null;")
    page.find_element(By.CSS_SELECTOR, f'#strip button[data-input="{then}"]').click()
    wait.until(lambda d: d.execute_script(fresh) == str(then))
    assert page.execute_script(listed) == ranked[then]
