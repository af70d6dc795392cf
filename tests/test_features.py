"""Feature maps: captured inputs/outputs are the real tensors; the grid shows them tile by tile."""

from __future__ import annotations

import numpy as np
import torch
import torchvision

from hookviz.engine.features import feature_maps, rank_channels
from hookviz.render import colormap_lut, feature_grid, normalize, tile_positions
from tests.conftest import hook_counts


def test_input_stage_equals_previous_output_where_the_architecture_says_so() -> None:
    model = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 64, 64)
    maps = feature_maps(model, x, ["maxpool", "layer1", "layer1.0.conv1", "layer2.0.conv1"], stage="both")
    got = {(m.layer, m.stage): m.tensor for m in maps}
    # layer1.0.conv1 receives maxpool's output; layer2.0.conv1 receives layer1's output.
    torch.testing.assert_close(got[("layer1.0.conv1", "input")], got[("maxpool", "output")])
    torch.testing.assert_close(got[("layer2.0.conv1", "input")], got[("layer1", "output")])
    with torch.no_grad():
        ref = model.eval().layer1[0].conv1(model.maxpool(model.relu(model.bn1(model.conv1(x)))))
    torch.testing.assert_close(got[("layer1.0.conv1", "output")], ref)
    assert hook_counts(model) == 0


def test_grid_tiles_are_the_normalised_channels() -> None:
    fmap = np.random.default_rng(0).normal(size=(10, 7, 9)).astype(np.float32)
    fmap[3] = 5.0  # constant channel → ranked last, drawn as zeros
    channels = rank_channels(torch.from_numpy(fmap), 6)
    assert 3 not in channels and len(channels) == 6
    stds = fmap.reshape(10, -1).std(axis=1)
    assert channels == list(np.argsort(-stds, kind="stable")[:6])
    grid = feature_grid(fmap, channels, title="t", colormap="gray")
    band = grid.shape[0] - (tile_positions(6, 7, 9)[-1][0] + tile_positions(6, 7, 9)[-1][2] + 2)
    body = grid[band:]
    lut = colormap_lut("gray")
    for (y, x, th, tw), ch in zip(tile_positions(6, 7, 9), channels, strict=True):
        tile = body[y : y + th, x : x + tw]
        zoom = th // 7
        expected = lut[np.clip(np.rint(normalize(fmap[ch]) * 255), 0, 255).astype(np.uint8)]
        expected = np.repeat(np.repeat(expected, zoom, 0), zoom, 1)
        # Compare away from the channel label in the top-left corner.
        np.testing.assert_array_equal(tile[th // 2 :, :], expected[th // 2 :, :])
