"""Every torchvision classifier (up to 200 M parameters) through gradcam, featuremaps and summary with the
defaults: random weights, one process, the CLI as a user calls it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torchvision
from typer.testing import CliRunner

from hookviz.cli import app
from hookviz.models.torchvision import list_models
from tests.conftest import write_image

MAX_PARAMS = 200_000_000


def _published_params(name: str) -> int:
    """torchvision's own parameter count for the architecture, from its weights' metadata (no download)."""
    return int(torchvision.models.get_model_weights(name).DEFAULT.meta["num_params"])


def _expected_params(name: str) -> int:
    """The parameters of the model ``--weights none`` builds: torchvision's published count, except for
    googlenet, whose pretrained weights come without the two auxiliary heads that a random-init
    googlenet has (counted here from the module itself)."""
    if name == "googlenet":
        model = torchvision.models.googlenet(weights=None, init_weights=False)
        return sum(p.numel() for p in model.parameters())
    return _published_params(name)


@pytest.mark.slow
def test_every_torchvision_classifier_works_with_the_defaults(tmp_path: Path, built_once: None) -> None:
    photo = write_image(
        tmp_path / "photo.jpg", np.random.default_rng(0).integers(0, 256, (150, 200, 3), dtype=np.uint8)
    )
    names = [n for n in list_models() if _published_params(n) <= MAX_PARAMS]
    assert len(names) >= 70  # all but the four giants (regnet_y_128gf, vit_h_14, vit_l_16, vit_l_32)
    runner = CliRunner()
    failures: list[str] = []
    for name in names:
        out = tmp_path / name
        common = [str(photo), "--model", name, "--weights", "none", "--out", str(out), "-q", "--json"]
        r = runner.invoke(app, ["gradcam", *common])
        if r.exit_code != 0:
            failures.append(f"{name} gradcam: {r.stderr.strip()}")
        else:
            (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
            (cam,) = rec["maps"]
            if not (cam["finite"] and Path(rec["outputs"][0]).stat().st_size > 0):
                failures.append(f"{name} gradcam: map not finite or no file")
        r = runner.invoke(app, ["featuremaps", *common])
        if r.exit_code != 0:
            failures.append(f"{name} featuremaps: {r.stderr.strip()}")
        else:
            (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
            if not rec["maps"] or len(rec["outputs"]) != len(rec["maps"]) or rec["predicted"] is None:
                failures.append(
                    f"{name} featuremaps: {len(rec['outputs'])} files for {len(rec['maps'])} maps"
                )
        r = runner.invoke(app, ["summary", "--model", name, "--format", "json"])
        if r.exit_code != 0:
            failures.append(f"{name} summary: {r.stderr.strip()}")
        elif json.loads(r.stdout)["total_params"] != _expected_params(name):
            failures.append(f"{name} summary: {json.loads(r.stdout)['total_params']} params")
    assert not failures, "\n".join(failures)
