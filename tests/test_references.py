# ruff: noqa: RUF002
"""Every method equals its reference implementation on the same model, layer, input and target.

pytorch-grad-cam 1.5.7 for its CAMs, torchcam 0.5.0 for SS-CAM, IS-CAM, Smooth Grad-CAM++ and CAM, captum 0.9
for the pixel attributions; within 1e-3 after each side's own min-max normalisation, stochastic methods with
the same seed (so the same noise). The references are test-only dependencies (the ``dev`` extra).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import cv2
import numpy as np
import pytest
import torch
from torch import Tensor

from hookviz.engine.explain import explain
from hookviz.methods import MethodOptions
from tests.conftest import Trained, shapes_batch

pgc = pytest.importorskip("pytorch_grad_cam")
torchcam = pytest.importorskip("torchcam.methods")
captum = pytest.importorskip("captum.attr")

LAYER = "features"
SIZE = 48


def minmax(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    return (a - a.min()) / (a.max() - a.min() + 1e-12)


def like_pgc(m: Tensor) -> np.ndarray:
    """Our layer-resolution map as pytorch-grad-cam finishes one: min-max, cv2's bilinear resize, min-max."""
    a = m.numpy().astype(np.float32)
    a = a - a.min()
    a = a / (1e-7 + a.max())
    if a.shape != (SIZE, SIZE):
        a = cv2.resize(a, (SIZE, SIZE))
    return minmax(a)


def assert_close(ours: np.ndarray, ref: np.ndarray, tol: float = 1e-3) -> None:
    ours, ref = minmax(ours), minmax(ref)
    diff = float(np.abs(ours - ref).max())
    assert diff <= tol, f"max |ours - reference| = {diff:.2e}"
    assert ref.std() > 0.05, "the reference map is flat: the comparison would prove nothing"


@pytest.fixture(scope="module")
def image(trained: Trained) -> tuple[Tensor, int]:
    """One held-out image the model gets right, and its class."""
    x, y, _ = shapes_batch(8, np.random.default_rng(5))
    with torch.no_grad():
        pred = trained.model(x).argmax(1)
    i = int((pred == y).nonzero()[0, 0])
    return x[i : i + 1], int(y[i])


def ours(
    trained: Trained, x: Tensor, method: str, c: int, layers: tuple[str, ...] = (LAYER,), **kw: object
) -> Tensor:
    ex = explain(trained.model, x, list(layers), [method], c, options=MethodOptions(**kw))  # type: ignore[arg-type]
    return ex.maps[(method, layers[-1])][0, 0]


def run_pgc(
    cls: Callable[..., object],
    trained: Trained,
    x: Tensor,
    target: object,
    layers: list[object] | None = None,
    **call: object,
) -> np.ndarray:
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    tgt = target if not isinstance(target, int) else ClassifierOutputTarget(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cam = cls(model=trained.model, target_layers=layers or [trained.model.features])
        out = cam(input_tensor=x.clone(), targets=[tgt], **call)
    for p in trained.model.parameters():
        p.grad = None
    return np.asarray(out[0])


PGC = {
    "gradcam": "GradCAM",
    "xgradcam": "XGradCAM",
    "layercam": "LayerCAM",
    "hirescam": "HiResCAM",
    "gradcamelementwise": "GradCAMElementWise",
    "scorecam": "ScoreCAM",
    "segeigencam": "SegEigenCAM",
    "kpcacam": "KPCA_CAM",
    "fem": "FEM",
    "ablationcam": "AblationCAM",
}


@pytest.mark.parametrize("method", list(PGC))
def test_cams_equal_pytorch_grad_cam(method: str, trained: Trained, image: tuple[Tensor, int]) -> None:
    x, c = image
    ref = run_pgc(getattr(pgc, PGC[method]), trained, x, c)
    assert_close(like_pgc(ours(trained, x, method, c)), ref)


@pytest.mark.parametrize("method,cls", [("eigencam", "EigenCAM"), ("eigengradcam", "EigenGradCAM")])
def test_eigen_methods_equal_the_reference_up_to_the_svd_sign(
    method: str, cls: str, trained: Trained, image: tuple[Tensor, int]
) -> None:
    """An SVD's sign is arbitrary: the reference keeps LAPACK's, hookviz fixes it (correlating with the
    activation energy); one of the two signs of our signed projection must give the reference's map."""
    x, c = image
    ref = run_pgc(getattr(pgc, cls), trained, x, c)
    ex = explain(trained.model, x, [LAYER], [method], c, relu=False)
    signed = ex.maps[(method, LAYER)][0, 0]
    diffs = [np.abs(minmax(like_pgc(torch.relu(s * signed))) - minmax(ref)).max() for s in (1, -1)]
    assert min(diffs) <= 1e-3, diffs


def test_randomcam_draws_the_references_weights_from_the_same_seed(
    trained: Trained, image: tuple[Tensor, int]
) -> None:
    x, c = image
    np.random.seed(7)
    ref = run_pgc(pgc.RandomCAM, trained, x, c)
    assert_close(like_pgc(ours(trained, x, "randomcam", c, seed=7)), ref)
    assert np.abs(minmax(like_pgc(ours(trained, x, "randomcam", c, seed=8))) - minmax(ref)).max() > 0.05


def test_shapleycam_equals_the_reference_with_its_rest_target(
    trained: Trained, image: tuple[Tensor, int]
) -> None:
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputReST

    x, c = image
    ref = run_pgc(pgc.ShapleyCAM, trained, x, ClassifierOutputReST(c))
    assert_close(like_pgc(ours(trained, x, "shapleycam", c)), ref)
    # The Hessian term matters here (softmax in the score): not Grad-CAM's map.
    grad = like_pgc(ours(trained, x, "gradcam", c))
    assert np.abs(grad - minmax(ref)).max() > 1e-3


def test_finercam_equals_the_reference_against_the_nearest_classes(
    trained: Trained, image: tuple[Tensor, int]
) -> None:
    x, c = image
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cam = pgc.FinerCAM(trained.model, [trained.model.features])
        ref = np.asarray(cam(x.clone(), comparison_categories=[1, 2]))[0]  # 3 classes: the two others
    for p in trained.model.parameters():
        p.grad = None
    # The top-1 class against the two others, nearest first.
    assert_close(like_pgc(ours(trained, x, "finercam", c)), ref)


@pytest.fixture(scope="module")
def loud(trained: Trained) -> Trained:
    """The trained model with its logits scaled by 1000 (the same predictions): its layer gradients are large
    enough that the references' ε in Grad-CAM++'s denominator (pytorch-grad-cam 1e-6, torchcam 1e-8) is
    negligible."""
    import copy

    model = copy.deepcopy(trained.model)
    with torch.no_grad():
        model.fc.weight *= 1000
        model.fc.bias *= 1000
    return Trained(model, trained.accuracy)


def test_gradcampp_equals_both_references_where_their_epsilon_is_negligible(
    trained: Trained, loud: Trained, image: tuple[Tensor, int]
) -> None:
    """The references add a fixed ε to α's denominator (the paper has none); with this model's small
    gradients (~1e-3) it changes pytorch-grad-cam's map, so the equality is checked on the same network with
    logits x1000, where ε is negligible; on the original one, ours is the paper's formula without ε.
    (torchcam 0.5.0's GradCAMpp is not compared: its ``alpha[idx][mask].div_(...)`` divides a copy, so its α
    is the bare squared gradient.)"""
    x, c = image
    assert_close(like_pgc(ours(loud, x, "gradcampp", c)), run_pgc(pgc.GradCAMPlusPlus, loud, x, c))
    kept: list[Tensor] = []
    handle = trained.model.features.register_forward_hook(lambda mod, i, o: kept.append(o))
    try:
        (g,) = torch.autograd.grad(trained.model(x)[0, c], kept[0])
    finally:
        handle.remove()
    a = kept[0].detach()
    alpha = g.pow(2) / (2 * g.pow(2) + a.sum(dim=(2, 3), keepdim=True) * g.pow(3))
    want = torch.relu(((alpha * torch.relu(g)).sum(dim=(2, 3), keepdim=True) * a).sum(1))[0]
    assert torch.allclose(ours(trained, x, "gradcampp", c), want, rtol=1e-4, atol=1e-7)
    assert np.abs(minmax(run_pgc(pgc.GradCAMPlusPlus, trained, x, c)) - like_pgc(want)).max() > 1e-3


def test_refinecam_multiplies_the_layers_gradcampp(loud: Trained, image: tuple[Tensor, int]) -> None:
    x, c = image
    m = loud.model
    ref = run_pgc(pgc.RefineCAM, loud, x, c, layers=[m.features[6], m.features])
    got = ours(loud, x, "refinecam", c, layers=("features.6", LAYER)).numpy()
    assert_close(got, ref)


def test_fullgrad_equals_the_reference(trained: Trained, image: tuple[Tensor, int]) -> None:
    x, c = image
    ref = run_pgc(pgc.FullGrad, trained, x, c, layers=[])
    assert_close(ours(trained, x, "fullgrad", c).numpy(), ref)


def _torchcam(
    cls: Callable[..., object], trained: Trained, x: Tensor, c: int, seed: int = 0, **kw: object
) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cls(trained.model, LAYER, input_shape=(3, SIZE, SIZE), **kw) as extractor:  # type: ignore[operator]
            torch.manual_seed(seed)
            out = trained.model(x.clone())
            (cam,) = extractor(c, out)
    for p in trained.model.parameters():
        p.grad = None
    return cam[0].detach().numpy()


def test_sscam_and_iscam_equal_torchcam_with_the_same_noise(
    trained: Trained, image: tuple[Tensor, int]
) -> None:
    x, c = image
    ref = _torchcam(torchcam.SSCAM, trained, x, c, seed=3, num_samples=3, std=2.0, batch_size=64)
    assert_close(ours(trained, x, "sscam", c, seed=3, samples=3, noise=2.0).numpy(), ref)
    ref = _torchcam(torchcam.ISCAM, trained, x, c, num_samples=4, batch_size=64)
    assert_close(ours(trained, x, "iscam", c, samples=4).numpy(), ref)


def test_cam_equals_torchcam_and_is_refused_without_a_pooling_linear_head(
    trained: Trained, image: tuple[Tensor, int]
) -> None:
    from hookviz.errors import UsageError

    x, c = image
    ref = _torchcam(torchcam.CAM, trained, x, c, fc_layer="fc")  # torchcam's CAM keeps the sign
    got = explain(trained.model, x, [LAYER], ["cam"], c, relu=False).maps[("cam", LAYER)][0, 0]
    assert_close(got.numpy(), ref)
    with pytest.raises(UsageError, match="global average pooling then a linear classifier"):
        ours(trained, x, "cam", c, layers=("features.6",))


def test_smoothgradcampp_equals_torchcam_as_the_noise_vanishes_and_averages_by_hand(
    trained: Trained, image: tuple[Tensor, int]
) -> None:
    """torchcam keeps the last noisy copy's gradient and activations; hookviz averages the gradient's powers
    (the paper): the two agree as the noise goes to 0, and ours equals the average computed by hand."""
    x, c = image
    ref = _torchcam(torchcam.SmoothGradCAMpp, trained, x, c, num_samples=2, std=1e-6)
    assert_close(ours(trained, x, "smoothgradcampp", c, samples=2, noise=1e-6).numpy(), ref)
    # By hand, with real noise: the same copies, each one's layer gradient, the formula.
    from hookviz.methods.ownpass import noisy_copies

    n, sigma = 5, 0.3
    noisy = noisy_copies(x, n, sigma, seed=11)
    m = trained.model
    kept: list[Tensor] = []
    handle = m.features.register_forward_hook(lambda mod, i, o: kept.append(o))
    try:
        grads = []
        for k in range(n):
            kept.clear()
            out = m(noisy[k : k + 1])
            (g,) = torch.autograd.grad(out[0, c], kept[0])
            grads.append(g[0])
        kept.clear()
        with torch.no_grad():
            m(x)
        a = kept[0][0]
    finally:
        handle.remove()
    g = torch.stack(grads)
    g1, g2, g3 = g.mean(0), g.pow(2).mean(0), g.pow(3).mean(0)
    alpha = g2 / (2 * g2 + (g3 * a).sum(dim=(1, 2), keepdim=True) + 1e-8)
    want = torch.relu(((alpha * torch.relu(g1)).sum(dim=(1, 2), keepdim=True) * a).sum(0))
    got = ours(trained, x, "smoothgradcampp", c, samples=n, noise=sigma, seed=11)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def _captum(attr: Callable[[], Tensor]) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return attr().detach()


def test_pixel_attributions_equal_captum(trained: Trained, image: tuple[Tensor, int]) -> None:
    from captum.attr import InputXGradient, IntegratedGradients, Occlusion, Saliency

    x, c = image
    m = trained.model
    ref = _captum(lambda: Saliency(m).attribute(x.clone(), target=c))
    assert_close(ours(trained, x, "saliency", c).numpy(), ref[0].amax(0).numpy())
    ref = _captum(lambda: InputXGradient(m).attribute(x.clone().requires_grad_(), target=c))
    assert_close(ours(trained, x, "inputxgradient", c).numpy(), ref[0].sum(0).clamp_min(0).numpy())
    ref = _captum(lambda: IntegratedGradients(m).attribute(x.clone(), target=c, n_steps=16, baselines=0.0))
    got = explain(
        m,
        x,
        [LAYER],
        ["integratedgradients"],
        c,
        relu=False,
        options=MethodOptions(steps=16, baseline="mean"),
    ).maps[("integratedgradients", LAYER)]
    assert_close(got[0, 0].numpy(), ref[0].sum(0).numpy())
    ref = _captum(
        lambda: Occlusion(m).attribute(
            x.clone(), target=c, sliding_window_shapes=(3, 12, 12), strides=(3, 5, 5), baselines=0.0
        )
    )
    got = explain(
        m,
        x,
        [LAYER],
        ["occlusion"],
        c,
        relu=False,
        options=MethodOptions(window=12, stride=5, baseline="mean"),
    ).maps[("occlusion", LAYER)]
    assert_close(got[0, 0].numpy(), ref[0].mean(0).numpy())


@pytest.mark.parametrize(
    "method,nt_type",
    [("smoothgrad", "smoothgrad"), ("smoothgradsq", "smoothgrad_sq"), ("vargrad", "vargrad")],
)
def test_smoothgrad_family_equals_captums_noise_tunnel(
    method: str, nt_type: str, trained: Trained, image: tuple[Tensor, int]
) -> None:
    from captum.attr import NoiseTunnel, Saliency

    x, c = image
    m = trained.model
    sigma = 0.15 * float(x.max() - x.min())
    torch.manual_seed(4)
    ref = _captum(
        lambda: NoiseTunnel(Saliency(m)).attribute(
            x.clone(), target=c, nt_type=nt_type, nt_samples=6, stdevs=sigma, abs=False
        )
    )
    got = ours(trained, x, method, c, samples=6, noise=0.15, seed=4)
    assert_close(got.numpy(), ref[0].abs().amax(0).numpy())
