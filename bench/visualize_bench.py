"""Feature visualisation (issue #36) against lucent's ``render_vis``: the same model, layer, channel, picture
size (128, enlarged to 224), number of steps and optimiser (Adam, lr 0.05); each final picture is scored the
same way afterwards (the channel's mean at the layer, on the untransformed picture, normalised and enlarged),
and each run is timed. lucent (torch-lucent 0.1.8, test-only: ``pip install --no-deps torch-lucent==0.1.8
kornia==0.4.1`` plus ``decorator ipython``) draws from torch's global generator, seeded the same.
Run with ``python bench/visualize_bench.py [--steps 128]``."""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
import torchvision

from hookviz.concepts.visualize import Objective, visualize

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def score(model: torch.nn.Module, layer: str, channel: int, image: torch.Tensor) -> float:
    """The channel's mean at ``layer`` on ``image`` (``(1, 3, H, W)`` in [0, 1]) as the model sees it."""
    kept: list[torch.Tensor] = []
    handle = dict(model.named_modules())[layer].register_forward_hook(lambda m, a, o: kept.append(o))
    x = F.interpolate((image - MEAN) / STD, size=(224, 224), mode="bilinear", align_corners=True)
    with torch.no_grad():
        model.eval()(x)
    handle.remove()
    return float(kept[0][0, channel].mean())


def lucent_run(model: torch.nn.Module, layer: str, channel: int, steps: int, seed: int) -> torch.Tensor:
    from lucent.optvis import render

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        images = render.render_vis(
            model,
            f"{layer.replace('.', '_')}:{channel}",
            thresholds=(steps,),
            show_image=False,
            progress=False,
        )
    return torch.from_numpy(images[-1]).permute(0, 3, 1, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()  # random weights: no download; both see the same model
    cases = [("layer2", 7), ("layer3", 5), ("layer4", 100)]
    rows = []
    for layer, channel in cases:
        t0 = time.perf_counter()
        ours = visualize(model, Objective(layer, channel=channel), size=128, input_size=(224, 224),
                         steps=args.steps, seed=0).images  # fmt: skip
        t1 = time.perf_counter()
        theirs = lucent_run(model, layer, channel, args.steps, seed=0)
        t2 = time.perf_counter()
        a, b = score(model, layer, channel, ours), score(model, layer, channel, theirs)
        rows.append((layer, channel, a, b, (t1 - t0), (t2 - t1)))
    print(f"resnet18 (random weights), 128 px enlarged to 224, {args.steps} steps, CPU, 2 threads")
    print(
        "| layer:channel | hookviz objective | lucent objective | hookviz time | lucent time | time ratio |"
    )
    for layer, channel, a, b, ta, tb in rows:
        print(f"| {layer}:{channel} | {a:.3f} | {b:.3f} | {ta:.1f} s | {tb:.1f} s | {ta / tb:.2f}x |")
    print(f"median time ratio (hookviz / lucent): {statistics.median(r[4] / r[5] for r in rows):.2f}x")


if __name__ == "__main__":
    main()
