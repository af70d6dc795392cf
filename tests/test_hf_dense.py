"""Hugging Face detectors and semantic segmenters through ``--model hf:DIR``, built from configs (no hub).

Each tiny model is saved with its image processor, as ``save_pretrained`` leaves a folder. The boxes must be
those of the processor's ``post_process_object_detection`` and the regions those of its
``post_process_semantic_segmentation``, computed here independently from the processor's own inputs; every
method that applies must run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.engine.detection import detection_methods, explain_detections
from hookviz.engine.explain import explain
from hookviz.io.shapes import shapes_scene
from hookviz.methods import MethodOptions
from hookviz.tasks import load_model
from tests.conftest import (
    hook_counts,
    invoke,
    picture,
    records,
    write_image,
)

T = pytest.importorskip("transformers")

LABELS = {0: "square", 1: "disc", 2: "cross"}
COMMON = {"num_labels": 3, "id2label": LABELS, "label2id": {v: k for k, v in LABELS.items()}}
SEG_LABELS = {0: "background", 1: "square", 2: "disc", 3: "cross"}
SEG_COMMON = {"num_labels": 4, "id2label": SEG_LABELS, "label2id": {v: k for k, v in SEG_LABELS.items()}}
EDGES = {"shortest_edge": 160, "longest_edge": 320}


#: A one-layer encoder and decoder, two heads: every DETR-like model here.
TINY = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
}


def _detr(cls: Any, **kw: Any) -> Any:
    base = {"backbone": "resnet18", "use_pretrained_backbone": False, **TINY, "num_queries": 12}
    return cls(**{**base, **kw}, **COMMON)


def _swin() -> Any:
    return T.SwinConfig(
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 2, 2],
        window_size=4,
        image_size=64,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )


DETECTORS: dict[str, Any] = {
    "detr": lambda: (_detr(T.DetrConfig), T.DetrImageProcessor(size=EDGES)),
    "conditional_detr": lambda: (_detr(T.ConditionalDetrConfig), T.ConditionalDetrImageProcessor(size=EDGES)),
    "deformable_detr": lambda: (
        _detr(T.DeformableDetrConfig, decoder_layers=2, encoder_n_points=2, decoder_n_points=2),
        T.DeformableDetrImageProcessor(size=EDGES),
    ),
    "rt_detr": lambda: (
        T.RTDetrConfig(
            backbone_config=T.RTDetrResNetConfig(
                hidden_sizes=[16, 32, 64, 128],
                embedding_size=16,
                depths=[1, 1, 1, 1],
                layer_type="basic",
                out_features=["stage2", "stage3", "stage4"],
            ),
            encoder_in_channels=[32, 64, 128],
            decoder_in_channels=[32, 32, 32],
            encoder_hidden_dim=32,
            num_queries=12,
            **TINY,
            **COMMON,
        ),
        T.RTDetrImageProcessor(size={"height": 160, "width": 160}),
    ),
    "yolos": lambda: (
        T.YolosConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=[160, 160],
            patch_size=16,
            num_detection_tokens=10,
            **COMMON,
        ),
        T.YolosImageProcessor(size=EDGES),
    ),
}

SQUARE = {"height": 64, "width": 64}
SEGMENTERS: dict[str, Any] = {
    "segformer": lambda: (
        T.SegformerConfig(
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[16, 32],
            patch_sizes=[7, 3],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
            decoder_hidden_size=32,
            **SEG_COMMON,
        ),
        T.SegformerImageProcessor(size=SQUARE),
        "AutoModelForSemanticSegmentation",
    ),
    "upernet": lambda: (
        T.UperNetConfig(
            backbone_config=T.ConvNextConfig(
                hidden_sizes=[8, 16, 32, 64],
                depths=[1, 1, 1, 1],
                out_features=["stage1", "stage2", "stage3", "stage4"],
            ),
            hidden_size=16,
            auxiliary_in_channels=32,
            use_auxiliary_head=False,
            **SEG_COMMON,
        ),
        T.SegformerImageProcessor(size=SQUARE),
        "AutoModelForSemanticSegmentation",
    ),
    "dpt": lambda: (
        T.DPTConfig(
            hidden_size=32,
            num_hidden_layers=4,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=64,
            patch_size=16,
            backbone_out_indices=[0, 1, 2, 3],
            neck_hidden_sizes=[8, 16, 32, 32],
            fusion_hidden_size=16,
            head_in_index=-1,
            use_auxiliary_head=False,
            **SEG_COMMON,
        ),
        T.DPTImageProcessor(size=SQUARE, keep_aspect_ratio=False),
        "AutoModelForSemanticSegmentation",
    ),
    "mask2former": lambda: (
        T.Mask2FormerConfig(
            backbone_config=_swin(),
            feature_size=32,
            mask_feature_size=32,
            hidden_dim=32,
            encoder_feedforward_dim=64,
            dim_feedforward=64,
            encoder_layers=1,
            decoder_layers=2,
            num_queries=8,
            num_attention_heads=2,
            **SEG_COMMON,
        ),
        T.Mask2FormerImageProcessor(size={"shortest_edge": 64, "longest_edge": 128}),
        "AutoModelForUniversalSegmentation",
    ),
    "maskformer": lambda: (
        T.MaskFormerConfig(
            backbone_config=_swin(),
            fpn_feature_size=32,
            mask_feature_size=32,
            decoder_config={"model_type": "detr", **TINY, "num_queries": 8},
            **SEG_COMMON,
        ),
        T.MaskFormerImageProcessor(size={"shortest_edge": 64, "longest_edge": 128}),
        "AutoModelForUniversalSegmentation",
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every model saved (seed 0) with its processor, as ``save_pretrained`` leaves a folder."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name, make in {**DETECTORS, **SEGMENTERS}.items():
        config, processor, *auto = make()
        cls = getattr(T, auto[0] if auto else "AutoModelForObjectDetection")
        torch.manual_seed(0)
        model = cls.from_config(config)
        with torch.no_grad():  # class scores spread out, so that boxes and regions differ from query to query
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        model.save_pretrained(root / name)
        processor.save_pretrained(root / name)
        out[name] = root / name
    return out


def _photo(seed: int, size: tuple[int, int] = (120, 200)) -> np.ndarray:
    img, _, _, _ = shapes_scene(np.random.default_rng(seed), *size, 3, (9, 16))
    return (img * 255).round().astype(np.uint8)


def _tensor(rgb: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(rgb).permute(2, 0, 1).float() / 255


@pytest.mark.parametrize("name", list(DETECTORS))
def test_boxes_equal_the_processors_post_processing(name: str, folders: dict[str, Path]) -> None:
    loaded = load_model(f"hf:{folders[name]}", weights="DEFAULT")
    assert loaded.task_name == "detection" and loaded.categories == ("square", "disc", "cross")
    model = T.AutoModelForObjectDetection.from_pretrained(folders[name]).eval()
    processor = T.AutoImageProcessor.from_pretrained(folders[name])
    for seed in (1, 2):
        rgb = _photo(seed)
        with torch.no_grad():
            out = model(**processor(images=rgb, return_tensors="pt"))
            want = processor.post_process_object_detection(out, threshold=0.0, target_sizes=[rgb.shape[:2]])[
                0
            ]
            [got] = loaded.model.detect([_tensor(rgb)], 0.0)
        assert len(got.boxes) == len(want["boxes"]) > 0
        assert torch.allclose(got.boxes, want["boxes"], atol=1e-3)
        assert torch.equal(got.labels, want["labels"])
        assert torch.allclose(got.scores, want["scores"], atol=1e-5)


@pytest.mark.parametrize("name", list(DETECTORS))
def test_every_detector_method_runs_and_the_model_is_left_as_found(
    name: str, folders: dict[str, Path]
) -> None:
    loaded = load_model(f"hf:{folders[name]}", weights="DEFAULT")
    model = loaded.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    layer = {
        "yolos": "vit.encoder.layer.1.layernorm_before",
        "rt_detr": "model.backbone.model.encoder.stages.3",
    }
    layers = [layer.get(name, "model.backbone.model.layer4")]
    methods = detection_methods()
    [ex] = explain_detections(
        model,
        [_tensor(_photo(3))],
        layers,
        methods,
        score_threshold=0.0,
        max_boxes=2,
        options=MethodOptions(masks=8, batch=4),
    )
    assert len(ex.boxes) == 2
    for (method, _), maps in ex.maps.items():
        assert torch.isfinite(maps).all(), method
    # A box's gradient reaches the backbone: its HiResCAM map is not all zeros.
    assert float(ex.maps[("hirescam", layers[0])].abs().amax()) > 0
    assert hook_counts(model) == 0 and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_detr_encoder_tokens_are_laid_on_their_grid(folders: dict[str, Path]) -> None:
    """An encoder layer's tokens ``(1, h*w, d)`` become a ``(h, w)`` map on the backbone's stride-32 grid, and
    the CLI fuses it with the backbone's map."""
    loaded = load_model(f"hf:{folders['detr']}", weights="DEFAULT")
    rgb = _photo(4)
    [ex] = explain_detections(
        loaded.model, [_tensor(rgb)], ["model.encoder.layers.0"], ["hirescam"], score_threshold=0
    )
    assert float(ex.maps[("hirescam", "model.encoder.layers.0")].abs().amax()) > 0


def test_detectors_from_the_cli(tmp_path: Path, folders: dict[str, Path]) -> None:
    write_image(tmp_path / "s.png", _photo(5))
    r = invoke(
        "gradcam",
        str(tmp_path / "s.png"),
        "--model",
        f"hf:{folders['detr']}",
        "--weights",
        "DEFAULT",
        "--out",
        str(tmp_path / "out"),
        "--score-threshold",
        "0",
        "--max-boxes",
        "2",
        "--layer",
        "model.backbone.model.layer4",
        "--layer",
        "model.encoder.layers.0",
        "--fuse",
        "mean",
    )
    assert r.exit_code == 0, r.output
    [rec] = records(tmp_path / "out")
    assert [d["name"] in LABELS.values() for d in rec["detections"]] == [True, True]
    assert {m["layer"] for m in rec["maps"]} == {
        "model.backbone.model.layer4",
        "model.encoder.layers.0",
        "fused",
    }
    for d in rec["detections"]:
        for name in d["outputs"]:
            picture(tmp_path / "out" / name, min_size=(60, 60))
    r = invoke(
        "gradcam",
        str(tmp_path / "s.png"),
        "--model",
        f"hf:{folders['yolos']}",
        "--weights",
        "DEFAULT",
        "--out",
        str(tmp_path / "y"),
        "--score-threshold",
        "0",
        "--max-boxes",
        "1",
    )
    assert r.exit_code == 0 and "patch tokens entering its last encoder block" in r.stderr, r.output
    r = invoke(
        "evaluate",
        str(tmp_path / "s.png"),
        "--model",
        f"hf:{folders['detr']}",
        "--weights",
        "DEFAULT",
        "--out",
        str(tmp_path / "e"),
    )
    assert r.exit_code == 2 and "detector" in r.stderr


@pytest.mark.parametrize("name", list(SEGMENTERS))
def test_regions_equal_the_processors_post_processing(name: str, folders: dict[str, Path]) -> None:
    """The argmax of the class scores hookviz reads is the processor's semantic map, on the same input;
    Grad-CAM and HiResCAM run at the default layer."""
    loaded = load_model(f"hf:{folders[name]}", weights="DEFAULT")
    assert loaded.task_name == "segmentation" and loaded.categories == tuple(SEG_LABELS.values())
    x = torch.from_numpy(loaded.preprocess(_photo(6, (60, 90)))[0])[None]
    auto = getattr(T, SEGMENTERS[name]()[2])
    model = auto.from_pretrained(folders[name]).eval()
    processor = T.AutoImageProcessor.from_pretrained(folders[name])
    with torch.no_grad():
        want = processor.post_process_semantic_segmentation(
            model(pixel_values=x), target_sizes=[x.shape[-2:]]
        )[0]
        got = loaded.model(x)
    assert got.shape == (1, 4, *x.shape[-2:])
    assert torch.equal(got[0].argmax(0), want)
    layer = loaded.model.default_layers[0]
    ex = explain(loaded.model, x, [layer], ["gradcam", "hirescam"])
    assert all(torch.isfinite(m).all() for m in ex.maps.values())
    assert ex.labels is not None and torch.equal(ex.labels[0].long(), want)


def test_segmenters_from_the_cli_with_evaluate(tmp_path: Path, folders: dict[str, Path]) -> None:
    write_image(tmp_path / "s.png", _photo(7, (60, 90)))
    spec = ["--model", f"hf:{folders['segformer']}", "--weights", "DEFAULT"]
    r = invoke("gradcam", str(tmp_path / "s.png"), *spec, "--out", str(tmp_path / "out"), "--target", "disc")
    assert r.exit_code == 0 and "decode_head.linear_fuse" in r.stderr, r.output
    [rec] = records(tmp_path / "out")
    assert rec["task"] == "segmentation"
    r = invoke("evaluate", str(tmp_path / "s.png"), *spec, "--out", str(tmp_path / "e"), "--steps", "4")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("name", ["detr", "rt_detr"])
def test_input_size_resizes_as_the_processor_would(name: str, folders: dict[str, Path]) -> None:
    """``--input-size 96``: the processor's shorter side (DETR, the longer capped at 1333/800 of it) or its
    fixed square (RT-DETR) becomes 96; boxes equal the processor's own at that size."""
    loaded = load_model(f"hf:{folders[name]}", weights="DEFAULT", input_size=96)
    size = {"height": 96, "width": 96} if name == "rt_detr" else {"shortest_edge": 96, "longest_edge": 160}
    model = T.AutoModelForObjectDetection.from_pretrained(folders[name]).eval()
    processor = T.AutoImageProcessor.from_pretrained(folders[name])
    rgb = _photo(8)
    with torch.no_grad():
        inputs = processor(images=rgb, size=size, return_tensors="pt")
        want = processor.post_process_object_detection(
            model(**inputs), threshold=0.0, target_sizes=[rgb.shape[:2]]
        )
        [got] = loaded.model.detect([_tensor(rgb)], 0.0)
    assert got.canvas == tuple(inputs["pixel_values"].shape[-2:]) and min(got.canvas) == 96
    assert torch.allclose(got.boxes, want[0]["boxes"], atol=1e-3)


@pytest.mark.parametrize(
    "make",
    [
        "Mask2FormerImageProcessor(size={'shortest_edge': 64, 'longest_edge': 96})",
        "Mask2FormerImageProcessor(size={'shortest_edge': 800, 'longest_edge': 1333})",
        "MaskFormerImageProcessor(size={'shortest_edge': 64, 'longest_edge': 128}, size_divisor=32)",
        "DPTImageProcessor(size={'height': 64, 'width': 64}, keep_aspect_ratio=True, ensure_multiple_of=14)",
        "DPTImageProcessor(size={'height': 96, 'width': 96}, keep_aspect_ratio=True, ensure_multiple_of=32)",
        "DPTImageProcessor(size={'height': 64, 'width': 64}, keep_aspect_ratio=False, ensure_multiple_of=32)",
        "SegformerImageProcessor(size={'height': 64, 'width': 64})",
    ],
)
def test_a_segmenters_input_is_the_shape_its_processor_gives(make: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    import transformers  # noqa: F401  (the processors named by ``make``)

    from hookviz.io.images import Preprocess
    from hookviz.models.hf import _preprocessing

    processor = eval(f"transformers.{make}")
    processor.save_pretrained(tmp_path)
    built = SimpleNamespace(preprocess=Preprocess())
    _preprocessing(built, str(tmp_path), None)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    sizes = [
        (100, 300),
        (300, 100),
        (64, 64),
        (37, 211),
        (480, 640),
        *[tuple(rng.integers(20, 700, 2)) for _ in range(6)],
    ]
    for h, w in sizes:
        photo = rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8)
        want = processor(images=photo, return_tensors="pt")["pixel_values"][0]
        x, box = built.preprocess(photo)
        assert x.shape == tuple(want.shape), (make, (h, w), x.shape, tuple(want.shape))
        assert (box.x0, box.y0, box.x1, box.y1) == (0, 0, int(w), int(h))  # the whole photo, as they see it
        assert float(np.abs(x - want.numpy()).mean()) < 0.25  # the same picture (resamplers differ a little)
