"""All nine torchvision video classifiers (random weights) through gradcam, featuremaps, layers and summary
on a short generated video; their MACs against torchvision's published figures (``_ops``, 16-frame clips)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ball_video, invoke

pytestmark = pytest.mark.slow

#: What the sweep changes from each model's defaults to stay a few seconds on one core: one clip per video
#: (the weights ask for 1 to 12) and, where the architecture takes any size, shorter clips of smaller frames
#: (Swin3D's 32 frames at 224 are 88-282 GMACs). The MACs are checked at the published figures' size.
SMALLER = {
    "r3d_18": ["--clip-len", "8", "--input-size", "64"],
    "mc3_18": ["--clip-len", "8", "--input-size", "64"],
    "r2plus1d_18": ["--clip-len", "8", "--input-size", "64"],
    "s3d": ["--clip-len", "14"],  # its least: the head pools 2 x 7 x 7 at 224
    "mvit_v1_b": [],  # 16 frames at 224: its position embedding is for that size alone
    "mvit_v2_s": [],
    "swin3d_t": ["--clip-len", "4", "--input-size", "64"],
    "swin3d_s": ["--clip-len", "4", "--input-size", "64"],
    "swin3d_b": ["--clip-len", "4", "--input-size", "64"],
}


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twenty frames of a ball crossing a 96x72 picture, at 15 fps."""
    return ball_video(tmp_path_factory.mktemp("sweep") / "ball.mp4")


@pytest.mark.parametrize("name", sorted(SMALLER))
def test_every_torchvision_video_model(name: str, clip: Path, tmp_path: Path, built_once: None) -> None:
    import torchvision

    weights = torchvision.models.get_model_weights(name).DEFAULT
    common = ["--model", name, "--weights", "none", *SMALLER[name]]
    out = tmp_path / "out"
    res = invoke("gradcam", str(clip), *common, "--clips", "1", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.stdout.splitlines()]
    (one, whole) = recs
    (m,) = one["maps"]
    t, h, w = m["shape"]
    assert t >= 1 and h >= 2 and w >= 2 and m["finite"] and m["max"] >= m["min"]
    assert (
        whole["video"]["clips"] == 1
        and whole["video"]["name"] == weights.meta["categories"][whole["video"]["index"]]
    )
    assert any(o.endswith(".webm") for o in one["outputs"]) and any(
        o.endswith(".frames.png") for o in one["outputs"]
    )

    res = invoke("featuremaps", str(clip), *common, "--clips", "1", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout.splitlines()[0])["maps"]
    assert shown and all(len(s["shape"]) == 4 for s in shown)  # (C, T, H, W) per layer

    res = invoke("layers", "--model", name, *SMALLER[name][:2])
    assert res.exit_code == 0, res.output
    (marked,) = [line for line in res.stdout.splitlines() if "default Grad-CAM" in line]
    # "layer4 ... <- default Grad-CAM layer", or "avgpool ... <- its input is the default ... (avgpool:input)"
    default = marked.split()[0] if marked.endswith("layer") else marked.rsplit("(", 1)[1].rstrip(")")
    assert default == m["layer"]  # the layer gradcam used by default

    # MACs at the published figures' clip size (16 frames), within 1 %.
    size = "3,16,112,112" if name in ("r3d_18", "mc3_18", "r2plus1d_18") else "3,16,224,224"
    res = invoke("summary", "--model", name, "--weights", "none", "--input-size", size, "--format", "json")
    assert res.exit_code == 0, res.output
    macs = json.loads(res.stdout)["macs"]
    assert macs / 1e9 == pytest.approx(weights.meta["_ops"], rel=0.01)
    assert json.loads(res.stdout)["total_params"] == weights.meta["num_params"]
