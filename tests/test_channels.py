"""``hookviz channels``: each channel's best inputs over a folder, checked against a direct computation on a
model trained on the synthetic shapes; resuming and torchrun give the same file; the receptive fields are
the known ones; the contributions add up to the logit."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision

from hookviz.concepts.dataset import crop, parse_channels
from hookviz.concepts.examples import TopK, channel_scores, receptive_field
from hookviz.errors import UsageError
from hookviz.io.shapes import draw_shape
from tests.conftest import TinyCNN, Trained, invoke, run_cli, write_image

LAYER = "features.10"  # the last ReLU: its mean over the map feeds the head


@pytest.fixture(scope="module")
def shapes_model(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyCNN, Path]:
    """The suite's model trained on the shapes (95 % held out at least: test_localisation), saved as a
    user's state_dict."""
    path = tmp_path_factory.mktemp("model") / "shapes.pt"
    torch.save(trained.model.state_dict(), path)
    return trained.model, path


def gathered(out: Path) -> Any:
    """The run's ``channels.KEY.json`` (one run's settings in ``out``)."""
    (found,) = out.glob("channels.*.json")
    return json.loads(found.read_text())


def _folder(root: Path, n: int = 30, seed: int = 5) -> tuple[Path, list[int]]:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    kinds = []
    for i in range(n):
        kind = i % 3
        img, _ = draw_shape(kind, 48, rng)
        write_image(root / f"s{i:02d}.png", (img * 255).round().astype(np.uint8))
        kinds.append(kind)
    return root, kinds


def _args(weights: Path, labels: Path) -> list[str]:
    model = ["--model", "tests.conftest:TinyCNN", "--weights", str(weights), "--labels", str(labels)]
    return [*model, "--input-size", "48", "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1",
            "--device", "cpu"]  # fmt: skip


@pytest.fixture
def labels(tmp_path: Path) -> Path:
    path = tmp_path / "labels.txt"
    path.write_text("square\ndisc\ncross\n")
    return path


def _photo(name: str) -> torch.Tensor:
    from PIL import Image

    return torch.from_numpy(np.asarray(Image.open(name).convert("RGB"), np.float32) / 255).permute(2, 0, 1)


def _direct(model: TinyCNN, folder: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Each photo's channel maxima and their cells at LAYER, by a plain forward hook."""
    names = sorted(str(p) for p in folder.glob("*.png"))
    x = torch.stack([_photo(n) for n in names])
    kept: list[torch.Tensor] = []
    handle = dict(model.named_modules())[LAYER].register_forward_hook(lambda m, a, o: kept.append(o.clone()))
    with torch.no_grad():
        model.eval()(x)
    handle.remove()
    flat = kept[0].flatten(2)
    top, where = flat.max(dim=2)
    return names, top.numpy(), where.numpy()


def test_top_k_of_every_channel_equals_a_direct_computation(
    tmp_path: Path, shapes_model: tuple[TinyCNN, Path], labels: Path
) -> None:
    model, weights = shapes_model
    folder, _ = _folder(tmp_path / "in")
    res = invoke("channels", str(folder), *_args(weights, labels), "--layer", LAYER, "--top", "5", "--out",
                 str(tmp_path / "out"), "-q")  # fmt: skip
    assert res.exit_code == 0, res.output
    data = gathered(tmp_path / "out")
    names, top, where = _direct(model, folder)
    layer = data["layers"][LAYER]
    assert data["inputs"] == 30 and layer["map"] == [12, 12] and layer["channels_in_layer"] == 64
    assert len(layer["channels"]) == 64
    for item in layer["channels"]:
        c = item["channel"]
        order = sorted(range(len(names)), key=lambda i: (-top[i, c], names[i]))[:5]
        got = item["examples"]
        np.testing.assert_allclose([e["score"] for e in got], top[order, c], rtol=1e-4, atol=1e-5)
        # the same photos (ties within the tolerance may swap places)
        for e, i in zip(got, order, strict=True):
            assert e["input"] == names[i] or abs(top[i, c] - e["score"]) < 1e-4
        e, i = got[0], order[0]
        cy, cx = divmod(int(where[i, c]), 12)
        assert e["peak"] == pytest.approx([(cy + 0.5) * 4 - 0.5, (cx + 0.5) * 4 - 0.5], abs=0.01)
        assert (tmp_path / "out" / item["sheet"]).exists()


@pytest.mark.slow  # a server of its own / a whole run: in make test, not test-fast
def test_the_run_gathers_as_it_goes_and_reads_the_files_only_when_it_must(
    tmp_path: Path, shapes_model: tuple[TinyCNN, Path], labels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job feeds each rendered input to its Feed; gathering with it reads no file and gives what reading
    every file gives. A fed input without its ``ok`` record (a write that failed) makes it read them all."""
    from hookviz.concepts import dataset
    from hookviz.jobs import channels as built
    from hookviz.report import latest_records

    _, weights = shapes_model
    folder, _ = _folder(tmp_path / "in", n=12)
    jobs: list = []
    real_job = built.channels_job  # the library builds the command's job: keep the one it built
    monkeypatch.setattr(built, "channels_job", lambda *a, **kw: jobs.append(real_job(*a, **kw)) or jobs[-1])
    out = tmp_path / "out"
    res = invoke("channels", str(folder), *_args(weights, labels), "--layer", LAYER, "--layer", "features.4",
                 "--target", "disc", "--top", "3", "--out", str(out), "-q")  # fmt: skip
    assert res.exit_code == 0, res.output
    (job,) = jobs
    recs = latest_records((out / "manifest.jsonl").read_text().splitlines())
    assert job.feed is not None and sorted(job.feed.files) == sorted(r["input"] for r in recs)
    read: list[str] = []
    real_load = np.load
    monkeypatch.setattr(
        np, "load", lambda path, *a, **kw: read.append(str(path)) or real_load(path, *a, **kw)
    )
    fed = dataset.gather(recs, job.layers, 3, feed=job.feed)
    assert read == []
    files = dataset.gather(recs, job.layers, 3)
    assert len(read) == 12
    for a, b in zip(fed.layers, files.layers, strict=True):
        assert a.inputs == b.inputs == 12 and a.map == b.map
        assert [a.top.best(c) for c in range(len(a.top))] == [b.top.best(c) for c in range(len(b.top))]
        np.testing.assert_array_equal(a.contributions, b.contributions)
    read.clear()
    failed = [dict(r, status="error") if i == 4 else r for i, r in enumerate(recs)]  # its write failed
    kept = [r for r in failed if r["status"] == "ok"]
    again = dataset.gather(kept, job.layers, 3, feed=job.feed)
    assert len(read) == 11 and again.inputs == 11
    top = again.layers[0].top
    assert recs[4]["input"] not in {e.input for c in range(len(top)) for e in top.best(c)}


def test_contributions_add_up_to_the_logit_and_name_the_channels(
    tmp_path: Path, shapes_model: tuple[TinyCNN, Path], labels: Path
) -> None:
    """LAYER's mean over the map feeds a linear head: the channels' gradient x activation sums to the
    target's logit less the head's bias, for every photo (an identity, computed independently here)."""
    model, weights = shapes_model
    folder, _ = _folder(tmp_path / "in", n=12)
    names, _, _ = _direct(model, folder)
    res = invoke("channels", str(folder), *_args(weights, labels), "--layer", LAYER, "--target", "disc",
                 "--out", str(tmp_path / "out"), "--channels", "0-3")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "channels driving disc most" in res.output
    data = gathered(tmp_path / "out")
    x = torch.stack([_photo(n) for n in names])
    with torch.no_grad():
        logits = model(x)
        features = model.features(x).mean(dim=(2, 3))
        per_channel = (features * model.fc.weight[1]).numpy()
        bias = float(model.fc.bias[1])  # channel c's term of the disc logit
    ranking = data["layers"][LAYER]["attribution"]
    summed = per_channel.sum(axis=0)
    np.testing.assert_allclose(
        [r["contribution"] for r in ranking], np.sort(summed)[::-1], rtol=1e-4, atol=1e-4
    )
    assert [r["channel"] for r in ranking[:5]] == list(np.argsort(-summed, kind="stable")[:5])
    recs = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    by_name = {r["input"]: r for r in recs}
    for i, n in enumerate(names):
        with np.load(next(p for p in by_name[n]["outputs"] if p.endswith(".npz"))) as arrays:
            total = float(arrays["contributions0"].sum())
        assert total == pytest.approx(float(logits[i, 1]) - bias, rel=1e-4, abs=1e-4)
    assert [c["channel"] for c in data["layers"][LAYER]["channels"]] == [0, 1, 2, 3]
    assert len(list(next((tmp_path / "out").glob("channels.*/")).glob("*.png"))) == 4


def test_a_resumed_run_gives_the_same_file(
    tmp_path: Path, shapes_model: tuple[TinyCNN, Path], labels: Path
) -> None:
    _, weights = shapes_model
    folder, _ = _folder(tmp_path / "in", n=12)
    args = [*_args(weights, labels), "--layer", LAYER, "--layer", "features.4", "--top", "3", "-q"]
    assert invoke("channels", str(folder), *args, "--out", str(tmp_path / "whole")).exit_code == 0
    part = tmp_path / "part"
    first = [str(p) for p in sorted(folder.glob("*.png"))[:5]]
    assert invoke("channels", *first, *args, "--out", str(part)).exit_code == 0  # "killed" after five
    assert invoke("channels", str(folder), *args, "--out", str(part)).exit_code == 0
    a = gathered(tmp_path / "whole")
    b = gathered(part)
    assert a["layers"] == b["layers"] and b["inputs"] == 12
    recs = [json.loads(line) for line in (part / "manifest.jsonl").read_text().splitlines()]
    assert sum(r["status"] == "skipped" for r in recs) == 5


@pytest.mark.slow
def test_torchrun_gives_the_same_file(
    tmp_path: Path, shapes_model: tuple[TinyCNN, Path], labels: Path
) -> None:
    _, weights = shapes_model
    folder, _ = _folder(tmp_path / "in", n=12)
    args = ["channels", str(folder), *_args(weights, labels), "--layer", LAYER, "--top", "4", "-q"]
    assert invoke(*args, "--out", str(tmp_path / "one")).exit_code == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    run = [*cmd, "-m", "hookviz", *args, "--out", str(tmp_path / "two")]
    res = run_cli(run, env=env, cwd=Path(__file__).parent.parent)
    assert res.returncode == 0, res.stderr
    a = gathered(tmp_path / "one")
    b = gathered(tmp_path / "two")
    assert a["layers"] == b["layers"] and b["inputs"] == 12


def test_receptive_fields_are_the_known_ones() -> None:
    """conv 3x3 -> 3; a 2x2 pool -> 4; conv at stride 2 -> 8; pool -> 10; conv at stride 4 -> 18. ResNet-18:
    7 after conv1, 43 after layer1, 99, 211, and 435 after layer4 (cut to the 224 input)."""
    tiny = TinyCNN()
    x = torch.zeros(1, 3, 48, 48)
    assert [receptive_field(tiny, x, n)[0] for n in ("features.0", "features.4", "features.8")] == [3, 8, 18]
    resnet = torchvision.models.resnet18()
    x = torch.zeros(1, 3, 224, 224)
    got = [receptive_field(resnet, x, n) for n in ("conv1", "layer1", "layer2", "layer3", "layer4")]
    assert got == [(7, 7), (43, 43), (99, 99), (211, 211), (224, 224)]


def test_channel_scores_leave_the_model_as_found() -> None:
    model = TinyCNN().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    found, logits = channel_scores(model, torch.rand(2, 3, 48, 48), ["features.8"], reduce="mean", target=1)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        act = model.eval().features(torch.rand(1, 3, 48, 48))  # shapes only
    assert found[0].scores.shape == (2, act.shape[1]) and logits.shape == (2, 3)


class _Viewing(torch.nn.Module):
    """An older model's head: ``.view`` over a map, which a channels-last batch refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        return self.fc(y.view(y.shape[0], -1))


def test_channel_scores_in_the_fast_layout_and_for_a_model_that_refuses_it() -> None:
    from hookviz.methods import _utils

    torch.manual_seed(0)
    x = torch.rand(3, 3, 8, 8)
    for model, layer in ((_Viewing(), "conv"), (TinyCNN(), "features.8")):
        kept: list[torch.Tensor] = []
        handle = dict(model.named_modules())[layer].register_forward_hook(lambda m, a, o: kept.append(o))
        with torch.no_grad():
            logits = model.eval()(x)  # the plain layout: the reference
        handle.remove()
        top, where = kept[0].flatten(2).max(dim=2)
        found, got = channel_scores(model, x, [layer])
        torch.testing.assert_close(found[0].scores, top, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, logits, rtol=1e-5, atol=1e-6)
        w = kept[0].shape[-1]
        assert torch.equal(found[0].peaks, torch.stack([where // w, where % w], dim=2))
        assert (model in _utils.PLAIN) == isinstance(model, _Viewing)  # refused once, then plain


def test_every_method_runs_on_a_model_that_refuses_the_fast_layout() -> None:
    """The methods that run their own passes feed them channels-last on the CPU: a model whose ``.view``
    refuses that layout gets the plain one, with the maps it gives when only the plain one is tried."""
    from hookviz import methods
    from hookviz.engine.explain import explain
    from hookviz.methods import MethodOptions, _utils

    options = MethodOptions(samples=4, steps=4, masks=16, seed=0)
    torch.manual_seed(0)
    x = torch.rand(2, 3, 8, 8)
    weights = _Viewing().state_dict()
    ran = 0
    for name in [n for n in methods.names() if not methods.get(n).detection]:
        maps, models = [], [_Viewing().eval(), _Viewing().eval()]
        _utils.PLAIN.add(models[1])
        for model in models:
            model.load_state_dict(weights)
            try:
                maps.append(explain(model, x, ["conv"], [name], [0], options=options).maps)
            except UsageError:  # a method this model cannot have (CAM needs pooling then a linear head)
                break
        if len(maps) < 2:
            continue
        ran += 1
        for key, got in maps[0].items():
            torch.testing.assert_close(got, maps[1][key], rtol=1e-4, atol=1e-5, msg=str(key))
        if name in ("scorecam", "occlusion", "rise", "smoothgrad"):  # each runs passes of its own
            assert models[0] in _utils.PLAIN
    assert ran >= 20


def test_top_k_keeps_the_same_inputs_in_any_order() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, (40, 6)).astype(float)  # many ties
    names = [f"p{i:02d}" for i in range(40)]
    results = []
    for seed in range(5):
        order = np.random.default_rng(seed).permutation(40)
        top = TopK(6, 5)
        for i in order:
            top.add(names[i], scores[i].tolist(), [(0.0, 0.0)] * 6)
        results.append([[(e.score, e.input) for e in top.best(c)] for c in range(6)])
    assert all(r == results[0] for r in results)
    for c in range(6):
        want = sorted(range(40), key=lambda i: (-scores[i, c], names[i]))[:5]
        assert [e[1] for e in results[0][c]] == [names[i] for i in want]


def test_top_k_over_a_long_stream_equals_sorting_everything() -> None:
    rng = np.random.default_rng(1)
    scores = np.round(rng.normal(size=(600, 64)), 2)  # ties among 600 inputs, bars rising as they stream
    scores[300:] = scores[rng.integers(0, 300, 300)]  # and copies of inputs: exact ties at every bar
    peaks = rng.uniform(0, 50, (600, 64, 2)).astype(np.float32)
    names = [f"p{i:03d}" for i in rng.permutation(600)]
    top = TopK(64, 8)
    for i in range(600):
        top.add(names[i], scores[i], peaks[i])
    for c in range(64):
        want = sorted(range(600), key=lambda i: (-scores[i, c], names[i]))[:8]
        got = top.best(c)
        assert [e.input for e in got] == [names[i] for i in want]
        assert [e.peak for e in got] == [tuple(float(v) for v in peaks[i, c]) for i in want]
    with pytest.raises(ValueError, match="3 scores"):
        top.add("x", [1.0, 2.0, 3.0], [(0, 0)] * 3)


def test_channel_lists_and_crops() -> None:
    assert parse_channels("0,5,2-4", 8) == [0, 5, 2, 3, 4]
    assert parse_channels(None, 3) == [0, 1, 2]
    with pytest.raises(UsageError, match="channel 9 does not exist"):
        parse_channels("9", 8)
    with pytest.raises(UsageError, match="channel numbers"):
        parse_channels("top5", 8)
    rgb = np.zeros((200, 300, 3), np.uint8)
    tile, whole = crop(rgb, (10.0, 290.0), (20, 20))
    assert tile.shape == (128, 128, 3) and not whole
    _, whole = crop(rgb, (100.0, 150.0), (180, 280))
    assert whole


def test_sheets_shrink_a_photo_once_for_all_its_whole_photo_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A photo among the best of many channels, drawn whole in each: shrunk once when decoded and once into
    its tile, however many sheets show it, and every sheet the same pixels as the first."""
    import cv2

    from hookviz.concepts.dataset import Photos, channel_sheet
    from hookviz.concepts.examples import Example

    rng = np.random.default_rng(3)
    pictures = {f"p{i}": rng.integers(0, 256, (600, 500, 3), dtype=np.uint8) for i in range(3)}
    examples = [Example(float(i), name, (300.0, 250.0)) for i, name in enumerate(pictures)]
    field = lambda name: (500, 400)  # noqa: E731  # covers most of the photo: drawn whole
    calls = []
    real = cv2.resize
    monkeypatch.setattr(cv2, "resize", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    photos = Photos(read=pictures.__getitem__)
    sheets = [channel_sheet(examples, field, photos, title="the same title") for _ in range(5)]
    assert len(calls) == 2 * len(pictures)  # each photo: its decode's shrink, then its tile
    assert all(np.array_equal(sheet, sheets[0]) for sheet in sheets[1:])  # a kept tile draws the same
    assert sheets[0].shape[1] >= 3 * 128


def test_sheets_decode_a_big_jpeg_at_the_size_they_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A photo for the sheets is decoded at 1/4 of its size (libjpeg's scaling), upright, with the scale of
    the whole photo, and looks as the whole photo shrunk does."""
    import cv2
    from PIL import Image, JpegImagePlugin

    from hookviz.concepts.dataset import Photos
    from hookviz.io.images import load_rgb

    yy, xx = np.mgrid[0:1500, 0:2000]
    picture = np.stack([xx * 255 // 2000, yy * 255 // 1500, (xx // 100 % 2) * 200], -1).astype(np.uint8)
    exif = Image.Image().getexif()
    exif[0x0112] = 6  # stored sideways: upright it is 1500 wide, 2000 high
    Image.fromarray(picture).save(tmp_path / "big.jpg", quality=92, exif=exif)
    decoded: list[tuple[int, int]] = []
    real = JpegImagePlugin.JpegImageFile.draft

    def draft(self: JpegImagePlugin.JpegImageFile, mode: str, size: tuple[int, int]) -> object:
        out = real(self, mode, size)
        decoded.append(self.size)
        return out

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", draft)
    rgb, scale = Photos()(str(tmp_path / "big.jpg"))
    assert rgb.shape == (384, 288, 3) and scale == pytest.approx(384 / 2000)
    assert decoded == [(500, 375)]  # 1/4: still at least 384 on the longer side
    whole = load_rgb(tmp_path / "big.jpg")
    assert whole.shape == (2000, 1500, 3)
    shrunk = cv2.resize(whole, (288, 384), interpolation=cv2.INTER_AREA)
    assert np.abs(shrunk.astype(int) - rgb).mean() < 2.0


def test_bad_channels_option_is_one_line(
    tmp_path: Path, shapes_model: tuple[TinyCNN, Path], labels: Path
) -> None:
    _, weights = shapes_model
    folder, _ = _folder(tmp_path / "in", n=3)
    res = invoke("channels", str(folder), *_args(weights, labels), "--layer", LAYER, "--channels", "99",
                 "--out", str(tmp_path / "out"))  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "channel 99 does not exist (the layer has 64: 0-63)" in res.output


def test_a_class_through_its_top_channels_is_its_grad_cam_term(trained: Trained) -> None:
    """Channel c's term of Grad-CAM's sum is mean(gradient_c) x A_c; summed over every channel it is the
    Grad-CAM map before its ReLU (hookviz.grad_cam with relu=False), computed here by hand too."""
    from hookviz.concepts.examples import channel_terms
    from hookviz.engine.explain import grad_cam

    model = trained.model
    x = torch.stack([_photo_tensor(k, seed) for k, seed in ((1, 3), (0, 4))])
    target = torch.tensor([1, 0])
    every = channel_terms(model, x, LAYER, target, 64)
    acts: list[torch.Tensor] = []
    handle = model.features[10].register_forward_hook(lambda m, a, o: acts.append(o))
    xs = x.clone().requires_grad_(True)
    out = model(xs)
    handle.remove()
    g = torch.autograd.grad(out[[0, 1], target].sum(), acts[0])[0]
    terms = (g.mean(dim=(2, 3), keepdim=True) * acts[0]).detach()
    contribution = terms.sum(dim=(2, 3))
    for b in range(2):
        c = int(every.channels[b, 0])
        assert c == int(contribution[b].argmax())
        torch.testing.assert_close(every.maps[b, 0], terms[b, c].clamp_min(0), rtol=1e-4, atol=1e-6)
        positive = float(contribution[b].clamp_min(0).sum())
        assert float(every.shares[b].sum()) * positive == pytest.approx(
            float(contribution[b].sum()), rel=1e-4
        )
    whole = grad_cam(model, x, LAYER, target=target, relu=False)
    np.testing.assert_allclose(whole.maps.numpy(), terms.sum(dim=1).numpy(), rtol=1e-4, atol=1e-5)


def _photo_tensor(kind: int, seed: int) -> torch.Tensor:
    img, _ = draw_shape(kind, 48, np.random.default_rng(seed))
    return torch.from_numpy(img).permute(2, 0, 1)


def test_gradcam_channels_option(tmp_path: Path, shapes_model: tuple[TinyCNN, Path], labels: Path) -> None:
    _, weights = shapes_model
    folder, _ = _folder(tmp_path / "in", n=2)
    res = invoke("gradcam", str(folder), *_args(weights, labels), "--layer", LAYER, "--channels", "top3",
                 "--out", str(tmp_path / "out"), "-q")  # fmt: skip
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    for rec in recs:
        shown = rec["channel_terms"][LAYER]
        assert len(shown) == 3 and shown[0]["share"] >= shown[1]["share"] >= shown[2]["share"]
        assert sum(".gradcam-channels." in p for p in rec["outputs"]) == 1
    bad = invoke(
        "gradcam", str(folder), *_args(weights, labels), "--channels", "all", "--out", str(tmp_path / "b")
    )
    assert bad.exit_code == 2 and "give topK, like top4" in bad.output


def test_the_report_shows_channels_tcav_and_visualisations(tmp_path: Path) -> None:
    from hookviz.report import build_report

    out = tmp_path / "out"
    (out / "channels.k1").mkdir(parents=True)
    (out / "channels.k1" / "L.c0.png").write_bytes(b"png")
    (tmp_path / "secret.png").write_bytes(b"png")
    sheets = [("channels.k1/L.c0.png", 0), ("../secret.png", 1), ("/etc/passwd", 2)]
    layer = {"field": [18, 18], "attribution": [{"channel": 0, "contribution": 1.5}],
             "channels": [{"channel": c, "sheet": s} for s, c in sheets]}  # fmt: skip
    (out / "channels.k1.json").write_text(json.dumps({"inputs": 3, "layers": {"L": layer}}))
    concept = {"concept": "<b>disc</b>", "sign_count": 1.0, "sign_count_std": 0.0, "magnitude": 0.2,
               "p_value": 0.001, "significant": True}  # fmt: skip
    null = {"concept": "(random)", "sign_count": 0.5}
    tcav = {"target": {"name": "disc"}, "layers": [{"layer": "L", "concepts": [concept], "null": null}]}
    (out / "tcav.k2.json").write_text(json.dumps(tcav))
    (out / "visualize.m.L.c0.s0.json").write_text(
        json.dumps({"layer": "L", "channel": 0, "objective": [2.5]})
    )
    (out / "visualize.m.L.c0.s0.png").write_bytes(b"png")
    page = build_report(out).read_text()  # no manifest: the concept files alone make a page
    assert 'src="channels.k1/L.c0.png"' in page and "secret" not in page and "/etc/passwd" not in page
    assert "TCAV for disc" in page and "&lt;b&gt;disc&lt;/b&gt;" in page and "<b>disc</b>" not in page
    assert 'src="visualize.m.L.c0.s0.png"' in page and "objective 2.5" in page
    with pytest.raises(UsageError, match="holds no manifest.jsonl"):
        build_report(tmp_path / "empty")


TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]


def test_channels_outputs_of_other_settings_stand_side_by_side(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    base = ["channels", str(photos), *TINY, "--layer", "features.4", "--out", str(out), "-q"]
    assert invoke(*base, "--top", "2").exit_code == 0
    assert invoke(*base, "--top", "3").exit_code == 0
    found = sorted(out.glob("channels.*.json"))
    assert len(found) == 2
    tops = sorted(json.loads(f.read_text())["top"] for f in found)
    assert tops == [2, 3]
    for f in found:
        data = json.loads(f.read_text())
        sheets = {c["sheet"] for c in data["layers"]["features.4"]["channels"] if "sheet" in c}
        assert sheets and all(s.startswith(f"{f.stem}/") and (out / s).is_file() for s in sheets)
