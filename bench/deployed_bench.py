"""The model you deploy (issue #51): each method through onnxruntime (``--model FILE.onnx``) and through
the ``torch.export`` program (``--model FILE.pt2``) against the same method on the PyTorch model (CPU),
side by side.

resnet18 (weights=None: the cost does not depend on the weights), exported here with a dynamic batch, a batch
of 4 images at 224 px, layer4, each image's top class; the same settings on every side. Interleaved rounds in
a shuffled order; medians. Run with ``make bench`` or ``python bench/deployed_bench.py``."""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import medians
from hookviz.engine.explain import explain
from hookviz.methods import MethodOptions
from hookviz.models import exported, onnx
from hookviz.models.sources import Options

FORWARD = ("eigencam", "scorecam", "ablationcam", "occlusion", "rise")
GRADIENT = ("gradcam", "layercam", "saliency", "integratedgradients")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(4, 3, 224, 224)
    folder = Path(tempfile.mkdtemp(prefix="hookviz-bench-"))
    batch = {"x": {0: torch.export.Dim("batch")}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), folder / "m.onnx", dynamic_shapes=batch, verbose=False)
        torch.export.save(torch.export.export(model, (x,), dynamic_shapes=batch), folder / "m.pt2")
    runtime = onnx.build(str(folder / "m.onnx"), "DEFAULT", Options()).model
    program = exported.build(str(folder / "m.pt2"), "DEFAULT", Options()).model
    options = MethodOptions(batch=64, masks=500, window=56, stride=28, steps=16)

    def run(on: torch.nn.Module, method: str) -> None:
        explain(on, x, ["layer4"], [method], options=options)

    print(
        f"# hookviz deployed bench: resnet18, batch {len(x)} at 224 px, layer4, {args.rounds} rounds, medians"
    )
    print("| method | PyTorch | onnxruntime | ratio | torch.export | ratio |\n|---|---|---|---|---|---|")
    for method in (*FORWARD, *GRADIENT):
        sides = {"torch": lambda m=method: run(model, m), "export": lambda m=method: run(program, m)}
        if method in FORWARD:
            sides["onnx"] = lambda m=method: run(runtime, m)
        t = medians(sides, args.rounds)
        ort = (
            f"{t['onnx'] * 1000:.0f} ms | {t['onnx'] / t['torch']:.2f}x"
            if "onnx" in t
            else "no gradients | -"
        )
        print(f"| {method} | {t['torch'] * 1000:.0f} ms | {ort} | {t['export'] * 1000:.0f} ms | "
              f"{t['export'] / t['torch']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
