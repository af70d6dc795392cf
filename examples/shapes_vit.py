"""A small vision transformer for the synthetic shapes (square, disc, cross), 64 x 64 inputs: torchvision's
``VisionTransformer`` (a class token, 4 blocks of 4 heads over an 8 x 8 grid of tokens) whose patch embedding
is a small convolutional stem (Xiao et al., "Early convolutions help transformers see better", 2021): it
trains in minutes on two cores where 8 x 8 linear patches need far longer.

``scripts/train_shapes_vit.py`` trains it and writes ``tests/fixtures/shapes_vit.safetensors``;
``hookviz gradcam photo.png --model examples/shapes_vit.py:make_vit --weights
tests/fixtures/shapes_vit.safetensors --method attention`` explains it.
"""

from __future__ import annotations

from torch import nn
from torchvision.models import VisionTransformer

SIZE = 64


def make_vit() -> VisionTransformer:
    model = VisionTransformer(
        image_size=SIZE, patch_size=8, num_layers=4, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=3
    )
    model.conv_proj = nn.Sequential(  # 64 -> 8 x 8 tokens of 64, as the 8 x 8 patches would give
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.Conv2d(64, 64, 2, stride=2),
    )
    return model
