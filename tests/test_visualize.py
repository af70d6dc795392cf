"""Feature visualisation: a channel's picture drives it harder than every photo of the data set does, reaches
at least lucent's objective on the same model, steps and settings, repeats with its seed, works on a ViT."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision

from hookviz.concepts.visualize import Objective, visualize
from hookviz.errors import UsageError
from hookviz.io.shapes import shapes_batch
from tests.conftest import TinyCNN, Trained, invoke

LAYER = "features.10"


def _channel_means(model: torch.nn.Module, x: torch.Tensor, layer: str = LAYER) -> torch.Tensor:
    kept: list[torch.Tensor] = []
    handle = dict(model.named_modules())[layer].register_forward_hook(lambda m, a, o: kept.append(o.clone()))
    with torch.no_grad():
        model(x)
    handle.remove()
    return kept[0].mean(dim=(2, 3))


def test_a_channel_picture_beats_every_photo(trained: Trained) -> None:
    model = trained.model
    x, _, _ = shapes_batch(200, np.random.default_rng(7))
    photos = _channel_means(model, x)
    channel = int(photos.mean(0).argmax())  # a channel the photos do drive
    res = visualize(model, Objective(LAYER, channel=channel), size=48, input_size=(48, 48),
                    mean=(0, 0, 0), std=(1, 1, 1), steps=96, seed=0)  # fmt: skip
    own = float(_channel_means(model, res.images)[0, channel])
    assert own == pytest.approx(res.objective[0], rel=1e-4)  # the record's value is the picture's
    assert own > 1.5 * float(photos[:, channel].max()), (own, float(photos[:, channel].max()))
    assert res.history[-1] > res.history[0]


@pytest.mark.slow  # a reference's run beside ours: in make test, not the inner loop
def test_at_least_lucents_objective_on_the_same_settings(trained: Trained) -> None:
    with warnings.catch_warnings():  # kornia 0.4.1 uses torch.jit.script, deprecated
        warnings.simplefilter("ignore")
        render = pytest.importorskip("lucent.optvis.render")  # make install adds torch-lucent (test-only)

    model = trained.model
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])

    def score(image: torch.Tensor, channel: int) -> float:
        x = F.interpolate((image - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1), size=(224, 224),
                          mode="bilinear", align_corners=True)  # fmt: skip
        return float(_channel_means(model, x)[0, channel])

    for channel in (3, 17, 40):
        ours = visualize(model, Objective(LAYER, channel=channel), size=128, input_size=(224, 224), steps=48)
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = render.render_vis(model, f"features_10:{channel}", thresholds=(48,), show_image=False,
                                       progress=False)  # fmt: skip
        a = score(ours.images, channel)
        b = score(torch.from_numpy(theirs[-1]).permute(0, 3, 1, 2), channel)
        assert a == pytest.approx(ours.objective[0], rel=1e-4)
        assert a >= b, (channel, a, b)


def test_the_same_seed_gives_the_same_picture_and_the_model_is_left_as_found() -> None:
    torch.manual_seed(0)
    model = TinyCNN().train()
    model.fc.weight.requires_grad_(False)
    args = {"size": 32, "input_size": (48, 48), "steps": 8}
    a = visualize(model, Objective("features.4", channel=2), seed=3, **args)
    b = visualize(model, Objective("features.4", channel=2), seed=3, **args)
    c = visualize(model, Objective("features.4", channel=2), seed=4, **args)
    assert torch.equal(a.images, b.images) and not torch.equal(a.images, c.images)
    assert model.training and not model.fc.weight.requires_grad and model.features[0].weight.requires_grad
    assert all(p.grad is None for p in model.parameters())


def test_neurons_directions_and_diversity() -> None:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    args = {"size": 32, "input_size": (48, 48), "steps": 24}
    n = visualize(model, Objective("features.8", channel=1, neuron=(5, 6)), **args)
    assert n.history[-1] > n.history[0]
    d = torch.zeros(64)
    d[1] = 2.0  # the direction of channel 1 alone: its objective is channel 1's mean
    by_dir = visualize(model, Objective("features.8", direction=d), **args)
    by_channel = visualize(model, Objective("features.8", channel=1), **args)
    torch.testing.assert_close(by_dir.images, by_channel.images)
    two = visualize(model, Objective("features.8", channel=1), images=2, diversity=1.0, **args)
    assert two.images.shape == (2, 3, 32, 32) and not torch.allclose(two.images[0], two.images[1], atol=0.05)
    with pytest.raises(UsageError, match="give a channel"):
        Objective("features.8")
    with pytest.raises(UsageError, match="layer 'features.8' has 64"):
        visualize(model, Objective("features.8", channel=99), **args)


def test_a_vit_block() -> None:
    """A transformer block's output is (B, tokens, C): a channel's mean over the tokens goes up from where the
    optimisation starts (the same seed, no step)."""
    torch.manual_seed(0)
    vit = torchvision.models.VisionTransformer(
        image_size=64, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=5
    ).eval()
    for channel in (3, 7, 11):
        objective = Objective("encoder.layers.encoder_layer_1", channel=channel)
        start = visualize(vit, objective, size=64, input_size=(64, 64), steps=1, lr=0.0, seed=0)
        res = visualize(vit, objective, size=64, input_size=(64, 64), steps=32, seed=0)
        assert res.objective[0] > start.objective[0] + 0.05, (channel, start.objective, res.objective)


def test_cli(tmp_path: Path) -> None:
    args = ["visualize", "--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48",
            "--device", "cpu", "--layer", "features.4", "--channel", "3", "--steps", "8", "--size", "32",
            "--out", str(tmp_path)]  # fmt: skip
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    (png,) = tmp_path.glob("visualize.tests.conftest_TinyCNN.features.4.c3.s0.*.png")
    record = json.loads(png.with_suffix(".json").read_text())
    assert png.name == f"visualize.tests.conftest_TinyCNN.features.4.c3.s0.{record['key']}.png"
    assert record["steps"] == 8 and len(record["objective"]) == 1
    again = invoke(*args)  # the same settings: skipped, as every output of a run is
    assert again.exit_code == 0 and "skipped" in again.output
    assert invoke(*args, "--overwrite").exit_code == 0
    bad = invoke(*args, "--neuron", "3")
    assert bad.exit_code == 2 and "--neuron '3': give Y,X" in bad.output


TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]


def test_visualize_names_hold_its_settings(tmp_path: Path) -> None:
    import torch

    from tests.conftest import TinyCNN

    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        w = tmp_path / f"w{seed}.pt"
        torch.save(TinyCNN().state_dict(), w)
        paths.append(w)
    base = ["visualize", "--model", "tests.conftest:TinyCNN", "--input-size", "48", "--device", "cpu",
            "--layer", "features.4", "--channel", "3", "--size", "32",
            "--out", str(tmp_path / "o")]  # fmt: skip
    runs = [
        [*base, "--weights", str(paths[0]), "--steps", "4"],
        [*base, "--weights", str(paths[1]), "--steps", "4"],  # another checkpoint
        [*base, "--weights", str(paths[1]), "--steps", "5"],
        [*base, "--weights", str(paths[1]), "--steps", "5", "--lr", "0.1"],
        [*base, "--weights", str(paths[1]), "--steps", "5", "--lr", "0.1", "--size", "40"],
    ]
    for args in runs:
        r = invoke(*args)
        assert r.exit_code == 0, r.output
    assert len(list((tmp_path / "o").glob("visualize.*.png"))) == len(runs)


def test_a_bad_direction_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "text.npy").write_text("0.1, 0.2\n")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "nan.npy", np.array([1.0, np.nan, *[0.0] * 14], np.float32))
    np.save(tmp_path / "square.npy", np.ones((4, 4), np.float32))
    np.save(tmp_path / "zeros.npy", np.zeros(16, np.float32))
    base = ["visualize", *TINY, "--layer", "features.1", "--steps", "2", "--size", "16",
            "--out", str(tmp_path / "o")]  # fmt: skip
    for name, why in (
        ("missing.npy", "no such file"),
        ("text.npy", "not a .npy array of numbers"),
        ("objects.npy", "not a .npy array of numbers"),
        ("nan.npy", "NaN or infinity"),
        ("square.npy", "(4, 4) array is not a vector"),
        ("zeros.npy", "every value is 0"),
    ):
        r = invoke(*base, "--direction", str(tmp_path / name))
        assert r.exit_code == 2, (name, r.exit_code, r.output)
        assert (why in r.output and "numpy.save" in r.output) or name == "missing.npy", r.output
        assert not (tmp_path / "o").exists()
    np.save(tmp_path / "column.npy", np.ones((16, 1, 1), np.float32))
    r = invoke(*base, "--direction", str(tmp_path / "column.npy"))
    assert r.exit_code == 0, r.output
    (record,) = (tmp_path / "o").glob("*.json")
    json.loads(record.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))


def test_a_dead_unit_says_so(tmp_path: Path) -> None:
    """A channel whose ReLU gives 0 to every picture: objective 0.0 with a note, not silence."""
    import torch

    from tests.conftest import TinyCNN

    model = TinyCNN()
    with torch.no_grad():
        model.features[1].weight[2] = 0.0
        model.features[1].bias[2] = -1.0  # channel 2 after the ReLU is 0 everywhere
    torch.save(model.state_dict(), tmp_path / "w.pt")
    r = invoke("visualize", "--model", "tests.conftest:TinyCNN", "--weights", str(tmp_path / "w.pt"),
               "--input-size", "32", "--device", "cpu", "--layer", "features.2", "--channel", "2", "--steps",
               "3", "--size", "16", "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "stayed at 0" in r.output and "dead unit" in r.output
    (record,) = (tmp_path / "o").glob("*.json")
    assert "dead unit" in json.loads(record.read_text())["note"]
