"""A trust run read back by its key (:mod:`hookviz.run.verdicts`): ``gradcam --method auto`` draws the method
and layer a real trust run of the trained shapes CNN recommends, the same from Python as from the command
line; a run made on the first photos when none is found, kept and found again; a model no map of which can
be trusted refused in one line (exit 4); the badges the report and the explorer show."""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.errors import UntrustedError, UsageError
from hookviz.explore.server import Explorer
from hookviz.explore.session import Session
from hookviz.io.shapes import shapes_batch
from hookviz.jobs.build import CamSettings
from hookviz.report import build_report
from hookviz.run.runner import explain_inputs
from hookviz.run.verdicts import badge_for, choose, find_trust, read_trust, trust_key, trust_runs
from hookviz.tasks import load_model
from tests.conftest import PATIENCE, TinyCNN, invoke, records, write_image

#: The shapes CNN as the command line loads it: its class, its weights file, its input as it was trained.
AS_TRAINED = ["--input-size", "48", "--mean", "0,0,0", "--std", "1,1,1"]


@dataclass(frozen=True)
class Shapes:
    """The trained shapes CNN saved as a weights file, photos of shapes, and a trust run of it."""

    weights: Path
    photos: Path
    trust: Path

    @property
    def model(self) -> list[str]:
        return ["--model", "tests.conftest:TinyCNN", "--weights", str(self.weights), *AS_TRAINED]

    def loaded(self) -> Any:
        return load_model("tests.conftest:TinyCNN", str(self.weights), input_size=48, mean=(0.0, 0.0, 0.0),
                          std=(1.0, 1.0, 1.0), device="cpu")  # fmt: skip


def shape_photos(folder: Path, n: int, seed: int) -> Path:
    """``n`` scenes of one shape each (square, disc, cross), as PNG files."""
    folder.mkdir(parents=True)
    x, _, _ = shapes_batch(n, np.random.default_rng(seed))
    for i, image in enumerate(x):
        write_image(
            folder / f"s{i:02d}.png", (image.numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8)
        )
    return folder


@pytest.fixture(scope="module")
def shapes(trained: Any, tmp_path_factory: pytest.TempPathFactory) -> Shapes:
    """A trust run of the trained shapes CNN over 16 scenes: guided backprop first, then Grad-CAM."""
    d = tmp_path_factory.mktemp("verdicts")
    torch.save(trained.model.state_dict(), d / "shapes.pt")
    found = Shapes(d / "shapes.pt", shape_photos(d / "photos", 16, 5), d / "trust")
    r = invoke("trust", str(found.photos), *found.model, "--method", "guidedbackprop,gradcam",
               "--out", str(found.trust))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    return found


def _verdicts(trust: Path) -> dict[str, dict[str, Any]]:
    """Each method's candidate at the model's default layer, ``features`` (the run also tries the layers
    ``--layer auto`` would, Grad-CAM's verdicts there are their own; guided backprop is tested there only)."""
    data = json.loads((trust / "trust.json").read_text())
    return {c["method"]: c for c in data["candidates"] if c["layer"] == "features"}


@pytest.mark.slow
def test_auto_draws_what_a_real_trust_run_recommends(shapes: Shapes, tmp_path: Path) -> None:
    found = _verdicts(shapes.trust)
    # The run itself: guided backprop keeps much of its map with the classifier re-initialised (Adebayo et
    # al.; care or fails on the photos' PNGs), Grad-CAM changes with it and is recommended. Listed first,
    # guided backprop is what a choice that took the first candidate would draw.
    guided, cam = found["guidedbackprop"], found["gradcam"]
    assert guided["verdict"] in ("care", "fails") and guided["tests"]["randomisation"]["outcome"] != "pass"
    assert guided["tests"]["randomisation"]["value"] > cam["tests"]["randomisation"]["value"] + 0.1
    assert cam["verdict"] == "recommended", cam["reason"]
    out = tmp_path / "cli"
    r = invoke("gradcam", str(shapes.photos), *shapes.model, "--method", "auto", "--trust", str(shapes.trust),
               "--out", str(out), "-q")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    # Said on stderr, even with -q: the method, the layer and the run it came from.
    assert (
        f"--method auto chose gradcam at features, recommended by the trust run in {shapes.trust}" in r.stderr
    )
    assert "16 photo(s), seed 0" in r.stderr
    cli = sorted(records(out), key=lambda rec: rec["input"])
    assert len(cli) == 16 and {(m["method"], m["layer"]) for rec in cli for m in rec["maps"]} == {
        ("gradcam", "features")
    }
    # From Python, the library call gradcam makes: the same choice, the same settings key, the same maps.
    settings = CamSettings(methods=("auto",))
    py = explain_inputs(shapes.loaded(), str(shapes.photos), tmp_path / "py", settings, trust=shapes.trust)
    py = sorted(py, key=lambda rec: rec["input"])
    assert [rec["key"] for rec in py] == [rec["key"] for rec in cli]
    assert [rec["maps"][0]["max"] for rec in py] == pytest.approx([rec["maps"][0]["max"] for rec in cli])
    # The trust run is found by its key: the model and its weights' fingerprint, as the records have them.
    run = read_trust(shapes.trust)
    assert run.key == trust_key(shapes.loaded())
    assert run.key == {k: cli[0]["settings"][k] for k in ("model", "weights")}
    assert run.key["weights"].startswith("sha256:")


@pytest.mark.slow
def test_without_a_run_one_is_made_on_the_first_photos_and_kept(shapes: Shapes, tmp_path: Path) -> None:
    photos = shape_photos(tmp_path / "few", 3, 11)
    out = tmp_path / "out"
    r = invoke("gradcam", str(photos), *shapes.model, "--method", "auto", "--out", str(out))
    assert r.exit_code in (0, 4), r.stderr
    (made,) = out.glob("trust.*/trust.json")
    data = json.loads(made.read_text())
    assert data["key"] == read_trust(shapes.trust).key and len(data["photos"]) == 3
    assert "the trust run made now in" in r.stderr or "no map here can be trusted" in r.stderr
    # Its choice is the one choose() reads from the file it kept.
    try:
        chosen = choose(read_trust(made.parent))
    except UntrustedError:
        assert r.exit_code == 4
        return
    assert f"--method auto chose {chosen.method} at {chosen.layer}" in r.stderr
    assert {(m["method"], m["layer"]) for rec in records(out) for m in rec["maps"]} == {
        (chosen.method, chosen.layer)
    }
    # Found again, not made again: the next run into this folder reads it.
    before = made.stat().st_mtime_ns
    r = invoke("gradcam", str(photos), *shapes.model, "--method", "auto", "--out", str(out), "--overwrite")
    assert r.exit_code == 0 and "made now" not in r.stderr and made.stat().st_mtime_ns == before


@pytest.mark.slow
def test_a_model_no_map_of_which_can_be_trusted_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(1)
    torch.save(TinyCNN().state_dict(), tmp_path / "random.pt")
    photos = shape_photos(tmp_path / "photos", 8, 5)
    model = ["--model", "tests.conftest:TinyCNN", "--weights", str(tmp_path / "random.pt"), *AS_TRAINED]
    r = invoke("trust", str(photos), *model, "--method", "gradcam", "--out", str(tmp_path / "trust"))
    assert r.exit_code == 0, r.stderr
    assert json.loads((tmp_path / "trust" / "trust.json").read_text())["answer"].startswith(
        "no map here can be trusted"
    )
    out = tmp_path / "out"
    r = invoke("gradcam", str(photos), *model, "--method", "auto", "--trust", str(tmp_path / "trust"),
               "--out", str(out))  # fmt: skip
    # One line, exit 4, nothing drawn.
    assert r.exit_code == 4, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("hookviz: error: --method auto: the trust run in")
    assert "says no map here can be trusted" in r.stderr and "name a --method to draw one anyway" in r.stderr
    assert not (out / "manifest.jsonl").exists()
    loaded = load_model("tests.conftest:TinyCNN", str(tmp_path / "random.pt"), input_size=48,
                        mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), device="cpu")  # fmt: skip
    with pytest.raises(UntrustedError, match="no map here can be trusted"):
        explain_inputs(loaded, str(photos), tmp_path / "py", CamSettings(methods=("auto",)),
                       trust=tmp_path / "trust")  # fmt: skip


@pytest.mark.slow
def test_auto_refuses_what_cannot_work_in_one_line(shapes: Shapes, tmp_path: Path) -> None:
    base = ["gradcam", str(shapes.photos), *shapes.model, "--out", str(tmp_path / "o")]
    for extra, said in [
        (["--method", "auto,gradcam"], "--method auto stands alone"),
        (["--method", "auto", "-l", "features"], "--method auto chooses the layer too"),
        (["--method", "gradcam", "--trust", str(shapes.trust)], "goes with --method auto"),
        (["--method", "auto", "--trust", str(tmp_path)], "holds no trust.json"),
    ]:
        r = invoke(*base, *extra)
        assert r.exit_code == 2 and said in r.stderr, (extra, r.stderr)
    # A trust run of other weights is not this model's: named, refused.
    torch.save(TinyCNN().state_dict(), tmp_path / "other.pt")
    other = ["--model", "tests.conftest:TinyCNN", "--weights", str(tmp_path / "other.pt"), *AS_TRAINED]
    r = invoke("gradcam", str(shapes.photos), *other, "--method", "auto", "--trust", str(shapes.trust),
               "--out", str(tmp_path / "o2"))  # fmt: skip
    assert r.exit_code == 2 and "holds trust runs of tests.conftest:TinyCNN (weights sha256:" in r.stderr
    assert not (tmp_path / "o" / "manifest.jsonl").exists() and not (tmp_path / "o2").exists()


def _report(path: Path, model: str, weights: str, verdicts: dict[str, str]) -> Path:
    """A trust.json as ``hookviz trust`` writes it, with made-up figures: one candidate per method."""
    test = {"name": "class", "value": 0.7, "ci": 0.05, "outcome": "care", "rule": "r", "per_photo": [0.7]}
    candidates = [
        {"method": m, "layer": "layer4", "verdict": v, "reason": f"{v} because", "control": False,
         "tests": {"class": {**test, "outcome": {"recommended": "pass", "fails": "fail"}.get(v, v)}}}
        for m, v in verdicts.items()
    ]  # fmt: skip
    data = {
        "model": model, "photos": ["a", "b"], "seed": 0, "candidates": candidates, "default": None,
        "answer": "recommended: x", "notes": [], "key": {"model": model, "weights": weights},
        "model_check": {"entropy": 0.1, "flips": 0.0, "same_class": False, "at_chance": False,
                        "reason": "ok"},
    }  # fmt: skip
    path.mkdir(parents=True)
    (path / "trust.json").write_text(json.dumps(data))
    return path


def test_runs_are_found_by_key_newest_first_and_badged(tmp_path: Path) -> None:
    old = _report(tmp_path / "a", "resnet18", "IMAGENET1K_V1", {"gradcam": "care", "saliency": "fails"})
    new = _report(tmp_path / "b", "resnet18", "IMAGENET1K_V1", {"gradcam": "recommended"})
    _report(tmp_path / "c", "resnet18", "none", {"gradcam": "recommended"})
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "trust.json").write_text('{"model": "x"}')  # not a report: left out, and said
    os.utime(old / "trust.json", (1, 1))
    said: list[str] = []
    run = find_trust({"model": "resnet18", "weights": "IMAGENET1K_V1"}, [tmp_path], said.append)
    assert run is not None and run.folder == new
    assert len(said) == 1 and "not a trust.json hookviz trust wrote" in said[0]
    assert find_trust({"model": "resnet50", "weights": "IMAGENET1K_V1"}, [tmp_path]) is None
    assert len(trust_runs([tmp_path])) == 3
    first = read_trust(old)
    care = badge_for(first, "gradcam", "layer4")
    assert care is not None and care["verdict"] == "care" and care["label"] == "care: class"
    assert "class 0.70 ± 0.05 (care)" in care["title"] and str(old) in care["title"]
    assert badge_for(first, "saliency", "other")["label"] == "fails: class"  # type: ignore[index]
    assert badge_for(first, "layercam") is None
    assert choose(first).method == "gradcam" and choose(first).verdict == "care"
    # A trust.json without a key (an older hookviz) is named, never matched.
    data = json.loads((new / "trust.json").read_text())
    del data["key"]
    (new / "trust.json").write_text(json.dumps(data))
    with pytest.raises(UsageError, match="has no key"):
        read_trust(new)


def _page_data(page: Path) -> list[dict[str, Any]]:
    """The cards the report's page draws (its JSON data, as the page's script reads it)."""
    text = page.read_text()
    tag = '<script type="application/json" id="data">'
    start = text.index(tag) + len(tag)
    return json.loads(text[start : text.index("</script>", start)])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_the_report_and_the_explorer_show_each_methods_verdict(shapes: Shapes, tmp_path: Path) -> None:
    found = _verdicts(shapes.trust)
    out = tmp_path / "cams"
    r = invoke("gradcam", str(shapes.photos), *shapes.model, "--method", "gradcam,guidedbackprop,layercam",
               "--out", str(out), "-q")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    page = build_report(out, trust=[shapes.trust])
    pictures = [p for c in _page_data(page) for p in c["pictures"]]
    shown = {(p["method"], (p.get("verdict") or {}).get("verdict")) for p in pictures}
    # Each map carries its method's verdict from the trust run; layercam, which it did not test, none (nor the
    # sheet of the three).
    assert shown == {
        ("gradcam", "recommended"),
        ("guidedbackprop", found["guidedbackprop"]["verdict"]),
        ("layercam", None),
        ("sheet", None),
    }
    html = page.read_text()
    assert f"verdicts from the trust run in {shapes.trust}" in html
    # Without --trust, a run in a subfolder of OUT is found alike; a run of other weights is not.
    shutil.copytree(shapes.trust, out / "trust")
    cards = _page_data(build_report(out))
    assert {p["method"]: p["verdict"]["label"] for c in cards for p in c["pictures"] if p.get("verdict")} == {
        "gradcam": badge_for(read_trust(shapes.trust), "gradcam", "features")["label"],  # type: ignore[index]
        "guidedbackprop": badge_for(read_trust(shapes.trust), "guidedbackprop")["label"],  # type: ignore[index]
    }
    assert "randomisation" in badge_for(read_trust(shapes.trust), "guidedbackprop")["label"]  # type: ignore[index]
    # The explorer's method list, through its API.
    session = Session(shapes.loaded(), [str(shapes.photos)], trust=read_trust(shapes.trust))
    explorer = Explorer(session)
    thread = threading.Thread(target=explorer.serve_forever, daemon=True)
    thread.start()
    try:
        port = explorer.server_address[1]
        url = f"http://127.0.0.1:{port}/api/methods?token={explorer.token}"
        with urllib.request.urlopen(url, timeout=PATIENCE) as answer:
            listed = {m["name"]: m.get("trust") for m in json.loads(answer.read())}
    finally:
        explorer.shutdown()
        explorer.server_close()
        session.close()
    assert listed["gradcam"]["verdict"] == found["gradcam"]["verdict"]
    assert listed["guidedbackprop"]["verdict"] == found["guidedbackprop"]["verdict"] != "recommended"
    assert listed["guidedbackprop"]["layer"] == "features"
    assert "randomisation" in listed["guidedbackprop"]["title"] and listed["layercam"] is None
