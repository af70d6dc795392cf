"""Grad-CAM equals the paper's formula computed here with plain autograd (no hooks)."""

from __future__ import annotations

import threading

import pytest
import torch
import torchvision

from hookviz.engine.explain import explain, grad_cam
from hookviz.errors import LayerError, TargetError
from hookviz.methods import cams
from tests.conftest import TinyCNN, hook_counts


def _reference(model: torchvision.models.ResNet, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Selvaraju et al. eq. 1-2, independently: split the network at layer4 by hand."""
    m = model
    with torch.no_grad():
        a = m.layer4(m.layer3(m.layer2(m.layer1(m.maxpool(m.relu(m.bn1(m.conv1(x))))))))
    a = a.detach().requires_grad_()
    logits = m.fc(torch.flatten(m.avgpool(a), 1))
    grads = torch.stack(
        [torch.autograd.grad(logits[i, target[i]], a, retain_graph=True)[0][i] for i in range(len(x))]
    )
    alpha = grads.mean(dim=(2, 3))  # (B, K)
    cam = torch.einsum("bk,bkhw->bhw", alpha, a.detach())
    return torch.clamp(cam, min=0)


def test_gradcam_equals_the_formula_on_resnet18() -> None:
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(3, 3, 96, 96)
    res = grad_cam(model, x, "layer4")
    with torch.no_grad():
        top = model(x).argmax(1)
    ref = _reference(model, x, top)
    assert res.maps.shape == (3, 3, 3)
    assert ref.abs().max() > 0
    torch.testing.assert_close(res.maps, ref, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(res.predicted, top)
    torch.testing.assert_close(res.target, top)


def test_explicit_targets_and_signed_maps() -> None:
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 64, 64)
    target = torch.tensor([5, 900])
    res = grad_cam(model, x, "layer4", target=[5, 900], relu=False)
    ref_signed = _reference(model, x, target)
    assert (res.maps < 0).any()
    torch.testing.assert_close(torch.clamp(res.maps, min=0), ref_signed, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(res.target_score, res.probs[[0, 1], [5, 900]])


def test_pure_function_matches_loops() -> None:
    a, g = torch.randn(2, 4, 3, 5), torch.randn(2, 4, 3, 5)
    out = cams.grad_cam(a, g)
    for b in range(2):
        expected = sum(g[b, k].mean() * a[b, k] for k in range(4))
        torch.testing.assert_close(out[b], torch.clamp(expected, min=0))
    with pytest.raises(ValueError, match="differ in shape"):
        cams.grad_cam(a, g[:, :2])


def test_model_left_as_found_and_no_parameter_gradient(tiny: TinyCNN) -> None:
    tiny.train()
    tiny.features[0].weight.requires_grad_(False)
    running = tiny.features[1].running_mean.clone()
    grad_cam(tiny, torch.randn(2, 3, 16, 16), "features.8")
    assert tiny.training and all(m.training for m in tiny.modules())
    assert not tiny.features[0].weight.requires_grad
    assert all(p.grad is None for p in tiny.parameters())
    torch.testing.assert_close(tiny.features[1].running_mean, running)  # eval mode: BN stats untouched
    assert hook_counts(tiny) == 0


def test_bad_layer_and_target_are_clear_errors(tiny: TinyCNN) -> None:
    x = torch.randn(1, 3, 16, 16)
    with pytest.raises(LayerError, match="not a \\(B, C, H, W\\) feature map"):
        grad_cam(tiny, x, "fc")
    with pytest.raises(TargetError, match="out of range 0..2"):
        grad_cam(tiny, x, "features.8", target=7)
    assert hook_counts(tiny) == 0 and tiny.training


def test_two_threads_explaining_one_model() -> None:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    xs = [torch.rand(4, 3, 32, 32) for _ in range(2)]
    expected = [explain(model, x, ["features"], ["gradcam"]).maps[("gradcam", "features")] for x in xs]
    got: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(5):
                got[i] = explain(model, xs[i], ["features"], ["gradcam"]).maps[("gradcam", "features")]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(2):
        torch.testing.assert_close(got[i], expected[i])
    assert hook_counts(model) == 0
