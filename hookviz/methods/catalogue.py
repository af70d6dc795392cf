# ruff: noqa: RUF001
"""The built-in methods' registrations (torch-free: each names its function as ``"module:function"``).

Order is the order sheets show them: the CAM family first, then the pixel attributions, then controls.
"""

from __future__ import annotations

import math
from typing import Any

from hookviz.methods.registry import MethodOptions, register_method

_C = "hookviz.methods.compute"
_P = "hookviz.methods.perturb"
_X = "hookviz.methods.pixel"
_O = "hookviz.methods.ownpass"
_A = "hookviz.methods.attention"
_SHARED = "the shared backward passes"
#: The CAMs weighting the activations by the gradients of the shared pass: their family, needs and cost.
_GRADIENT: dict[str, Any] = {
    "family": "gradient-weighted", "needs": {"activations", "layer_gradients"}, "cost": _SHARED,
}  # fmt: skip
#: The class-agnostic CAMs of the activations alone: their family, needs and cost.
_ACTIVATIONS: dict[str, Any] = {
    "family": "activation-only", "needs": {"activations"}, "class_specific": False,
    "cost": "no backward pass",
}  # fmt: skip


def _n(options: MethodOptions, default: int) -> int:
    return options.samples or default


def _windows(options: MethodOptions, size: tuple[int, ...]) -> int:
    """Occlusion's windows over an input of ``size`` (two sides, or three for a volume)."""
    w, s = min(options.window, *size), options.stride
    return math.prod((n - w) // s + 1 + ((n - w) % s > 0) for n in size)


#: Default samples of the stochastic methods (their references' defaults).
SAMPLES = {"sscam": 35, "iscam": 10, "smoothgradcampp": 4, "smoothgrad": 25}
#: Default noise of the stochastic methods: SS-CAM's and Smooth Grad-CAM++'s are standard deviations in
#: the input tensor's units (torchcam's defaults); SmoothGrad's a share of each image's value range (its
#: paper).
NOISE = {"sscam": 2.0, "smoothgradcampp": 0.3, "smoothgrad": 0.15}

# -- the CAM family: one map per layer from the shared pass ---------------------------------------------
register_method(
    "gradcam", title="Grad-CAM", **_GRADIENT,
    paper="Selvaraju et al., ICCV 2017",
    formula="ReLU(Σ_k mean(∂y/∂A^k) A^k)", detection=True, function=f"{_C}:gradcam",
)  # fmt: skip
register_method(
    "gradcampp", title="Grad-CAM++", **_GRADIENT,
    paper="Chattopadhay et al., WACV 2018",
    formula="closed-form α from 2nd/3rd powers of the gradient", detection=True,
    assumes_nonnegative="its weights divide by each channel's sum of activations (the derivation takes "
    "A >= 0)",
    function=f"{_C}:gradcampp",
)  # fmt: skip
register_method(
    "xgradcam", title="XGrad-CAM", **_GRADIENT,
    paper="Fu et al., BMVC 2020", formula="weights Σ (A/ΣA)·∂y/∂A",
    detection=True, assumes_nonnegative="its weights divide by each channel's sum of activations",
    function=f"{_C}:xgradcam",
)  # fmt: skip
register_method(
    "layercam", title="LayerCAM", **_GRADIENT,
    paper="Jiang et al., TIP 2021",
    formula="ReLU(Σ_k ReLU(∂y/∂A^k) ⊙ A^k), element-wise", detection=True, function=f"{_C}:layercam",
)  # fmt: skip
register_method(
    "hirescam", title="HiResCAM", **_GRADIENT,
    paper="Draelos & Carin, 2020",
    formula="ReLU(Σ_k ∂y/∂A^k ⊙ A^k), element-wise", detection=True, function=f"{_C}:hirescam",
)  # fmt: skip
register_method(
    "eigencam", title="Eigen-CAM", **_ACTIVATIONS,
    paper="Muhammad & Yeasin, IJCNN 2020",
    formula="first principal component of A; no gradient, class-agnostic", detection=True,
    function=f"{_C}:eigencam",
)  # fmt: skip
register_method(
    "scorecam", title="Score-CAM", family="perturbation", needs={"activations", "masked_passes"},
    cost="one masked forward pass per channel", paper="Wang et al., CVPRW 2020",
    formula="softmax-weighted channels from masked forward passes", function=f"{_C}:scorecam",
    passes=lambda k, t, o, hw: (k, 0), options=("batch",), in_all=False,
)  # fmt: skip
register_method(
    "guidedbackprop", title="Guided Backprop", family="input-gradient", needs={"own_passes"},
    cost="one forward and one backward pass per target", paper="Springenberg et al., 2015",
    formula="input gradient, only positive gradients through every rectifier (ReLU, ReLU6, "
    "hardtanh(x, 0, t), clamp(x, min=0), LeakyReLU; the record counts them, a network with none gets a "
    "note); max over colours",
    function=f"{_C}:guidedbackprop", passes=lambda k, t, o, hw: (1, t), resolution="input",
)  # fmt: skip
register_method(
    "guidedgradcam", title="Guided Grad-CAM", family="input-gradient",
    needs={"activations", "layer_gradients", "own_passes"}, uses=("gradcam",),
    cost="Guided Backprop's passes", paper="Selvaraju et al., ICCV 2017",
    formula="guided backprop × the upsampled Grad-CAM", function=f"{_C}:guidedgradcam",
    passes=lambda k, t, o, hw: (1, t), resolution="input",
)  # fmt: skip
register_method(
    "gradcamelementwise", title="Grad-CAM element-wise", **_GRADIENT,
    paper="pytorch-grad-cam (Gildenblat)",
    formula="Σ_k ReLU(∂y/∂A^k ⊙ A^k)", detection=True, function=f"{_C}:gradcamelementwise",
)  # fmt: skip
register_method(
    "eigengradcam", title="EigenGrad-CAM", **_GRADIENT,
    paper="pytorch-grad-cam (Gildenblat), after Eigen-CAM",
    formula="first principal component of ∂y/∂A ⊙ A", detection=True, function=f"{_C}:eigengradcam",
)  # fmt: skip
register_method(
    "segeigencam", title="Seg-Eigen-CAM", **_GRADIENT,
    paper="Chung & Ying, Appl. Sci. 2025 (for segmentation)",
    formula="first principal component of |∂y/∂A| ⊙ A, its sign set by the larger extreme",
    function=f"{_C}:segeigencam",
)  # fmt: skip
register_method(
    "kpcacam", title="KPCA-CAM", **_ACTIVATIONS,
    paper="Karmani et al., 2024",
    formula="first kernel-PCA component of A (sigmoid kernel tanh(x·y/K + 1))", detection=True,
    function=f"{_C}:kpcacam",
)  # fmt: skip
register_method(
    "fem", title="FEM", **_ACTIVATIONS,
    paper="Fuad et al., IPTA 2020",
    formula="Σ_k w_k A^k, w_k the share of A^k's positions above its mean + 2σ", detection=True,
    function=f"{_C}:fem",
)  # fmt: skip
register_method(
    "cam", title="CAM", **_GRADIENT,
    paper="Zhou et al., CVPR 2016",
    formula="Σ_k W_ck A^k, W the linear classifier after global average pooling (refused for any other head)",
    in_all=False, function=f"{_C}:cam",
)  # fmt: skip
register_method(
    "finercam", title="Finer-CAM", family="gradient-weighted", needs={"activations", "own_passes"},
    cost="one forward and one backward pass per target", paper="Zhang et al., CVPR 2025",
    formula="Grad-CAM of Σ_j p_j (y_c − y_j) / Σ_j p_j over the compared classes j (--compare, else the 3 "
    "with the nearest logits)",
    options=("compare",), passes=lambda k, t, o, hw: (1, t), function=f"{_O}:finercam",
)  # fmt: skip
register_method(
    "shapleycam", title="Shapley-CAM", family="gradient-weighted", needs={"activations", "own_passes"},
    cost="one forward and two backward passes per target", paper="Cai et al., 2025 (arXiv 2501.06261)",
    formula="ReLU(Σ_k mean(∇y − ½ H·A)_k A^k) with the ReST score y = logit − cross-entropy",
    passes=lambda k, t, o, hw: (1, 2 * t), function=f"{_O}:shapleycam",
)  # fmt: skip
register_method(
    "smoothgradcampp", title="Smooth Grad-CAM++", family="gradient-weighted",
    needs={"activations", "own_passes"}, cost="Grad-CAM++ over noisy copies of the input",
    paper="Omeiza et al., 2019", in_all=False, options=("seed", "samples", "noise"),
    formula="Grad-CAM++ with the gradient's powers and ReLU(∂y/∂A) averaged over noisy inputs",
    passes=lambda k, t, o, hw: (_n(o, SAMPLES["smoothgradcampp"]), _n(o, SAMPLES["smoothgradcampp"]) * t),
    function=f"{_O}:smoothgradcampp",
)  # fmt: skip
register_method(
    "refinecam", title="Refine-CAM", **_GRADIENT, uses=("gradcampp",),
    paper="pytorch-grad-cam's RefineCAM (arXiv 2605.14641)",
    formula="product over the requested layers of each one's min-max-normalised, upsampled Grad-CAM++",
    across_layers=True, resolution="input", function=f"{_C}:refinecam",
)  # fmt: skip
register_method(
    "ablationcam", title="Ablation-CAM", family="perturbation", needs={"activations", "own_passes"},
    cost="the network after the layer once per channel", paper="Desai & Ramaswamy, WACV 2020",
    formula="ReLU(Σ_k w_k A^k), w_k = (y − y with A^k zeroed) / y", in_all=False, options=("batch",),
    passes=lambda k, t, o, hw: (k, 0), function=f"{_P}:ablationcam",
)  # fmt: skip
register_method(
    "sscam", title="SS-CAM", family="perturbation", needs={"activations", "own_passes"},
    cost="Score-CAM's passes for each noisy copy", paper="Wang et al., 2020 (SS-CAM)", in_all=False,
    formula="Score-CAM with each channel's mask + Gaussian noise, scores averaged over the copies",
    options=("seed", "samples", "noise", "batch"),
    passes=lambda k, t, o, hw: (k * _n(o, SAMPLES["sscam"]), 0), function=f"{_P}:sscam",
)  # fmt: skip
register_method(
    "iscam", title="IS-CAM", family="perturbation", needs={"activations", "own_passes"},
    cost="Score-CAM's passes for each integration step", paper="Naidu et al., 2020 (IS-CAM)", in_all=False,
    formula="Score-CAM with scores integrated over masks scaled by Σ_{j≤i} j/N (torchcam's schedule)",
    options=("samples", "batch"), passes=lambda k, t, o, hw: (k * _n(o, SAMPLES["iscam"]), 0),
    function=f"{_P}:iscam",
)  # fmt: skip

# -- pixel attributions: one map at the input's resolution, the same for every layer --------------------
register_method(
    "saliency", title="Saliency", family="input-gradient", needs={"input_gradients"},
    cost="the shared pass (its backward passes reach the input)", paper="Simonyan et al., ICLR-W 2014",
    formula="max over colours of |∂y/∂x|", function=f"{_X}:saliency", resolution="input",
)  # fmt: skip
register_method(
    "inputxgradient", title="Input × Gradient", family="input-gradient", needs={"input_gradients"},
    cost="the shared pass, its backward passes to the input", paper="Shrikumar et al., 2016",
    formula="Σ_colours x ⊙ ∂y/∂x (its positive part; signed with --no-relu)",
    function=f"{_X}:inputxgradient", resolution="input",
)  # fmt: skip
register_method(
    "fullgrad", title="FullGrad", family="input-gradient", needs={"input_gradients", "bias_gradients"},
    cost="the shared pass (its backward passes reach the input, a hook at every biased layer)",
    paper="Srinivas & Fleuret, NeurIPS 2019",
    formula="|x ⊙ ∂y/∂x| + Σ_layers |b ⊙ ∂y/∂z| over every conv/BatchNorm bias, each channel min-max "
    "scaled and upsampled",
    function=f"{_X}:fullgrad", resolution="input", in_all=False,
)  # fmt: skip
for _name, _title, _formula in (
    ("smoothgrad", "SmoothGrad", "max over colours of |mean over noisy copies of ∂y/∂x|"),
    ("smoothgradsq", "SmoothGrad²", "max over colours of the mean of (∂y/∂x)² over noisy copies"),
    ("vargrad", "VarGrad", "max over colours of the variance of ∂y/∂x over noisy copies"),
):
    register_method(
        _name, title=_title, family="input-gradient", needs={"own_passes"},
        cost="one forward and backward pass per noisy copy and target", in_all=False,
        paper="Smilkov et al., 2017" if _name != "vargrad" else "Adebayo et al., 2018",
        formula=f"{_formula}; noise σ = --noise × the image's value range (0.15)",
        options=("seed", "samples", "noise"), function=f"{_X}:{_name}",
        passes=lambda k, t, o, hw: (_n(o, SAMPLES["smoothgrad"]), _n(o, SAMPLES["smoothgrad"]) * t),
        resolution="input",
    )  # fmt: skip
register_method(
    "integratedgradients", title="Integrated Gradients", family="input-gradient", needs={"own_passes"},
    cost="one forward and backward pass per step and target", paper="Sundararajan et al., ICML 2017",
    formula="Σ_colours (x − x') ⊙ ∫ ∂y/∂x along x' → x (Gauss-Legendre, --ig-steps); x' from --baseline",
    in_all=False, options=("steps", "baseline", "batch"),
    passes=lambda k, t, o, hw: (o.steps, o.steps * t), function=f"{_X}:integratedgradients",
    resolution="input",
)  # fmt: skip
register_method(
    "occlusion", title="Occlusion", family="pixel-perturbation", needs={"own_passes"},
    cost="one forward pass per window position", paper="Zeiler & Fergus, ECCV 2014",
    formula="per pixel, the mean drop of y over the --window squares (every --stride) that cover it when "
    "filled with --baseline",
    in_all=False, options=("window", "stride", "baseline", "batch"),
    passes=lambda k, t, o, hw: (_windows(o, hw), 0), function=f"{_P}:occlusion", resolution="input",
)  # fmt: skip
register_method(
    "rise", title="RISE", family="pixel-perturbation", needs={"own_passes"},
    cost="one forward pass per random mask", paper="Petsiuk et al., BMVC 2018",
    formula="Σ_i p(c | x ⊙ M_i) M_i / (N · 0.5), M_i upsampled random --cells² grids (--masks of them)",
    in_all=False, options=("seed", "masks", "cells", "batch"),
    passes=lambda k, t, o, hw: (o.masks, 0), function=f"{_P}:rise", resolution="input",
)  # fmt: skip

register_method(
    "drise", title="D-RISE", family="pixel-perturbation", needs={"own_passes"}, detection=True,
    detection_only=True,
    cost="one detector pass per random mask", paper="Petsiuk et al., CVPR 2021",
    formula="per box, Σ_i w_i M_i / (N · 0.5), w_i the best IoU × score of its class among the masked "
    "photo's detections (detectors only)",
    in_all=False, options=("seed", "masks", "cells", "batch"), passes=lambda k, t, o, hw: (o.masks, 0),
    resolution="input",
)  # fmt: skip

# -- transformers: the attention probabilities of every encoder block, one pass shared by the three -------
_ATTENTION = "one forward pass with every block's attention, one backward pass per target"
register_method(
    "rollout", title="Attention rollout", family="attention", needs={"own_passes"}, class_specific=False,
    cost=_ATTENTION, paper="Abnar & Zuidema, ACL 2020",
    formula="the head's tokens' row of Π_l norm(½ fuse_h(A^l) + ½ I); --head-fusion mean/max/min, the lowest "
    "--discard-ratio of each fused matrix set to 0",
    in_all=False, options=("head_fusion", "discard"), passes=lambda k, t, o, hw: (1, 1),
    function=f"{_A}:rollout",
)  # fmt: skip
register_method(
    "chefer", title="Attention relevance (Chefer)", family="attention", needs={"own_passes"},
    cost=_ATTENTION, paper="Chefer, Gur & Wolf, ICCV 2021",
    formula="the head's tokens' row of R, R ← R + E_h[(∂y/∂A^l ⊙ A^l)⁺] R from R = I over the blocks",
    in_all=False, passes=lambda k, t, o, hw: (1, t), function=f"{_A}:chefer",
)  # fmt: skip
register_method(
    "legrad", title="LeGrad", family="attention", needs={"own_passes"},
    cost="one forward pass with every block's attention, one backward pass per block and target",
    paper="Bousselham et al., 2024",
    formula="mean over blocks l of E_heads,queries[(∂s^l/∂A^l)⁺], s^l the head on block l's mean token",
    in_all=False, passes=lambda k, t, o, hw: (1, t), function=f"{_A}:legrad",
)  # fmt: skip

# -- controls ----------------------------------------------------------------------------------------
register_method(
    "randomcam", title="Random-CAM", family="control", needs={"activations"}, class_specific=False,
    cost="no backward pass", paper="a control (pytorch-grad-cam's RandomCAM)",
    formula="ReLU(Σ_k w_k A^k), w_k uniform in [−1, 1] (--seed): what chance looks like", in_all=False,
    options=("seed",), function=f"{_C}:randomcam",
)  # fmt: skip
