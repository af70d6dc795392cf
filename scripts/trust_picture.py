"""docs/img/trust-grid.png: ``hookviz trust`` on the packaged EfficientNet-Lite0 over the four sample photos
(Grad-CAM and guided backprop, seed 0), its ``trust.png`` as written, and the figures docs/trust.md quotes.

    python scripts/trust_picture.py [--out docs/img/trust-grid.png]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "trust-grid.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hookviz-trust-") as d:
        subprocess.run(
            [sys.executable, "-m", "hookviz", "trust", "sample_images", "--model", "efficientnet_lite0",
             "--method", "gradcam,guidedbackprop", "--device", "cpu", "--out", str(Path(d) / "trust")],
            check=True, cwd=ROOT,
        )  # fmt: skip
        with Image.open(Path(d) / "trust" / "trust.png") as img:
            img.save(args.out, optimize=True)  # the same pixels, smaller
        data = json.loads((Path(d) / "trust" / "trust.json").read_text())
    for c in data["candidates"]:
        figures = {name: round(t["value"], 2) for name, t in c["tests"].items()}
        print(c["method"], c["layer"], c["verdict"], figures)
    print(args.out)


if __name__ == "__main__":
    main()
