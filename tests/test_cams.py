"""The CAM family: each method against its paper's formula written independently, one pass equals many."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
import torchvision

from hookviz.engine.explain import explain
from hookviz.methods import cams
from tests.conftest import BUILT_IN_CAMS, GRADIENT_METHODS, TinyCNN, Trained, hook_counts, shapes_batch

B, K, H, W = 2, 3, 4, 5


@pytest.fixture
def ag() -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    g = torch.Generator().manual_seed(1)
    a = torch.relu(torch.randn(B, K, H, W, generator=g, dtype=torch.float64))
    grad = torch.randn(B, K, H, W, generator=g, dtype=torch.float64)
    return a, grad, a.numpy(), grad.numpy()


def rectify(x: float) -> float:
    return max(x, 0.0)


def _loop_map(weight: object, a: np.ndarray, b: int) -> np.ndarray:
    """sum_k w(b, k, i, j) * A[b, k, i, j] with plain loops; weight is a function."""
    out = np.zeros((H, W))
    for i in range(H):
        for j in range(W):
            out[i, j] = sum(weight(k, i, j) * a[b, k, i, j] for k in range(K))  # type: ignore[operator]
    return out


def test_gradcam_formula(ag: tuple) -> None:
    a, g, an, gn = ag
    for b in range(B):
        alpha = [gn[b, k].sum() / (H * W) for k in range(K)]
        ref = np.maximum(_loop_map(lambda k, i, j: alpha[k], an, b), 0)
        np.testing.assert_allclose(cams.grad_cam(a, g)[b].numpy(), ref, atol=1e-12)


def test_gradcampp_formula(ag: tuple) -> None:
    a, g, an, gn = ag
    for b in range(B):
        w = []
        for k in range(K):
            s = an[b, k].sum()
            total = 0.0
            for i in range(H):
                for j in range(W):
                    gg = gn[b, k, i, j]
                    denom = 2 * gg**2 + s * gg**3
                    alpha = gg**2 / denom if denom != 0 else 0.0
                    total += alpha * rectify(gg)
            w.append(total)
        ref = np.maximum(_loop_map(lambda k, i, j: w[k], an, b), 0)
        np.testing.assert_allclose(cams.grad_cam_pp(a, g)[b].numpy(), ref, atol=1e-12)


def test_xgradcam_formula(ag: tuple) -> None:
    a, g, an, gn = ag
    for b in range(B):
        w = [(an[b, k] * gn[b, k]).sum() / an[b, k].sum() for k in range(K)]
        ref = np.maximum(_loop_map(lambda k, i, j: w[k], an, b), 0)
        np.testing.assert_allclose(cams.xgrad_cam(a, g)[b].numpy(), ref, atol=1e-12)


def test_layercam_and_hirescam_formulas(ag: tuple) -> None:
    a, g, an, gn = ag
    for b in range(B):
        layer = np.maximum(_loop_map(lambda k, i, j: rectify(gn[b, k, i, j]), an, b), 0)
        hires = np.maximum(_loop_map(lambda k, i, j: gn[b, k, i, j], an, b), 0)
        np.testing.assert_allclose(cams.layer_cam(a, g)[b].numpy(), layer, atol=1e-12)
        np.testing.assert_allclose(cams.hires_cam(a, g)[b].numpy(), hires, atol=1e-12)
    signed = cams.hires_cam(a, g, relu=False)
    assert (signed < 0).any()


def test_eigencam_is_the_first_principal_component(ag: tuple) -> None:
    a, _, an, _ = ag
    out = cams.eigen_cam(a, relu=False)
    for b in range(B):
        m = an[b].reshape(K, H * W).T
        centred = m - m.mean(axis=0)
        _, _, vt = np.linalg.svd(centred)
        proj = centred @ vt[0]
        if np.dot(proj, m.sum(axis=1) - m.sum(axis=1).mean()) < 0:
            proj = -proj
        np.testing.assert_allclose(out[b].numpy().ravel(), proj, atol=1e-10)
        # It is the direction of largest variance: no other unit vector projects with more.
        rand = np.random.default_rng(b).normal(size=(200, K))
        rand /= np.linalg.norm(rand, axis=1, keepdims=True)
        assert (centred @ rand.T).var(axis=0).max() <= proj.var() + 1e-12


def _bilinear_corners(m: np.ndarray, size: int) -> np.ndarray:
    h, w = m.shape
    ys, xs = np.linspace(0, h - 1, size), np.linspace(0, w - 1, size)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = m[y0][:, x0] * (1 - fx) + m[y0][:, x1] * fx
    bottom = m[y1][:, x0] * (1 - fx) + m[y1][:, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)


@pytest.mark.parametrize("dead", [False, True], ids=["live", "dead-channels"])
def test_scorecam_against_a_direct_masked_forward_loop(dead: bool) -> None:
    torch.manual_seed(0)
    model = TinyCNN(width=4).eval()
    if dead:  # three channels that ReLU turns off everywhere: their masks are all zero (run once)
        with torch.no_grad():
            model.features[9].bias[:3] = -1e4
    x = torch.rand(2, 3, 24, 24)
    ex = explain(model, x, ["features"], ["scorecam"], targets=[1, 2], scorecam_batch=5)
    with torch.no_grad():
        acts = model.features(x)  # (2, 16, 6, 6)
        assert bool((acts[:, :3] == 0).all()) == dead
        for b in range(2):
            scores = np.zeros((2, acts.shape[1]))
            for k in range(acts.shape[1]):
                # Corner-aligned bilinear upsampling, written out: sample (i, j) at i * 5 / 23 in the 6x6 map.
                up = _bilinear_corners(acts[b, k].numpy(), 24)
                mask = (up - up.min()) / (up.max() - up.min()) if up.max() > up.min() else np.zeros_like(up)
                # The target logit, as pytorch-grad-cam and torchcam score a masked input.
                logits = model(x[b : b + 1] * torch.from_numpy(mask))[0]
                scores[:, k] = logits[[1, 2]].numpy()
            for j in range(2):
                alpha = np.exp(scores[j]) / np.exp(scores[j]).sum()
                ref = np.maximum(np.tensordot(alpha, acts[b].numpy(), axes=1), 0)
                np.testing.assert_allclose(
                    ex.maps[("scorecam", "features")][b, j].numpy(), ref, rtol=1e-4, atol=1e-6
                )


def test_one_pass_equals_method_by_method_layer_by_layer_class_by_class() -> None:
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 64, 64)
    methods = [*GRADIENT_METHODS, "eigencam"]
    together = explain(model, x, ["layer3", "layer4"], methods, "top3")
    assert together.grads_computed == 3  # one backward per target, shared by both layers and all methods
    for j in range(3):
        per_image = together.targets[:, j]
        for layer in ["layer3", "layer4"]:
            for m in methods:
                alone = explain(model, x, [layer], [m], per_image)
                torch.testing.assert_close(
                    together.maps[(m, layer)][:, j], alone.maps[(m, layer)][:, 0], rtol=1e-5, atol=1e-7
                )


def test_nothing_before_the_earliest_layer_records_autograd_history() -> None:
    model = torchvision.models.resnet18(weights=None)
    seen: dict[str, bool] = {}
    handles = [
        getattr(model, name).register_forward_hook(
            lambda m, i, o, name=name: seen.__setitem__(name, o.requires_grad)
        )
        for name in ("conv1", "layer1", "layer2", "layer3", "layer4", "fc")
    ]
    explain(model, torch.randn(1, 3, 64, 64), ["layer3", "layer4"], ["gradcam"])
    for h in handles:
        h.remove()
    # layer3's own output is handed on as a fresh leaf after the user hook has seen it.
    assert seen == {
        "conv1": False,
        "layer1": False,
        "layer2": False,
        "layer3": False,
        "layer4": True,
        "fc": True,
    }


@pytest.mark.parametrize("method", BUILT_IN_CAMS)
def test_every_method_leaves_the_model_as_found(tiny: TinyCNN, method: str) -> None:
    tiny.features[4].weight.grad = torch.zeros_like(tiny.features[4].weight)
    grads = [p.grad for p in tiny.parameters()]
    explain(
        tiny, torch.randn(2, 3, 16, 16), ["features.4", "features.8"], [method], "top2", scorecam_batch=16
    )
    assert [p.grad for p in tiny.parameters()] == grads
    assert tiny.training and hook_counts(tiny) == 0 and torch.is_grad_enabled()


def test_vit_and_swin_maps_on_the_patch_grid() -> None:
    vit = torchvision.models.vit_b_16(weights=None, image_size=64).eval()
    torch.nn.init.normal_(vit.heads.head.weight, std=0.02)  # torchvision initialises the head to zeros
    layers = ["encoder.layers.encoder_layer_10", "encoder.layers.encoder_layer_11.ln_1"]
    ex = explain(vit, torch.randn(1, 3, 64, 64), layers, ["gradcam", "eigencam"], relu=False)
    assert ex.maps[("gradcam", "encoder.layers.encoder_layer_10")].shape == (
        1,
        1,
        4,
        4,
    )  # 64/16, class token dropped
    assert ex.maps[("gradcam", "encoder.layers.encoder_layer_11.ln_1")].abs().sum() > 0
    swin = torchvision.models.swin_t(weights=None).eval()
    ex = explain(swin, torch.randn(1, 3, 64, 64), ["features.5", "features"], ["gradcam", "layercam"])
    assert ex.maps[("gradcam", "features.5")].shape == (1, 1, 4, 4)  # stage 3 of swin_t: /16
    assert ex.maps[("layercam", "features")].shape == (1, 1, 2, 2)  # stage 4: /32


def test_every_gradient_method_localises_on_the_trained_model(trained: Trained) -> None:
    from hookviz.core.hooks import trace_shapes
    from hookviz.core.layers import default_cam_layer
    from tests.test_localisation import _peak_hits

    x, y, masks = shapes_batch(200, np.random.default_rng(5))
    layer = default_cam_layer(trained.model, trace_shapes(trained.model, x[:1]))
    assert layer == "features"  # the tensor entering the pooling: after the last ReLU
    ex = explain(trained.model, x, [layer], list(GRADIENT_METHODS), y)
    rates = {m: float(_peak_hits(ex.maps[(m, layer)][:, 0].numpy(), masks).mean()) for m in GRADIENT_METHODS}
    print("peak-in-shape rate per method:", {m: f"{r:.1%}" for m, r in rates.items()})
    assert all(r >= 0.9 for r in rates.values()), rates


def test_fuse_upsamples_scales_each_layer_then_combines() -> None:
    """Against an independent NumPy/OpenCV version: bilinear resize, per-map min-max, mean or max."""

    rng = np.random.default_rng(3)
    coarse = torch.from_numpy(rng.random((2, 1, 2, 3)).astype(np.float32) * 7)  # a large-magnitude layer
    fine = torch.from_numpy(rng.random((2, 1, 4, 6)).astype(np.float32) * 0.01)
    size = (8, 12)

    def reference(t: torch.Tensor) -> np.ndarray:
        up = np.stack(
            [cv2.resize(m[0].numpy(), (size[1], size[0]), interpolation=cv2.INTER_LINEAR) for m in t]
        )
        lo = up.reshape(2, -1).min(1)[:, None, None]
        hi = up.reshape(2, -1).max(1)[:, None, None]
        return (up - lo) / (hi - lo)

    a, b = reference(coarse), reference(fine)
    got_mean = cams.fuse([coarse, fine], size, "mean")[:, 0].numpy()
    got_max = cams.fuse([coarse, fine], size, "max")[:, 0].numpy()
    np.testing.assert_allclose(got_mean, (a + b) / 2, atol=1e-5)
    np.testing.assert_allclose(got_max, np.maximum(a, b), atol=1e-5)
    signed = cams.fuse([coarse - 3.5], size, "mean", relu=False)
    assert float(signed.abs().max()) == pytest.approx(1.0)


def test_colour_scale_policies() -> None:
    maps = torch.tensor([[[[0.5, 2.0], [float("nan"), float("inf")]]]])
    assert cams.colour_scale(maps, "image") is None
    assert cams.colour_scale(maps, "none", vmax=3.0) == (0.0, 3.0)
    assert cams.colour_scale(maps, "none", relu=False, vmax=3.0) == (-3.0, 3.0)
    assert cams.colour_scale(maps, "batch") == (0.0, 2.0)  # NaN/Inf count as 0
    assert cams.colour_scale(-maps, "batch", relu=False) == (-2.0, 2.0)
    with pytest.raises(ValueError, match="vmax > 0"):
        cams.colour_scale(maps, "none")
