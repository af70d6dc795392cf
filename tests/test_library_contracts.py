"""Library contracts: every public call is safe wherever users call it (no_grad, inference_mode, training
loops, AMP, torch.compile, bfloat16), leaves the model as found, and validates its choices."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from torch import nn
from typer.testing import CliRunner

import hookviz
from hookviz.cli import EXIT_INTERNAL, app
from hookviz.core.hooks import capture
from hookviz.engine.explain import explain, grad_cam
from hookviz.errors import UsageError
from hookviz.io.images import Box, Preprocess, decode_png
from hookviz.options import Normalize
from hookviz.render import overlay
from hookviz.summary import summarize
from hookviz.training.gradients import GlobalNormClipper, default_grad_layers, gradient_flow
from hookviz.training.regularize import attach_dropblock
from tests.conftest import BUILT_IN_CAMS, TinyCNN, hook_counts, tiny_loaded, write_image


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18().eval()


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


# -- gradients wherever users call ---------------------------------------------------------------


def test_grad_cam_inside_no_grad_and_inference_mode(resnet: nn.Module) -> None:
    x = torch.randn(2, 3, 64, 64)
    expected = grad_cam(resnet, x, "layer4").maps
    with torch.no_grad():
        got = grad_cam(resnet, x, "layer4").maps
        assert not torch.is_grad_enabled()  # the caller's mode, restored
    assert torch.allclose(got, expected)
    with torch.inference_mode():
        x_inf = x.clone()  # an inference tensor, as users make them
        got = explain(resnet, x_inf, ["layer3"], ["gradcam", "layercam"]).maps[("gradcam", "layer3")]
        assert torch.is_inference_mode_enabled()
    assert torch.allclose(got, explain(resnet, x, ["layer3"], ["gradcam"]).maps[("gradcam", "layer3")])


def test_a_model_made_under_inference_mode_is_a_clear_error() -> None:
    with torch.inference_mode():
        model = TinyCNN().eval()
    with pytest.raises(UsageError, match=r"made under torch.inference_mode\(\).*outside inference mode"):
        grad_cam(model, torch.randn(1, 3, 16, 16), "features.8")


# -- gradient_flow -------------------------------------------------------------------------------


def test_gradient_flow_in_train_mode_leaves_batchnorm_statistics_alone(resnet: nn.Module) -> None:
    model = copy.deepcopy(resnet)
    before = _state(model)
    flow = gradient_flow(model, torch.randn(2, 3, 64, 64), lambda z: z.sum(), train_mode=True)
    assert len(flow.outputs) == 41
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not model.training and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("trainable", ["none", "fc"])
def test_gradient_flow_measures_frozen_layers(resnet: nn.Module, trainable: str) -> None:
    model = copy.deepcopy(resnet)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(trainable))
    flow = gradient_flow(model, torch.randn(1, 3, 64, 64), lambda z: z[0, 3])
    assert [s.name for s in flow.outputs] == default_grad_layers(model)  # all 41, not just fc
    assert all(s.norm > 0 for s in flow.outputs)
    assert [s.name for s in flow.params] == ([] if trainable == "none" else ["fc.weight", "fc.bias"])
    assert all(p.requires_grad == n.startswith(trainable) for n, p in model.named_parameters())


def test_gradient_flow_reports_a_shared_module_per_call(resnet: nn.Module, tmp_path: Path) -> None:
    flow = gradient_flow(resnet, torch.randn(1, 3, 64, 64), lambda z: z.sum(), ["layer4.0.relu"])
    assert [s.name for s in flow.outputs] == ["layer4.0.relu#1", "layer4.0.relu#2"]
    photo = write_image(tmp_path / "p.png", np.zeros((40, 40, 3), np.uint8))
    args = ["--weights", "none", "--input-size", "64", "--layers", "layer4*", "--out", str(tmp_path / "o")]
    r = CliRunner().invoke(app, ["gradflow", str(photo), *args, "--json", "-q"])
    assert r.exit_code == 0, r.stderr
    (js,) = (tmp_path / "o").glob("*.gradflow.json")
    names = [s["name"] for s in json.loads(js.read_text())["outputs"]]
    assert "layer4.0.relu#2" in names and "layer4.1.conv2" in names


# -- the global-norm clipper ---------------------------------------------------------------------


def _clip_setup() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(1)
    model = TinyCNN().eval()
    return model, copy.deepcopy(model), torch.randn(4, 3, 16, 16)


def test_clipper_recovers_after_a_backward_that_raised() -> None:
    model, twin, x = _clip_setup()
    clipper = GlobalNormClipper(model, 0.05)
    boom = {"on": True}

    def explode(g: torch.Tensor) -> torch.Tensor:
        if boom["on"]:
            raise RuntimeError("injected in backward")
        return g

    out = model.features[:4](x)
    out.register_hook(explode)  # fires after the head's parameters got their gradients
    loss = model.fc(torch.flatten(model.pool(model.features[4:](out)), 1)).pow(2).sum()
    with pytest.raises(RuntimeError, match="injected"):
        loss.backward()
    model.zero_grad(set_to_none=True)
    model(x).pow(2).sum().backward()
    twin(x).pow(2).sum().backward()
    reference = float(torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.05))
    assert clipper.last_norm == pytest.approx(reference, rel=1e-5)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-7)
    clipper.remove()
    assert hook_counts(model) == 0
    model.zero_grad(set_to_none=True)
    model(x).pow(2).sum().backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert float(norm) == pytest.approx(reference, rel=1e-4)  # removed: no longer clipped


def test_clipper_under_amp_equals_clip_grad_norm_after_unscale() -> None:
    model, twin, x = _clip_setup()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler_twin = torch.amp.GradScaler("cpu", init_scale=1024.0)
    clipper = GlobalNormClipper(model, 0.5, scaler=scaler)
    scaler.scale(model(x).pow(2).sum()).backward()
    scaler.unscale_(opt)
    scaler_twin.scale(twin(x).pow(2).sum()).backward()
    scaler_twin.unscale_(opt_twin)
    reference = float(torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5))
    assert reference > 0.5  # clipping happens
    assert clipper.last_norm == pytest.approx(reference, rel=1e-4)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-8)
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert float(total) == pytest.approx(0.5, rel=1e-4)
    clipper.remove()


# -- compiled and bfloat16 models ----------------------------------------------------------------


def test_a_compiled_model_is_explained_through_its_original_module(resnet: nn.Module) -> None:
    compiled = torch.compile(resnet)
    x = torch.randn(1, 3, 64, 64)
    with pytest.warns(UserWarning, match="torch.compile'd; hookviz runs its original eager module"):
        got = grad_cam(compiled, x, "layer4").maps
    assert torch.allclose(got, grad_cam(resnet, x, "layer4").maps)
    with pytest.warns(UserWarning, match="compile"), capture(compiled, ["layer4"]) as cap, torch.no_grad():
        cap.model(x)
    assert cap.captured.outputs["layer4"][0].shape == (1, 512, 2, 2)


def test_summarize_probes_in_the_models_dtype(resnet: nn.Module) -> None:
    bf16 = copy.deepcopy(resnet).to(torch.bfloat16)
    a, b = summarize(resnet, (3, 64, 64)), summarize(bf16, (3, 64, 64))
    assert (b.total_params, b.macs) == (a.total_params, a.macs)
    assert b.param_bytes == a.param_bytes // 2


# -- DropBlock globs -----------------------------------------------------------------------------


def test_dropblock_globs_are_checked_at_attach_time(resnet: nn.Module) -> None:
    model = copy.deepcopy(resnet)
    with attach_dropblock(model, ["layer*"], 0.1, 3) as handle:
        assert handle.layers == ["layer1", "layer2", "layer3", "layer4"]  # not their 57 submodules
    with attach_dropblock(model, ["*"], 0.1, 3) as handle:
        assert handle.layers == [
            "conv1",
            "bn1",
            "relu",
            "maxpool",
            "layer1",
            "layer2",
            "layer3",
            "layer4",
            "avgpool",
        ]
        model.train()
        model(torch.randn(2, 3, 64, 64))
    with pytest.raises(Exception, match="matches no layer with a"):
        attach_dropblock(model, ["fc*"], 0.1, 3)
    assert hook_counts(model) == 0


# -- choices, validated in the library and the CLI alike ----------------------------------------


def test_choices_fail_the_same_way_in_library_and_cli() -> None:
    from hookviz import methods

    assert methods.names()[: len(BUILT_IN_CAMS)] == list(BUILT_IN_CAMS)
    with pytest.raises(UsageError, match="resize 'sqaush': choose one of crop, squash"):
        Preprocess(resize="sqaush")
    from hookviz.jobs import CamJob
    from hookviz.jobs.settings import CamSettings

    with pytest.raises(UsageError, match="--normalize 'batchh': choose one of image, batch, none"):
        CamJob(loaded=tiny_loaded(TinyCNN()), params=CamSettings(layers=("features.8",), normalize="batchh"))
    assert Normalize("batch") == "batch"
    r = CliRunner().invoke(app, ["gradcam", "x.jpg", "--normalize", "batchh"])
    assert r.exit_code == 2 and "'batchh' is not one of" in r.stderr


def test_an_internal_error_has_its_own_exit_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import hookviz.tasks

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(hookviz.tasks, "load_model", broken)
    photo = write_image(tmp_path / "p.png", np.zeros((8, 8, 3), np.uint8))
    r = CliRunner().invoke(app, ["gradcam", str(photo), "--weights", "none", "--out", str(tmp_path / "o")])
    assert r.exit_code == EXIT_INTERNAL == 70
    assert "internal error: ZeroDivisionError: a bug (rerun with --debug" in r.stderr


def test_one_version_and_exports_for_type_checkers() -> None:
    assert importlib.metadata.version("hookviz") == hookviz.__version__
    for name in hookviz.__all__:
        assert getattr(hookviz, name) is not None
    source = Path(hookviz.__file__).read_text()
    assert "if TYPE_CHECKING:" in source and all(f" {n}" in source for n in hookviz.__all__)


def test_no_library_module_changes_the_matplotlib_backend() -> None:
    import matplotlib

    matplotlib.use("svg")  # a notebook user's choice
    from hookviz.render import grad_flow_plot, summary_plot

    try:
        grad_flow_plot(["a", "b"], [1.0, 0.1], [0.5, float("nan")], title="t")
        summary_plot(summarize(TinyCNN(), (3, 16, 16)))
        assert matplotlib.get_backend().lower() == "svg"
    finally:
        matplotlib.use("Agg")


# -- golden files and pixels ---------------------------------------------------------------------


def test_the_layers_table_golden(golden: object) -> None:
    r = CliRunner().invoke(app, ["layers", "--model", "resnet18", "--depth", "2", "--input-size", "64"])
    assert r.exit_code == 0, r.stderr
    golden("layers_resnet18.txt", r.stdout)  # type: ignore[operator]


def test_one_manifest_record_golden(golden: object, tmp_path: Path) -> None:
    rgb = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    photo = write_image(tmp_path / "photo.png", rgb)
    out = tmp_path / "o"
    args = ["gradcam", str(photo), "--weights", "none", "--input-size", "64", "--target", "tabby"]
    r = CliRunner().invoke(app, [*args, "--out", str(out), "-q", "--json", "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    rec = json.loads(r.stdout)
    # Masked: the time, the temporary folder and its hash in the names; floats rounded to 4 digits.
    rec["time"] = "<time>"
    rec["input"] = Path(rec["input"]).name
    rec["prefix"] = re.sub(r"-[0-9a-f]{8}\.", "-<path hash>.", rec["prefix"])
    rec["outputs"] = [re.sub(r"-[0-9a-f]{8}\.", "-<path hash>.", Path(o).name) for o in rec["outputs"]]
    for part in (rec["predicted"], rec["target"], rec["maps"][0]["target"]):
        part["score"] = round(part["score"], 4)
    rec["maps"][0]["max"] = round(rec["maps"][0]["max"], 4)
    rec["maps"][0]["file"] = re.sub(r"-[0-9a-f]{8}\.", "-<path hash>.", rec["maps"][0]["file"])
    golden("manifest_record.json", json.dumps(rec, indent=1, sort_keys=True) + "\n")  # type: ignore[operator]


def test_overlay_pixels_land_where_the_map_says() -> None:
    """A map that is 1 in its top-left quarter and 0 elsewhere, over a grey photo, crop box in the middle."""
    photo = np.full((40, 60, 3), 100, np.uint8)
    box = Box(10, 0, 50, 40)
    cam = np.zeros((4, 4), np.float32)
    cam[:2, :2] = 1.0
    out = overlay(photo, cam, box, alpha=1.0, colormap="jet")
    assert out.shape == photo.shape
    # jet: 1 is dark red (127, 0, 0), 0 is dark blue (0, 0, 127) at full opacity.
    assert np.abs(out[5, 15].astype(int) - (127, 0, 0)).max() <= 4
    assert np.abs(out[35, 45].astype(int) - (0, 0, 127)).max() <= 4
    # Outside the box: the photo, dimmed, in grey (no colour).
    left = out[20, 3].astype(int)
    assert left[0] == left[1] == left[2] and left[0] < 100


def test_decoded_outputs_are_pictures_not_just_bytes(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "p.png", np.full((50, 70, 3), 90, np.uint8))
    args = ["--weights", "none", "--input-size", "64", "--layers", "layer1.0.conv1"]
    r = CliRunner().invoke(
        app, ["featuremaps", str(photo), *args, "--out", str(tmp_path / "o"), "-q", "--json"]
    )
    assert r.exit_code == 0, r.stderr
    grid = decode_png(Path(json.loads(r.stdout)["outputs"][0]).read_bytes())
    # 64 channels of a 16x16 map, each tile enlarged to 64 px: an 8x8 mosaic under a title band.
    assert grid.shape[1] >= 8 * 64 and grid.shape[0] >= 8 * 64
    assert len(np.unique(grid.reshape(-1, 3), axis=0)) > 50  # coloured tiles, not a blank image
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert grid.dtype == np.uint8
