"""`hookviz trust` on a detector under a budget: the clock read before each photo, the figures over the photos
explained within it (said in `dropped`), every candidate left out when none was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hookviz
from hookviz.engine.detection import explain_detections
from hookviz.evaluation import trust_clock
from hookviz.io.images import DEFAULT_MAX_PIXELS
from hookviz.io.shapes import shapes_scene
from hookviz.run import trust_detection
from hookviz.run.trust import read_photos
from hookviz.tasks import load_model
from tests.conftest import ROOT, write_image


class _Clock:
    """A clock that moves only when a photo is explained: one second each (the same cut whatever the load)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def explain_detections(self, *args: Any, **kwargs: Any) -> Any:
        self.now += 1.0
        return explain_detections(*args, **kwargs)


def test_a_budget_cuts_a_detectors_photos_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_model(f"{ROOT / 'examples' / 'shapes_detector.py'}:make_detector",
                        str(ROOT / "tests" / "fixtures" / "shapes_detector.safetensors"),
                        labels=["__background__", "square", "disc", "cross"])  # fmt: skip
    rng = np.random.default_rng(21)
    for i in range(4):
        img = shapes_scene(rng, 120, 160, 2, (9, 18))[0]
        write_image(tmp_path / f"d{i}.png", (img * 255).round().astype(np.uint8))
    whole = hookviz.trust(loaded, str(tmp_path), methods=["hirescam"])
    clock = _Clock()
    monkeypatch.setattr(trust_clock, "time", clock)
    monkeypatch.setattr(trust_detection, "explain_detections", clock.explain_detections)
    report = hookviz.trust(loaded, str(tmp_path), methods=["hirescam"], budget=1.5)
    assert clock.now == 2.0  # read before the third photo: spent
    said = "the budget of 1.5 s was spent"
    assert (
        report.partial
        and not report.left_out
        and report.answer.endswith(
            "(partial: 0 candidate(s) not tested and 2 tested on part of the photos within the budget)"
        )
    )
    full = {c.method: c for c in whole.candidates}
    boxes = 0
    for c in report.candidates:
        assert c.dropped == f"budget: its figures are over the first 2 of 4 photos only ({said})"
        got = c.tests["localisation"].per_photo  # a figure a box: the whole run's on the first 2 photos
        assert (
            got == full[c.method].tests["localisation"].per_photo[: len(got)]
            and 0 < len(got) < full[c.method].photos
        )
        boxes = len(got)
    assert boxes > 0 and not report.model_check.at_chance
    # Spent before the first photo (the model's load took it all): nothing tested, the model not judged.
    photos = read_photos(loaded, [str(tmp_path)], 16, DEFAULT_MAX_PIXELS)
    layer = whole.candidates[0].layer
    none = trust_detection.trust_detections(loaded, photos.batch, photos.names, [layer], ["hirescam"],
                                            budget=0.5, started=-1.0)  # fmt: skip
    assert none.candidates == [] and not none.model_check.at_chance and none.partial
    assert none.left_out == [f"hirescam at {layer}: not tested (the budget of 0.5 s was spent)",
                             "edges at -: not tested (the budget of 0.5 s was spent)"]  # fmt: skip
    assert none.answer.startswith("no answer: no candidate was tested within the budget")
