"""Every ``--metric`` family through ``evaluate`` on models built the way torchvision builds them: a ResNet, a
MobileNetV3 (Hardswish, SE blocks), a segmentation DeepLabV3 (its class read over its region) and a Swin
(channels-last maps); random weights, small inputs, one photo, the CLI as a user calls it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hookviz.cli import app
from hookviz.evaluation.families import FIGURES
from tests.conftest import evaluation_file, write_image


@pytest.mark.slow
@pytest.mark.parametrize(
    "model", ["resnet18", "mobilenet_v3_small", "deeplabv3_mobilenet_v3_large", "swin_t"]
)
def test_every_family_runs_on(model: str, tmp_path: Path) -> None:
    photo = write_image(
        tmp_path / "p.png", np.random.default_rng(0).integers(0, 256, (80, 96, 3), dtype=np.uint8)
    )
    size = "64"
    r = CliRunner().invoke(
        app, ["evaluate", str(photo), "--model", model, "--weights", "none", "--input-size", size,
              "--metric", "all", "--method", "gradcam", "--method", "layercam", "--robust-samples", "2",
              "--regions", "4", "--out", str(tmp_path / "o"), "-q"],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    rows = {r["method"]: r for r in json.loads(evaluation_file(tmp_path / "o").read_text())["rows"]}
    assert set(rows) == {"gradcam", "layercam", "random", "center"}
    image_level = [f for f, spec in FIGURES.items() if spec[0] != "localisation"]
    names = {"increase": "increase_in_confidence"}
    for method in ("gradcam", "layercam"):
        missing = [f for f in image_level if names.get(f, f) not in rows[method]]
        assert not missing, (method, missing)
