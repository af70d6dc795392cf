"""``--layer`` as hookviz/core/layers.py resolves it: a module name or a glob, checked and given once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hookviz.core.hooks import logits_of
from hookviz.core.layers import cam_layers, candidate_layers, default_cam_layer, default_reason, one_module
from hookviz.engine.explain import explain
from hookviz.errors import LayerError, UsageError
from hookviz.jobs.build import chosen_layers, one_layer
from hookviz.models.loaded import probe
from hookviz.tasks import load_model
from tests.conftest import hook_counts


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


def _tiny_hf(folder: Path, kind: str) -> str:
    """A tiny Hugging Face Swin or DINOv2 classifier (random weights, 32 px, 2 stages or layers) on disk."""
    import transformers as t

    torch.manual_seed(0)
    names = {0: "square", 1: "disc", 2: "cross"}
    if kind == "swin":
        config = t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                              window_size=4, id2label=names)  # fmt: skip
        model: Any = t.SwinForImageClassification(config)
    else:
        config = t.Dinov2Config(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64, id2label=names)  # fmt: skip
        model = t.Dinov2ForImageClassification(config)
    model.save_pretrained(folder / kind)
    t.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder / kind)
    return f"hf:{folder / kind}"


@pytest.mark.parametrize(
    ("kind", "layer", "before"),
    [
        ("swin", "swin.layernorm", "swin.encoder.layers.1.blocks.0.layernorm_before"),
        ("dinov2", "dinov2.layernorm", "dinov2.encoder.layer.1.norm1"),
    ],
)
def test_a_head_pooling_the_patch_tokens_takes_the_tensor_it_pools(
    tmp_path: Path, kind: str, layer: str, before: str
) -> None:
    """Hugging Face Swin pools its tokens (``AdaptiveAvgPool1d``) and DINOv2's head reads the class token and
    the mean of the patch tokens: the last block reaches the head through every patch token, so the default
    is the tensor entering the pooling (the final norm), not the last block's input norm; its Grad-CAM equals
    one computed by hand from a plain hook, on the 4 x 4 patch grid."""
    lm = load_model(_tiny_hf(tmp_path, kind))
    calls = probe(lm)
    assert default_cam_layer(lm.model, calls) == layer
    assert default_reason(calls, layer).startswith("the tensor entering its global pooling")
    assert candidate_layers(lm.model, calls)[-2:] == [before, layer]  # --layer auto tries both
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ex = explain(lm.model, x, [layer], ["gradcam"], targets=[2])
    got: dict[str, torch.Tensor] = {}
    module = dict(lm.model.named_modules())[layer]
    handle = module.register_forward_hook(lambda m, a, o: got.__setitem__("tokens", o))
    try:
        score = logits_of(lm.model(x))[0, 2]
    finally:
        handle.remove()
    tokens = got["tokens"]
    (grad,) = torch.autograd.grad(score, tokens)
    patches, grads = (tokens[0], grad[0]) if kind == "swin" else (tokens[0, 1:], grad[0, 1:])
    assert float(grads.abs().sum()) > 0  # the patch tokens reach the score: the pooling, not the class token
    hand = torch.relu(patches @ grads.mean(dim=0)).reshape(4, 4)
    assert hand.max() > 0
    torch.testing.assert_close(ex.maps[("gradcam", layer)][0, 0].float(), hand.detach(), rtol=1e-4, atol=1e-6)
    assert hook_counts(lm.model) == 0
