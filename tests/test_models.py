"""Models and weights: names, DEFAULT through the hub cache, files loaded safely, default CAM layers."""

from __future__ import annotations

import json
import os
import urllib.error
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision

from hookviz.core.layers import default_cam_layer
from hookviz.engine.explain import explain
from hookviz.errors import DeviceError, ModelNotFoundError, TargetError, UsageError, WeightsError
from hookviz.models.classes import parse_target
from hookviz.models.loaded import probe, resolve_device
from hookviz.tasks import load_model
from tests.conftest import (
    invoke,
    write_image,
)


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_unknown_model_suggests_close_matches() -> None:
    with pytest.raises(ModelNotFoundError, match="unknown model 'resnet19'; did you mean 'resnet18'"):
        load_model("resnet19", "none")


def test_weights_none_is_random_and_says_so() -> None:
    lm = load_model("resnet18", "none")
    assert not lm.pretrained and lm.weights == "none (random init)"
    assert len(lm.categories) == 1000 and lm.preprocess.crop_size == 224
    assert not lm.model.training


def test_default_weights_come_from_the_torch_hub_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real download path, pointed at a local cache through TORCH_HOME (no network)."""
    reference = torchvision.models.resnet18(weights=None)
    weights = torchvision.models.ResNet18_Weights.DEFAULT
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(reference.state_dict(), cache / os.path.basename(weights.url))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    lm = load_model("resnet18", "DEFAULT")
    assert lm.pretrained and lm.weights == "DEFAULT (IMAGENET1K_V1)"
    assert lm.categories[281] == "tabby"
    assert _same(lm.model, reference)
    assert (lm.preprocess.crop_size, lm.preprocess.resize_size) == (224, 256)


def test_default_weights_unavailable_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(WeightsError) as info:
        load_model("resnet18", "DEFAULT")
    msg = str(info.value)
    assert "--weights PATH" in msg and "--weights none" in msg and "Name or service not known" in msg
    assert info.value.exit_code == 3


@pytest.mark.parametrize("wrap", ["bare", "state_dict", "model", "ddp"])
def test_weights_file_formats(tmp_path: Path, wrap: str) -> None:
    ref = torchvision.models.resnet18(weights=None, num_classes=10)
    sd = ref.state_dict()
    obj: object = {
        "bare": sd,
        "state_dict": {"state_dict": sd, "epoch": 3},
        "model": {"model": sd, "optimizer": {}},
        "ddp": {f"module.{k}": v for k, v in sd.items()},
    }[wrap]
    path = tmp_path / "w.pth"
    torch.save(obj, path)
    lm = load_model("resnet18", str(path))
    assert lm.pretrained and lm.weights == str(path)
    assert lm.model.fc.out_features == 10  # a fine-tuned head is recognised
    assert _same(lm.model, ref)
    assert lm.categories == ()


def test_weights_for_another_architecture_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "r34.pth"
    torch.save(torchvision.models.resnet34(weights=None).state_dict(), path)
    with pytest.raises(WeightsError, match=r"does not fit resnet18: .*unexpected key.*layer1\.2.*--model"):
        load_model("resnet18", str(path))


def test_code_carrying_pickle_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pth"
    torch.save({"state_dict": Evil()}, path)
    with pytest.raises(WeightsError, match="refused.*could run code"):
        load_model("resnet18", str(path))
    assert not marker.exists()


def test_corrupt_and_missing_weights_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"this is not a checkpoint")
    with pytest.raises(WeightsError, match="not a readable PyTorch weights file"):
        load_model("resnet18", str(bad))
    with pytest.raises(UsageError, match="no such file, and not a weights name for resnet18"):
        load_model("resnet18", str(tmp_path / "nope.pth"))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("resnet18", "layer4"),
        ("mobilenet_v2", "features"),
        ("vgg11", "features.18"),
        # norm5's output is a BatchNorm's (signed); the pooling gets F.relu of it, in densenet's forward
        ("densenet121", "adaptive_avg_pool2d:input"),
    ],
)
def test_default_cam_layer_is_the_last_convolutional_stage(name: str, expected: str) -> None:
    lm = load_model(name, "none", input_size=64)
    assert default_cam_layer(lm.model, probe(lm)) == expected


def test_targets_by_index_and_name() -> None:
    lm = load_model("resnet18", "none")
    assert parse_target("top1", lm, 1000) is None
    assert parse_target("281", lm, 1000) == 281
    assert parse_target("Tabby", lm, 1000) == 281
    with pytest.raises(TargetError, match="out of range: resnet18 has classes 0..999"):
        parse_target("1000", lm, 1000)
    with pytest.raises(TargetError, match="did you mean 'tabby'"):
        parse_target("tabbby", lm, 1000)


def test_devices() -> None:
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(DeviceError, match="CUDA is not available on this machine; use --device cpu"):
            resolve_device("cuda")
    with pytest.raises(DeviceError, match="not a device"):
        resolve_device("gpu0")


def test_a_model_that_cannot_take_the_default_size_asks_for_the_size_it_was_built_for(tmp_path: Path) -> None:
    """A fixed-size MONAI volume network (a Regressor built for 32³) run at the default 64³: the hint asks for
    ``--input-size D,H,W`` (not "leave --input-size out", which was not given); with a wrong size given,
    the hint is to leave it out."""
    pytest.importorskip("monai")
    import numpy as np

    from tests.conftest import invoke

    np.save(tmp_path / "v.npy", np.random.default_rng(1).normal(size=(32, 32, 32)).astype(np.float32))
    spec = "monai:Regressor?in_shape=(1,32,32,32)&out_shape=(2,)&channels=(4,8)&strides=(2,2)"
    for extra, said in (
        ([], "cannot take a 1x64x64x64 input"),
        (["--input-size", "24,24,24"], "cannot take a 1x24x24x24 input"),
    ):
        r = invoke("gradcam", str(tmp_path / "v.npy"), "--model", spec, "--weights", "none", *extra,
                   "--out", str(tmp_path / "o"))  # fmt: skip
        assert r.exit_code == 3 and said in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert ("leave --input-size out" in r.stderr) == bool(extra), r.stderr
        assert ("give it with --input-size D,H,W" in r.stderr) != bool(extra), r.stderr
    r = invoke("gradcam", str(tmp_path / "v.npy"), "--model", spec, "--weights", "none", "--input-size",
               "32,32,32", "--out", str(tmp_path / "ok"))  # fmt: skip
    assert r.exit_code == 0, r.stderr


def test_labels_duplicates_keras_json_imagenet_and_class_n(tmp_path: Path) -> None:
    from hookviz.errors import TargetError
    from hookviz.models.classes import find_class, parse_target, parse_targets, read_labels
    from hookviz.tasks import load_model

    with pytest.raises(TargetError, match="classes 1, 3 all have this name"):
        find_class("crane", ["a", "crane", "b", "crane"])
    keras = tmp_path / "imagenet_class_index.json"
    keras.write_text(json.dumps({"0": ["n01440764", "tench"], "1": ["n01443537", "goldfish"]}))
    assert read_labels(keras) == ("tench", "goldfish")
    lm = load_model("resnet18", "none", labels="imagenet")
    assert lm.categories[281] == "tabby" and lm.describe(281) == "tabby (281)"
    plain = load_model("resnet18", "none", labels=[f"c{i}" for i in range(1000)])
    object.__setattr__(plain, "categories", ())
    assert plain.describe(282) == "class 282"  # not "class 282 (282)"
    assert parse_target("class 3", plain, 1000) == 3
    for bad in ("²", "top²", "3²"):
        with pytest.raises(TargetError):
            parse_targets(bad, plain, 1000)


def test_a_wrapper_prefix_on_every_key_is_stripped(tmp_path: Path) -> None:
    from tests.shapes_net import ShapesNet

    torch.manual_seed(3)
    net = ShapesNet()
    for prefix in ("model.", "net.", "model.module."):
        path = tmp_path / f"{prefix.strip('.')}.ckpt"
        torch.save({"state_dict": {prefix + k: v for k, v in net.state_dict().items()}}, path)
        from hookviz.tasks import load_model

        lm = load_model("tests.shapes_net:make", str(path), input_size=48)
        for k, v in net.state_dict().items():
            torch.testing.assert_close(lm.model.state_dict()[k], v)


def test_timm_levit_defaults_to_its_token_map() -> None:
    timm = pytest.importorskip("timm")
    from hookviz.core.hooks import trace_shapes
    from hookviz.core.layers import default_cam_layer

    model = timm.create_model("levit_128s", pretrained=False).eval()
    layer = default_cam_layer(model, trace_shapes(model, torch.zeros(1, 3, 224, 224)))
    assert layer == "stages"  # the tokens its head averages, not a key/value projection
    ex = explain(model, torch.rand(1, 3, 224, 224), [layer], ["gradcam"])
    assert ex.maps[("gradcam", layer)].shape == (1, 1, 4, 4)


def test_a_newline_inside_one_prompt_or_label_is_not_two() -> None:
    import hashlib

    joined = hashlib.sha256("\n".join(["a cat\na dog"]).encode()).hexdigest()
    two = hashlib.sha256("\n".join(["a cat", "a dog"]).encode()).hexdigest()
    assert joined == two  # what the old key did
    from hookviz.tasks import load_model

    one = load_model("tests.conftest:TinyCNN", "none", labels=["a\nb", "c", "d"])
    other = load_model("tests.conftest:TinyCNN", "none", labels=["a", "b\nc", "d"])
    assert one.labels_id != other.labels_id


def test_labels_imagenet_from_the_cli(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "p.png", np.zeros((40, 40, 3), np.uint8))
    r = invoke("gradcam", str(photo), "--model", "resnet18", "--weights", "none", "--input-size", "32",
               "--labels", "imagenet", "--out", str(tmp_path / "o"), "--json", "-q")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout.splitlines()[0])
    assert rec["predicted"]["name"] != f"class {rec['predicted']['index']}"  # named from ImageNet's list


def test_prompts_past_the_tokenizer_limit_are_said() -> None:
    from hookviz.models.scores import _truncated

    class Tok:
        model_max_length = 5

        def __call__(self, texts: list[str], truncation: bool = False) -> dict[str, Any]:
            return {"input_ids": [t.split() for t in texts]}

    assert _truncated(Tok(), ["a b", "c d e"]) == ()
    (note,) = _truncated(Tok(), ["a b", "one two three four five six seven"])
    assert "1 prompt(s) are longer than the text model's 5 tokens" in note


def test_prompts_that_differ_only_past_the_limit_are_said_to_read_as_one() -> None:
    from hookviz.models.scores import _truncated

    class Tok:
        model_max_length = 5

        def __call__(self, texts: list[str], truncation: bool = False) -> dict[str, Any]:
            return {"input_ids": [t.split() for t in texts]}

        def decode(self, ids: list[str], skip_special_tokens: bool = True) -> str:
            return " ".join(ids)

    notes = _truncated(Tok(), ["a photo of a cat on a mat", "a photo of a cat in a hat", "a dog"])
    assert "2 prompt(s) are longer" in notes[0] and "cut after 'a photo of a cat'" in notes[0]
    assert notes[1].startswith("prompts 1 and 2 differ only past the 5-token limit")
    assert len(_truncated(Tok(), ["a photo of a cat on a mat", "a b"])) == 1
