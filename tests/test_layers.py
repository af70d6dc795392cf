"""``--layer`` as hookviz/core/layers.py resolves it: a module name or a glob, checked and given once."""

from __future__ import annotations

import pytest

from hookviz.core.layers import cam_layers, one_module
from hookviz.errors import LayerError, UsageError
from hookviz.jobs.build import chosen_layers, one_layer
from hookviz.models.loaded import probe
from hookviz.tasks import load_model


def test_a_glob_gives_the_layers_it_matches_that_can_be_cam_tensors_each_once() -> None:
    lm = load_model("resnet18", "none", input_size=64)
    calls = probe(lm)
    got = cam_layers(lm.model, ["layer4", "layer*.1.conv2", "layer4"], calls, "resnet18")
    assert got == ["layer4", "layer1.1.conv2", "layer2.1.conv2", "layer3.1.conv2", "layer4.1.conv2"]
    # relu runs several times a block and fc has no map: a glob over them keeps what can be a CAM tensor
    assert cam_layers(lm.model, ["layer4.0.*"], calls) == [
        "layer4.0.conv1", "layer4.0.bn1", "layer4.0.conv2", "layer4.0.bn2", "layer4.0.downsample",
        "layer4.0.downsample.0", "layer4.0.downsample.1",
    ]  # fmt: skip
    with pytest.raises(LayerError, match=r"pattern 'fc\*' matches no layer of resnet18 with a spatial map"):
        cam_layers(lm.model, ["fc*"], calls, "resnet18")
    with pytest.raises(LayerError, match="no layer 'layer9'"):
        chosen_layers(lm, ["layer9"], calls)


def test_a_command_taking_one_layer_takes_a_glob_matching_one() -> None:
    lm = load_model("resnet18", "none", input_size=64)
    calls = probe(lm)
    assert one_layer(lm, "layer4.1.conv2", calls) == "layer4.1.conv2"
    assert one_layer(lm, "layer4.1.bn[2]", calls) == "layer4.1.bn2"
    with pytest.raises(
        UsageError, match=r"--layer layer4.\*.conv2: takes one layer, and the pattern matches 2"
    ):
        one_layer(lm, "layer4.*.conv2", calls)
    assert one_module(lm.model, "lay*4") == "layer4"
    with pytest.raises(LayerError, match="takes one layer"):
        one_module(lm.model, "layer4.*")
