"""The gradcam job builder as library code: task dispatch, default and automatic layers, and notes as data."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hookviz.core.targets import Top
from hookviz.errors import UsageError
from hookviz.jobs import CamJob, DetectionJob
from hookviz.jobs.build import auto_line
from hookviz.jobs.settings import CamSettings
from hookviz.tasks import load_model, make_cam_job


def test_settings_are_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        CamSettings(("layer4",))  # type: ignore[misc]
    s = CamSettings(layers=("layer4",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.alpha = 1.0  # type: ignore[misc]


def test_a_classifier_gets_a_cam_job_at_its_pooling_input_with_the_note() -> None:
    lm = load_model("resnet18", "none", input_size=64)
    built = make_cam_job(lm, CamSettings(methods=("gradcam", "scorecam"), target="top2"))
    assert isinstance(built.job, CamJob) and list(built.job.layers) == ["layer4"]
    assert built.job.targets == Top(2) and built.auto is None
    using, cost = built.notes
    assert using.startswith("using layer layer4") and "entering its global pooling" in using
    assert "Score-CAM runs 512 forward passes per image at layer4" in cost
    named = make_cam_job(lm, CamSettings(layers=("layer3", "avgpool:input")))
    assert list(named.job.layers) == ["layer3", "avgpool:input"] and named.notes == ()


def test_layer_auto_is_chosen_on_the_first_images_and_agreed() -> None:
    lm = load_model("resnet18", "none", input_size=64)
    seen = []

    def agree(value: dict[str, object]) -> dict[str, object]:
        seen.append(value)
        return value

    built = make_cam_job(
        lm, CamSettings(layers=("auto",)), first_images=lambda n: torch.rand(n, 3, 64, 64), agree=agree
    )
    assert built.auto is not None and seen == [built.auto]
    assert list(built.job.layers) == [built.auto["chosen"]] and built.auto["images"] == 8  # --probe's 8
    assert auto_line(built.auto).startswith(f"--layer auto chose {built.auto['chosen']}")
    with pytest.raises(UsageError, match="needs at least one readable image"):
        make_cam_job(lm, CamSettings(layers=("auto",)), first_images=lambda n: None)


def test_a_detector_gets_a_detection_job_and_refusals() -> None:
    lm = load_model("fasterrcnn_mobilenet_v3_large_320_fpn", "none")
    built = make_cam_job(lm, CamSettings())
    assert isinstance(built.job, DetectionJob) and list(built.job.methods) == ["hirescam"]
    assert any("using HiResCAM for a detector" in n for n in built.notes)
    for settings, said in (
        (CamSettings(metrics=True), "--metrics"),
        (CamSettings(layers=("auto",)), "--layer auto"),
        (CamSettings(target="top3"), "name classes to keep"),
    ):
        with pytest.raises(UsageError, match=said):
            make_cam_job(lm, settings)
