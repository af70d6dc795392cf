"""A small Faster R-CNN (torchvision's class, a backbone of three conv stages) for the synthetic shapes.

``hookviz gradcam photo.png --model examples/shapes_detector.py:make_detector --weights W.safetensors``
loads it like any user's detector; ``scripts/train_shapes_detector.py`` trains it (CPU, a few minutes)
into the test fixture ``tests/fixtures/shapes_detector.safetensors``.
"""

from __future__ import annotations

from torch import nn

CLASSES = ("__background__", "square", "disc", "cross")


def _stage(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


def make_detector() -> nn.Module:
    """Faster R-CNN over a stride-8 backbone (``backbone.2`` is its last stage), 3 shape classes."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.ops import MultiScaleRoIAlign

    backbone = nn.Sequential(_stage(3, 24, 2), _stage(24, 48, 2), _stage(48, 64, 2))
    backbone.out_channels = 64  # type: ignore[assignment]
    return FasterRCNN(
        backbone,
        num_classes=None,
        min_size=120,
        max_size=200,
        rpn_anchor_generator=AnchorGenerator(((16, 24, 36),), ((1.0,),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], output_size=7, sampling_ratio=2),
        box_head=TwoMLPHead(64 * 7 * 7, 128),
        box_predictor=FastRCNNPredictor(128, len(CLASSES)),
        rpn_pre_nms_top_n_test=300,
        rpn_post_nms_top_n_test=100,
        box_detections_per_img=20,
    )
