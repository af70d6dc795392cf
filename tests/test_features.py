"""Feature maps: captured inputs/outputs are the real tensors; the grid shows them tile by tile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torchvision

from hookviz.engine.features import feature_maps, rank_channels
from hookviz.render import colormap_lut, feature_grid, normalize, tile_positions
from tests.conftest import TinyCNN, hook_counts, invoke, records, write_image


def test_input_stage_equals_previous_output_where_the_architecture_says_so() -> None:
    model = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 64, 64)
    maps = feature_maps(model, x, ["maxpool", "layer1", "layer1.0.conv1", "layer2.0.conv1"], stage="both")
    got = {(m.layer, m.stage): m.tensor for m in maps}
    # layer1.0.conv1 receives maxpool's output; layer2.0.conv1 receives layer1's output.
    torch.testing.assert_close(got[("layer1.0.conv1", "input")], got[("maxpool", "output")])
    torch.testing.assert_close(got[("layer2.0.conv1", "input")], got[("layer1", "output")])
    with torch.no_grad():
        ref = model.eval().layer1[0].conv1(model.maxpool(model.relu(model.bn1(model.conv1(x)))))
    torch.testing.assert_close(got[("layer1.0.conv1", "output")], ref)
    assert hook_counts(model) == 0


def test_grid_tiles_are_the_normalised_channels() -> None:
    fmap = np.random.default_rng(0).normal(size=(10, 7, 9)).astype(np.float32)
    fmap[3] = 5.0  # constant channel → ranked last, drawn as zeros
    channels = rank_channels(torch.from_numpy(fmap), 6)
    assert 3 not in channels and len(channels) == 6
    stds = fmap.reshape(10, -1).std(axis=1)
    assert channels == list(np.argsort(-stds, kind="stable")[:6])
    grid = feature_grid(fmap, channels, title="t", colormap="gray")
    band = grid.shape[0] - (tile_positions(6, 7, 9)[-1][0] + tile_positions(6, 7, 9)[-1][2] + 2)
    body = grid[band:]
    lut = colormap_lut("gray")
    for (y, x, th, tw), ch in zip(tile_positions(6, 7, 9), channels, strict=True):
        tile = body[y : y + th, x : x + tw]
        zoom = th // 7
        expected = lut[np.clip(np.rint(normalize(fmap[ch]) * 255), 0, 255).astype(np.uint8)]
        expected = np.repeat(np.repeat(expected, zoom, 0), zoom, 1)
        # Compare away from the channel label in the top-left corner.
        np.testing.assert_array_equal(tile[th // 2 :, :], expected[th // 2 :, :])


def _tiny_run(tmp_path: Path) -> tuple[TinyCNN, list[str], dict[str, np.ndarray]]:
    """A seeded TinyCNN's weights, two 40 x 40 photos and the options that feed them to it as they are (no
    resize, no normalisation), and each photo's ``features.4`` input and output by a plain forward hook."""
    model = TinyCNN().eval()
    with torch.no_grad():  # running statistics other than 0 and 1: the batch norms do something
        for bn in (model.features[1], model.features[5], model.features[9]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    torch.save(model.state_dict(), tmp_path / "tiny.pt")
    rng = np.random.default_rng(11)
    seen: dict[str, np.ndarray] = {}
    (tmp_path / "in").mkdir()
    for i in range(2):
        rgb = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
        write_image(tmp_path / "in" / f"p{i}.png", rgb)
        got: dict[str, torch.Tensor] = {}
        conv = model.features[4]
        handles = [
            conv.register_forward_pre_hook(lambda m, a: got.__setitem__("input", a[0].clone())),
            conv.register_forward_hook(lambda m, a, o: got.__setitem__("output", o.clone())),
        ]
        with torch.no_grad():
            model(torch.from_numpy(rgb.astype(np.float32) / 255).permute(2, 0, 1)[None])
        for h in handles:
            h.remove()
        seen.update({f"p{i}.{k}": v[0].numpy() for k, v in got.items()})
    options = ["--model", "tests.conftest:TinyCNN", "--weights", str(tmp_path / "tiny.pt"), "--input-size",
               "40", "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1", "--device", "cpu",
               "--layers", "features.4", "--stage", "both", "--max-channels", "8", "-q"]  # fmt: skip
    return model, options, seen


def test_featuremaps_maps_zarr_holds_every_feature_map_as_a_hook_sees_it(tmp_path: Path) -> None:
    """``featuremaps --maps zarr`` writes an array per input, layer and stage: the whole map (every channel),
    equal to a plain hook's tensor within float16's precision and to ``--save-raw``'s ``.npy``; the records
    say where each went; with ``--no-pictures`` only the store and the manifest are written."""
    import zarr

    _, options, seen = _tiny_run(tmp_path)
    photos = str(tmp_path / "in")
    r = invoke("featuremaps", photos, *options, "--save-raw", "--out", str(tmp_path / "raw"))
    assert r.exit_code == 0, r.stderr
    r = invoke("featuremaps", photos, *options, "--maps", "zarr", "--out", str(tmp_path / "z"))
    assert r.exit_code == 0, r.stderr
    r = invoke(
        "featuremaps", photos, *options, "--maps", "zarr", "--no-pictures", "--out", str(tmp_path / "np")
    )
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "np").iterdir()) == ["manifest.jsonl", "maps.zarr"]
    for out in ("z", "np"):
        store = zarr.open_group(str(tmp_path / out / "maps.zarr"), mode="r")
        recs = sorted(records(tmp_path / out), key=lambda rec: rec["input"])
        assert len(recs) == 2 and all(rec["status"] == "ok" for rec in recs)
        for i, rec in enumerate(recs):
            group = store[rec["prefix"]]
            assert sorted(group.array_keys()) == [
                "featuremap.features.4.input",
                "featuremap.features.4.output",
            ]
            for stage, (ch, size) in (("input", (16, 20)), ("output", (32, 20))):
                array = group[f"featuremap.features.4.{stage}"]
                hooked = seen[f"p{i}.{stage}"]
                assert array.shape == (ch, size, size) == hooked.shape and array.dtype == np.float16
                assert array.attrs["complete"] and array.attrs["prefix"] == rec["prefix"]
                assert array.attrs["box"] == [0, 0, 40, 40] == rec["box"]
                scale = float(np.abs(hooked).max())
                assert scale > 0.1 and float(hooked.std()) > 0.01  # a real map, not zeros
                np.testing.assert_allclose(
                    array[...].astype(np.float32), hooked, rtol=2e-3, atol=1e-3 * scale
                )
                npy = tmp_path / "raw" / f"{rec['prefix']}.featuremap.features.4.{stage}.npy"
                np.testing.assert_allclose(np.load(npy), hooked, rtol=1e-5, atol=1e-6 * scale)
            where = {m["stage"]: m for m in rec["maps"]}
            if out == "np":  # no picture: the record names the array instead
                assert all(m["file"] is None for m in rec["maps"])
                assert where["output"]["raw"].endswith(
                    f"maps.zarr/{rec['prefix']}/featuremap.features.4.output"
                )
            else:
                assert all((tmp_path / out / m["file"]).is_file() for m in rec["maps"])
            assert any(o.endswith("/featuremap.features.4.output") for o in rec["outputs"])
    # The same settings again: every input skipped (its arrays are there), nothing rewritten.
    r = invoke(
        "featuremaps", photos, *options, "--maps", "zarr", "--no-pictures", "--out", str(tmp_path / "np")
    )
    assert r.exit_code == 0 and [rec["status"] for rec in records(tmp_path / "np")][2:] == ["skipped"] * 2


def test_featuremaps_refused_run_leaves_nothing(tmp_path: Path) -> None:
    """``--no-pictures`` with no raw map to write: one line, exit 2, and no folder, no store made."""
    _, options, _ = _tiny_run(tmp_path)
    r = invoke("featuremaps", str(tmp_path / "in"), *options, "--no-pictures", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and r.stderr.count("error") == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith("would write no file; add --save-raw or --maps zarr")
    assert not (tmp_path / "o").exists()
