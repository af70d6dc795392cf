"""A user's own model code, as ``--model tests/shapes_net.py:make`` or ``--model tests.shapes_net:ShapesNet``
would find it (importable, so a whole pickle of it can be loaded back)."""

from __future__ import annotations

import torch
from torch import nn


class ShapesNet(nn.Module):
    """conv-bn-relu x3, global pooling, a 3-class head: squares, discs, crosses."""

    def __init__(self, classes: int = 3, width: int = 16) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for i, cout in enumerate((width, 2 * width, 4 * width)):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            if i < 2:
                layers.append(nn.MaxPool2d(2))
            cin = cout
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=(2, 3)))


class DictOut(ShapesNet):
    """The same network returning a dict, as detection-style or multi-head code often does."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        features = self.body(x)
        return {"features": features, "logits": self.head(features.mean(dim=(2, 3)))}


def make() -> ShapesNet:
    return ShapesNet()


def make_dict() -> DictOut:
    return DictOut()


def not_a_model() -> str:
    return "a string"


def make_segmenter(classes: int = 4) -> nn.Module:
    """torchvision's FCN over a small stride-4 backbone (``backbone.1`` its last stage): background and
    the three shapes, trained in the tests on :func:`hookviz.shapes.shapes_scene`."""
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation import FCN
    from torchvision.models.segmentation.fcn import FCNHead

    def stage(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=2, dilation=2, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )

    body = nn.Sequential(stage(3, 24), stage(24, 48))
    return FCN(IntermediateLayerGetter(body, {"1": "out"}), FCNHead(48, classes))
