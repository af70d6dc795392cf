"""docs/img's pictures of two models the tests train on the synthetic shapes (no fixture file holds them):
the FCN segmenter of tests/test_dense.py (``--target disc``: docs/img/segmentation-shapes.png) and the
ShapesNet of tests/test_targets.py (``--similar-to`` a reference disc: docs/img/similar-to-shapes.png).

Each model is trained here as its test trains it (seeded), saved into a working folder beside its photos,
and ``hookviz gradcam`` runs inside that folder with relative paths, so the captions name
``segmenter.safetensors`` and ``net.safetensors``, never a temporary folder.

    python scripts/shapes_pictures.py [NAME ...] [--out docs/img] [--keep /tmp/shapes-pictures]

NAME: segmentation-shapes, similar-to-shapes (default: both).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hookviz.io.shapes import draw_shape, shapes_scene  # noqa: E402

SCALE = 4  # the photos enlarged (nearest: the shapes stay crisp) so that the captions are readable
NAMES = ["__background__", "square", "disc", "cross"]


def hookviz(work: Path, *args: str) -> None:
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    subprocess.run([sys.executable, "-m", "hookviz", *args], check=True, cwd=work, env=environ)


def save_photo(path: Path, img: np.ndarray) -> None:
    """A float (or uint8) RGB picture enlarged SCALE times, as a PNG."""
    from PIL import Image

    rgb = img if img.dtype == np.uint8 else (img * 255).round().clip(0, 255).astype(np.uint8)
    Image.fromarray(rgb.repeat(SCALE, axis=0).repeat(SCALE, axis=1)).save(path)


def small_png(source: Path, target: Path) -> None:
    """``source`` saved again with zlib's best compression: the same pixels, a third smaller."""
    from PIL import Image

    with Image.open(source) as img:
        img.save(target, optimize=True)


def train_segmenter(path: Path) -> None:
    """tests/test_dense.py's ``segmenter`` fixture: the FCN trained 220 steps on scenes of 1-2 shapes."""
    import torch.nn.functional as F
    from safetensors.torch import save_file

    from tests.shapes_net import make_segmenter

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make_segmenter()
    steps = 220
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=steps)
    model.train()
    for _ in range(steps):
        batch = [shapes_scene(rng, 64, 80, 2, (7, 12)) for _ in range(16)]
        x = torch.from_numpy(np.stack([b[0].transpose(2, 0, 1) for b in batch]))
        y = torch.from_numpy(np.stack([b[3] for b in batch]))
        loss = F.cross_entropy(model(x)["out"], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    save_file({k: v.contiguous() for k, v in model.eval().state_dict().items()}, str(path))


def segmentation(work: Path, target: Path) -> None:
    """A scene of a cross and a disc (80x64, shown at 320x256), the disc explained (its pixels outlined)."""
    if not (work / "segmenter.safetensors").exists():
        train_segmenter(work / "segmenter.safetensors")
    (work / "labels.txt").write_text("\n".join(NAMES) + "\n")
    rng = np.random.default_rng(3)
    while True:
        img, _boxes, labels, _classes = shapes_scene(rng, 64, 80, 2, (7, 12))
        if sorted(labels.tolist()) == [1, 2]:  # a disc and a cross
            break
    save_photo(work / "scene.png", img)
    shutil.rmtree(work / "seg", ignore_errors=True)
    shutil.copy(ROOT / "tests" / "shapes_net.py", work / "shapes_net.py")
    hookviz(work, "gradcam", "scene.png", "--model", "shapes_net.py:make_segmenter", "--weights",
            "segmenter.safetensors", "--labels", "labels.txt", "--input-size", "64", "--target", "disc",
            "--device", "cpu", "--out", "seg", "-q")  # fmt: skip
    (found,) = (work / "seg").glob("scene*.gradcam.*.png")
    small_png(found, target)


def similarity(work: Path, target: Path) -> None:
    """tests/test_targets.py's ShapesNet (trained as its ``shapes`` fixture is), a scene of a disc beside a
    square (96x48, shown at 384x192) and the similarity of its embedding to a reference disc's."""
    from safetensors.torch import save_file

    from tests.conftest import train_on_shapes
    from tests.shapes_net import ShapesNet
    from tests.test_targets import _scene

    if not (work / "net.safetensors").exists():
        torch.manual_seed(0)
        save_file(train_on_shapes(ShapesNet(), 400).state_dict(), str(work / "net.safetensors"))
    rng = np.random.default_rng(5)
    rgb, _ = _scene(rng, 1, 0)  # the disc on the left, the square on the right
    save_photo(work / "scene.png", rgb)
    disc, _ = draw_shape(1, 48, rng)
    save_photo(work / "ref_disc.png", disc)
    shutil.rmtree(work / "sim", ignore_errors=True)
    hookviz(work, "gradcam", "scene.png", "--model", "tests.shapes_net:make", "--weights", "net.safetensors",
            "--input-size", "48", "--resize", "shorter", "--mean", "0,0,0", "--std", "1,1,1",
            "--similar-to", "ref_disc.png", "--method", "gradcam,layercam,scorecam", "--device", "cpu",
            "--out", "sim", "-q")  # fmt: skip
    (found,) = (work / "sim").glob("scene*sheet*.png")
    small_png(found, target)


PICTURES: dict[str, Callable[[Path, Path], None]] = {
    "segmentation-shapes": segmentation,
    "similar-to-shapes": similarity,
}


def main() -> None:
    from page_pictures import asked  # this folder's sibling: the same command line

    args = asked(PICTURES, __doc__ or "")
    out = args.out
    with tempfile.TemporaryDirectory(prefix="hookviz-shapes-") as d:
        work = (args.keep or Path(d)).resolve()
        for name in args.names:
            (work / name).mkdir(parents=True, exist_ok=True)
            PICTURES[name](work / name, out / f"{name}.png")
            print(out / f"{name}.png")


if __name__ == "__main__":
    main()
