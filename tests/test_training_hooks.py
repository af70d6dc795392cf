"""Training-time hooks: DropBlock hits its rate, gradients from tensor hooks are exact, clipping holds."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from typer.testing import CliRunner

from hookviz.cli import app
from hookviz.training.gradients import GlobalNormClipper, clip_grad_values, gradient_flow
from hookviz.training.regularize import attach_dropblock, attach_dropout2d, drop_block, seed_rate
from tests.conftest import ROOT, SAMPLES, TinyCNN, hook_counts, picture, run_cli


@pytest.mark.parametrize("size", [7, 14, 28, 56])
@pytest.mark.parametrize("block", [1, 3, 5, 7])
def test_dropped_fraction_hits_drop_prob(size: int, block: int) -> None:
    gen = torch.Generator().manual_seed(size * 100 + block)
    masks = max(500, 1_000_000 // (size * size))
    x = torch.ones(masks, 1, size, size)
    _, keep = drop_block(x, 0.1, block, generator=gen)
    dropped = 1.0 - float(keep.mean())
    assert abs(dropped - 0.1) / 0.1 < 0.10, dropped


def test_dropped_regions_are_whole_squares_inside_the_map() -> None:
    gen = torch.Generator().manual_seed(3)
    block = 5
    _, keep = drop_block(torch.ones(200, 3, 20, 20), 0.2, block, generator=gen)
    dropped = 1.0 - keep
    # windows that are entirely dropped, and the union of those windows
    full = -F.max_pool2d(-dropped, block, stride=1)
    union = F.max_pool2d(F.pad(full, (block - 1,) * 4), block, stride=1)
    assert dropped.sum() > 0
    assert torch.equal(union, dropped)


def test_block_larger_than_the_map_and_per_channel_vs_shared() -> None:
    gen = torch.Generator().manual_seed(0)
    _, keep = drop_block(torch.ones(20000, 1, 7, 7), 0.1, 9, generator=gen)
    per_map = keep.flatten(1).mean(1)
    assert set(per_map.unique().tolist()) <= {0.0, 1.0}  # the whole 7x7 map is the block
    assert abs((1 - float(per_map.mean())) - 0.1) < 0.01
    _, shared = drop_block(torch.ones(50, 8, 10, 10), 0.3, 3, shared=True, generator=gen)
    assert torch.equal(shared, shared[:, :1].expand_as(shared))


def test_expectation_is_preserved_at_every_position() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(1, 1, 14, 14) + 0.5
    out, _ = drop_block(x.expand(8000, 1, 14, 14), 0.1, 5, generator=gen)
    ratio = out.mean(0) / x[0]
    assert float((ratio - 1).abs().max()) < 0.04
    assert abs(float(out.sum((1, 2, 3)).mean() / x.sum()) - 1) < 0.005
    assert seed_rate(0.1, 14, 14, 5) > 0.1 / 25  # overlap-corrected: more seeds than the naive rate


def test_hooks_act_in_training_only_and_remove_cleanly() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=4)
    x = torch.randn(2, 3, 64, 64)
    model.eval()
    with torch.no_grad():
        ref = model(x)
    handle = attach_dropblock(model, ["layer2", "layer3"], 0.2, 3)
    assert hook_counts(model) == 2
    with torch.no_grad():
        assert torch.equal(model(x), ref)  # eval: exact no-op
    model.train()
    seen = {}
    probe = model.layer3.register_forward_hook(lambda m, i, o: seen.setdefault("out", o))
    model(x)
    probe.remove()
    assert (seen["out"] == 0).float().mean() > 0.1  # blocks of zeros were dropped
    handle.remove()
    assert hook_counts(model) == 0 and not hasattr(model, "dropblock")
    with attach_dropout2d(model, ["layer1"], 0.5):
        out = {}
        h = model.layer1.register_forward_hook(lambda m, i, o: out.setdefault("o", o))
        model(x)
        h.remove()
        zero_channels = (out["o"].flatten(2).abs().sum(2) == 0).float().mean()
        assert 0.3 < float(zero_channels) < 0.7
    assert hook_counts(model) == 0


def test_linear_schedule() -> None:
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1))
    model.train()
    handle = attach_dropblock(model, ["0"], 0.2, 3, schedule_steps=10)
    probs = []
    for _ in range(12):
        probs.append(handle.current_drop_prob())
        model(torch.randn(1, 1, 8, 8))
    assert probs[0] == 0.0 and probs[5] == pytest.approx(0.1) and probs[10] == probs[11] == pytest.approx(0.2)
    handle.remove()


def test_tensor_hook_gradients_equal_autograd_and_param_norms_equal_grad() -> None:
    torch.manual_seed(0)
    model = TinyCNN()
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 0])
    flow = gradient_flow(model, x, lambda z: F.cross_entropy(z, y), train_mode=True)
    assert all(p.grad is None for p in model.parameters())

    # Independent: split the network by hand and ask autograd for the conv outputs' gradients.
    twin = copy.deepcopy(model).train()
    f = twin.features
    c0 = f[0](x)
    c4 = f[4](f[3](f[2](f[1](c0))))
    c8 = f[8](f[7](f[6](f[5](c4))))
    logits = twin.fc(torch.flatten(twin.pool(f[10](f[9](c8))), 1))
    loss = F.cross_entropy(logits, y)
    g0, g4, g8 = torch.autograd.grad(loss, [c0, c4, c8], retain_graph=True)
    got = {s.name: s for s in flow.outputs}
    for name, g in (("features.0", g0), ("features.4", g4), ("features.8", g8)):
        assert got[name].norm == pytest.approx(float(g.norm()), rel=1e-5)
        assert got[name].max_abs == pytest.approx(float(g.abs().max()), rel=1e-5)
    loss.backward()
    params = {s.name: s.norm for s in flow.params}
    for name, p in twin.named_parameters():
        assert params[name] == pytest.approx(float(p.grad.norm()), rel=1e-5)
    assert flow.loss == pytest.approx(float(loss.detach()))


def test_value_clipping_bounds_every_gradient() -> None:
    torch.manual_seed(0)
    model = TinyCNN()
    with clip_grad_values(model, 1e-3):
        F.cross_entropy(model(torch.randn(8, 3, 16, 16) * 5), torch.zeros(8, dtype=torch.long)).backward()
    bound = float(torch.tensor(1e-3, dtype=torch.float32))  # the bound as a float32 value
    assert max(float(p.grad.abs().max()) for p in model.parameters()) <= bound
    assert hook_counts(model) == 0


def test_global_norm_clipping_equals_the_bound_when_above() -> None:
    torch.manual_seed(0)
    model = TinyCNN()
    twin = copy.deepcopy(model)
    x, y = torch.randn(8, 3, 16, 16) * 5, torch.zeros(8, dtype=torch.long)
    with GlobalNormClipper(model, 0.5) as clipper:
        F.cross_entropy(model(x), y).backward()
    norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))
    assert clipper.last_norm is not None and clipper.last_norm > 0.5
    assert norm == pytest.approx(0.5, rel=1e-5)
    F.cross_entropy(twin(x), y).backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    # Below the bound nothing changes; after remove() nothing is clipped.
    model.zero_grad()
    with GlobalNormClipper(model, 1e6):
        F.cross_entropy(model(x), y).backward()
    assert float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))) > 0.5


def test_gradflow_and_dropblock_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["--weights", "none", "--input-size", "64", "--device", "cpu", "--out", str(tmp_path)]
    r = runner.invoke(app, ["gradflow", str(SAMPLES / "cat.jpg"), *args, "--label", "tabby"])
    assert r.exit_code == 0, r.stderr
    (js,) = tmp_path.glob("*.gradflow.json")
    data = json.loads(js.read_text())
    assert data["objective"] == "cross-entropy vs class 281"
    assert data["outputs"][0]["name"] == "conv1" and data["outputs"][-1]["name"] == "fc"
    assert all(s["norm"] > 0 for s in data["params"])
    picture(tmp_path / js.name.replace(".json", ".png"), (800, 500))
    r = runner.invoke(
        app, ["dropblock", str(SAMPLES / "cat.jpg"), *args, "--layer", "layer2", "--block-size", "3"]
    )
    assert r.exit_code == 0, r.stderr
    rec = json.loads((tmp_path / "manifest.jsonl").read_text().splitlines()[-1])
    assert 0.0 < rec["dropped_fraction"] < 0.3 and rec["outputs"][0].endswith(".dropblock.layer2.png")
    r = runner.invoke(app, ["dropblock", str(SAMPLES / "cat.jpg"), *args, "--layer", "fc"])
    assert r.exit_code == 2 and "not a feature map" in r.stderr


def _run_example(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    res = run_cli([sys.executable, str(ROOT / "examples" / script), *args], cwd=cwd)
    assert res.returncode == 0, res.stderr
    return res


@pytest.mark.slow
def test_example_trains(tmp_path: Path) -> None:
    res = _run_example("train_with_hooks.py", "--steps", "30", "--log-every", "10", cwd=tmp_path)
    assert re.search(r"step +30 ", res.stdout) and "grad norm" in res.stdout and "accuracy" in res.stdout


@pytest.mark.slow
def test_shapes_example_writes_its_sheet(tmp_path: Path) -> None:
    out = tmp_path / "s.png"
    res = _run_example("explain_shapes.py", "--steps", "40", "--eval", "8", "--out", str(out), cwd=tmp_path)
    assert "map peak inside the shape: gradcam" in res.stdout
    picture(out, (600, 400), min_colours=200)
