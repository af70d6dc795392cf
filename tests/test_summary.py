"""hookviz summary: exact parameters, MACs by formula, attention counted, model untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn
from typer.testing import CliRunner

from hookviz.cli import app
from hookviz.summary import summarize
from tests.conftest import hook_counts, picture


class HandCNN(nn.Module):
    """Convs with stride, padding, groups and depthwise; a functional matmul and an einsum."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2, bias=False)
        self.dw = nn.Conv2d(16, 16, 5, padding=2, groups=16)
        self.proj = nn.Parameter(torch.randn(16, 12))
        self.fc = nn.Linear(12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dw(self.c2(torch.relu(self.c1(x))))  # (B, 16, 16, 16)
        tokens = x.flatten(2).transpose(1, 2)  # (B, 256, 16)
        tokens = torch.matmul(tokens, self.proj)  # functional: (B, 256, 12)
        gram = torch.einsum("bnd,bmd->bnm", tokens, tokens)  # (B, 256, 256)
        return self.fc(tokens.mean(1)) + gram.mean()


def test_macs_of_a_hand_built_cnn_equal_the_formula() -> None:
    b = 2
    s = summarize(HandCNN(), (3, 32, 32), batch_size=b)
    rows = {r.name: r for r in s.rows}
    c1 = b * 8 * 32 * 32 * (3 // 1) * 3 * 3
    c2 = b * 16 * 16 * 16 * (8 // 2) * 3 * 3
    dw = b * 16 * 16 * 16 * (16 // 16) * 5 * 5
    matmul = b * 256 * 16 * 12
    einsum = b * 256 * 256 * 12
    fc = b * 12 * 10
    assert rows["c1"].macs == c1 and rows["c2"].macs == c2 and rows["dw"].macs == dw and rows["fc"].macs == fc
    assert rows[""].macs_self == matmul + einsum  # functional ops belong to the module whose forward ran them
    assert s.macs == c1 + c2 + dw + matmul + einsum + fc and s.flops == 2 * s.macs
    assert s.total_params == sum(p.numel() for p in HandCNN().parameters())
    assert rows[""].params == 16 * 12 and rows["c2"].params == 16 * 4 * 9
    assert rows["c2"].output_shapes == [[b, 16, 16, 16]] and rows["c1"].input_shapes == [[b, 3, 32, 32]]


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "vit_b_16"])
def test_parameters_are_exact_and_rows_sum_to_the_total(name: str) -> None:
    model = torchvision.models.get_model(name, weights=None)
    s = summarize(model, (3, 224, 224), depth=1)
    assert s.total_params == sum(p.numel() for p in model.parameters())
    assert sum(r.params for r in s.rows) == s.total_params
    assert sum(p for _, p, _ in s.visible_rows()) == s.total_params  # rolled up at depth 1
    assert s.trainable_params == s.total_params and s.non_trainable_params == 0


def test_resnet18_macs_match_the_conv_and_linear_formula() -> None:
    model = torchvision.models.resnet18(weights=None)
    expected = 0

    def conv(m: nn.Conv2d, i: tuple[torch.Tensor], o: torch.Tensor) -> None:
        nonlocal expected
        expected += o.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]

    def lin(m: nn.Linear, i: tuple[torch.Tensor], o: torch.Tensor) -> None:
        nonlocal expected
        expected += o.numel() * m.in_features

    hs = [m.register_forward_hook(conv) for m in model.modules() if isinstance(m, nn.Conv2d)]
    hs += [m.register_forward_hook(lin) for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))
    for h in hs:
        h.remove()
    s = summarize(model)
    assert abs(s.macs - expected) / expected < 0.005
    assert 1.80e9 < s.macs < 1.83e9


def test_vit_b_16_counts_attention_products() -> None:
    model = torchvision.models.vit_b_16(weights=None)
    n, d, mlp, blocks, patch, classes = 197, 768, 3072, 12, 16, 1000
    embed = (n - 1) * d * 3 * patch * patch
    per_block_linear = n * d * 3 * d + n * d * d + 2 * n * d * mlp
    per_block_attention = 2 * n * n * d  # QK^T and AV over all heads
    expected = embed + blocks * (per_block_linear + per_block_attention) + d * classes
    s = summarize(model)
    assert abs(s.macs - expected) / expected < 0.01, (s.macs, expected)
    rows = {r.name: r for r in s.rows}
    for i in range(blocks):
        attn = rows[f"encoder.layers.encoder_layer_{i}.self_attention"]
        assert attn.attention_macs == per_block_attention
        assert attn.macs == per_block_attention + n * d * 4 * d
    assert 17.4e9 < s.macs < 17.7e9
    assert s.attention_macs == blocks * per_block_attention  # ≈ 0.72 G, what the other tools miss
    assert rows["encoder"].attention_macs == s.attention_macs
    assert "attention MACs" in str(s) and "of which attention products 715.33 MMACs" in str(s)


def test_model_comes_out_unchanged() -> None:
    model = torchvision.models.resnet18(weights=None)
    model.train()
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    keys = list(model.state_dict())
    attrs = set(vars(model))
    summarize(model)
    assert list(model.state_dict()) == keys and set(vars(model)) == attrs
    assert hook_counts(model) == 0 and all(m.training for m in model.modules())
    assert model.fc.weight.grad is not None and float(model.fc.weight.grad.sum()) == model.fc.weight.numel()
    assert all(p.grad is None for n, p in model.named_parameters() if not n.startswith("fc.weight"))


def test_cli_table_json_and_plot(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["summary", "--model", "resnet18", "--depth", "1"])
    assert r.exit_code == 0, r.stderr
    assert "layer4" in r.stdout and "11,689,512 total" in r.stdout and "1 MAC = 2 FLOPs" in r.stdout
    assert "layer4.0" not in r.stdout
    r = runner.invoke(
        app, ["summary", "--model", "mobilenet_v2", "--format", "json", "--input-size", "3,160,160"]
    )
    data = json.loads(r.stdout)
    assert data["total_params"] == 3504872 and data["input_size"] == [3, 160, 160]
    assert data["flops"] == 2 * data["macs"] and data["units"]["macs"].startswith("multiply-accumulates")
    png = tmp_path / "r18.png"
    r = runner.invoke(app, ["summary", "--model", "resnet18", "--plot", str(png), "--format", "csv"])
    assert r.exit_code == 0 and r.stdout.startswith("name,type,depth")
    assert picture(png, (1000, 300)).shape[1] == 1320  # 12 inches at 110 dpi
    r = runner.invoke(app, ["summary", "--model", "resnet18", "--plot", str(png)])
    assert r.exit_code == 2 and "exists" in r.stderr
    r = runner.invoke(app, ["summary", "--input-size", "3,abc"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["summary", "--model", "resnet-18"])
    assert r.exit_code == 2 and "did you mean 'resnet18'" in r.stderr


def test_scaled_dot_product_attention_is_counted() -> None:
    class Attn(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = x.reshape(2, 4, 50, 8)  # (B, heads, L, E)
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    s = summarize(Attn(), (4, 50, 8), batch_size=2)
    assert s.macs == 2 * (2 * 4 * 50 * 50 * 8)
    assert s.rows[0].attention_macs == s.macs


def test_table_golden(golden: object) -> None:
    """The table as a user reads it (regenerate with `pytest --update-golden` after a deliberate change)."""
    s = summarize(HandCNN(), (3, 32, 32), batch_size=2, depth=1, name="HandCNN")
    golden("handcnn_summary.txt", str(s) + "\n\n" + s.to_markdown() + "\n")  # type: ignore[operator]


class TwoBranches(nn.Module):
    """A photo's branch that runs, a branch that never does (a language model's stand-in) and a block list
    run by its parent's loop."""

    def __init__(self) -> None:
        super().__init__()
        self.tower = nn.Conv2d(3, 4, 3)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.language = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tower(x).mean((2, 3))
        for block in self.blocks:
            h = block(h)
        return h


@pytest.mark.parametrize("on_meta", [False, True])
def test_modules_that_never_ran_are_named_and_left_out_of_the_training_memory(on_meta: bool) -> None:
    """The branch no operation read is named, its parameters are in the total alone and out of the
    training memory estimate; the block list run by its parent is the other note's example. A weight
    it shares with a module that ran (tied embeddings) is used: not among them."""
    model = TwoBranches()
    s = summarize(model, (3, 8, 8), on_meta=on_meta)
    unused = 10 * 4 + 4 * 10 + 10
    assert s.total_params == sum(p.numel() for p in model.parameters())
    assert s.unused == ["language"] and s.unused_params == unused and s.unused_param_bytes == 4 * unused
    assert s.training_memory_estimate == 4 * 4 * (s.total_params - unused) + s.forward_activation_bytes
    assert s.notes[0].startswith(f"language never ran on this input: no operation read its {unused:,} ")
    assert s.notes[1].startswith("1 module(s) never ran as modules (e.g. blocks); ")
    assert f"  of which {unused:,} in modules that never ran (language): not in the MACs" in str(s)
    assert s.to_dict()["unused"] == ["language"]
    model.language[1].weight = model.blocks[0].weight  # tied: read through the block
    s = summarize(model, (3, 8, 8))
    assert s.unused == ["language.0"] and s.unused_params == 10 * 4
    whole = summarize(HandCNN(), (3, 32, 32))
    assert whole.unused == [] and whole.unused_params == 0 and not whole.notes
