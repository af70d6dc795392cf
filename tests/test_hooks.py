"""The hook core: handles owned and removed, the model left exactly as found, gradients from tensor hooks."""

from __future__ import annotations

import warnings

import pytest
import torch
import torchvision
from torch import nn

from hookviz.core.hooks import capture, preserved, trace_shapes
from hookviz.core.layers import resolve_layers
from hookviz.errors import LayerError
from tests.conftest import TinyCNN, hook_counts


def _state(model: nn.Module) -> tuple[list[bool], list[bool], list[object], list[str]]:
    return (
        [m.training for m in model.modules()],
        [p.requires_grad for p in model.parameters()],
        [p.grad for p in model.parameters()],
        sorted(model.state_dict()),
    )


def test_hooks_removed_and_model_restored_after_success(tiny: TinyCNN) -> None:
    before = _state(tiny)
    with (
        capture(tiny, ["features.0", "features.4"], inputs=True, grad_layers=["features.8"]) as cap,
        torch.no_grad(),
    ):
        logits = tiny(torch.randn(2, 3, 16, 16))
        assert hook_counts(tiny) == 5
    torch.autograd.grad(logits[:, 0].sum(), cap.captured.taps["features.8"][0])
    assert hook_counts(tiny) == 0
    assert _state(tiny) == before
    assert all(p.grad is None for p in tiny.parameters())
    assert torch.is_grad_enabled()


def test_exception_inside_the_context_leaves_no_hook_and_user_hooks_still_fire(tiny: TinyCNN) -> None:
    fired: list[str] = []
    user = tiny.features[0].register_forward_hook(lambda m, i, o: fired.append("user"))
    tiny.features[4].weight.grad = torch.ones_like(tiny.features[4].weight)
    tiny.fc.weight.requires_grad_(False)
    before = _state(tiny)
    with (
        pytest.raises(RuntimeError, match="boom"),
        preserved(tiny),
        capture(tiny, ["features.0"], grad_layers=["features.4"]),
    ):
        tiny.eval()
        for p in tiny.parameters():
            p.requires_grad_(True)
        with torch.no_grad():
            tiny(torch.randn(1, 3, 8, 8))
        raise RuntimeError("boom")
    assert hook_counts(tiny) == 1  # only the user's
    assert _state(tiny) == before
    assert tiny.training
    assert torch.is_grad_enabled()
    fired.clear()
    tiny(torch.randn(1, 3, 8, 8))
    assert fired == ["user"]
    user.remove()


def test_clone_protects_captured_tensors_from_in_place_ops(tiny: TinyCNN) -> None:
    tiny.eval()
    x = torch.randn(2, 3, 8, 8)
    with capture(tiny, ["features.1"]) as cap, torch.no_grad():
        tiny(x)
    bn_out = cap.captured.outputs["features.1"][0]
    with torch.no_grad():
        expected = tiny.features[1](tiny.features[0](x))
    assert (expected < 0).any()  # the in-place ReLU after it would have zeroed these
    torch.testing.assert_close(bn_out, expected)


def test_a_reused_module_is_recorded_once_per_call_and_cannot_be_a_tap() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 1)
            self.act = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.conv(self.act(x))).mean(dim=(2, 3))

    model = Twice()
    with capture(model, ["act"]) as cap:
        model(torch.randn(1, 3, 4, 4))
    assert len(cap.captured.outputs["act"]) == 2
    with pytest.raises(LayerError, match="runs more than once"), capture(model, grad_layers=["act"]):
        model(torch.randn(1, 3, 4, 4))
    assert hook_counts(model) == 0


def test_tensor_hook_gradient_equals_autograd_and_no_parameter_gradient(tiny: TinyCNN) -> None:
    tiny.eval()
    x = torch.randn(3, 3, 16, 16)
    # Reference: plain autograd on the same tensor, no hooks.
    a = tiny.features[:8](x)
    a_leaf = a.detach().requires_grad_()
    logits = tiny.fc(torch.flatten(tiny.pool(tiny.features[8:](a_leaf)), 1))
    (ref,) = torch.autograd.grad(logits[:, 1].sum(), a_leaf)
    for p in tiny.parameters():
        p.grad = None
    with capture(tiny, grad_layers=["features.7"]) as cap, torch.no_grad():
        out = tiny(x)
    tap = cap.captured.taps["features.7"][0]
    assert tap.is_leaf and tap.requires_grad  # nothing before the tap was recorded
    torch.autograd.grad(out[:, 1].sum(), tap)
    torch.testing.assert_close(cap.captured.grads["features.7"][0], ref)
    assert all(p.grad is None for p in tiny.parameters())


def test_tap_before_an_in_place_residual_add_works_where_full_backward_hooks_fail() -> None:
    """resnet's bn2 output is modified in place by `out += identity`: the module-hook trap."""
    model = torchvision.models.resnet18(weights=None, num_classes=4).eval()
    x = torch.randn(1, 3, 64, 64)
    with capture(model, grad_layers=["layer1.0.bn2"]) as cap, torch.no_grad():
        out = model(x)
    torch.autograd.grad(out[:, 0].sum(), cap.captured.taps["layer1.0.bn2"][0])
    g = cap.captured.grads["layer1.0.bn2"][0]
    assert g.shape == (1, 64, 16, 16) and g.abs().sum() > 0

    handle = model.layer1[0].bn2.register_full_backward_hook(lambda m, gi, go: None)
    try:
        with pytest.raises(RuntimeError):
            model(x.requires_grad_())[:, 0].sum().backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)


def test_legacy_backward_hook_is_wrong_on_a_multi_op_module() -> None:
    """What the docs warn about: register_backward_hook sees only the module's last operation."""
    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    block_out = {}

    class Wrap(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.block(x)
            return (h * 2).sum()  # d(loss)/d(block output) = 2 everywhere

    x = torch.randn(3, 4, requires_grad=True)

    def legacy(m: nn.Module, gi: tuple[torch.Tensor, ...], go: tuple[torch.Tensor, ...]) -> None:
        block_out["in"] = gi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that this hook is deprecated for exactly this reason
        h = block.register_backward_hook(legacy)
        Wrap()(x).backward()
    h.remove()
    # The true gradient w.r.t. the block input differs from what the legacy hook reports as grad_input.
    true = x.grad
    reported = [g for g in block_out["in"] if g is not None and g.shape == x.shape]
    assert not any(torch.allclose(r, true) for r in reported)


def test_resolve_layers_names_globs_and_close_matches() -> None:
    model = torchvision.models.resnet18(weights=None)
    assert resolve_layers(model, ["layer4"], model_name="resnet18") == ["layer4"]
    assert resolve_layers(model, ["layer*.0.conv1"]) == [f"layer{i}.0.conv1" for i in range(1, 5)]
    convs = resolve_layers(model, ["*"], kinds=(nn.Conv2d,))
    assert len(convs) == 20 and convs[0] == "conv1"
    with pytest.raises(
        LayerError, match=r"no layer 'layer9' in resnet18; did you mean 'layer4'.*hookviz layers"
    ):
        resolve_layers(model, ["layer9"], model_name="resnet18")
    with pytest.raises(LayerError, match="matches no"):
        resolve_layers(model, ["block*"], model_name="resnet18")


def test_trace_shapes_reports_output_shapes_and_calls() -> None:
    model = torchvision.models.resnet18(weights=None)
    calls = {c.name: c for c in trace_shapes(model, torch.zeros(1, 3, 64, 64))}
    assert calls["layer4"].output_shape == (1, 512, 2, 2)
    assert calls["fc"].output_shape == (1, 1000)
    assert calls["layer1.0.relu"].calls == 2
    assert hook_counts(model) == 0 and model.training


def test_public_api_is_importable_lazily() -> None:
    import hookviz
    import hookviz.engine.explain  # submodules loaded first must not shadow the exports

    for name in hookviz.__all__:
        assert callable(getattr(hookviz, name)), name
    with pytest.raises(AttributeError):
        _ = hookviz.nothing_here
