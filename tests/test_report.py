"""``hookviz report``: a static page over a run, checked in a real browser (headless Chromium, Selenium)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hookviz.cli import app
from hookviz.io.images import decode_png
from hookviz.report import build_report, latest_records
from tests.conftest import ball_video, invoke, write_image

FAST = ["--weights", "none", "--input-size", "64", "--device", "cpu"]
HOSTILE = '<img src=x onerror="window.pwned=1">.png'


def _browser_paths() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    paths = _browser_paths()
    if paths is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs Chromium and chromedriver (apt-get install chromium chromium-driver)")
        pytest.skip("no chromium/chromedriver here (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1300,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=paths[1]), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small run: four photos (one with a hostile name), one broken file, two methods x two layers."""
    d = tmp_path_factory.mktemp("report")
    photos = d / "in"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.jpg", "b.png", "c.png", HOSTILE):
        write_image(photos / name, rng.integers(0, 256, (60, 80, 3), dtype=np.uint8))
    (photos / "broken.png").write_text("not a picture")
    out = d / "out"
    r = CliRunner().invoke(
        app,
        ["gradcam", str(photos), *FAST, "--method", "gradcam", "--method", "layercam", "--layer", "layer3",
         "--layer", "layer4", "--out", str(out), "-q", "--report"],
    )  # fmt: skip
    assert r.exit_code == 1  # the broken file
    assert f"hookviz: report: {out / 'index.html'}" in r.stderr
    return out


def _open(browser: object, page: Path) -> None:
    browser.get(page.as_uri())  # type: ignore[attr-defined]


def test_the_page_loads_offline_with_a_card_per_input(browser: object, run: Path) -> None:
    _open(browser, run / "index.html")
    from selenium.webdriver.common.by import By

    cards = browser.find_elements(By.CSS_SELECTOR, "article.card")  # type: ignore[attr-defined]
    inputs = {json.loads(line)["input"] for line in (run / "manifest.jsonl").read_text().splitlines()}
    assert {c.get_attribute("data-input") for c in cards} == inputs and len(cards) == 5
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]  # type: ignore[attr-defined]
    assert not errors, errors
    images = browser.find_elements(By.CSS_SELECTOR, "article.card img")  # type: ignore[attr-defined]
    assert len(images) == 4 * 5  # 4 photos x (2 methods x 2 layers + the sheet)
    assert all(img.get_attribute("alt") for img in images)
    assert all(img.get_attribute("loading") == "lazy" for img in images)
    # Every thumbnail decodes from its relative path (file://, no server).
    browser.execute_script("document.querySelectorAll('img').forEach(i => i.loading = 'eager')")  # type: ignore[attr-defined]
    loaded = browser.execute_async_script(  # type: ignore[attr-defined]
        """const done = arguments[arguments.length - 1];
        const imgs = Array.from(document.querySelectorAll('article.card img'));
        Promise.all(imgs.map(i => i.decode().then(() => i.naturalWidth > 0, () => false))).then(done);"""
    )
    assert loaded and all(loaded)
    shot = decode_png(browser.get_screenshot_as_png())  # type: ignore[attr-defined]
    assert len(np.unique(shot.reshape(-1, 3), axis=0)) > 500  # pictures, text, colours: not blank
    assert "RANDOM weights" in browser.find_element(By.CSS_SELECTOR, ".warning").text  # type: ignore[attr-defined]


def test_filters_change_what_is_visible(browser: object, run: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _open(browser, run / "index.html")
    Select(browser.find_element(By.ID, "f-status")).select_by_visible_text("error")  # type: ignore[attr-defined]
    cards = browser.find_elements(By.CSS_SELECTOR, "article.card")  # type: ignore[attr-defined]
    assert [c.get_attribute("data-status") for c in cards] == ["error"]
    assert "not an image file" in cards[0].text
    Select(browser.find_element(By.ID, "f-status")).select_by_visible_text("all")  # type: ignore[attr-defined]
    Select(browser.find_element(By.ID, "f-method")).select_by_visible_text("layercam")  # type: ignore[attr-defined]
    Select(browser.find_element(By.ID, "f-layer")).select_by_visible_text("layer4")  # type: ignore[attr-defined]
    cards = browser.find_elements(By.CSS_SELECTOR, "article.card")  # type: ignore[attr-defined]
    images = browser.find_elements(By.CSS_SELECTOR, "article.card img")  # type: ignore[attr-defined]
    assert len(cards) == 4 and len(images) == 4
    assert all(".layercam.layer4.png" in i.get_attribute("src") for i in images)
    assert browser.find_element(By.ID, "summary").text == "4 of 5 inputs"  # type: ignore[attr-defined]


def test_a_hostile_file_name_stays_text(browser: object, run: Path) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, run / "index.html")
    assert browser.execute_script("return window.pwned === undefined")  # type: ignore[attr-defined]
    titles = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "article.card h2")]  # type: ignore[attr-defined]
    assert any(t.endswith(HOSTILE) for t in titles)
    assert not browser.find_elements(By.CSS_SELECTOR, 'img[src="x"]')  # type: ignore[attr-defined]
    html = (run / "index.html").read_text()
    assert "<img src=x" not in html and "\\u003cimg src=x" in html  # escaped in the data


def test_ten_thousand_records_page_by_page(browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    lines = []
    for i in range(10_000):
        ok = i % 10 != 0
        rec = {"input": f"photos/{i:05d}.jpg", "status": "ok" if ok else "error", "key": "k", "model": "m",
               "command": "gradcam", "weights": "w", "pretrained": True, "error": None if ok else "bad",
               "predicted": {"index": i % 7, "name": f"class {i % 7}", "score": (i % 100) / 100},
               "maps": [{"file": f"{i:05d}.gradcam.layer4.png", "method": "gradcam", "layer": "layer4",
                         "target": {"index": i % 7, "name": f"class {i % 7}", "score": 0.5}}],
               "outputs": [f"out/{i:05d}.gradcam.layer4.png"]}  # fmt: skip
        lines.append(json.dumps(rec))
    (tmp_path / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    page = build_report(tmp_path)
    _open(browser, page)
    assert len(browser.find_elements(By.CSS_SELECTOR, "article.card")) == 60  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "summary").text == "10000 of 10000 inputs"  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "page").text == "page 1 of 167"  # type: ignore[attr-defined]
    browser.find_element(By.ID, "next").click()  # type: ignore[attr-defined]
    first = browser.find_element(By.CSS_SELECTOR, "article.card")  # type: ignore[attr-defined]
    assert first.get_attribute("data-input") == "photos/00060.jpg"


def test_latest_record_per_input_and_settings_wins() -> None:
    lines = [
        json.dumps({"input": "a.jpg", "key": "k1", "status": "error"}),
        "not json",
        json.dumps({"input": "a.jpg", "key": "k1", "status": "ok"}),
        json.dumps({"input": "a.jpg", "key": "k2", "status": "ok"}),
    ]
    got = latest_records(lines)
    assert [(r["key"], r["status"]) for r in got] == [("k1", "ok"), ("k2", "ok")]


def test_report_command_and_its_errors(run: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["report", str(run), "--title", "My <b>run</b>"])
    assert r.exit_code == 0 and r.stdout.strip() == str(run / "index.html")
    assert "<title>My &lt;b&gt;run&lt;/b&gt;</title>" in (run / "index.html").read_text()
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "holds no manifest.jsonl" in r.stderr


def test_foreign_and_null_values_do_not_stop_the_page(browser: object, tmp_path: Path) -> None:
    """A null metric, a NaN score, a string where a dict belongs: every card still shows, with no script
    error, and a segmentation's score reads as a share of the pixels."""
    from selenium.webdriver.common.by import By

    recs = [
        {"input": "a.png", "status": "ok", "key": "k", "score": "share of pixels",
         "predicted": {"index": 3, "name": "class 3", "score": 1.0},
         "maps": [{"file": "a.gradcam.png", "method": "gradcam", "layer": "l",
                   "metrics": {"deletion_auc": None, "insertion_auc": 0.4}}]},
        {"input": "b.png", "status": "ok", "key": "k",
         "predicted": {"index": 1, "name": "cat", "score": None}, "maps": "oops"},
        {"input": "c.png", "status": "ok", "key": "k",
         "predicted": {"index": 2, "name": "dog", "score": 0.25}},
    ]  # fmt: skip
    lines = [json.dumps(r) for r in recs]
    lines.insert(1, '{"input": "d.png", "status": "ok", "predicted": {"score": NaN}}')  # Python's old NaN
    (tmp_path / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    _open(browser, build_report(tmp_path))
    cards = browser.find_elements(By.CSS_SELECTOR, "article.card")  # type: ignore[attr-defined]
    assert len(cards) == 4
    logs = browser.get_log("browser")  # type: ignore[attr-defined]
    errors = [e for e in logs if e["level"] == "SEVERE" and e.get("source") != "network"]  # no picture files
    assert not errors, errors
    text = {c.get_attribute("data-input"): c.text for c in cards}
    assert "class 3 100.0% of pixels" in text["a.png"] and "(3)" not in text["a.png"]
    assert "dog (2) p=0.250" in text["c.png"]
    assert "deletion" not in text["a.png"]  # a null metric is left out, not drawn as NaN


def test_a_video_run_plays_its_overlays_in_the_page(browser: object, tmp_path: Path) -> None:
    """A video model's run: a card per clip (with its frames and seconds) whose overlay WebM Chromium
    decodes and plays, and a card for the whole video's prediction."""
    from selenium.webdriver.common.by import By

    video = ball_video(tmp_path / "ball.mp4", size=(48, 40))
    net = str(Path(__file__).with_name("video_net.py")) + ":ShapesVideoNet"
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app,
        ["gradcam", str(video), "--model", net, "--weights", "none", "--input-size", "32",
         "--resize", "squash", "--clip-len", "8", "--clips", "2", "--out", str(out), "-q", "--report"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    _open(browser, out / "index.html")
    cards = browser.find_elements(By.CSS_SELECTOR, "article.card")  # type: ignore[attr-defined]
    assert len(cards) == 3
    parts = [c.find_element(By.CSS_SELECTOR, "p.meta").text for c in cards]
    assert any(p.startswith("clip 1/2 · frames") and p.endswith(" s") for p in parts)
    assert any(p.startswith("whole video: mean of 2 clips") for p in parts)
    browser.set_script_timeout(30)  # type: ignore[attr-defined]
    played = browser.execute_async_script(  # type: ignore[attr-defined]
        """const done = arguments[arguments.length - 1];
        const videos = Array.from(document.querySelectorAll("video"));
        const state = (v) => [v.videoWidth, v.readyState, v.currentTime, v.error ? v.error.code : 0];
        const playing = (v) => v.error || (v.readyState >= 2 && v.currentTime > 0);
        const start = Date.now();  // a loaded machine may take seconds: wait for play, up to 20 s
        const poll = () => videos.every(playing) || Date.now() - start > 20000
            ? done(videos.map(state)) : setTimeout(poll, 100);
        poll();"""
    )
    assert len(played) == 2
    for width, ready, now, error in played:
        assert error == 0 and width >= 32 and ready >= 2 and now > 0  # decoded, and playing


def test_report_skips_wrong_typed_records_with_a_warning(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    lines = [
        json.dumps({"input": "a.png", "status": "ok", "predicted": "tabby", "maps": "none", "outputs": 3}),
        json.dumps({"input": "b.png", "status": "ok", "maps": [{"file": "b.png", "metrics": {
            "deletion_auc": None, "insertion_auc": 0.5}}],
            "predicted": {"index": 1, "name": "x", "score": "hi"}}),
        "not json at all",
        json.dumps([1, 2]),
        json.dumps({"input": "seg.png", "status": "ok", "score": "share of pixels",
                    "predicted": {"index": 3, "name": "class 3", "score": 1.0}}),
    ]  # fmt: skip
    (out / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    r = invoke("report", str(out))
    assert r.exit_code == 0, r.stderr
    assert "manifest line 3 is not a hookviz record" in r.stderr and "line 4" in r.stderr
    page = (out / "index.html").read_text()
    data = json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0])
    cards = {c["input"]: c for c in data}
    assert set(cards) == {"a.png", "b.png", "seg.png"}
    assert cards["a.png"]["predicted"] is None and cards["a.png"]["pictures"] == []
    assert cards["b.png"]["pictures"][0]["metrics"] is None and cards["b.png"]["score"] is None
    assert cards["seg.png"]["share"] is True  # shown as a share of the pixels, not "p=1.000"


def _features_json(folder: Path) -> dict[str, object]:
    """A ``hookviz sae features`` folder as the command writes it: three features (one never fired), the
    first with a sheet and the classes its ablation lowers, one top patch named by a hostile file name."""
    (folder / "features").mkdir(parents=True)
    write_image(folder / "features" / "_blocks.10.f2.png", np.full((20, 40, 3), 200, np.uint8))
    edges = [0.0, 0.01, 0.1, 1.0]
    data = {
        "layer": "_blocks.10", "model": "efficientnet_lite0", "inputs": 5, "field": [35, 35], "skipped": [],
        "features": [
            {"feature": 0, "fired": 0.0, "top": [], "histogram": {"edges": edges, "counts": [980, 0, 0, 0]}},
            {"feature": 1, "fired": 0.05,
             "top": [{"input": "/x/in/b.jpg", "score": 0.7, "box": [1, 2, 30, 31], "cell": [0, 0]}],
             "histogram": {"edges": edges, "counts": [931, 10, 39, 0]}},
            {"feature": 2, "fired": 0.25, "sheet": "features/_blocks.10.f2.png",
             "top": [{"input": f"/x/in/{HOSTILE}", "score": 2.5, "box": [10, 20, 45, 55], "cell": [3, 2]},
                     {"input": "/x/in/a.jpg", "score": 1.25, "box": [0, 0, 35, 35], "cell": [0, 0]}],
             "histogram": {"edges": edges, "counts": [735, 5, 120, 120]},
             "classes": [{"class": 281, "name": "tabby", "logit_drop": 0.75}]},
        ],
    }  # fmt: skip
    (folder / "features" / "features.json").write_text(json.dumps(data))
    (folder / "config.json").write_text(json.dumps({"arch": "topk", "k": 16, "width": 3}))
    return data


def test_the_report_shows_an_sae_run_s_features(browser: object, tmp_path: Path) -> None:
    """hookviz report over a ``hookviz sae`` run folder (no manifest) shows its features, those with a sheet
    first then by how often they fire: the sheet, each top patch's input and box, the histogram's bars of
    the bins above zero scaled to the tallest, the classes; a run folder inside a run's output shows too."""
    from selenium.webdriver.common.by import By

    run = tmp_path / "sae"
    _features_json(run)
    r = invoke("report", str(run))
    assert r.exit_code == 0, r.output
    page = (run / "index.html").read_text()
    assert "2 of 3 fire over 5 input(s)" in page and "topk dictionary, k 16" in page
    browser.get((run / "index.html").as_uri())  # type: ignore[attr-defined]
    cards = browser.find_elements(By.CSS_SELECTOR, "#features .feature")  # type: ignore[attr-defined]
    assert [c.get_attribute("data-feature") for c in cards] == ["2", "1", "0"]
    first = cards[0]
    assert first.find_element(By.TAG_NAME, "img").get_attribute("src").endswith("features/_blocks.10.f2.png")
    items = [li.text for li in first.find_elements(By.CSS_SELECTOR, ".patches li")]
    assert items == [f"{HOSTILE} [10, 20, 45, 55] 2.5", "a.jpg [0, 0, 35, 35] 1.25"]
    bars = [b.get_attribute("style") for b in first.find_elements(By.CSS_SELECTOR, ".hist i")]
    assert bars == ["height: 4.2%;", "height: 100%;", "height: 100%;"]  # 5, 120, 120 of 120
    assert "tabby by 0.75" in first.find_element(By.CLASS_NAME, "classes").text
    assert browser.execute_script("return window.pwned") is None  # type: ignore[attr-defined]
    never = [b.get_attribute("style") for b in cards[2].find_elements(By.CSS_SELECTOR, ".hist i")]
    assert never == ["height: 0%;"] * 3  # feature 0 never fired
    outer = tmp_path / "out"
    outer.mkdir()
    shutil.copytree(run, outer / "sae-run")
    (outer / "manifest.jsonl").write_text("")
    page = build_report(outer).read_text()
    assert "(sae-run)" in page and 'src="sae-run/features/_blocks.10.f2.png"' in page
