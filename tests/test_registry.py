"""The method registry: a method is one function plus one registration, from outside the package too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from hookviz import methods
from hookviz.methods.compute import LayerPass
from tests.conftest import invoke, records, write_image


@pytest.fixture
def toy() -> Iterator[str]:
    """|gradient| x activation, summed over channels: one function, one registration, no other file."""

    @methods.register_method(
        "absgrad", title="AbsGrad toy", family="gradient-weighted", needs={"activations", "layer_gradients"},
        cost="the shared backward passes", paper="a test", formula="Σ_k |∂y/∂A^k| A^k",
    )  # fmt: skip
    def absgrad(p: LayerPass) -> torch.Tensor:
        return torch.stack([(g.abs() * p.activations).sum(dim=1) for g in p.grads], dim=1)

    yield "absgrad"
    methods.unregister("absgrad")


def test_a_method_registered_outside_the_package_runs_everywhere(toy: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hookviz.cli import app

    r = CliRunner().invoke(app, ["gradcam", "--help"], env={"COLUMNS": "2000"})
    assert f"|{toy}|all" in r.stdout
    photo = write_image(tmp_path / "p.png", np.random.default_rng(0).integers(0, 256, (50, 60, 3), np.uint8))
    out = tmp_path / "out"
    r = invoke("gradcam", str(photo), "--weights", "none", "--input-size", "64", "--method", "gradcam",
               "--method", toy, "--out", str(out), "-q", "--report")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    assert [m["method"] for m in rec["maps"]] == ["gradcam", toy]
    assert any(o.endswith(".sheet.png") for o in rec["outputs"])
    page = (out / "index.html").read_text()
    data = json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0])
    assert toy in {p["method"] for p in data[0]["pictures"]}
    # Its map is its formula, computed independently.
    from hookviz.engine.explain import explain
    from hookviz.tasks import load_model

    lm = load_model("resnet18", "none", input_size=64)
    x = torch.rand(2, 3, 64, 64)
    ex = explain(lm.model, x, ["layer4"], [toy, "hirescam"])
    assert ex.maps[(toy, "layer4")].shape == ex.maps[("hirescam", "layer4")].shape
    m = lm.model
    with torch.no_grad():
        a = m.layer4(m.layer3(m.layer2(m.layer1(m.maxpool(m.relu(m.bn1(m.conv1(x))))))))
    a.requires_grad_()
    logits = m.fc(torch.flatten(m.avgpool(a), 1))
    (g,) = torch.autograd.grad(logits[torch.arange(2), logits.argmax(1)].sum(), a)
    torch.testing.assert_close(ex.maps[(toy, "layer4")][:, 0], (g.abs() * a).sum(dim=1).detach())
    assert "AbsGrad toy" in methods.title(toy) and toy in methods.parse(["all"])
    assert f"`{toy}`" in methods.table()


def test_registration_is_checked() -> None:
    with pytest.raises(ValueError, match="taken"):
        methods.register_method("gradcam", title="x", family="gradient-weighted", needs=(), cost="")
    with pytest.raises(ValueError, match="family"):
        methods.register_method("x1", title="x", family="magic", needs=(), cost="")
    with pytest.raises(ValueError, match="needs"):
        methods.register_method("x2", title="x", family="perturbation", needs={"telepathy"}, cost="")


def test_the_plan_comes_from_what_methods_need() -> None:
    """Eigen-CAM alone needs no gradient: no backward pass runs; Guided Grad-CAM brings Grad-CAM's maps."""
    from hookviz.engine.explain import explain
    from tests.conftest import TinyCNN

    model = TinyCNN().eval()
    x = torch.rand(2, 3, 32, 32)
    assert explain(model, x, ["features"], ["eigencam"]).grads_computed == 0
    ex = explain(model, x, ["features"], ["guidedgradcam"])
    assert ex.grads_computed == 1 and list(ex.maps) == [("guidedgradcam", "features")]


def test_the_docs_method_table_is_the_registry() -> None:
    page = (Path(__file__).parent.parent / "docs" / "methods.md").read_text()
    assert methods.table() in page, "regenerate with: python -m hookviz.methods"


def test_method_all_holds_the_cheap_ones_its_words_promise() -> None:
    from hookviz.methods.registry import REGISTRY, MethodOptions, parse

    chosen = parse(["all"])
    options = MethodOptions()
    for name in chosen:
        passes = REGISTRY[name].passes
        if passes is None:
            continue
        for k in (64, 512):  # whatever the layer's width
            forward, backward = passes(k, 3, options, (224, 224))
            assert forward <= 1 and backward <= 2 * 3, (name, k, forward, backward)
    assert "scorecam" not in chosen and "fullgrad" not in chosen
    assert {"gradcam", "hirescam", "eigencam", "saliency"} <= set(chosen)
