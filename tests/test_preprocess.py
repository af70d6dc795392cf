"""The pixels a model sees are those of its own evaluation pipeline: torchvision's weights transforms, timm's
data config as the model was built, Hugging Face image processors; checked on the sample photos."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from hookviz.io.images import Preprocess, load_rgb
from hookviz.models.sources import Built
from tests.conftest import SAMPLES

PHOTOS = sorted(SAMPLES.glob("*.jpg"))


@pytest.mark.parametrize(
    "weights",
    [
        torchvision.models.ResNet50_Weights.IMAGENET1K_V2,  # 232 → 224, bilinear
        torchvision.models.ViT_B_16_Weights.IMAGENET1K_V1,
        torchvision.models.EfficientNet_V2_S_Weights.IMAGENET1K_V1,  # 384 → 384, bilinear
        torchvision.models.Inception_V3_Weights.IMAGENET1K_V1,  # 342 → 299
        torchvision.models.RegNet_Y_16GF_Weights.IMAGENET1K_SWAG_E2E_V1,  # 384, bicubic
    ],
    ids=str,
)
def test_torchvision_weights_transform_reproduced_exactly(weights: object) -> None:
    from hookviz.models.torchvision import preprocess_of

    transform = weights.transforms()  # type: ignore[attr-defined]
    ours = preprocess_of(transform)
    assert len(PHOTOS) >= 4
    for photo in PHOTOS:
        rgb = load_rgb(photo)
        x, box = ours(rgb)
        expected = transform(Image.open(photo).convert("RGB")).numpy()
        assert x.shape == expected.shape
        assert float(np.abs(x - expected).mean()) <= 1e-6, photo.name
        # The box is where the crop lies on the photo: its centre, the crop's share of the shorter side.
        side = min(rgb.shape[:2]) * transform.crop_size[0] / transform.resize_size[0]
        assert abs(box.width - side) <= 2 and abs(box.height - side) <= 2
        assert abs((box.x0 + box.x1) / 2 - rgb.shape[1] / 2) <= 1


def test_same_top1_as_torchvision_transform_on_a_trained_network() -> None:
    """A network whose decision hangs on small pixel differences (trained on nothing, so its top-1 is as
    fragile as can be) gives the same class on our input as on torchvision's, for every sample photo."""
    weights = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    from hookviz.models.torchvision import preprocess_of

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    ours = preprocess_of(weights.transforms())
    with torch.no_grad():
        for photo in PHOTOS:
            x, _ = ours(load_rgb(photo))
            theirs = weights.transforms()(Image.open(photo).convert("RGB"))
            a, b = model(torch.from_numpy(x)[None]), model(theirs[None])
            assert int(a.argmax()) == int(b.argmax())
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


TIMM_MODELS = ["test_resnet", "vit_little_patch16_reg4_gap_256", "test_vit?img_size=64", "test_convnext"]


@pytest.mark.parametrize("spec", TIMM_MODELS)
def test_timm_data_config_of_the_model_as_built(spec: str) -> None:
    timm = pytest.importorskip("timm")
    from hookviz.tasks import load_model

    lm = load_model(f"timm:{spec}", "none")
    name, _, query = spec.partition("?")
    kwargs = {"img_size": int(query.split("=")[1])} if query else {}
    model = timm.create_model(name, pretrained=False, **kwargs)
    data = timm.data.resolve_data_config(
        {"input_size": (3, *([kwargs["img_size"]] * 2))} if kwargs else {}, model=model
    )
    transform = timm.data.create_transform(**data, is_training=False)
    assert lm.preprocess.crop_size == data["input_size"][-1]
    for photo in PHOTOS:
        x, _ = lm.preprocess(load_rgb(photo))
        expected = transform(Image.open(photo).convert("RGB")).numpy()
        assert x.shape == expected.shape, (x.shape, expected.shape)
        assert float(np.abs(x - expected).mean()) <= 1e-6, photo.name


PROCESSORS = [
    ("ViTImageProcessor", {}),  # squash to 224
    ("DeiTImageProcessor", {}),  # squash to 256, centre crop 224
    ("ConvNextImageProcessor", {}),  # shortest edge 384: squashed, no crop
    ("ConvNextImageProcessor", {"size": {"shortest_edge": 224}}),  # int(224 / 0.875) = 256, crop 224
    ("CLIPImageProcessor", {}),  # shortest edge 224, centre crop 224, bicubic
]


@pytest.mark.parametrize(("cls", "kwargs"), PROCESSORS, ids=[f"{c}{k}" for c, k in PROCESSORS])
def test_hugging_face_image_processors(cls: str, kwargs: dict[str, object]) -> None:
    transformers = pytest.importorskip("transformers")
    from hookviz.models.hf import _preprocessing

    proc = getattr(transformers, cls)(**kwargs)
    with tempfile.TemporaryDirectory() as where:
        proc.save_pretrained(where)
        built = Built(torch.nn.Identity(), "m", "none", False, "none", (), Preprocess())
        _preprocessing(built, where, None)
    for photo in PHOTOS:
        rgb = load_rgb(photo)
        x, _ = built.preprocess(rgb)
        expected = proc(Image.fromarray(rgb), return_tensors="pt")["pixel_values"][0].numpy()
        assert x.shape == expected.shape
        # transformers 5 resizes with torch's antialiased kernel, not PIL's. Every value within two 8-bit
        # levels of the processor's (the kernels' last bits round some pixels the other way: 1 % of a level on
        # average here, 12 % under ATEN_CPU_CAPABILITY=default), and few of them off at all.
        level = 1 / 255 / min(float(v) for v in getattr(proc, "image_std", None) or [1.0])
        diff = np.abs(x - expected)
        assert float(diff.max()) <= 2.01 * level and float(diff.mean()) <= 0.25 * level, photo.name


def test_a_size_the_model_cannot_take_is_one_exit_3_line(tmp_path: Path) -> None:
    from tests.conftest import invoke, write_image

    photo = write_image(tmp_path / "p.png", np.zeros((40, 40, 3), np.uint8))
    r = invoke("gradcam", str(photo), "--model", "vit_b_16", "--weights", "none", "--input-size", "64",
               "--out", str(tmp_path / "o"), "-q")  # fmt: skip
    assert r.exit_code == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot take a 3x64x64 input" in lines[0] and "Traceback" not in r.stderr
