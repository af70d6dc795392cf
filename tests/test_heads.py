"""Heads other than one softmax: multi-label (independent sigmoids, ``--target positive``) and regression
(raw values, ``--negate``); maps equal a direct computation through hooks, records read the head as it is."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hookviz.core.readout import scorer
from hookviz.core.targets import Positive
from hookviz.engine.explain import explain
from hookviz.tasks import load_model
from tests.conftest import ROOT, invoke, picture, records, write_image
from tests.heads_net import BIASES

MULTI = f"{ROOT / 'tests' / 'heads_net.py'}:make_multilabel"
REGRESSOR = f"{ROOT / 'tests' / 'heads_net.py'}:make_regressor"


def _grad_cam(
    model: torch.nn.Module, x: torch.Tensor, layer: str, output: int, sign: float = 1.0
) -> torch.Tensor:
    """Grad-CAM of ``sign * output`` at ``layer``, computed here with one forward hook (no hookviz)."""
    store: dict[str, torch.Tensor] = {}
    module = dict(model.named_modules())[layer]
    handle = module.register_forward_hook(lambda m, a, out: store.setdefault("a", out))
    try:
        y = model(x)
    finally:
        handle.remove()
    (g,) = torch.autograd.grad(sign * y[0, output], store["a"])
    weights = g.mean(dim=(2, 3), keepdim=True)
    return F.relu((weights * store["a"]).sum(dim=1))[0].detach()


def _photo(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)


def test_multi_label_positive_targets_equal_a_direct_computation() -> None:
    loaded = load_model(MULTI, weights="DEFAULT", head="sigmoid", input_size=32, resize="squash")
    x = torch.from_numpy(loaded.preprocess(_photo(1))[0])[None]
    with torch.no_grad():
        logits = loaded.model(x)
    probs = torch.sigmoid(logits)[0]
    want = [int(k) for k in probs.argsort(descending=True) if probs[k] >= 0.5]
    assert want == [0, 2]  # the biases decide: 0.88 and 0.73
    ex = explain(loaded.model, x, ["conv2"], ["gradcam"], Positive(0.5))
    assert ex.targets[0].tolist() == want and ex.score_kind == "sigmoid"
    assert torch.allclose(ex.target_scores[0], probs[want], atol=1e-6)  # sigmoids, not a softmax
    raw = loaded.model.wrapped
    for j, k in enumerate(want):
        direct = _grad_cam(raw, x, "conv2", k)
        assert torch.allclose(ex.maps[("gradcam", "conv2")][0, j], direct, atol=1e-5 * float(direct.max()))
    lower = explain(loaded.model, x, ["conv2"], ["gradcam"], Positive(0.8))
    assert lower.targets[0].tolist() == [0]
    none = explain(loaded.model, x, ["conv2"], ["gradcam"], Positive(0.99))
    assert none.targets[0].tolist() == [0]  # no label reaches it: the likeliest is shown


def test_positive_in_a_batch_pads_each_row_with_its_own_labels() -> None:
    from hookviz.core.readout import positive_targets

    logits = torch.tensor([[3.0, -3.0, 2.0], [-3.0, -3.0, -2.0], [-1.0, 4.0, 0.5]])
    order = logits.argsort(dim=1, descending=True, stable=True)
    assert positive_targets(logits, order, 0.5).tolist() == [[0, 2], [2, 2], [1, 2]]


def test_multi_label_from_the_cli(tmp_path: Path) -> None:
    (folder := tmp_path / "in").mkdir()
    for i in range(2):
        write_image(folder / f"p{i}.png", _photo(i))
    r = invoke(
        "gradcam", str(folder), "--model", MULTI, "--weights", "DEFAULT", "--input-size", "32", "--resize",
        "squash", "--head", "sigmoid", "--target", "positive", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    for rec in records(tmp_path / "out"):
        assert rec["settings"]["head"] == "sigmoid"
        assert [t["index"] for t in rec["targets"]] == [0, 2] and all(t["positive"] for t in rec["targets"])
        assert [Path(o).name.split(".")[-2] for o in rec["outputs"] if ".c" in o] == ["c0", "c2"]
        sheet = [o for o in rec["outputs"] if o.endswith(".sheet.png")]
        assert sheet and sheet == rec["outputs"][-1:]  # written last: the photo's completion mark
        for o in rec["outputs"]:
            picture(o, min_size=(32, 32), min_colours=10)
        assert rec["predicted"]["score"] == pytest.approx(1 / (1 + np.exp(-BIASES[0])), abs=0.05)
    r = invoke("gradcam", str(folder), "--model", MULTI, "--weights", "DEFAULT", "--target", "positive",
               "--out", str(tmp_path / "x"))  # fmt: skip
    assert r.exit_code == 2 and "--head sigmoid" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = invoke("evaluate", str(folder), "--model", MULTI, "--weights", "DEFAULT", "--head", "sigmoid",
               "--input-size", "32", "--resize", "squash", "--out", str(tmp_path / "e"))  # fmt: skip
    assert r.exit_code == 0, r.output


def test_evaluation_reads_a_sigmoid_head_as_sigmoids() -> None:
    logits = torch.tensor([[2.0, -1.0], [0.0, 3.0]])
    rows = torch.arange(2)
    assert torch.allclose(scorer(kind="sigmoid")(logits, rows), torch.sigmoid(logits))
    assert torch.allclose(scorer()(logits, rows), torch.softmax(logits, dim=1))
    assert torch.equal(scorer(kind="raw")(logits, rows), logits)


def test_a_one_output_head_is_a_regression_and_negate_explains_what_lowers_it() -> None:
    loaded = load_model(REGRESSOR, weights="DEFAULT", input_size=32, resize="squash")
    assert loaded.model.score_kind == "raw"  # found: a single output
    x = torch.from_numpy(loaded.preprocess(_photo(2))[0])[None]
    with torch.no_grad():
        value = float(loaded.model(x)[0, 0])
    up = explain(loaded.model, x, ["features.2"], ["gradcam", "hirescam"], relu=False)
    assert float(up.predicted_score[0]) == pytest.approx(value, abs=1e-6)  # the raw value, no softmax
    direct = _grad_cam(loaded.model.wrapped, x, "features.2", 0)
    assert torch.allclose(
        F.relu(up.maps[("gradcam", "features.2")][0, 0]), direct, atol=1e-5 * float(direct.max() + 1e-9)
    )
    negated = load_model(REGRESSOR, weights="DEFAULT", input_size=32, resize="squash", negate=True)
    down = explain(negated.model, x, ["features.2"], ["gradcam", "hirescam"], relu=False)
    for key in up.maps:  # both are linear in the gradient: negating the output negates the signed map
        assert torch.allclose(down.maps[key], -up.maps[key], atol=1e-6)
    assert torch.allclose(
        F.relu(down.maps[("gradcam", "features.2")][0, 0]),
        _grad_cam(loaded.model.wrapped, x, "features.2", 0, -1.0),
        atol=1e-5,
    )


def test_regression_from_the_cli(tmp_path: Path) -> None:
    write_image(tmp_path / "p.png", _photo(3))
    args = ["--model", REGRESSOR, "--weights", "DEFAULT", "--input-size", "32", "--resize", "squash"]
    r = invoke("gradcam", str(tmp_path / "p.png"), *args, "--out", str(tmp_path / "up"), "--no-relu")
    assert r.exit_code == 0 and "read as regression values" in r.stderr, r.output
    [up] = records(tmp_path / "up")
    r = invoke(
        "gradcam", str(tmp_path / "p.png"), *args, "--negate", "--out", str(tmp_path / "down"), "--no-relu"
    )
    assert r.exit_code == 0, r.output
    [down] = records(tmp_path / "down")
    assert up["settings"]["head"] == "raw" and down["settings"]["negate"] is True
    assert up["predicted"]["value"] == pytest.approx(down["predicted"]["value"], abs=1e-6)  # the value itself
    assert down["predicted"]["score"] == pytest.approx(
        -up["predicted"]["score"], abs=1e-6
    )  # what is explained
    assert down["maps"][0]["min"] == pytest.approx(-up["maps"][0]["max"], rel=1e-4)
    r = invoke("gradcam", str(tmp_path / "p.png"), "--model", MULTI, "--weights", "DEFAULT", "--negate",
               "--out", str(tmp_path / "x"))  # fmt: skip
    assert r.exit_code == 2 and "regression" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_hugging_face_problem_type_decides_the_head(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    for problem, kind in (
        ("multi_label_classification", "sigmoid"),
        ("regression", "raw"),
        (None, "softmax"),
    ):
        config = transformers.ViTConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=32,
            patch_size=8, num_labels=3, problem_type=problem,
        )  # fmt: skip
        folder = tmp_path / str(problem)
        transformers.ViTForImageClassification(config).save_pretrained(folder)
        loaded = load_model(f"hf:{folder}", weights="DEFAULT")
        assert getattr(loaded.model, "score_kind", "softmax") == kind, problem


SOFTMAXED = f"{ROOT / 'tests' / 'heads_net.py'}:make_softmax"
TWO_OUTPUTS = f"{ROOT / 'tests' / 'heads_net.py'}:make_two_outputs"


def test_a_model_ending_in_a_softmax_is_read_as_probabilities_never_twice(tmp_path: Path) -> None:
    """Its outputs (non-negative rows summing to 1) are reported as they are, as a PyTorch module, a
    TorchScript archive and an ONNX graph: the record's score is the model's own probability, not the softmax
    of it; one note says so; Grad-CAM explains the log-probability (computed here with one hook)."""
    loaded = load_model(SOFTMAXED, weights="DEFAULT", input_size=32, resize="squash")
    assert loaded.model.reads_as == "probabilities" and any("gives probabilities" in n for n in loaded.notes)
    x = torch.from_numpy(loaded.preprocess(_photo(5))[0])[None]
    raw = loaded.model.wrapped
    with torch.no_grad():
        probs = raw(x)[0]
    top = int(probs.argmax())
    assert float(probs[top]) > 0.3 and float(torch.softmax(probs, 0)[top]) < 0.3  # twice would be far off
    ex = explain(loaded.model, x, ["features.2"], ["gradcam"])
    assert int(ex.predicted[0]) == top and float(ex.predicted_score[0]) == pytest.approx(
        float(probs[top]), abs=1e-6
    )
    store: dict[str, torch.Tensor] = {}
    handle = raw.features[2].register_forward_hook(lambda m, a, out: store.setdefault("a", out))
    try:
        (g,) = torch.autograd.grad(torch.log(raw(x)[0, top]), store.setdefault("a", torch.empty(0)))
    finally:
        handle.remove()
    direct = F.relu((g.mean(dim=(2, 3), keepdim=True) * store["a"]).sum(dim=1))[0].detach()
    got = ex.maps[("gradcam", "features.2")][0, 0]
    assert torch.allclose(got, direct, atol=1e-5 * float(direct.max() + 1e-9))

    photo = write_image(tmp_path / "p.png", _photo(5))
    script = tmp_path / "softmaxed.pt"
    with pytest.warns(FutureWarning):  # torch.jit itself is deprecated
        torch.jit.save(torch.jit.trace(raw.eval(), torch.zeros(1, 3, 32, 32)), str(script))
    specs = {"module": [SOFTMAXED, "--method", "gradcam"], "script": [str(script), "--method", "saliency"]}
    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnxscript"):
        graph = tmp_path / "softmaxed.onnx"
        batch = {"x": {0: torch.export.Dim("batch")}}
        torch.onnx.export(
            raw.eval(), (torch.zeros(2, 3, 32, 32),), graph, dynamic_shapes=batch, verbose=False
        )
        specs["onnx"] = [str(graph), "--method", "scorecam"]
    for name, (model, *method) in specs.items():
        r = invoke("gradcam", str(photo), "--model", model, *method, "--input-size", "32", "--resize",
                   "squash", "--out", str(tmp_path / name))  # fmt: skip
        assert r.exit_code == 0, r.output
        assert sum("gives probabilities" in line for line in r.stderr.splitlines()) == 1, r.stderr
        (rec,) = records(tmp_path / name)
        assert rec["predicted"]["index"] == top, name
        assert rec["predicted"]["score"] == pytest.approx(float(probs[top]), abs=1e-4), name
        assert (rec["settings"]["head"], rec["settings"]["explained"]) == ("probabilities", "log-probability")
    r = invoke("gradcam", str(photo), "--model", SOFTMAXED, "--input-size", "32", "--resize", "squash",
               "--head", "softmax", "--out", str(tmp_path / "twice"))  # fmt: skip
    assert r.exit_code == 0 and "gives probabilities" not in r.stderr, r.output
    (rec,) = records(tmp_path / "twice")  # asked for: the probabilities read as logits
    assert rec["predicted"]["score"] == pytest.approx(float(torch.softmax(probs, 0)[top]), abs=1e-4)


def test_a_model_returning_several_tensors_says_which_it_explains_and_output_picks(tmp_path: Path) -> None:
    """``(tanh(y[:, :5]), y)``: the first is explained with a note naming it and the record saying it;
    ``--output 1`` explains the 10 logits; a dict's outputs by name; an output it has not, or on a model
    returning one tensor: one line, exit 2."""
    photo = write_image(tmp_path / "p.png", _photo(6))
    common = ["--input-size", "32", "--resize", "squash"]
    loaded = load_model(TWO_OUTPUTS, weights="DEFAULT", input_size=32, resize="squash")
    x = torch.from_numpy(loaded.preprocess(_photo(6))[0])[None]
    with torch.no_grad():
        first, logits = loaded.model.wrapped(x)
    for output, want, said in ((None, first[0], "explaining [0] (--output N picks another)"),
                               ("1", logits[0], "explaining [1]")):  # fmt: skip
        extra = ["--output", output] if output else []
        out = tmp_path / f"o{output}"
        r = invoke("gradcam", str(photo), "--model", TWO_OUTPUTS, *common, *extra, "--out", str(out))
        assert r.exit_code == 0, r.output
        assert "returns a tuple of 2 tensors: [0] (B, 5), [1] (B, 10)" in r.stderr and said in r.stderr
        (rec,) = records(out)
        assert rec["settings"]["output"] == (int(output) if output else 0)
        assert rec["predicted"]["index"] == int(want.argmax())
        assert rec["predicted"]["score"] == pytest.approx(float(torch.softmax(want, 0).max()), abs=1e-5)
    named = f"{ROOT / 'tests' / 'heads_net.py'}:make_named_outputs"
    r = invoke("gradcam", str(photo), "--model", named, *common, "--output", "scores",
               "--out", str(tmp_path / "named"))  # fmt: skip
    assert r.exit_code == 0 and "explaining 'scores'" in r.stderr, r.output
    (rec,) = records(tmp_path / "named")
    assert rec["settings"]["output"] == "scores" and rec["predicted"]["index"] == int(logits[0].argmax())
    cases = [
        (
            [TWO_OUTPUTS, "--output", "2"],
            "--output 2: heads_net:make_two_outputs returns a tuple of 2 tensors",
        ),
        ([named], "none named as class scores; pick one with --output NAME"),
        ([SOFTMAXED, "--output", "1"], "--output 1: heads_net:make_softmax returns one tensor"),
    ]
    for model, said in cases:
        r = invoke("gradcam", str(photo), "--model", *model, *common, "--out", str(tmp_path / "x"))
        assert r.exit_code == 2 and said in r.stderr, r.output
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
