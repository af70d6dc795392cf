"""Attention rollout, Chefer et al.'s relevance and LeGrad: their formulas computed independently on small
transformers written the way papers' code writes them, LeGrad against torchcam's, localisation on a ViT
trained on the shapes, fused and explicit attention giving the same maps, refusals, the model as found."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.engine.explain import explain
from hookviz.methods import MethodOptions
from tests.conftest import evaluation_file, invoke, write_image

ROOT = Path(__file__).resolve().parent.parent
VIT = f"{ROOT / 'examples' / 'shapes_vit.py'}:make_vit"
VIT_WEIGHTS = ROOT / "tests" / "fixtures" / "shapes_vit.safetensors"


class Block(nn.Module):
    """Pre-norm self-attention and MLP; the attention explicit (``q kᵀ`` softmax) or fused (SDPA)."""

    def __init__(self, dim: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.heads, self.fused = heads, fused
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.record: list[Tensor] | None = None  # the independent computation's own capture

    def forward(self, t: Tensor) -> Tensor:
        b, n, d = t.shape
        q, k, v = self.qkv(self.n1(t)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.fused:
            o = F.scaled_dot_product_attention(q, k, v)
        else:
            a = (q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5).softmax(dim=-1)
            if self.record is not None:
                self.record.append(a)
            o = a @ v
        t = t + self.proj(o.transpose(1, 2).reshape(b, n, d))
        return t + self.mlp(self.n2(t))


class TinyViT(nn.Module):
    """4 x 4 patches of 4 px, a class token (pooled by it) or none (mean of the patches), register tokens."""

    def __init__(
        self, *, pool: str = "token", registers: int = 0, fused: bool = False, depth: int = 3
    ) -> None:
        super().__init__()
        dim, self.pool, self.registers = 16, pool, registers
        self.prefix = registers + (pool == "token")
        self.embed = nn.Conv2d(3, dim, 4, 4)
        self.cls = nn.Parameter(torch.randn(1, self.prefix, dim) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, self.prefix + 16, dim) * 0.5)
        self.blocks = nn.ModuleList(Block(dim, 2, fused) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x: Tensor) -> Tensor:
        t = self.embed(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1) + self.pos
        for block in self.blocks:
            t = block(t)
        t = self.norm(t)
        return self.head(t[:, 0] if self.pool == "token" else t[:, self.prefix :].mean(dim=1))


def _model(seed: int = 0, **kw: object) -> TinyViT:
    torch.manual_seed(seed)
    return TinyViT(**kw).eval()  # type: ignore[arg-type]


def _recorded(model: TinyViT, x: Tensor, target: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """The attentions and their gradients, taken by the model's own code (not hookviz's)."""
    for block in model.blocks:
        block.record = []  # type: ignore[assignment]
    try:
        y = model(x)
        attn = [a for block in model.blocks for a in block.record]  # type: ignore[union-attr]
        grads = torch.autograd.grad(y.gather(1, target[:, None]).sum(), attn)
    finally:
        for block in model.blocks:
            block.record = None  # type: ignore[assignment]
    return [a.detach() for a in attn], [g.detach() for g in grads]


def _read(model: TinyViT, r: Tensor) -> Tensor:
    """The head's tokens' rows: the class token's, or the mean of the patch tokens' rows."""
    rows = r[:, 0] if model.pool == "token" else r[:, model.prefix :].mean(dim=1)
    return rows[:, model.prefix :].reshape(-1, 4, 4)


LAYER = "blocks.2.n1"


@pytest.mark.parametrize("kw", [{}, {"pool": "mean", "registers": 2}, {"registers": 3}])
def test_chefer_equals_its_formula(kw: dict[str, object]) -> None:
    model = _model(**kw)
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    ex = explain(model, x, [LAYER], ["chefer"], "top2")
    for j in range(2):
        attn, grads = _recorded(model, x, ex.targets[:, j])
        r = torch.eye(attn[0].shape[-1]).expand(3, -1, -1)
        for a, g in zip(attn, grads, strict=True):
            r = r + (g * a).clamp(min=0).mean(dim=1) @ r
        torch.testing.assert_close(ex.maps[("chefer", LAYER)][:, j], _read(model, r), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("fusion", "discard"), [("mean", 0.0), ("max", 0.5), ("min", 0.2)])
def test_rollout_equals_its_formula(fusion: str, discard: float) -> None:
    model = _model(3, registers=1)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    options = MethodOptions(head_fusion=fusion, discard=discard)
    ex = explain(model, x, [LAYER], ["rollout"], None, options=options)
    attn, _ = _recorded(model, x, ex.targets[:, 0])
    n = attn[0].shape[-1]
    r = torch.eye(n).expand(2, -1, -1)
    for a in attn:
        f = {"mean": a.mean(dim=1), "max": a.max(dim=1).values, "min": a.min(dim=1).values}[fusion]
        for i in range(2):  # the lowest `discard` share of each image's entries to 0, except entry (0, 0)
            flat = f[i].flatten()
            low = flat.argsort()[: int(flat.numel() * discard)]
            flat[low[low != 0]] = 0
        step = (f + torch.eye(n)) / 2
        r = (step / step.sum(dim=-1, keepdim=True)) @ r
    torch.testing.assert_close(ex.maps[("rollout", LAYER)][:, 0], _read(model, r), rtol=1e-5, atol=1e-6)


def test_fused_attention_gives_the_same_maps_as_explicit() -> None:
    """SDPA inside the probe is computed explicitly: the maps of a fused model equal its explicit twin's."""
    explicit, fused = _model(5), _model(5, fused=True)
    fused.load_state_dict(explicit.state_dict())
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    methods = ["rollout", "chefer", "legrad"]
    a, b = explain(explicit, x, [LAYER], methods, "top2"), explain(fused, x, [LAYER], methods, "top2")
    for key, value in a.maps.items():
        assert float(value.abs().max()) > 0, key
        torch.testing.assert_close(b.maps[key], value, rtol=1e-4, atol=1e-6)


def test_legrad_equals_torchcams_on_a_torchvision_vit() -> None:
    torchcam = pytest.importorskip("torchcam.methods")
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=64, patch_size=16, num_layers=4, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10
    ).eval()
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision starts the head at zero
    x = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    layer = "encoder.layers.encoder_layer_3.ln_1"
    ex = explain(model, x, [layer], ["legrad"], None)
    ours = ex.maps[("legrad", layer)][:, 0].flatten(1)
    with torchcam.LeGrad(model, [f"encoder.layers.encoder_layer_{i}" for i in range(4)]) as extractor:
        theirs = extractor(ex.targets[:, 0].tolist(), model(x))[0].flatten(1)
    lo, hi = ours.min(1, keepdim=True).values, ours.max(1, keepdim=True).values
    torch.testing.assert_close((ours - lo) / (hi - lo), theirs, rtol=0, atol=1e-5)


def test_the_model_is_left_as_found_even_after_a_refusal() -> None:
    model = _model(6)
    model.train()
    model.blocks[0].n1.weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    x = torch.randn(2, 3, 16, 16)
    explain(model, x, [LAYER], ["rollout", "chefer", "legrad"], "top2")
    with pytest.raises(Exception, match="token layer"):
        explain(model, x, ["embed"], ["chefer"], None)  # a conv layer: refused inside the pass
    assert model.training and {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == hooks
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_cnn_is_refused_in_one_line_before_any_photo(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "p.png", np.zeros((20, 20, 3), np.uint8))
    r = invoke("gradcam", str(photo), "--model", "resnet18", "--weights", "none", "--method", "rollout",
               "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "no transformer encoder blocks" in line and "use gradcam" in line
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def _trained_vit() -> nn.Module:
    import sys

    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT))
    from examples.shapes_vit import make_vit

    model = make_vit()
    model.load_state_dict(load_file(str(VIT_WEIGHTS)))
    return model.eval()


def test_attention_maps_peak_on_the_shape_of_a_trained_vit() -> None:
    """The ViT of scripts/train_shapes_vit.py (99.8 % held out): each map's peak patch holds part of the
    shape far more often than a model-blind map's (a random patch: 11 %; the centre patch: 25 %).
    Measured on these 60 images: rollout 100 %, chefer 97 %, legrad 53 %."""
    from hookviz.io.shapes import shapes_batch

    model = _trained_vit()
    x, y, masks = shapes_batch(60, np.random.default_rng(2024), 64)
    layer = "encoder.layers.encoder_layer_3.ln_1"
    ex = explain(model, x, [layer], ["rollout", "chefer", "legrad"], None)
    assert float((ex.predicted == y).float().mean()) >= 0.95

    def hit(m: Tensor, mask: np.ndarray) -> bool:
        r, c = divmod(int(m.flatten().argmax()), 8)
        return bool(mask[8 * r : 8 * r + 8, 8 * c : 8 * c + 8].any())

    chance = np.mean([[hit(torch.eye(64)[k].view(8, 8), m) for k in range(64)] for m in masks])
    centre = np.mean([hit(torch.eye(64)[36].view(8, 8), m) for m in masks])
    assert chance < 0.15 and centre < 0.3
    rates = {
        method: np.mean([hit(ex.maps[(method, layer)][i, 0], masks[i]) for i in range(60)])
        for method in ("rollout", "chefer", "legrad")
    }
    assert rates["rollout"] >= 0.9 and rates["chefer"] >= 0.85 and rates["legrad"] >= 0.4, rates


def test_the_cli_explains_a_vit_with_every_attention_method(tmp_path: Path) -> None:
    from hookviz.io.shapes import draw_shape

    img, _ = draw_shape(1, 64, np.random.default_rng(3))
    photo = write_image(tmp_path / "disc.png", (img * 255).round().astype(np.uint8))
    out = tmp_path / "o"
    r = invoke("gradcam", str(photo), "--model", VIT, "--weights", str(VIT_WEIGHTS), "--input-size", "64",
               "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1", "--method", "attention",
               "--target", "top2", "--head-fusion", "max", "--discard-ratio", "0.5", "--out", str(out), "-q",
               "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert [m["method"] for m in rec["maps"]] == [
        "rollout",
        "rollout",
        "chefer",
        "chefer",
        "legrad",
        "legrad",
    ]
    assert rec["predicted"]["index"] == 1  # the disc
    assert rec["options"] == {"head_fusion": "max", "discard": 0.5}
    assert len(rec["outputs"]) >= 6 and all(Path(o).stat().st_size > 0 for o in rec["outputs"])


def test_evaluate_and_sanity_take_the_attention_methods(tmp_path: Path) -> None:
    from hookviz.io.shapes import draw_shape

    photos = []
    for k in range(3):
        img, _ = draw_shape(k, 64, np.random.default_rng(10 + k))
        photos.append(str(write_image(tmp_path / f"s{k}.png", (img * 255).round().astype(np.uint8))))
    common = ["--model", VIT, "--weights", str(VIT_WEIGHTS), "--input-size", "64", "--resize", "squash",
              "--mean", "0,0,0", "--std", "1,1,1", "-q"]  # fmt: skip
    r = invoke("evaluate", *photos, *common, "--method", "rollout,chefer", "--out", str(tmp_path / "e"))
    assert r.exit_code == 0, r.stderr
    rows = json.loads(evaluation_file(tmp_path / "e").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    by = {row["method"]: row for row in rows}
    assert by["chefer"]["insertion_auc"] > by["random"]["insertion_auc"]
    r = invoke("sanity", photos[0], *common, "--method", "chefer", "--out", str(tmp_path / "s"))
    assert r.exit_code == 0, r.stderr
