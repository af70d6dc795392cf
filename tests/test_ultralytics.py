"""ultralytics YOLO through ``--model ultralytics:...``: boxes equal ``model.predict``, maps find their boxes.

The detector is the fixture ``scripts/train_shapes_yolo.py`` trained (a tiny YOLOv8 on synthetic shape scenes,
held-out mAP50 0.995). Photos are non-square so that the letterbox pads them (the maps must be mapped back
through the padding); the other models are ultralytics' own definitions built with random weights.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.engine.detection import explain_detections
from hookviz.io.shapes import shapes_scene
from hookviz.models.sources import Options
from hookviz.models.ultralytics import process_kept
from tests.conftest import (
    ROOT,
    hook_counts,
    invoke,
    picture,
    records,
    write_image,
)

# ultralytics patches PIL.Image.open and torch.save when imported; hookviz imports it with them put back,
# and so do the tests (a patched Image.open would turn the other tests' bad files into install attempts).
with process_kept():
    ultralytics = pytest.importorskip("ultralytics")
    from ultralytics import YOLO

FIXTURE = ROOT / "tests" / "fixtures" / "shapes_yolo.pt"
SPEC = f"ultralytics:{FIXTURE}"
#: Photo sizes (H, W): letterboxed to 160 they are padded above and below, left and right, or not at all.
SIZES = [(130, 200), (150, 100), (96, 160), (176, 144)]


def _build(spec: str = SPEC, weights: str = "DEFAULT") -> Any:
    from hookviz.models.ultralytics import build

    return build(spec, weights, Options())


def _scenes(n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = SIZES[i % len(SIZES)]
        img, boxes, labels, _ = shapes_scene(rng, h, w, 3, (9, 16))
        out.append(((img * 255).round().astype(np.uint8), boxes, labels))
    return out


def _tensor(rgb: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(rgb).permute(2, 0, 1).float() / 255


@pytest.fixture(scope="module")
def yolo() -> Any:
    return _build()


def test_boxes_classes_and_scores_equal_predict(yolo: Any) -> None:
    """On letterboxed photos of four shapes: every box within a tenth of a pixel of ``predict``'s, the same
    classes in the same order, scores within 1e-4 (predict fuses Conv+BN; hookviz runs the model as saved)."""
    reference = YOLO(str(FIXTURE))
    compared = 0
    for rgb, _, _ in _scenes(12, seed=21):
        ours = yolo.model.detect([_tensor(rgb)], 0.25)[0]
        theirs = reference.predict(rgb[..., ::-1].copy(), conf=0.25, verbose=False)[0].boxes
        assert ours.labels.tolist() == theirs.cls.long().tolist()
        assert torch.allclose(ours.boxes, theirs.xyxy, atol=0.1), (ours.boxes, theirs.xyxy)
        assert torch.allclose(ours.scores.detach(), theirs.conf, atol=1e-4)
        compared += len(theirs)
    assert compared >= 20


def test_letterbox_region_is_where_ultralytics_puts_the_photo(yolo: Any) -> None:
    """Padding (grey 114) lies exactly outside the region the maps are cut from."""
    for h, w in SIZES:
        rgb = np.zeros((h, w, 3), np.uint8)
        found = yolo.model.detect([_tensor(rgb)], 0.25)[0]
        canvas = yolo.model.letterbox(_tensor(rgb)[None])[0]
        top, left, rh, rw = found.region
        assert tuple(canvas.shape[1:]) == found.canvas and found.canvas[0] % 32 == found.canvas[1] % 32 == 0
        inside = canvas[:, top : top + rh, left : left + rw]
        assert float(inside.abs().max()) == 0.0  # the black photo
        assert float(canvas.sum()) == pytest.approx(114 / 255 * 3 * (canvas[0].numel() - rh * rw), rel=1e-5)
    assert {_pad(yolo, s) for s in SIZES} == {"rows", "columns", "none"}


def _pad(yolo: Any, size: tuple[int, int]) -> str:
    found = yolo.model.detect([torch.zeros(3, *size)], 0.25)[0]
    top, left, _, _ = found.region
    return "rows" if top else "columns" if left else "none"


def test_each_box_map_peaks_inside_its_box(yolo: Any) -> None:
    """The default (HiResCAM, the mean of the three neck scales) for each detected box: its peak lies in
    the box (2 px margin) for at least 90 % of the boxes of held-out letterboxed scenes; every scale on its
    own gets gradients (the head does not cut them off)."""
    layers = list(yolo.model.default_layers)
    assert layers == ["model.15", "model.18", "model.21"]
    from hookviz.methods import cams

    hits = total = 0
    for rgb, _, _ in _scenes(16, seed=33):
        ex = explain_detections(yolo.model, [_tensor(rgb)], layers, ["hirescam"], score_threshold=0.5)[0]
        per_layer = [ex.maps[("hirescam", la)] for la in layers]
        # A box's score reads one scale's anchor; gradients reach that scale and those it is made from.
        reached = torch.stack([m.flatten(1).amax(dim=1) > 0 for m in per_layer])  # (scales, boxes)
        assert reached.any(dim=0).all()
        fused = cams.fuse([m[None] for m in per_layer], ex.resized, "mean")[0]
        h, w = rgb.shape[:2]
        for box, cam in zip(ex.boxes.tolist(), fused, strict=True):
            up = torch.nn.functional.interpolate(cam[None, None], size=(h, w), mode="bilinear")[0, 0]
            y, x = divmod(int(up.argmax()), w)
            total += 1
            hits += box[0] - 2 <= x <= box[2] + 2 and box[1] - 2 <= y <= box[3] + 2
    assert total >= 25 and hits >= 0.9 * total, (hits, total)


def test_the_model_is_left_as_found(yolo: Any) -> None:
    model = yolo.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    model.train()
    explain_detections(
        model, [torch.rand(3, 120, 150)], ["model.15"], ["gradcam", "eigencam"], score_threshold=0
    )
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())
    assert hook_counts(model) == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_gradcam_from_the_cli_writes_a_map_per_box(tmp_path: Path, yolo: Any) -> None:
    (folder := tmp_path / "in").mkdir()
    scenes = _scenes(2, seed=5)
    for i, (rgb, _, _) in enumerate(scenes):
        write_image(folder / f"s{i}.png", rgb)
    r = invoke("gradcam", str(folder), "--model", SPEC, "--out", str(tmp_path / "out"), "--max-boxes", "3")
    assert r.exit_code == 0, r.output
    assert "model.15, model.18, model.21" in r.stderr  # the note names the fused tensors
    recs = sorted(records(tmp_path / "out"), key=lambda rec: str(rec["input"]))
    for rec, (rgb, _, _) in zip(recs, scenes, strict=True):
        found = yolo.model.detect([_tensor(rgb)], 0.5)[0]
        want = found.scores.detach().argsort(descending=True)[:3]
        assert [d["index"] for d in rec["detections"]] == found.labels[want].tolist()
        assert [d["name"] for d in rec["detections"]] == [
            ("square", "disc", "cross")[int(k)] for k in found.labels[want]
        ]
        assert rec["settings"]["fuse"] == "mean" and rec["layers"] == ["model.15", "model.18", "model.21"]
        for d in rec["detections"]:
            [name] = d["outputs"]
            assert ".hirescam.fused.box" in name
            picture(tmp_path / "out" / name, min_size=(60, 60))


def test_one_scale_on_request_and_every_detector_method(tmp_path: Path) -> None:
    rgb = _scenes(1, seed=8)[0][0]
    write_image(tmp_path / "s.png", rgb)
    r = invoke(
        "gradcam", str(tmp_path / "s.png"), "--model", SPEC, "--out", str(tmp_path / "out"),
        "--layer", "model.18", "--method", "gradcam,layercam,eigencam,drise", "--masks", "64",
        "--max-boxes", "1",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    [rec] = records(tmp_path / "out")
    assert {m["method"] for m in rec["maps"]} == {"gradcam", "layercam", "eigencam", "drise"}
    assert {m["layer"] for m in rec["maps"]} == {"model.18"}
    assert all(m["finite"] for m in rec["maps"])
    assert all(m["max"] > m["min"] for m in rec["maps"] if m["method"] in ("eigencam", "drise"))


def test_other_commands_take_a_yolo_and_evaluate_refuses_it(tmp_path: Path) -> None:
    rgb = _scenes(1, seed=9)[0][0]
    write_image(tmp_path / "s.png", rgb)
    r = invoke(
        "featuremaps",
        str(tmp_path / "s.png"),
        "--model",
        SPEC,
        "--layer",
        "model.15",
        "--out",
        str(tmp_path / "f"),
    )
    assert r.exit_code == 0, r.output
    [rec] = records(tmp_path / "f")
    assert "nothing detected" not in r.stderr and rec["task"] == "detection"
    r = invoke("layers", "--model", SPEC)
    assert r.exit_code == 0 and "model.22" in r.stdout and "Detect" in r.stdout
    r = invoke("summary", "--model", SPEC)
    assert r.exit_code == 0, r.output
    r = invoke("evaluate", str(tmp_path / "s.png"), "--model", SPEC, "--out", str(tmp_path / "e"))
    assert r.exit_code == 2 and "detector" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_input_size_letterboxes_as_predict_imgsz(tmp_path: Path) -> None:
    """``--input-size 200`` rounds up to the stride (224), as ``predict(imgsz=200)`` does."""
    from hookviz.tasks import load_model

    loaded = load_model(SPEC, input_size=200)
    assert loaded.model.imgsz == 224
    rgb = _scenes(1, seed=12)[0][0]
    ours = loaded.model.detect([_tensor(rgb)], 0.25)[0]
    theirs = YOLO(str(FIXTURE)).predict(rgb[..., ::-1].copy(), imgsz=200, verbose=False)[0].boxes
    assert ours.canvas[1] == 224
    assert torch.allclose(ours.boxes, theirs.xyxy, atol=0.1)


@pytest.mark.parametrize("yaml", ["yolov8n-seg.yaml", "yolo11n.yaml", "yolo26n.yaml"])
def test_segment_and_newer_models_equal_ultralytics_postprocessing(yaml: str) -> None:
    """Other heads, random weights: a segment head (mask coefficients after the classes; predict drops the
    instances whose mask is empty), YOLO11, and YOLO26's end-to-end head. Random weights give every anchor
    nearly the same score, so NMS would keep whichever near-tie its sort puts first and a second run of the
    model (predict fuses Conv+BN: other last bits) may differ; ultralytics' own predictor therefore
    post-processes the very outputs hookviz read."""
    from ultralytics.models.yolo.detect.predict import DetectionPredictor
    from ultralytics.models.yolo.segment.predict import SegmentationPredictor

    built = _build(f"ultralytics:{yaml}")
    _spread(built, torch.Generator().manual_seed(0))
    rgb = _scenes(1, seed=4)[0][0]
    [ours] = built.model.detect([_tensor(rgb)], 0.05)
    canvas = built.model.letterbox(_tensor(rgb)[None])
    segment = yaml.endswith("-seg.yaml")
    task = "segment" if segment else "detect"
    predictor = (SegmentationPredictor if segment else DetectionPredictor)(
        overrides={"conf": 0.05, "task": task}
    )
    predictor.model, predictor.batch = built.model.wrapped, [["s.png"]]
    with torch.no_grad():
        theirs = predictor.postprocess(built.model.wrapped(canvas), canvas, [rgb[..., ::-1].copy()])[0]
    assert len(ours.boxes) == len(theirs.boxes) > 0
    assert torch.allclose(ours.boxes, theirs.boxes.xyxy, atol=1e-3)
    assert torch.equal(ours.labels, theirs.boxes.cls.long())
    assert torch.allclose(ours.scores.detach(), theirs.boxes.conf, atol=1e-6)
    if segment:
        top, left, h, w = ours.region
        assert ours.masks is not None
        assert torch.equal(ours.masks, theirs.masks.data[:, top : top + h, left : left + w].bool())


def test_classify_models_are_classifiers_with_logits() -> None:
    """A classify model is explained by its logits; its preprocessing is ultralytics' classify transform."""
    from hookviz.tasks import load_model

    loaded = load_model("ultralytics:yolov8n-cls.yaml")
    assert loaded.task_name == "classification"
    reference = YOLO("yolov8n-cls.yaml")
    reference.model.load_state_dict(loaded.model.wrapped.state_dict())
    rgb = np.random.default_rng(0).integers(0, 256, (180, 240, 3), dtype=np.uint8)
    x = torch.from_numpy(loaded.preprocess(rgb)[0])[None]
    with torch.no_grad():
        logits = loaded.model(x)
    probs = reference.predict(rgb[..., ::-1].copy(), imgsz=224, verbose=False)[0].probs.data
    assert torch.allclose(logits.softmax(1)[0], probs, atol=1e-4)


def test_bad_specs_are_one_line(tmp_path: Path) -> None:
    write_image(tmp_path / "s.png", np.zeros((40, 40, 3), np.uint8))
    for spec, words in [
        ("ultralytics:nothere.pt", "cannot load"),
        ("ultralytics:yolov8n-pose.yaml", "pose model"),
        ("ultralytics:", "needs a checkpoint"),
    ]:
        r = invoke("gradcam", str(tmp_path / "s.png"), "--model", spec, "--out", str(tmp_path / "o"))
        assert r.exit_code != 0 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_weights_none_keeps_the_class_names() -> None:
    built = _build(weights="none")
    assert built.categories == ("square", "disc", "cross") and built.model.imgsz == 160
    assert not built.pretrained


@pytest.fixture(scope="module")
def segmenter() -> Any:
    """A YOLOv8 segment model, random weights with class scores spread out (a few classes pass 0.05)."""
    built = _build("ultralytics:yolov8n-seg.yaml")
    _spread(built, torch.Generator().manual_seed(1))
    with torch.no_grad():  # two classes well above the others, their scores varying from place to place
        for conv in built.model.model[-1].modules():
            if isinstance(conv, torch.nn.Conv2d) and conv.bias is not None and conv.out_channels == 80:
                conv.bias.fill_(-8.0)
                conv.bias[[3, 7]] = -1.0
    return built


def _spread(built: Any, gen: torch.Generator) -> None:
    """Class scores spread out over classes and places: random init gives every anchor nearly the same score,
    and NMS among near-ties keeps whichever its sort puts first."""
    with torch.no_grad():
        for conv in built.model.model[-1].modules():
            last = isinstance(conv, torch.nn.Conv2d) and conv.bias is not None
            if last and conv.out_channels == built.model.num_classes:
                conv.bias.copy_(torch.randn(conv.out_channels, generator=gen) * 0.3 - 3)
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) * 0.5)


def test_segment_models_explain_each_class_region(segmenter: Any) -> None:
    """A segment model's class regions: each class among the boxes, its region the union of its instances'
    masks (those of ``predict``), its target the sum of their scores; HiResCAM being linear in the gradient,
    a region's map without ReLU is the sum of its instances' maps."""
    rgb = _scenes(1, seed=6)[0][0]
    x = _tensor(rgb)
    kw = {"score_threshold": 0.05, "max_boxes": 8, "relu": False}
    [ex] = explain_detections(segmenter.model, [x], ["model.15"], ["hirescam"], **kw)
    assert len(ex.region_labels) == 2
    assert ex.region_labels.tolist() == list(dict.fromkeys(ex.labels.tolist()))
    box_maps, region_maps = ex.maps[("hirescam", "model.15")], ex.region_maps[("hirescam", "model.15")]
    for r, k in enumerate(ex.region_labels.tolist()):
        mine = ex.labels == k
        assert float(ex.region_scores[r]) == pytest.approx(float(ex.scores[mine].sum()), rel=1e-5)
        assert torch.allclose(
            region_maps[r], box_maps[mine].sum(dim=0), atol=1e-5 * float(box_maps.abs().max())
        )
    masks = segmenter.model.detect([x], 0.05)[0].masks
    for r, k in enumerate(ex.region_labels.tolist()):
        assert torch.equal(ex.region_masks[r], masks[ex_indices(ex, segmenter, x, k)].any(dim=0))


def ex_indices(ex: Any, segmenter: Any, x: torch.Tensor, k: int) -> torch.Tensor:
    """The indices, among all of the photo's detections, of the shown boxes of class ``k``."""
    [found] = segmenter.model.detect([x], 0.05)
    order = found.scores.detach().argsort(descending=True, stable=True)[: len(ex.boxes)]
    return order[found.labels[order] == k]


def test_segment_class_regions_from_the_cli(
    tmp_path: Path, segmenter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookviz.models import sources

    made = sources.Source("ultralytics", lambda spec, weights, options: segmenter)
    monkeypatch.setitem(sources._SOURCES, "ultralytics", made)
    write_image(tmp_path / "s.png", _scenes(1, seed=6)[0][0])
    r = invoke("gradcam", str(tmp_path / "s.png"), "--model", "ultralytics:yolov8n-seg.yaml", "--out",
               str(tmp_path / "out"), "--score-threshold", "0.05", "--max-boxes", "4")  # fmt: skip
    assert r.exit_code == 0, r.output
    [rec] = records(tmp_path / "out")
    assert rec["regions"] and all(reg["instances"] >= 1 and 0 < reg["pixels"] < 1 for reg in rec["regions"])
    for reg in rec["regions"]:
        [name] = reg["outputs"]
        assert f".class{reg['index']}.png" in name
        picture(tmp_path / "out" / name, min_size=(60, 60))
    assert sum(1 for m in rec["maps"] if m.get("region") is not None) == len(rec["regions"])


def test_nothing_detected_is_a_line_not_a_failure(tmp_path: Path) -> None:
    """No box above the threshold: the fused default has nothing to fuse; the photo is still done."""
    write_image(tmp_path / "s.png", _scenes(1, seed=10)[0][0])
    r = invoke("gradcam", str(tmp_path / "s.png"), "--model", SPEC, "--out", str(tmp_path / "o"),
               "--score-threshold", "0.9999")  # fmt: skip
    assert r.exit_code == 0 and "nothing detected with score >= 0.9999" in r.output, r.output
    [rec] = records(tmp_path / "o")
    assert rec["detections"] == [] and rec["maps"] == []


def test_loading_a_yolo_leaves_the_process_as_found(tmp_path: Path) -> None:
    """ultralytics patches PIL.Image.open (to pip-install a HEIF plugin when a file is not an image) and
    torch.save on import; after hookviz loads a YOLO both are the originals; a broken photo is one line."""
    import importlib

    from PIL import Image

    from hookviz.errors import InputError
    from hookviz.io.images import load_rgb

    for name in [m for m in sys.modules if m == "ultralytics" or m.startswith("ultralytics.")]:
        del sys.modules[name]  # a first import, as in a fresh process
    opened, saved = Image.open, torch.save
    importlib.invalidate_caches()
    _build()
    assert Image.open is opened and torch.save is saved
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(InputError):
        load_rgb(tmp_path / "empty.jpg")


def test_a_yolo_reads_an_rgba_png_as_predict_does(tmp_path: Path) -> None:
    """Shapes painted under a transparent alpha: predict (cv2.imread) sees them, a viewer does not; the
    boxes hookviz explains are predict's."""
    from hookviz.models.ultralytics import process_kept

    with process_kept():
        pytest.importorskip("ultralytics")
        from ultralytics import YOLO
    import cv2

    from hookviz.io.inputs import Item, read_input
    from hookviz.io.shapes import shapes_scene
    from hookviz.models.sources import Options
    from hookviz.models.ultralytics import build

    fixture = ROOT / "tests" / "fixtures" / "shapes_yolo.pt"
    built = build(f"ultralytics:{fixture}", "DEFAULT", Options())
    rng = np.random.default_rng(4)
    compared = 0
    for i in range(3):
        img, *_ = shapes_scene(rng, 130, 200, 3, (9, 16))
        rgb = (img * 255).round().astype(np.uint8)
        alpha = np.full(rgb.shape[:2], 255, np.uint8)
        alpha[:, : rgb.shape[1] // 2] = 0  # the left half transparent
        path = tmp_path / f"s{i}.png"
        cv2.imwrite(str(path), np.dstack([rgb[..., ::-1], alpha]))
        drawn, _, _ = read_input(Item(str(path), path), built.preprocess, 10**8)
        np.testing.assert_array_equal(drawn, cv2.imread(str(path))[..., ::-1])
        ours = built.model.detect([torch.from_numpy(drawn.copy()).permute(2, 0, 1).float() / 255], 0.25)[0]
        theirs = YOLO(str(fixture)).predict(str(path), conf=0.25, verbose=False)[0].boxes
        assert ours.labels.tolist() == theirs.cls.long().tolist()
        assert torch.allclose(ours.boxes, theirs.xyxy, atol=0.1)
        compared += len(theirs)
    assert compared >= 3
