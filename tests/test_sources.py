"""Any model a user has: timm, Hugging Face, their own code, safetensors and pickles, from the CLI and Python.

Offline throughout: random weights, configs built here, models trained here on the synthetic shapes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from hookviz import methods as registry
from hookviz.core.layers import default_cam_layer
from hookviz.engine.explain import explain
from hookviz.io.shapes import SHAPES, draw_shape
from hookviz.models.loaded import probe
from hookviz.tasks import load_model
from tests.conftest import ROOT, hook_counts, invoke, records, train_on_shapes, write_image
from tests.shapes_net import ShapesNet

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

NET = str(ROOT / "tests" / "shapes_net.py")
RAW_INPUT = ["--input-size", "48", "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1"]


# -- a model trained here, saved every way a user saves one ---------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ShapesNet trained for a few seconds, as a checkpoint dict, safetensors and a whole pickle; a
    timm test_resnet (output stride 8) trained likewise; 60 held-out shape photos with their masks."""
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("saved")
    net = train_on_shapes(ShapesNet(), 400)
    torch.save({"epoch": 3, "state_dict": net.state_dict()}, d / "net.pth")
    save_file(net.state_dict(), str(d / "net.safetensors"))
    torch.save(net, d / "whole.pt")
    tnet = train_on_shapes(timm.create_model("test_resnet", num_classes=3, output_stride=8), 200)
    save_file(tnet.state_dict(), str(d / "timm.safetensors"))
    (d / "labels.txt").write_text("\n".join(SHAPES) + "\n")
    photos = d / "photos"
    photos.mkdir()
    rng = np.random.default_rng(77)
    for i in range(60):
        kind = i % 3
        img, mask = draw_shape(kind, 48, rng)
        write_image(photos / f"{i:02d}_{SHAPES[kind]}.png", (img * 255).round().astype(np.uint8))
        np.save(d / f"mask{i:02d}.npy", mask)
    return {"dir": d, "photos": photos}


def _localisation(saved: dict[str, Path], out: Path) -> tuple[float, float]:
    """Accuracy and how often the map's peak (photo resolution) lies inside the shape."""
    right = inside = 0
    recs = [r for r in records(out) if r["status"] == "ok"]
    assert len(recs) == 60
    for rec in recs:
        name = Path(str(rec["input"])).name
        i, truth = int(name[:2]), name[3:-4]
        right += rec["predicted"]["name"] == truth  # type: ignore[index]
        full = np.load(next(o for o in rec["outputs"] if str(o).endswith(".full.npy")))  # type: ignore[union-attr]
        mask = np.load(saved["dir"] / f"mask{i:02d}.npy")
        inside += bool(mask.flat[int(np.nanargmax(full))])
    return right / 60, inside / 60


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "weights", "extra"),
    [
        (f"{NET}:make", "net.pth", []),
        ("tests.shapes_net:ShapesNet", "net.safetensors", []),
        ("whole.pt", "DEFAULT", ["--trust-pickle"]),
    ],
    ids=["factory-file+checkpoint", "module-path+safetensors", "whole-pickle"],
)
def test_a_trained_model_of_your_own_localises_the_shapes(
    saved: dict[str, Path], tmp_path: Path, model: str, weights: str, extra: list[str]
) -> None:
    d = saved["dir"]
    model = str(d / model) if model.endswith(".pt") else model
    w = weights if weights == "DEFAULT" else str(d / weights)
    out = tmp_path / "o"
    r = invoke(
        "gradcam", str(saved["photos"]), "--model", model, "--weights", w, *extra, *RAW_INPUT,
        "--labels", str(d / "labels.txt"), "--save-raw", "--out", str(out), "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    accuracy, inside = _localisation(saved, out)
    assert accuracy >= 0.95 and inside >= 0.90, (accuracy, inside)  # the torchvision path's bar


@pytest.mark.slow
def test_a_trained_timm_model_localises_the_shapes(saved: dict[str, Path], tmp_path: Path) -> None:
    d, out = saved["dir"], tmp_path / "o"
    r = invoke(
        "gradcam", str(saved["photos"]), "--model", "timm:test_resnet?output_stride=8",
        "--weights", str(d / "timm.safetensors"), "--layer", "layer3", *RAW_INPUT,
        "--labels", str(d / "labels.txt"), "--save-raw", "--out", str(out), "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    accuracy, inside = _localisation(saved, out)
    # timm's test ResNet is deeper and coarser than ShapesNet: measured 1.00 and 0.84 on 200 images.
    assert accuracy >= 0.95 and inside >= 0.70, (accuracy, inside)


# -- timm: many families, no options --------------------------------------------------------------

TIMM_FAMILIES = [
    "resnet18", "resnet26d", "efficientnet_b0", "convnext_atto", "regnetx_002", "densenet121",
    "mobilenetv3_small_050", "vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224",
    "vit_little_patch16_reg4_gap_256", "eva02_tiny_patch14_224", "swin_tiny_patch4_window7_224",
    "maxvit_nano_rw_256", "fastvit_t8", "efficientvit_b0", "mobilevit_xxs", "coatnet_nano_rw_224",
    "poolformer_s12", "edgenext_xx_small", "tiny_vit_5m_224", "cait_xxs24_224", "pvt_v2_b0", "ghostnet_050",
]  # fmt: skip


#: The families with global self-attention over their patch tokens: the attention methods apply.
TIMM_ATTENTION = {
    "vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224", "vit_little_patch16_reg4_gap_256",
    "eva02_tiny_patch14_224", "cait_xxs24_224",
}  # fmt: skip


def _expected_grid(model: torch.nn.Module, size: int) -> tuple[int, int]:
    """timm's own account of the final map: the patch grid of a ViT, else the input over its reduction."""
    embed = getattr(model, "patch_embed", None)
    if (
        embed is not None
        and getattr(embed, "grid_size", None)
        and getattr(model, "num_prefix_tokens", None) is not None
    ):
        return tuple(embed.grid_size)  # type: ignore[return-value]
    reduction = model.feature_info[-1]["reduction"]
    return (-(-size // reduction), -(-size // reduction))


@pytest.mark.slow
def test_timm_families_work_with_no_options(tmp_path: Path) -> None:
    photo = write_image(
        tmp_path / "p.jpg", np.random.default_rng(0).integers(0, 256, (120, 150, 3), np.uint8)
    )
    failures = []
    for name in TIMM_FAMILIES:
        out = tmp_path / name
        r = invoke("gradcam", str(photo), "--model", f"timm:{name}", "--weights", "none", "--save-raw",
                   "--out", str(out), "-q", "--json")  # fmt: skip
        if r.exit_code != 0:
            failures.append(f"{name}: {r.stderr.strip()}")
            continue
        rec = json.loads(r.stdout)
        raw = np.load(next(o for o in rec["outputs"] if o.endswith(".npy") and not o.endswith(".full.npy")))
        model = timm.create_model(name, pretrained=False)
        expected = _expected_grid(model, rec["settings"]["input"]["crop_size"])
        if raw.shape != expected or not np.isfinite(raw).all():
            failures.append(f"{name}: map {raw.shape} at {rec['layer']}, expected {expected}")
        if name not in TIMM_ATTENTION:
            continue
        r = invoke("gradcam", str(photo), "--model", f"timm:{name}", "--weights", "none", "--save-raw",
                   "--method", "attention", "--out", str(out / "attention"), "-q", "--json")  # fmt: skip
        if r.exit_code != 0:
            failures.append(f"{name} --method attention: {r.stderr.strip()}")
            continue
        rec = json.loads(r.stdout)
        for o in rec["outputs"]:
            if o.endswith(".npy") and not o.endswith(".full.npy"):
                raw = np.load(o)
                if raw.shape != expected or not np.isfinite(raw).all() or raw.max() <= 0:
                    failures.append(f"{name}: {Path(o).name} {raw.shape}, expected {expected}")
    assert not failures, "\n".join(failures)


def test_timm_token_layouts_drop_prefix_tokens() -> None:
    """DeiT's distillation token and ViT's register tokens are not patches: the grid comes from the embed.
    DeiT's head reads its class and distillation tokens (the default: the last block's input norm); the
    ``gap`` ViT averages its patch tokens (the default: ``norm``, the tensor entering that mean)."""
    for name, prefix, default in (
        ("deit_tiny_distilled_patch16_224", 2, "blocks.11.norm1"),
        ("vit_little_patch16_reg4_gap_256", 4, "norm"),
    ):
        lm = load_model(f"timm:{name}", "none")
        assert lm.model.num_prefix_tokens == prefix
        calls = probe(lm)
        layer = default_cam_layer(lm.model, calls)
        assert layer == default
        s = lm.preprocess.crop_size
        ex = explain(lm.model, torch.randn(1, 3, s, s), [layer], ["eigencam"])
        assert tuple(ex.maps[("eigencam", layer)].shape[2:]) == tuple(lm.model.patch_embed.grid_size)
        assert hook_counts(lm.model) == 0


def test_timm_preprocessing_comes_from_its_data_config() -> None:
    lm = load_model("timm:vit_little_patch16_reg4_gap_256", "none")
    cfg = timm.data.resolve_data_config({}, model=lm.model)
    p = lm.preprocess
    assert (p.crop_size, p.mean, p.std, p.interpolation) == (256, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "bicubic")
    assert p.resize_size == round(256 / cfg["crop_pct"]) == 269  # crop_pct 0.95
    lm = load_model("timm:test_resnet?output_stride=8", "none", input_size=64)
    assert lm.name == "timm:test_resnet[output_stride=8]" and lm.preprocess.crop_size == 64


def test_timm_default_weights_offline_is_a_clear_setup_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # The hub reads HF_HUB_OFFLINE once, at import: set in-process too, so the test never reaches the network.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    photo = write_image(tmp_path / "p.png", np.zeros((20, 20, 3), np.uint8))
    r = invoke("gradcam", str(photo), "--model", "timm:resnet18", "--out", str(tmp_path / "o"))
    assert r.exit_code == 3
    (line,) = r.stderr.strip().splitlines()
    assert "cannot get the pretrained weights for timm:resnet18" in line and "--weights none" in line


# -- Hugging Face ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small ViT and ConvNeXt classifier with class names, written by save_pretrained."""
    t = transformers
    d = tmp_path_factory.mktemp("hf")
    names = {0: "square", 1: "disc", 2: "cross"}
    torch.manual_seed(0)
    vit = t.ViTConfig(
        image_size=64, patch_size=8, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=96, id2label=names, label2id={v: k for k, v in names.items()},
    )  # fmt: skip
    t.ViTForImageClassification(vit).save_pretrained(d / "vit")
    t.ViTImageProcessor(size={"height": 64, "width": 64}).save_pretrained(d / "vit")
    cnx = t.ConvNextConfig(
        hidden_sizes=[16, 32, 48, 64],
        depths=[1, 1, 2, 1],
        id2label=names,
        label2id={v: k for k, v in names.items()},
    )
    t.ConvNextForImageClassification(cnx).save_pretrained(d / "convnext")
    t.ConvNextImageProcessor(size={"shortest_edge": 64}, crop_pct=0.875).save_pretrained(d / "convnext")
    small = {"image_size": 64, "patch_size": 8, "hidden_size": 48, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 96, "id2label": names}  # fmt: skip
    for kind, config, model in (
        ("deit", t.DeiTConfig(**small), t.DeiTForImageClassification),
        ("dinov2", t.Dinov2Config(**small), t.Dinov2ForImageClassification),
        ("dinov2reg", t.Dinov2WithRegistersConfig(**small, num_register_tokens=4),
         t.Dinov2WithRegistersForImageClassification),
    ):  # fmt: skip
        model(config).save_pretrained(d / kind)
        t.ViTImageProcessor(size={"height": 64, "width": 64}).save_pretrained(d / kind)
    return d


@pytest.mark.parametrize("kind", ["vit", "deit", "dinov2", "dinov2reg"])
def test_hugging_face_transformers_run_the_attention_methods(
    hf_models: Path, tmp_path: Path, kind: str
) -> None:
    photo = write_image(tmp_path / "p.png", np.random.default_rng(2).integers(0, 256, (70, 90, 3), np.uint8))
    r = invoke("gradcam", str(photo), "--model", f"hf:{hf_models / kind}", "--method", "attention",
               "--save-raw", "--out", str(tmp_path / "o"), "-q", "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    for method in ("rollout", "chefer", "legrad"):
        raw = np.load(
            next(o for o in rec["outputs"] if f".{method}." in o and o.endswith(f"{rec['layer']}.npy"))
        )
        assert raw.shape == (8, 8) and np.isfinite(raw).all() and raw.max() > 0, (method, raw.shape)


@pytest.mark.parametrize(
    ("kind", "layer", "grid"),
    [("vit", "vit.layers.2.layernorm_before", (8, 8)), ("convnext", "convnext.encoder.stages.3", (2, 2))],
)
def test_hugging_face_classifiers_from_a_folder(
    hf_models: Path, tmp_path: Path, kind: str, layer: str, grid: tuple[int, int]
) -> None:
    photo = write_image(tmp_path / "p.png", np.random.default_rng(1).integers(0, 256, (70, 90, 3), np.uint8))
    spec = f"hf:{hf_models / kind}"
    r = invoke("gradcam", str(photo), "--model", spec, "--method", "all", "--target", "disc", "--save-raw",
               "--out", str(tmp_path / "o"), "-q", "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["layer"] == layer and rec["target"]["name"] == "disc" and rec["target"]["index"] == 1
    assert rec["predicted"]["name"] in ("square", "disc", "cross") and rec["model"] == f"hf:{kind}"
    raw = np.load(next(o for o in rec["outputs"] if o.endswith(".gradcam." + layer + ".npy")))
    assert raw.shape == grid
    lm = load_model(spec)
    assert lm.categories == ("square", "disc", "cross") and lm.pretrained
    for command in (["layers", "--model", spec], ["summary", "--model", spec, "--format", "json"]):
        r = invoke(*command)
        assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["total_params"] == sum(p.numel() for p in lm.model.parameters())


# -- refusals and odd outputs ---------------------------------------------------------------------


def test_refusals_are_one_line_with_exit_3(saved: dict[str, Path], tmp_path: Path) -> None:
    photo = write_image(tmp_path / "p.png", np.zeros((20, 20, 3), np.uint8))
    base = ["gradcam", str(photo), "--out", str(tmp_path / "o")]
    cases = [
        (["--model", str(saved["dir"] / "whole.pt")], "holds a whole pickled model; loading it runs code"),
        (["--model", f"{NET}:not_a_model"], "not_a_model() returned str, not a torch.nn.Module"),
        (["--model", f"{NET}:missing"], "no function or class 'missing' (found: DictOut, ShapesNet"),
        (["--model", str(saved["dir"] / "net.pth")], "holds a state_dict, not a model"),
    ]
    for args, message in cases:
        r = invoke(*base, *args)
        assert r.exit_code == 3, (args, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert message in line, line
    assert "--trust-pickle" in invoke(*base, "--model", str(saved["dir"] / "whole.pt")).stderr


def test_a_missing_extra_names_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm now raises ImportError
    r = invoke("layers", "--model", "timm:resnet18")
    assert r.exit_code == 3
    assert r.stderr.strip() == (
        "hookviz: error: this model needs timm, which is not installed: pip install 'hookviz[timm]'"
    )


def test_a_model_returning_a_dict_is_explained_through_its_logits(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "p.png", np.random.default_rng(2).integers(0, 256, (48, 48, 3), np.uint8))
    r = invoke("gradcam", str(photo), "--model", f"{NET}:make_dict", "--weights", "none", *RAW_INPUT,
               "--out", str(tmp_path / "o"), "-q", "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["layer"] == "body" and rec["predicted"]["name"] == "class " + str(rec["predicted"]["index"])


def test_safetensors_and_checkpoint_load_the_same_values(saved: dict[str, Path]) -> None:
    a = load_model(f"{NET}:make", str(saved["dir"] / "net.pth"))
    b = load_model("tests.shapes_net:ShapesNet", str(saved["dir"] / "net.safetensors"))
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True)
    )
    assert a.weights_id != b.weights_id  # different files; each names its own content
    with Image.open(next(saved["photos"].iterdir())) as im:
        assert im.size == (48, 48)


@pytest.mark.parametrize("source", ["timm", "hf", "factory"])
def test_every_command_works_on_every_source(hf_models: Path, tmp_path: Path, source: str) -> None:
    spec = {"timm": "timm:test_convnext", "hf": f"hf:{hf_models / 'convnext'}", "factory": f"{NET}:make"}[
        source
    ]
    photo = write_image(tmp_path / "p.png", np.random.default_rng(3).integers(0, 256, (60, 80, 3), np.uint8))
    common = [str(photo), "--model", spec, "--weights", "none", "--input-size", "64", "-q", "--json"]
    for command in ("featuremaps", "gradflow", "dropblock"):
        out = tmp_path / command
        r = invoke(command, *common, "--out", str(out))
        assert r.exit_code == 0, (command, r.stderr)
        rec = json.loads(r.stdout)
        assert rec["status"] == "ok" and rec["predicted"] is not None and rec["outputs"], command
    r = invoke("gradcam", *common, "--method", "all", "--target", "top2", "--out", str(tmp_path / "cam"))
    assert r.exit_code == 0, r.stderr
    assert len(json.loads(r.stdout)["maps"]) == len(registry.parse(["all"])) * 2
    for command in (["layers", "--model", spec], ["summary", "--model", spec, "--input-size", "3,64,64"]):
        assert invoke(*command).exit_code == 0, command


def _strict(line: str) -> dict[str, object]:
    """Parse as strict JSON: NaN / Infinity are not JSON."""

    def refuse(name: str) -> object:
        raise ValueError(f"non-JSON constant {name}")

    value = json.loads(line, parse_constant=refuse)
    assert isinstance(value, dict)
    return value


def _labels(tmp_path: Path) -> Path:
    p = tmp_path / "labels.txt"
    p.write_text("square\ndisc\ncross\n")
    return p


def test_a_retrained_checkpoint_loaded_by_its_factory_changes_the_key(
    two_photos: Path, tmp_path: Path
) -> None:
    code = tmp_path / "net.py"
    code.write_text(
        "import torch\nfrom pathlib import Path\nfrom tests.shapes_net import ShapesNet\n"
        "def make():\n    m = ShapesNet()\n"
        "    state = torch.load(Path(__file__).with_name('w.pt'), weights_only=True)\n"
        "    m.load_state_dict(state)\n    return m\n"
    )
    from tests.shapes_net import ShapesNet

    out = tmp_path / "out"
    keys = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        torch.save(ShapesNet().state_dict(), tmp_path / "w.pt")
        r = invoke("gradcam", str(two_photos / "a.png"), "--model", f"{code}:make", "--input-size", "48",
                   "--labels", str(_labels(tmp_path)), "--out", str(out), "-q", "--json")  # fmt: skip
        assert r.exit_code == 0, r.stderr
        (rec,) = [_strict(line) for line in r.stdout.splitlines()]
        assert rec["status"] == "ok"  # not "skipped" with the old checkpoint's results
        keys.append(rec["key"])
    assert keys[0] != keys[1]


def test_each_source_is_one_record_that_claims_its_specs(tmp_path: Path) -> None:
    """``--model`` specs go to the source whose record claims them (a scheme, a bare name, a suffix, the
    user's code, any other file, else torchvision), and the warm server fingerprints the files its record
    names; a source registered from outside, by record or by scheme and builder, is asked first."""
    from hookviz.models.build import Source, build, model_files, register_source, unregister_source
    from hookviz.models.sources import source_of

    plain = tmp_path / "weights"
    plain.write_bytes(b"x")
    expected = {
        "timm:convnext_tiny": "timm", "hf:some/dir?x=1": "hf", "ultralytics:best.pt": "ultralytics",
        "monai:DenseNet121?spatial_dims=3": "monai", "efficientnet_lite0": "lite", "m.onnx": "onnx",
        "m.pt2": "export", "net.py:make_net": "python", "pkg.mod:Net": "python", "model.pt": "pickle",
        str(plain): "pickle", "resnet18": "torchvision", "onnx:m.onnx": "onnx",
    }  # fmt: skip
    assert {spec: source_of(spec).name for spec in expected} == expected
    assert model_files("hf:some/dir?revision=2") == (Path("some/dir"),) and model_files("m.onnx") == (
        Path("m.onnx"),
    )
    assert model_files("pkg.mod:Net") is None and model_files("net.py:make_net") is None
    assert model_files("resnet18") == () and model_files("efficientnet_lite0") == ()

    made: list[str] = []

    def toy(spec: str, weights: str, options: Any) -> Any:
        made.append(spec)
        return spec

    register_source(Source("toy", toy, scheme=False, suffixes=(".pt",), names=("resnet18",)))
    register_source("toy2", toy)
    try:
        assert source_of("model.pt").name == "toy" and source_of("resnet18").name == "toy"
        assert source_of("toy2:anything").name == "toy2" and source_of("timm:x").name == "timm"
        build("toy2:a", "none", None)  # type: ignore[arg-type]
        assert made == ["toy2:a"]
        with pytest.raises(ValueError, match="replace=True"):
            register_source("toy2", toy)
    finally:
        unregister_source("toy")
        unregister_source("toy2")
    assert source_of("model.pt").name == "pickle" and source_of("toy2:a").name == "python"
    with pytest.raises(ValueError, match="stays"):
        unregister_source("torchvision")
