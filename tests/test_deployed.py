"""The model you deploy: a ``torch.export`` program (``--model FILE.pt2``) gives the maps and prediction of
the PyTorch model it was exported from, for the CAMs, the input-gradient and the perturbation methods; a
program exported for a fixed batch, a truncated file and a layer not in the graph are one line each; a model
compiled with ``torch.compile`` is explained through its eager module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.io.shapes import draw_shape, shapes_scene
from tests.conftest import invoke, records, write_image

YOLO_FIXTURE = Path(__file__).parent / "fixtures" / "shapes_yolo.pt"

METHODS = "gradcam,layercam,scorecam,saliency,integratedgradients,occlusion,rise"


@pytest.fixture(scope="module")
def exported(trained: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The trained shapes CNN as a .pt2 program (dynamic batch) and as a state_dict, and a photo of a disc."""
    folder = tmp_path_factory.mktemp("deployed")
    model = trained.model.eval()
    example = torch.zeros(2, 3, 48, 48)
    program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    torch.export.save(program, folder / "shapes.pt2")
    torch.save(model.state_dict(), folder / "shapes.pth")
    img, _ = draw_shape(1, 48, np.random.default_rng(5))
    photo = write_image(folder / "disc.png", (img * 255).round().astype(np.uint8))
    return folder / "shapes.pt2", folder / "shapes.pth", photo


def _unit(v: np.ndarray) -> np.ndarray:
    v = np.nan_to_num(v.astype(np.float64))
    return (v - v.min()) / (v.max() - v.min() + 1e-12)


def test_an_exported_program_gives_the_maps_and_prediction_of_its_model(
    exported: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    program, weights, photo = exported
    common = [
        "--input-size",
        "48",
        "--layer",
        "features.6",
        "--method",
        METHODS,
        "--save-raw",
        "--target",
        "top2",
    ]
    runs = {}
    module = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights)]
    for name, model in (("program", ["--model", str(program)]), ("module", module)):
        out = tmp_path / name
        r = invoke("gradcam", str(photo), *model, *common, "--out", str(out))
        assert r.exit_code == 0, r.stderr
        (runs[name],) = records(out)
    assert runs["program"]["predicted"] == runs["module"]["predicted"]
    assert runs["program"]["predicted"]["index"] == 1  # the disc
    maps = {name: rec["maps"] for name, rec in runs.items()}
    assert len(maps["program"]) == len(maps["module"]) == 7 * 2
    for mine, theirs in zip(maps["program"], maps["module"], strict=True):
        assert (mine["method"], mine["target"]) == (theirs["method"], theirs["target"])
        raw = [np.load(tmp_path / name / Path(m["file"]).name.replace(".png", ".npy"))
               for name, m in (("program", mine), ("module", theirs))]  # fmt: skip
        np.testing.assert_allclose(_unit(raw[0]), _unit(raw[1]), atol=1e-4, err_msg=mine["file"])


def test_the_layers_of_a_program_are_its_model_s_module_paths(exported: tuple[Path, Path, Path]) -> None:
    program, _, _ = exported
    r = invoke("layers", "--model", str(program), "--input-size", "48")
    assert r.exit_code == 0, r.stderr
    assert all(name in r.stdout for name in ("features.0", "features.6", "features.10", "fc"))


def test_a_fixed_batch_a_truncated_file_and_a_missing_layer_are_one_line_each(
    exported: tuple[Path, Path, Path], trained: Any, tmp_path: Path
) -> None:
    program, _, photo = exported
    fixed = tmp_path / "fixed.pt2"
    torch.export.save(torch.export.export(trained.model.eval(), (torch.zeros(1, 3, 48, 48),)), fixed)
    truncated = tmp_path / "cut.pt2"
    truncated.write_bytes(program.read_bytes()[:5000])
    cases = [
        (["--model", str(fixed)], 2, "dynamic_shapes"),
        (["--model", str(truncated)], 3, "not a program torch.export can load"),
        (["--model", str(program), "--layer", "features.99"], 2, "no layer 'features.99'"),
        (["--model", str(program), "--weights", str(photo)], 2, "holds its own weights"),
    ]
    for extra, code, said in cases:
        r = invoke("gradcam", str(photo), *extra, "--input-size", "48", "--out", str(tmp_path / "out"))
        assert r.exit_code == code and said in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_compiled_model_is_explained_through_its_eager_module(trained: Any) -> None:
    from hookviz.engine.explain import explain

    model = trained.model.eval()
    compiled = torch.compile(model)
    x = torch.from_numpy(draw_shape(2, 48, np.random.default_rng(1))[0].transpose(2, 0, 1).copy()).float()[
        None
    ]
    with pytest.warns(UserWarning, match="original eager module"):
        got = explain(compiled, x, ["features.6"], ["gradcam", "layercam"])
    want = explain(model, x, ["features.6"], ["gradcam", "layercam"])
    for key in want.maps:
        torch.testing.assert_close(got.maps[key], want.maps[key], rtol=1e-5, atol=1e-6)


# -- ONNX ---------------------------------------------------------------------------------------------------
FORWARD = "eigencam,scorecam,ablationcam,occlusion,rise"


@pytest.fixture(scope="module")
def onnx_files(trained: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The trained shapes CNN as ONNX, with a dynamic batch (torch's exporter) and with a fixed batch of 1."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    folder = tmp_path_factory.mktemp("onnx")
    model = trained.model.eval()
    dynamic, fixed = folder / "shapes.onnx", folder / "shapes1.onnx"
    batch = {"x": {0: torch.export.Dim("batch")}}
    torch.onnx.export(model, (torch.zeros(2, 3, 48, 48),), dynamic, dynamic_shapes=batch, verbose=False)
    torch.onnx.export(model, (torch.zeros(1, 3, 48, 48),), fixed, verbose=False)
    return dynamic, fixed


def test_an_onnx_model_gives_the_forward_only_maps_and_prediction_of_its_model(
    exported: tuple[Path, Path, Path], onnx_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """Eigen-CAM, Score-CAM, Ablation-CAM (the rest of the graph run on the edited tensor), occlusion and RISE
    through onnxruntime equal the PyTorch model's, for a dynamic batch and for a graph fixed at batch 1."""
    _, weights, photo = exported
    common = ["--layer", "features.6", "--method", FORWARD, "--save-raw", "--target", "top2"]
    module = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--input-size", "48"]
    runs = {}
    for name, model in (("module", module), ("onnx", ["--model", str(onnx_files[0])]),
                        ("onnx1", ["--model", str(onnx_files[1])])):  # fmt: skip
        r = invoke("gradcam", str(photo), *model, *common, "--out", str(tmp_path / name))
        assert r.exit_code == 0, r.stderr
        (runs[name],) = records(tmp_path / name)
    for name in ("onnx", "onnx1"):
        assert runs[name]["predicted"] == runs["module"]["predicted"]
        assert len(runs[name]["maps"]) == len(runs["module"]["maps"]) == 5 * 2
        for mine, theirs in zip(runs[name]["maps"], runs["module"]["maps"], strict=True):
            assert (mine["method"], mine["target"]) == (theirs["method"], theirs["target"])
            raw = [np.load(tmp_path / run / Path(m["file"]).name.replace(".png", ".npy"))
                   for run, m in ((name, mine), ("module", theirs))]  # fmt: skip
            np.testing.assert_allclose(_unit(raw[0]), _unit(raw[1]), atol=1e-4, err_msg=mine["file"])


def test_an_onnx_model_lists_its_module_paths_and_refuses_in_one_line(
    onnx_files: tuple[Path, Path], exported: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    dynamic, _ = onnx_files
    photo = exported[2]
    r = invoke("layers", "--model", str(dynamic))
    assert r.exit_code == 0, r.stderr
    assert all(name in r.stdout for name in ("features.6", "features.10", "pool", "fc"))
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(dynamic.read_bytes()[:3000])
    cases = [
        (["--model", str(dynamic)], 2, "needs gradients"),  # Grad-CAM, the default
        (["--model", str(dynamic), "--method", "saliency"], 2, "use one of ablationcam"),
        (["--model", str(dynamic), "--method", "eigencam", "--layer", "features.99"], 2, "no layer"),
        (["--model", str(cut)], 3, "not an ONNX model onnx can read"),
    ]
    for extra, code, said in cases:
        r = invoke("gradcam", str(photo), *extra, "--out", str(tmp_path / "out"))
        assert r.exit_code == code and said in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "layer", "optimize"),
    [
        ("mobilenet_v3_small", "features", False),  # squeeze-excite, flatten: the exporter's own scope
        ("resnet18", "layer4", True),  # flatten
        ("shufflenet_v2_x0_5", "conv5", True),  # the channel shuffle's reshapes
    ],
)
def test_torch_s_default_onnx_export_of_torchvision_classifiers_gives_their_maps(
    name: str, layer: str, optimize: bool, tmp_path: Path
) -> None:
    """torchvision classifiers (weights=None) exported by torch's default (dynamo) exporter with a dynamic
    batch: the scope its passes record for the batch's size (``_empty_nn_module_stack_from_metadata_hook``,
    a scalar; kept when the graph is not optimised) is not a layer, and Eigen-CAM and the prediction equal
    the PyTorch module's."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None).eval()
    torch.save(model.state_dict(), tmp_path / "w.pth")
    file = tmp_path / f"{name}.onnx"
    batch = {"x": {0: torch.export.Dim("batch")}}
    torch.onnx.export(model, (torch.zeros(2, 3, 64, 64),), file, dynamic_shapes=batch, optimize=optimize,
                      verbose=False)  # fmt: skip
    photo = write_image(tmp_path / "p.png", np.random.default_rng(4).integers(0, 256, (70, 90, 3), np.uint8))
    runs = {}
    module = ["--model", name, "--weights", str(tmp_path / "w.pth"), "--input-size", "64"]
    for run, spec in (("module", module), ("onnx", ["--model", str(file)])):
        r = invoke("gradcam", str(photo), *spec, "--layer", layer, "--method", "eigencam", "--save-raw",
                   "--out", str(tmp_path / run))  # fmt: skip
        assert r.exit_code == 0, r.stderr
        (runs[run],) = records(tmp_path / run)
    assert runs["onnx"]["predicted"]["index"] == runs["module"]["predicted"]["index"]
    assert runs["onnx"]["predicted"]["score"] == pytest.approx(runs["module"]["predicted"]["score"], abs=1e-4)
    raw = [np.load(tmp_path / run / Path(runs[run]["maps"][0]["file"]).name.replace(".png", ".npy"))
           for run in ("onnx", "module")]  # fmt: skip
    np.testing.assert_allclose(_unit(raw[0]), _unit(raw[1]), atol=1e-4)


# -- TorchScript -------------------------------------------------------------------------------------------
def test_a_torchscript_archive_gives_its_model_s_input_maps_and_refuses_the_rest_in_one_line(
    exported: tuple[Path, Path, Path], trained: Any, tmp_path: Path
) -> None:
    _, weights, photo = exported
    archive = tmp_path / "shapes.pt"
    with pytest.warns(FutureWarning):  # torch.jit itself is deprecated
        torch.jit.save(torch.jit.trace(trained.model.eval(), torch.zeros(1, 3, 48, 48)), str(archive))
    methods = "saliency,integratedgradients,occlusion,rise"
    runs = {}
    module = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights)]
    for name, model in (("script", ["--model", str(archive)]), ("module", module)):
        r = invoke("gradcam", str(photo), *model, "--input-size", "48", "--method", methods, "--save-raw",
                   "--out", str(tmp_path / name))  # fmt: skip
        assert r.exit_code == 0, r.stderr
        (runs[name],) = records(tmp_path / name)
    assert runs["script"]["predicted"] == runs["module"]["predicted"]
    for mine, theirs in zip(runs["script"]["maps"], runs["module"]["maps"], strict=True):
        assert mine["method"] == theirs["method"]
        raw = [np.load(tmp_path / run / Path(m["file"]).name.replace(".png", ".npy"))
               for run, m in (("script", mine), ("module", theirs))]  # fmt: skip
        np.testing.assert_allclose(_unit(raw[0]), _unit(raw[1]), atol=1e-4, err_msg=mine["file"])
    for method in ("gradcam", "guidedbackprop"):
        r = invoke("gradcam", str(photo), "--model", str(archive), "--input-size", "48", "--method", method,
                   "--out", str(tmp_path / "o"))  # fmt: skip
        assert r.exit_code == 2 and "Python hooks do not run inside TorchScript" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_an_onnx_segmenter_gives_its_model_s_maps_and_a_symbolic_size_asks_for_input_size(
    tmp_path: Path,
) -> None:
    """The tests' FCN (seeded weights) exported with a dynamic height and width, run with ``--task
    segmentation``: the class picked, its share of the pixels and the forward-only maps equal the module's.
    Without --input-size (the graph takes any size), a graph fixed at a non-square size, and an opset
    onnxruntime cannot run: one line each."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import onnx

    from tests.shapes_net import make_segmenter

    torch.manual_seed(3)
    model = make_segmenter().eval()
    torch.save(model.state_dict(), tmp_path / "seg.pth")
    side = {
        0: torch.export.Dim("batch"),
        2: 16 * torch.export.Dim("h", max=64),
        3: 16 * torch.export.Dim("w", max=64),
    }
    torch.onnx.export(model, (torch.zeros(2, 3, 64, 80),), tmp_path / "seg.onnx", dynamic_shapes={"x": side},
                      verbose=False)  # fmt: skip
    torch.onnx.export(model, (torch.zeros(1, 3, 64, 80),), tmp_path / "seg6480.onnx", verbose=False)
    proto = onnx.load(str(tmp_path / "seg.onnx"))
    proto.opset_import[0].version = 99  # an opset no onnxruntime runs
    onnx.save(proto, str(tmp_path / "future.onnx"), save_as_external_data=False)
    img = shapes_scene(np.random.default_rng(3), 64, 80, 2, (7, 12))[0]
    photo = write_image(tmp_path / "scene.png", (img * 255).round().astype(np.uint8))
    common = ["--layer", "backbone.1", "--method", "eigencam,scorecam,ablationcam,occlusion", "--save-raw",
              "--input-size", "64", "--target", "top2"]  # fmt: skip
    module = ["--model", f"{Path(__file__).parent / 'shapes_net.py'}:make_segmenter", "--weights",
              str(tmp_path / "seg.pth")]  # fmt: skip
    runs = {}
    for name, spec in (("module", module), ("onnx", ["--model", str(tmp_path / "seg.onnx"), "--task",
                                                     "segmentation"])):  # fmt: skip
        r = invoke("gradcam", str(photo), *spec, *common, "--out", str(tmp_path / name))
        assert r.exit_code == 0, r.stderr
        (runs[name],) = records(tmp_path / name)
    assert runs["onnx"]["predicted"] == runs["module"]["predicted"]
    assert len(runs["onnx"]["maps"]) == len(runs["module"]["maps"]) == 4 * 2
    for mine, theirs in zip(runs["onnx"]["maps"], runs["module"]["maps"], strict=True):
        assert (mine["method"], mine["target"]) == (theirs["method"], theirs["target"])
        raw = [np.load(tmp_path / run / Path(m["file"]).name.replace(".png", ".npy"))
               for run, m in (("onnx", mine), ("module", theirs))]  # fmt: skip
        np.testing.assert_allclose(_unit(raw[0]), _unit(raw[1]), atol=1e-4, err_msg=mine["file"])
    cases = [
        ("seg.onnx", [], 2, "give --input-size N"),
        ("seg6480.onnx", [], 2, "takes 64x80 inputs only"),
        ("future.onnx", ["--input-size", "64"], 3, "onnxruntime cannot run it"),
    ]
    for file, extra, code, said in cases:
        model = ["--model", str(tmp_path / file), "--task", "segmentation"]
        r = invoke(
            "gradcam", str(photo), *model, "--method", "eigencam", *extra, "--out", str(tmp_path / "o")
        )
        assert r.exit_code == code and said in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# -- ultralytics YOLO exported to ONNX ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def yolo_onnx(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The tests' trained YOLO (tests/fixtures/shapes_yolo.pt) exported by ultralytics itself: at its fixed
    size 160, and with dynamic=True (beside a copy of the checkpoint)."""
    pytest.importorskip("ultralytics")
    pytest.importorskip("onnxruntime")
    import shutil
    import warnings

    from ultralytics import YOLO

    from hookviz.models.ultralytics import process_kept

    folder = tmp_path_factory.mktemp("yolo")
    (folder / "dynamic").mkdir()
    for where in (folder, folder / "dynamic"):
        shutil.copy(YOLO_FIXTURE, where / "shapes_yolo.pt")
    with process_kept(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ultralytics runs torch's legacy exporter (tracer warnings)
        YOLO(str(folder / "shapes_yolo.pt")).export(format="onnx", imgsz=160, simplify=False, verbose=False)
        YOLO(str(folder / "dynamic" / "shapes_yolo.pt")).export(
            format="onnx", imgsz=160, simplify=False, dynamic=True, verbose=False
        )
    return (
        folder / "shapes_yolo.onnx",
        folder / "dynamic" / "shapes_yolo.onnx",
        folder / "dynamic" / "shapes_yolo.pt",
    )


def test_a_yolo_onnx_export_finds_the_boxes_ultralytics_predicts_on_it(
    yolo_onnx: tuple[Path, Path, Path],
) -> None:
    from ultralytics import YOLO

    from hookviz.models.ultralytics import OnnxYolo, process_kept
    from hookviz.tasks import load_model
    from tests.test_ultralytics import _scenes, _tensor

    fixed, _, _ = yolo_onnx
    loaded = load_model(str(fixed))
    assert isinstance(loaded.model, OnnxYolo) and loaded.task_name == "detection"
    assert loaded.model.default_layers == ("model.15", "model.18", "model.21")  # what the head reads
    assert loaded.categories == ("square", "disc", "cross")
    with process_kept():
        reference = YOLO(str(fixed), task="detect")
    seen = 0
    for rgb, _, _ in _scenes(8, 3):
        with process_kept():
            (theirs,) = reference.predict(rgb[..., ::-1].copy(), imgsz=160, conf=0.25, verbose=False)
        ours = loaded.model.detect([_tensor(rgb)], 0.25)[0]
        assert ours.labels.tolist() == theirs.boxes.cls.long().tolist()
        torch.testing.assert_close(ours.boxes.float(), theirs.boxes.xyxy.float(), atol=1e-3, rtol=0)
        torch.testing.assert_close(ours.scores.float(), theirs.boxes.conf.float(), atol=1e-5, rtol=0)
        seen += len(ours.boxes)
    assert seen >= 8


@pytest.mark.slow
def test_a_yolo_onnx_export_gives_the_checkpoint_s_d_rise_and_eigen_cam(
    yolo_onnx: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Exported with dynamic=True (letterboxed as the module is), D-RISE per box and Eigen-CAM equal the
    checkpoint's; Grad-CAM and a size the fixed export was not made for are one line each."""
    from tests.test_ultralytics import _scenes

    fixed, dynamic, checkpoint = yolo_onnx
    rgb = _scenes(1, 3)[0][0]
    photo = write_image(tmp_path / "scene.png", rgb)
    runs = {}
    for name, spec in (("onnx", str(dynamic)), ("module", f"ultralytics:{checkpoint}")):
        r = invoke("gradcam", str(photo), "--model", spec, "--method", "eigencam,drise", "--masks", "500",
                   "--save-raw", "--out", str(tmp_path / name))  # fmt: skip
        assert r.exit_code == 0, r.stderr
        (runs[name],) = records(tmp_path / name)
    for mine, theirs in zip(runs["onnx"]["detections"], runs["module"]["detections"], strict=True):
        assert (mine["name"], mine["index"]) == (theirs["name"], theirs["index"])
        assert mine["score"] == pytest.approx(theirs["score"], abs=1e-4)
    assert len(runs["onnx"]["maps"]) == len(runs["module"]["maps"]) >= 3  # Eigen-CAM + a D-RISE per box
    for mine, theirs in zip(runs["onnx"]["maps"], runs["module"]["maps"], strict=True):
        assert mine["method"] == theirs["method"]
        raw = [np.load(tmp_path / run / Path(m["file"]).name.replace(".png", ".npy"))
               for run, m in (("onnx", mine), ("module", theirs))]  # fmt: skip
        np.testing.assert_allclose(_unit(raw[0]), _unit(raw[1]), atol=1e-4, err_msg=mine["file"])
    cases = [([], "needs gradients, which an ONNX model has not; use one of drise"),
             (["--method", "eigencam", "--input-size", "320"], "exported for 160 only")]  # fmt: skip
    for extra, said in cases:
        r = invoke("gradcam", str(photo), "--model", str(fixed), *extra, "--out", str(tmp_path / "o"))
        assert r.exit_code == 2 and said in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _graph(path: Path, inputs: dict[str, list[Any]], nhwc: bool = False) -> Path:
    """A small ONNX classifier (mean over space, then 3 scores) with the given inputs, written to ``path``."""
    import onnx
    from onnx import TensorProto, helper

    nodes, first = [], next(iter(inputs))
    if len(inputs) > 1:
        nodes.append(helper.make_node("Add", list(inputs), ["sum"]))
        first = "sum"
    if nhwc:
        nodes.append(helper.make_node("Transpose", [first], ["nchw"], perm=[0, 3, 1, 2]))
        first = "nchw"
    nodes += [
        helper.make_node("GlobalAveragePool", [first], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_deployed_models_the_photo_cannot_feed_are_one_line_naming_the_reason(
    trained: Any, tmp_path: Path
) -> None:
    """A channels-last ONNX graph is called that (not "64x3, not square"); a graph of two inputs is not blamed
    on onnxruntime (exit 2, not 3); a fixed non-square .pt2 names its size (no "leave --input-size out" when
    none was given); a .pt2 of dynamic height and width asks for --input-size, as an ONNX graph does."""
    pytest.importorskip("onnxruntime")
    img, _ = draw_shape(1, 48, np.random.default_rng(5))
    photo = write_image(tmp_path / "disc.png", (img * 255).round().astype(np.uint8))
    nhwc = _graph(tmp_path / "nhwc.onnx", {"x": ["N", 64, 64, 3]}, nhwc=True)
    two = _graph(tmp_path / "two.onnx", {"rgb": ["N", 3, 32, 32], "depth": ["N", 3, 32, 32]})
    model = trained.model.eval()
    batch = torch.export.Dim("batch")
    wide = tmp_path / "wide.pt2"
    program = torch.export.export(model, (torch.zeros(2, 3, 48, 64),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, wide)
    anysize = tmp_path / "any.pt2"
    sides = {
        0: batch,
        2: 16 * torch.export.Dim("h", min=2, max=8),
        3: 16 * torch.export.Dim("w", min=2, max=8),
    }
    torch.export.save(torch.export.export(model, (torch.zeros(2, 3, 48, 48),), dynamic_shapes={"x": sides}),
                      anysize)  # fmt: skip
    cases = [
        (nhwc, "eigencam", 2, "nhwc.onnx takes channels-last inputs (N, 64, 64, 3: NHWC)"),
        (two, "eigencam", 2, "two.onnx takes 2 inputs (rgb, depth), and hookviz feeds one"),
        (wide, "gradcam", 2, "wide.pt2 takes 48x64 inputs only"),
        (
            anysize,
            "gradcam",
            2,
            "any.pt2 takes any input size (its height and width are dynamic): give --input-size",
        ),
    ]
    for file, method, code, said in cases:
        r = invoke(
            "gradcam", str(photo), "--model", str(file), "--method", method, "--out", str(tmp_path / "o")
        )
        assert r.exit_code == code and said in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "leave --input-size out" not in r.stderr, r.stderr
    r = invoke(
        "gradcam", str(photo), "--model", str(anysize), "--input-size", "48", "--out", str(tmp_path / "a")
    )
    assert r.exit_code == 0, r.stderr
    (rec,) = records(tmp_path / "a")
    assert rec["predicted"]["index"] == 1 and rec["settings"]["input"]["crop_size"] == 48  # the disc, at 48
