"""Every method against its reference on the same model, layer, input and targets, as ratios from ONE run.

``python bench/methods_bench.py`` (``make bench`` runs it after the main benchmark). resnet18 (weights=None),
a batch of 8 images, layer4, each image's top-1 class; the methods' settings are set equal on both sides
(samples, steps, windows, batch sizes). Interleaved rounds in a shuffled order; medians.
"""

from __future__ import annotations

import os

# numpy's BLAS threads spin after pytorch-grad-cam's SVDs and slow whatever runs next (either side, by up to
# 1.7x): one BLAS thread keeps the interleaved timings honest. Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import contextlib
import io
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import medians


def _quiet(fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            fn()

    return run


SLOW = {"sscam", "iscam"}


def rows(rounds: int, batch: int, size: int, only: set[str] | None = None) -> list[tuple[str, float, float]]:
    import pytorch_grad_cam as pgc
    import torchcam.methods as tc
    from captum.attr import InputXGradient, IntegratedGradients, NoiseTunnel, Occlusion, Saliency
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputReST, ClassifierOutputTarget

    from hookviz.engine.explain import explain
    from hookviz.methods import MethodOptions

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(batch, 3, size, size)
    with torch.no_grad():
        top = model(x).argmax(1)
    classes = top.tolist()
    layer = model.layer4
    opts = MethodOptions(samples=2, steps=16, window=16, stride=8, batch=64, masks=500)

    def ours(method: str, layers: tuple[str, ...] = ("layer4",), **kw: object) -> Callable[[], object]:
        o = MethodOptions(**{**opts.__dict__, **kw})  # type: ignore[arg-type]
        return lambda: explain(model, x, list(layers), [method], top, options=o)

    def pgc_run(cls: Callable[..., object], target: Callable[[int], object] = ClassifierOutputTarget,
                layers: list[object] | None = None, **init: object) -> Callable[[], object]:  # fmt: skip
        def run() -> object:
            cam = cls(model=model, target_layers=layers if layers is not None else [layer], **init)
            try:
                return cam(input_tensor=x, targets=[target(c) for c in classes])
            finally:  # its hooks off the model now (left to the collector, they slow every later pass)
                for c in getattr(cam, "base_cam_per_layer", [cam]):
                    c.activations_and_grads.release()
                model.zero_grad(set_to_none=True)

        return run

    def finer_run() -> object:
        with pgc.FinerCAM(model, [layer]) as cam:  # its exit takes the hooks off the model
            out = cam(x)
        model.zero_grad(set_to_none=True)
        return out

    def tc_run(cls: Callable[..., object], **kw: object) -> Callable[[], object]:
        def run() -> object:
            with cls(model, "layer4", input_shape=(3, size, size), **kw) as extractor:  # type: ignore[operator]
                out = model(x)
                cams = extractor(classes, out)
            model.zero_grad(set_to_none=True)
            return cams

        return run

    def captum_run(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            out = fn()
            model.zero_grad(set_to_none=True)
            return out

        return run

    pairs: dict[str, tuple[Callable[[], object], Callable[[], object], str]] = {
        "gradcam": (ours("gradcam"), pgc_run(pgc.GradCAM), "pytorch-grad-cam"),
        "gradcampp": (ours("gradcampp"), pgc_run(pgc.GradCAMPlusPlus), "pytorch-grad-cam"),
        "xgradcam": (ours("xgradcam"), pgc_run(pgc.XGradCAM), "pytorch-grad-cam"),
        "layercam": (ours("layercam"), pgc_run(pgc.LayerCAM), "pytorch-grad-cam"),
        "hirescam": (ours("hirescam"), pgc_run(pgc.HiResCAM), "pytorch-grad-cam"),
        "gradcamelementwise": (
            ours("gradcamelementwise"),
            pgc_run(pgc.GradCAMElementWise),
            "pytorch-grad-cam",
        ),
        "eigencam": (ours("eigencam"), pgc_run(pgc.EigenCAM), "pytorch-grad-cam"),
        "eigengradcam": (ours("eigengradcam"), pgc_run(pgc.EigenGradCAM), "pytorch-grad-cam"),
        "segeigencam": (ours("segeigencam"), pgc_run(pgc.SegEigenCAM), "pytorch-grad-cam"),
        "kpcacam": (ours("kpcacam"), pgc_run(pgc.KPCA_CAM), "pytorch-grad-cam"),
        "fem": (ours("fem"), pgc_run(pgc.FEM), "pytorch-grad-cam"),
        "randomcam": (ours("randomcam"), pgc_run(pgc.RandomCAM), "pytorch-grad-cam"),
        "shapleycam": (ours("shapleycam"), pgc_run(pgc.ShapleyCAM, ClassifierOutputReST), "pytorch-grad-cam"),
        "finercam": (ours("finercam"), finer_run, "pytorch-grad-cam"),
        "refinecam": (
            ours("refinecam", ("layer3", "layer4")),
            pgc_run(pgc.RefineCAM, layers=[model.layer3, layer]),
            "pytorch-grad-cam",
        ),
        "fullgrad": (ours("fullgrad"), pgc_run(pgc.FullGrad, layers=[]), "pytorch-grad-cam"),
        "scorecam": (ours("scorecam"), pgc_run(pgc.ScoreCAM), "pytorch-grad-cam"),
        "ablationcam": (ours("ablationcam"), pgc_run(pgc.AblationCAM, batch_size=64), "pytorch-grad-cam"),
        "cam": (ours("cam"), tc_run(tc.CAM, fc_layer="fc"), "torchcam"),
        "sscam": (ours("sscam", noise=2.0), tc_run(tc.SSCAM, num_samples=2, batch_size=64), "torchcam"),
        "iscam": (ours("iscam"), tc_run(tc.ISCAM, num_samples=2, batch_size=64), "torchcam"),
        "smoothgradcampp": (
            ours("smoothgradcampp", samples=4),
            tc_run(tc.SmoothGradCAMpp, num_samples=4),
            "torchcam",
        ),
        "saliency": (
            ours("saliency"),
            captum_run(lambda: Saliency(model).attribute(x, target=top)),
            "captum",
        ),
        "inputxgradient": (
            ours("inputxgradient"),
            captum_run(lambda: InputXGradient(model).attribute(x.clone().requires_grad_(), target=top)),
            "captum",
        ),
        "smoothgrad": (
            ours("smoothgrad", samples=8),
            captum_run(
                lambda: NoiseTunnel(Saliency(model)).attribute(
                    x, target=top, nt_type="smoothgrad", nt_samples=8, stdevs=0.5
                )
            ),
            "captum",
        ),
        "integratedgradients": (
            ours("integratedgradients", baseline="mean"),
            captum_run(
                lambda: IntegratedGradients(model).attribute(
                    x, target=top, n_steps=16, internal_batch_size=64
                )
            ),
            "captum",
        ),
        "occlusion": (
            ours("occlusion", baseline="mean"),
            captum_run(
                lambda: Occlusion(model).attribute(
                    x,
                    target=top,
                    sliding_window_shapes=(3, 16, 16),
                    strides=(3, 8, 8),
                    perturbations_per_eval=64,
                )
            ),
            "captum",
        ),
    }

    def rise_loop() -> object:
        """RISE as its authors' code runs it (no peer library has it): per image, masks in batches of 64."""
        from hookviz.methods.perturb import random_masks

        masks = random_masks(opts.masks, opts.cells, (size, size), 0)
        maps = []
        with torch.no_grad():
            for i in range(batch):
                probs = torch.cat([
                    torch.softmax(model(x[i : i + 1] * m[:, None]), 1)[:, classes[i]]
                    for m in masks.split(64)
                ])  # fmt: skip
                maps.append(torch.einsum("n,nhw->hw", probs, masks) / (len(masks) * 0.5))
        return maps

    pairs["rise"] = (ours("rise"), rise_loop, "the authors' per-image loop")
    out: list[tuple[str, float, float]] = []
    for name, (mine, theirs, peer) in pairs.items():
        if only and name not in only:
            continue
        # SS-CAM and IS-CAM run 8,192 forward passes a call on each side: one round (after the warm-up).
        t = medians({"ours": _quiet(mine), "ref": _quiet(theirs)}, 1 if name in SLOW else rounds)
        out.append((f"{name}: hookviz vs {peer} (speed-up = ref / hookviz)", t["ours"], t["ref"] / t["ours"]))
        speed = t["ref"] / t["ours"]
        print(
            f"{name:22s} hookviz {t['ours']:.3f} s  {peer} {t['ref']:.3f} s  speed-up {speed:.2f}x",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=96, help="input side (layer4 is size/32)")
    parser.add_argument("--only", nargs="*", help="these methods only")
    args = parser.parse_args()
    print(f"# hookviz methods bench  {time.strftime('%Y-%m-%d')}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); resnet18 weights=None, batch {args.batch}, "
        f"{args.size}x{args.size}, layer4, median of {args.rounds} interleaved rounds\n"
    )
    rows(args.rounds, args.batch, args.size, set(args.only) if args.only else None)


if __name__ == "__main__":
    main()
