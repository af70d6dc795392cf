"""Which map to trust: each metric against a direct computation, and on a model trained here."""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner, Result

from hookviz import evaluation as ev
from hookviz.cli import app
from hookviz.engine.explain import explain
from hookviz.io.shapes import SHAPES, draw_shape, shapes_batch
from tests.conftest import (
    TinyCNN,
    evaluation_file,
    hook_counts,
    invoke,
    records,
    train_on_shapes,
    write_image,
)


class LeftHalf(nn.Module):
    """Class 1's logit is 2 x the mean of channel 0 over the left half: a model whose evidence is known."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)  # something for hooks to hold on to

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left = x[:, 0, :, : x.shape[3] // 2].mean(dim=(1, 2))
        return torch.stack([torch.zeros_like(left), 2 * left], dim=1) + 0 * self.conv(x).sum()


def _p(m: float) -> float:
    return 1 / (1 + math.exp(-2 * m))


def test_metrics_on_a_hand_made_case() -> None:
    x = torch.zeros(1, 3, 2, 4)
    x[:, :, :, :2] = 1.0  # left half white, right half black
    importance = torch.tensor([[[8.0, 7.0, 2.0, 1.0], [6.0, 5.0, 4.0, 3.0]]])  # the left half first
    f = ev.faithfulness(LeftHalf(), x, importance, torch.tensor([1]), steps=4)
    # Deletion (to zeros), 2 pixels a step: the left half's mean goes 1, 1/2, 0, 0, 0.
    deletion = [_p(m) for m in (1, 0.5, 0, 0, 0)]
    # Insertion from the blurred image (mean 1/2 everywhere): left mean 1/2, 3/4, 1, 1, 1.
    insertion = [_p(m) for m in (0.5, 0.75, 1, 1, 1)]
    np.testing.assert_allclose(f.deletion_curve[0].numpy(), deletion, rtol=1e-5)
    np.testing.assert_allclose(f.insertion_curve[0].numpy(), insertion, rtol=1e-5)
    trapezoid = lambda ys: sum((a + b) / 2 * 0.25 for a, b in itertools.pairwise(ys))  # noqa: E731
    assert float(f.deletion_auc[0]) == pytest.approx(trapezoid(deletion), rel=1e-5)
    assert float(f.insertion_auc[0]) == pytest.approx(trapezoid(insertion), rel=1e-5)
    # Average drop: the image times the map scaled to [0, 1]: the left pixels become 1, 6/7, 5/7, 4/7.
    p, p_masked = _p(1), _p((1 + 6 / 7 + 5 / 7 + 4 / 7) / 4)
    assert float(f.average_drop[0]) == pytest.approx((p - p_masked) / p * 100, rel=1e-4)
    assert float(f.increase[0]) == 0.0
    assert f.forward_passes == 5 + 5 + 1


def test_statistics_helpers() -> None:
    assert ev.mean_ci([1.0, 2.0, 3.0]) == pytest.approx((2.0, 4.302653 * 1.0 / math.sqrt(3)))  # t(0.975, 2)
    assert ev.mean_ci([1.0, float("nan"), 3.0]) == pytest.approx((2.0, 12.706205))  # sd sqrt(2), n 2
    # Wilson (1927) for 0 of 3 and 3 of 3: [0, 0.5615] and [0.4385, 1].
    assert ev.wilson(0, 3) == pytest.approx((0.0, 0.561497), abs=1e-6)
    assert ev.wilson(3, 3) == pytest.approx((0.438503, 1.0), abs=1e-6)
    mean, half = ev.mean_ci([5.0])
    assert mean == 5.0 and math.isnan(half)  # one value: no interval
    assert ev.rankdata(torch.tensor([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert ev.spearman(a, a * 10 + 1) == pytest.approx(1.0) and ev.spearman(a, -a) == pytest.approx(-1.0)
    assert ev.ssim(a, a) == pytest.approx(1.0) and ev.ssim(a, a.flip(0).flip(1)) < 0.5
    assert ev.center_maps(1, 5, 5)[0].argmax() == 12 and ev.random_maps(2, 3, 3).shape == (2, 3, 3)


@pytest.fixture(scope="module")
def centred() -> TinyCNN:
    """TinyCNN trained on shapes with inputs centred on the data's mean grey (x - 0.5), so that the deletion
    baseline (zeros in input space) is that grey, as it is for ImageNet-normalised photos."""
    torch.manual_seed(0)
    return train_on_shapes(TinyCNN(), shift=0.5)  # type: ignore[return-value]


def test_grad_cam_beats_chance_on_a_trained_model(centred: TinyCNN) -> None:
    x, y, _ = shapes_batch(100, np.random.default_rng(99))
    x = x - 0.5
    cam = explain(centred, x, ["features.8"], ["gradcam"], y).maps[("gradcam", "features.8")][:, 0]
    ours = ev.faithfulness(centred, x, cam, y)
    chance = ev.faithfulness(centred, x, ev.random_maps(100, 12, 12), y)
    # Measured: deletion 0.37 vs 0.53, insertion 0.96 vs 0.59 (200-odd images give the same picture).
    assert float(ours.deletion_auc.mean()) < float(chance.deletion_auc.mean()) - 0.08
    assert float(ours.insertion_auc.mean()) > float(chance.insertion_auc.mean()) + 0.2
    assert hook_counts(centred) == 0 and not centred.training


def test_sanity_check_separates_a_faithful_map_from_a_model_blind_one(centred: TinyCNN) -> None:
    x, y, _ = shapes_batch(16, np.random.default_rng(7))
    x = x - 0.5
    before = {k: v.clone() for k, v in centred.state_dict().items()}

    def maps(model: nn.Module) -> dict[str, torch.Tensor]:
        cam = explain(model, x, ["features.8"], ["gradcam"], y).maps[("gradcam", "features.8")][:, 0]
        edges = x.abs().sum(1)  # knows nothing of the model
        return {"gradcam": cam, "edges": edges}

    steps = ev.cascade(centred, maps, seed=0)
    # TinyCNN has no blocks: the test steps through its layers, from the head down.
    assert [name for name, _ in steps] == ["none", "fc", *(f"features.{i}" for i in (9, 8, 5, 4, 1, 0))]
    original, randomised = steps[0][1], steps[-1][1]
    rho = np.mean([ev.spearman(randomised["gradcam"][i], original["gradcam"][i]) for i in range(16)])
    sim = np.mean([ev.ssim(randomised["gradcam"][i], original["gradcam"][i]) for i in range(16)])
    assert rho < 0.5 and sim < 0.5, (rho, sim)
    assert np.mean([ev.ssim(randomised["edges"][i], original["edges"][i]) for i in range(16)]) > 0.99
    assert all(torch.equal(before[k], v) for k, v in centred.state_dict().items())  # a copy was randomised


@pytest.fixture(scope="module")
def shape_photos(tmp_path_factory: pytest.TempPathFactory, centred: TinyCNN) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ev")
    torch.save(centred.state_dict(), d / "tiny.pth")
    (d / "labels.txt").write_text("\n".join(SHAPES))
    rng = np.random.default_rng(5)
    (d / "in").mkdir()
    for i in range(12):
        img, mask = draw_shape(i % 3, 48, rng)
        write_image(d / "in" / f"{i:02d}.png", (img * 255).round().astype(np.uint8))
        np.save(d / f"mask{i:02d}.npy", mask)
    return {"dir": d}


def _cli_model(d: Path) -> list[str]:
    model = ["--model", "tests.conftest:TinyCNN", "--weights", str(d / "tiny.pth")]
    model += ["--labels", str(d / "labels.txt")]
    return [*model, "--input-size", "48", "--resize", "squash", "--mean", "0.5,0.5,0.5", "--std", "1,1,1"]


def test_evaluate_command_writes_the_table_csv_and_json(
    shape_photos: dict[str, Path], tmp_path: Path
) -> None:
    d, out = shape_photos["dir"], tmp_path / "o"
    r = CliRunner().invoke(
        app, ["evaluate", str(d / "in"), *_cli_model(d), "--method", "gradcam", "--method", "layercam",
              "--out", str(out)],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "12 image(s)" in r.stdout and "forward passes" in r.stdout
    rows = list(csv.DictReader(evaluation_file(out, ext="csv").read_text().splitlines()))
    assert [(row["method"], row["layer"]) for row in rows] == [
        ("gradcam", "features"), ("layercam", "features"), ("random", "-"), ("center", "-"),
    ]  # fmt: skip
    assert set(rows[0]) >= {"method", "layer", "images", "deletion_auc", "insertion_auc", "average_drop",
                            "increase_in_confidence"}  # fmt: skip
    by = {row["method"]: row for row in rows}
    assert float(by["gradcam"]["insertion_auc"]) > float(by["random"]["insertion_auc"])
    data = json.loads(evaluation_file(out).read_text())
    assert data["images"] == 12 and data["forward_passes"] == 12 * 4 * (17 + 17 + 1)


def test_evaluations_with_other_settings_in_one_out_keep_their_own_files(
    shape_photos: dict[str, Path], tmp_path: Path
) -> None:
    """Two evaluations of other method sets into one --out each keep their files (keyed by the settings, as
    the maps are); the same settings again keep the files there untouched, and grow them with more photos."""
    d, out = shape_photos["dir"], tmp_path / "o"
    photos = [str(d / "in" / f"{i:02d}.png") for i in range(4)]

    def run(method: str, *inputs: str) -> Result:
        r = CliRunner().invoke(
            app, ["evaluate", *inputs, *_cli_model(d), "--method", method, "--out", str(out)]
        )
        assert r.exit_code == 0, r.stderr
        return r

    run("gradcam", *photos[:3])
    first = {p.name: p.read_text() for p in out.glob("evaluation.*")}
    run("layercam", *photos[:3])
    files = {p.name: p.read_text() for p in out.glob("evaluation.*")}
    assert len(files) == 4 and {n: files[n] for n in first} == first  # the first's csv and json, as they were
    methods = sorted(json.loads(t)["rows"][0]["method"] for n, t in files.items() if n.endswith(".json"))
    assert methods == ["gradcam", "layercam"]
    (summary,) = [out / n for n in first if n.endswith(".json")]
    stamp = summary.stat().st_mtime_ns
    r = run("gradcam", *photos[:3])  # every photo skipped: the same figures
    assert summary.stat().st_mtime_ns == stamp and f"kept {out}" in r.stdout, r.stdout
    run("gradcam", *photos)  # one more photo: the same settings' table grows
    assert json.loads(summary.read_text())["images"] == 4


def test_sanity_command_writes_strips_and_json(shape_photos: dict[str, Path], tmp_path: Path) -> None:
    d, out = shape_photos["dir"], tmp_path / "o"
    r = CliRunner().invoke(app, ["sanity", str(d / "in"), *_cli_model(d), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.stderr
    data = json.loads((out / "sanity.json").read_text())
    layers = ["fc", *(f"features.{i}" for i in (9, 8, 5, 4, 1, 0))]
    assert [s["randomized_up_to"] for s in data["steps"] if s["method"] == "edges"] == ["none", *layers]
    assert set(data["steps"][0]) >= {"randomized_up_to", "method", "spearman", "spearman_ci95", "ssim"}
    last = {s["method"]: s for s in data["steps"] if s["randomized_up_to"] == "features.0"}
    assert last["gradcam"]["spearman"] < 0.5 and last["edges"]["spearman"] > 0.99
    assert "gradcam: at full randomisation" in r.stdout and "(passes)" in r.stdout
    assert len(list(out.glob("*.sanity.features.png"))) == 12


def test_layer_auto_picks_a_layer_whose_maps_land_on_the_shapes(
    shape_photos: dict[str, Path], tmp_path: Path
) -> None:
    d, out = shape_photos["dir"], tmp_path / "o"
    r = CliRunner().invoke(
        app, ["gradcam", str(d / "in"), *_cli_model(d), "--layer", "auto", "--probe", "6", "--save-raw",
              "--metrics", "--out", str(out), "-q", "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "--layer auto chose" in r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    auto = recs[0]["layer_auto"]
    assert auto["chosen"] == recs[0]["layer"] and len(auto["scores"]) >= 3 and auto["images"] == 6
    assert auto["scores"][auto["chosen"]] == max(auto["scores"].values())
    inside = 0
    for rec in recs:
        i = int(Path(rec["input"]).stem)
        full = np.load(next(o for o in rec["outputs"] if o.endswith(".full.npy")))
        inside += bool(np.load(d / f"mask{i:02d}.npy").flat[int(np.nanargmax(full))])
        (m,) = rec["maps"]
        assert 0 <= m["metrics"]["deletion_auc"] <= 1 and 0 <= m["metrics"]["insertion_auc"] <= 1
    assert inside >= 10, inside  # of 12
    mean_del = np.mean([rec["maps"][0]["metrics"]["deletion_auc"] for rec in recs])
    mean_ins = np.mean([rec["maps"][0]["metrics"]["insertion_auc"] for rec in recs])
    assert mean_ins > mean_del + 0.3, (mean_ins, mean_del)


class _GuidedReLU(torch.autograd.Function):
    """The reference: a ReLU whose backward passes a gradient only where input and gradient are positive."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)  # type: ignore[attr-defined]
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return g * (x > 0) * (g > 0)


class _Ref(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GuidedReLU.apply(x)


def test_guided_backprop_equals_relus_clamped_by_hand() -> None:
    import copy

    import torchvision

    from hookviz.methods.guided import guided_backprop

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5).eval()  # in-place module ReLUs, reused in each block
    x = torch.randn(2, 3, 64, 64)
    targets = torch.tensor([[1, 3], [4, 0]])
    got = guided_backprop(model, x, targets)
    ref_model = copy.deepcopy(model)
    for module in list(ref_model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.ReLU):
                setattr(module, child_name, _Ref())
    xi = x.clone().requires_grad_()
    logits = ref_model(xi)
    for j in range(2):
        (g,) = torch.autograd.grad(logits[torch.arange(2), targets[:, j]].sum(), xi, retain_graph=True)
        torch.testing.assert_close(got[:, j], g.abs().amax(dim=1), rtol=1e-4, atol=1e-6)
    assert hook_counts(model) == 0 and all(p.grad is None for p in model.parameters())
    # A functional ReLU (densenet calls F.relu) is guided too: the map differs from the plain gradient.
    dense = torchvision.models.densenet121(num_classes=3).eval()
    plain_x = x[:1].clone().requires_grad_()
    (plain,) = torch.autograd.grad(dense(plain_x)[0, 1], plain_x)
    guided = guided_backprop(dense, x[:1], torch.tensor([[1]]))[0, 0]
    assert not torch.allclose(guided, plain.abs().amax(dim=1)[0])


def test_guided_grad_cam_and_smoothing_through_explain(centred: TinyCNN) -> None:
    x, y, masks = shapes_batch(40, np.random.default_rng(3))
    x = x - 0.5
    ex = explain(centred, x, ["features.8"], ["guidedbackprop", "guidedgradcam"], y)
    gb, ggc = ex.maps[("guidedbackprop", "features.8")], ex.maps[("guidedgradcam", "features.8")]
    assert gb.shape == ggc.shape == (40, 1, 48, 48)  # the input's resolution
    cam = explain(centred, x, ["features.8"], ["gradcam"], y).maps[("gradcam", "features.8")]
    up = F.interpolate(cam, size=(48, 48), mode="bilinear", align_corners=False)
    torch.testing.assert_close(ggc, gb * up.clamp_min(0))
    # Guided maps are sharp at the shape's outline: their peak lies within 2 px of the shape (measured
    # 100 %), and the shape's pixels (8 % of the image) hold over three times their share of the map.
    m = torch.from_numpy(masks).float()
    near = F.max_pool2d(m[:, None], 5, 1, 2)[:, 0].flatten(1)
    assert float(near.gather(1, ggc[:, 0].flatten(1).argmax(1, keepdim=True)).mean()) >= 0.9
    share = (ggc[:, 0] * m).sum((1, 2)) / ggc[:, 0].sum((1, 2))
    assert float(share.mean()) > 3 * float(m.mean()), (float(share.mean()), float(m.mean()))
    smooth = explain(
        centred, x, ["features.8"], ["gradcam", "layercam"], y, eigen_smooth=True, aug_smooth=True
    )
    for m in ("gradcam", "layercam"):
        s = smooth.maps[(m, "features.8")][:, 0]
        up = F.interpolate(s[:, None], size=(48, 48), mode="bilinear", align_corners=False)[:, 0]
        hits = np.mean([masks[i].flat[int(up[i].argmax())] for i in range(40)])
        assert hits >= 0.8, (m, hits)


def test_guided_maps_are_drawn_with_the_top_half_percent_saturated() -> None:
    from hookviz.jobs import CamJob
    from hookviz.jobs.settings import CamSettings
    from tests.conftest import tiny_loaded

    params = CamSettings(layers=("features.8",), methods=("guidedbackprop",))
    job = CamJob(loaded=tiny_loaded(TinyCNN()), params=params)
    cam = np.linspace(0, 1, 10_000, dtype=np.float32).reshape(100, 100)
    cam[0, 0] = 1e6  # one pixel would otherwise take the whole colour range
    unit = job._unit(cam, None, "guidedbackprop")
    assert unit[50, 50] == pytest.approx(0.5025, abs=0.01) and unit[0, 0] == 1.0
    assert job._unit(cam, None, "gradcam")[50, 50] < 1e-5  # other maps: plain min-max


def test_sanity_independent_and_smooth(shape_photos: dict[str, Path], tmp_path: Path) -> None:
    """--order independent re-initialises one block at a time; --smooth N averages each map over N noisy
    inputs first (sMPRT); both recorded, and the verdict reads the mean over the blocks."""
    d, out = shape_photos["dir"], tmp_path / "o"
    photos = sorted((d / "in").iterdir())[:3]
    r = CliRunner().invoke(
        app, ["sanity", *map(str, photos), *_cli_model(d), "--order", "independent", "--smooth", "3",
              "--out", str(out), "-q"],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    data = json.loads((out / "sanity.json").read_text())
    assert data["order"] == "independent" and data["granularity"] == "block"
    rec = json.loads((out / "manifest.jsonl").read_text().splitlines()[-1])
    assert rec["settings"]["smooth"] == 3 and rec["settings"]["order"] == "independent"
    assert "gradcam: averaged over the blocks randomised one at a time" in r.stdout
    edges = [s for s in data["steps"] if s["method"] == "edges"]
    assert all(s["spearman"] == pytest.approx(1.0) for s in edges)
    bad = CliRunner().invoke(app, ["sanity", str(photos[0]), *_cli_model(d), "--order", "sideways"])
    assert bad.exit_code == 2 and "one of cascading, independent" in bad.stderr


def test_random_baseline_does_not_depend_on_the_batch() -> None:
    from hookviz.evaluation import random_maps, wilson

    x = torch.rand(6, 3, 8, 8)
    whole = random_maps(6, 4, 4, x=x)
    halves = torch.cat([random_maps(3, 4, 4, x=x[:3]), random_maps(3, 4, 4, x=x[3:])])
    torch.testing.assert_close(whole, halves)
    assert not torch.equal(whole[0], whole[3])  # image i and i + b get different maps
    low, high = wilson(3, 3)
    assert 0.0 < low < 1.0 and high == 1.0
    low, high = wilson(0, 3)
    assert low == 0.0 and 0.0 < high < 1.0
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # the textbook value


TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]


def test_robustness_randomisation_and_road_figures_do_not_change_with_the_batch_size(
    labelled_photos: Path, tmp_path: Path
) -> None:
    got = []
    for b in (1, 4):
        out = tmp_path / f"b{b}"
        r = invoke("evaluate", str(labelled_photos), *TINY, "--metric", "robustness,randomisation,road",
                   "--robust-samples", "2", "-b", str(b), "--out", str(out), "-q")  # fmt: skip
        assert r.exit_code == 0, r.stderr
        got.append({Path(x["input"]).name: x["metrics"] for x in records(out)})
    for name in got[0]:
        for method, figures in got[0][name].items():
            for fig, v in figures.items():
                w = got[1][name][method][fig]
                # Batched convolutions sum in another order: RIS, a ratio, moved 3e-4 relative under
                # ATEN_CPU_CAPABILITY=default; noise drawn per batch moved the figures by far more.
                assert v == pytest.approx(w, rel=5e-3, abs=1e-5), (name, method, fig, v, w)


def test_one_image_has_no_interval(labelled_photos: Path, tmp_path: Path) -> None:
    r = invoke("evaluate", str(labelled_photos / "p0.png"), *TINY, "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.stderr
    assert "±0.000" not in r.stdout and "(n/a)" in r.stdout
    rows = json.loads(evaluation_file(tmp_path / "o").read_text())["rows"]
    assert rows[0]["deletion_auc_ci95"] is None
