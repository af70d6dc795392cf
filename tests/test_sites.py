"""Layers resolved once into sites (hookviz/core/sites.py): one walk of the model, each layer once, its
module and layout kept; the hooks and the explain pass take them as they are."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torchvision.models import VisionTransformer

from hookviz.core.hooks import capture, trace_shapes
from hookviz.core.layout import Layout
from hookviz.core.sites import Site, bind, cam_sites, sites_of
from hookviz.core.targets import Top
from hookviz.engine.explain import explain
from hookviz.errors import LayerError
from hookviz.jobs.cam_build import classifier_job
from hookviz.jobs.settings import CamSettings
from hookviz.models.loaded import probe
from tests.conftest import TinyCNN, hook_counts, tiny_loaded
from tests.volume_net import VolumeNet


def walks(model: nn.Module, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls of ``model.named_modules`` (the walk every name lookup starts with) from now on."""
    seen = [0]
    original = model.named_modules

    def spy(*args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Module]]:
        seen[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "named_modules", spy)
    return seen


def test_a_glob_over_a_cnn_resolves_in_one_walk_each_layer_once_with_its_module_and_map(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    calls = trace_shapes(model, torch.zeros(1, 3, 48, 48))
    seen = walks(model, monkeypatch)
    sites = cam_sites(model, ["features", "features.[0-9]", "features", "pool:input"], calls, "tiny")
    # One walk for the four specs (the glob's hits checked each, where a lookup per name walked twice).
    assert seen[0] == 1
    # Named once each, in the order given, the glob's hits in network order.
    assert [s.name for s in sites] == [
        "features", "features.0", "features.1", "features.2", "features.3", "features.4", "features.5",
        "features.6", "features.7", "features.8", "features.9", "pool:input",
    ]  # fmt: skip
    by = {s.name: s for s in sites}
    assert by["features.4"].module is model.features[4]
    assert (by["features"].shape, by["features"].runs) == ((1, 64, 12, 12), 1)
    assert by["features"].layout == Layout("nchw") and by["features"].channels == 64
    assert by["features.3"].shape == (1, 16, 24, 24) and by["features.3"].channels == 16
    pooled = by["pool:input"]
    assert (pooled.path, pooled.stage, pooled.module) == ("pool", "input", model.pool)
    assert pooled.shape == (1, 64, 12, 12) and pooled.layout == Layout("nchw")
    assert seen[0] == 1  # reading a site walks nothing


def test_capture_takes_sites_as_they_are_and_stores_what_the_modules_return(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    sites = cam_sites(model, ["features.4", "pool:input"], trace_shapes(model, x[:1]))
    seen = walks(model, monkeypatch)
    with torch.no_grad(), capture(model, sites, grad_layers=sites[:1]) as cap:
        model(x)
        assert seen[0] == 0  # nothing looked up
        assert hook_counts(model) == 3  # a forward hook and a tap on features.4, a pre-hook on pool
    assert hook_counts(model) == 0
    with torch.no_grad():
        expected = model.features[:5](x)
    torch.testing.assert_close(cap.captured.outputs["features.4"][0], expected, rtol=0, atol=0)
    torch.testing.assert_close(cap.captured.taps["features.4"][0], expected, rtol=0, atol=0)
    torch.testing.assert_close(cap.captured.outputs["pool:input"][0], model.features(x), rtol=0, atol=0)
    # A name is resolved on entry, in one walk, and each layer hooked once however often it is given.
    before = seen[0]
    with torch.no_grad(), capture(model, ["features.4", "features.4", sites[0]]) as cap:
        model(x)
    assert seen[0] - before == 1 and len(cap.captured.outputs["features.4"]) == 1


def test_a_vit_token_sequence_site_has_its_patch_grid_and_class_token() -> None:
    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=5
    ).eval()
    nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision starts the head at zero
    calls = trace_shapes(model, torch.zeros(1, 3, 32, 32))
    (site,) = cam_sites(model, ["encoder.layers.encoder_layer_1.ln_1"], calls, "vit")
    assert site.shape == (1, 17, 16) and site.channels == 16
    assert site.layout == Layout("tokens", prefix=1, grid=(4, 4))
    assert site.traced_on == (3, 32, 32)
    # The traced layout holds for the same input at any batch size; tokens from another input are decided
    # from the tensor (their grid is the input's).
    assert site.holds((6, 17, 16), (6, 3, 32, 32))
    assert not site.holds((6, 17, 16), (6, 3, 16, 68))
    # The explain pass given the site draws the map the name gives.
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    by_site = explain(model, x, [site], ["gradcam"], Top(2)).maps[("gradcam", site.name)]
    by_name = explain(model, x, [site.name], ["gradcam"], Top(2)).maps[("gradcam", site.name)]
    assert by_site.shape == (2, 2, 4, 4) and float(by_site.abs().sum()) > 0
    torch.testing.assert_close(by_site, by_name, rtol=0, atol=0)


def test_a_volume_net_site_is_a_channels_first_map_over_depth() -> None:
    torch.manual_seed(0)
    model = VolumeNet().eval()
    calls = trace_shapes(model, torch.zeros(1, 1, 16, 16, 16))
    conv, pooled = cam_sites(model, ["features.5", "pool:input"], calls, "volume")
    assert conv.module is model.features[5] and conv.shape == (1, 16, 8, 8, 8)
    assert conv.layout == Layout("ncthw", time=8)
    assert (pooled.stage, pooled.shape, pooled.layout) == ("input", (1, 16, 8, 8, 8), Layout("ncthw", time=8))
    # A map's layout holds for any input giving the traced shape; another shape is decided from the tensor.
    assert conv.layout_at((3, 16, 8, 8, 8), (3, 1, 16, 16, 16)) is conv.layout
    assert conv.layout_at((1, 16, 4, 8, 8), (1, 1, 8, 16, 16)) == Layout("ncthw", time=4)


class _ChannelsLast(nn.Module):
    """A 3-D convolution whose output is handed on channels last, ``(B, T, H, W, C)`` (as Swin3D's blocks)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(1, 12, 3, padding=1)
        self.last = nn.Identity()
        self.head = nn.Linear(12, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.last(self.conv(x).permute(0, 2, 3, 4, 1))
        return self.head(y.mean(dim=(1, 2, 3)))


def test_a_site_s_channels_are_read_on_its_layout_s_channel_axis() -> None:
    """A 3-D convolution's map ``(N, C, D, H, W)`` has C channels, not W (a non-cubic input: every axis
    differs); a channels-last one ``(N, T, H, W, C)`` (H x W square, as the layout rule takes it) and a ViT's
    tokens ``(N, T, C)`` hold them last, with more tokens than channels and fewer (the cost notes count
    them)."""
    torch.manual_seed(0)
    volume = VolumeNet().eval()
    calls = trace_shapes(volume, torch.zeros(1, 1, 8, 12, 20))
    first, last = cam_sites(volume, ["features.0", "features.5"], calls, "volume")
    assert (first.shape, first.layout.kind if first.layout else None) == ((1, 8, 8, 12, 20), "ncthw")
    assert (first.channels, last.shape, last.channels) == (8, (1, 16, 4, 6, 10), 16)
    swin = _ChannelsLast().eval()
    (site,) = cam_sites(swin, ["last"], trace_shapes(swin, torch.zeros(1, 1, 4, 6, 6)), "swin3d")
    assert (site.shape, site.layout, site.channels) == ((1, 4, 6, 6, 12), Layout("nthwc", time=4), 12)
    for width in (8, 24):  # 17 tokens, fewer channels and more
        vit = VisionTransformer(
            image_size=32,
            patch_size=8,
            num_layers=1,
            num_heads=2,
            hidden_dim=width,
            mlp_dim=16,
            num_classes=3,
        ).eval()
        (tokens,) = cam_sites(
            vit, ["encoder.layers.encoder_layer_0"], trace_shapes(vit, torch.zeros(1, 3, 32, 32)), "vit"
        )
        assert (tokens.shape, tokens.layout, tokens.channels) == (
            (1, 17, width),
            Layout("tokens", 1, (4, 4)),
            width,
        )


def test_a_bad_layer_is_refused_in_one_line_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    model = TinyCNN().eval()
    calls = trace_shapes(model, torch.zeros(1, 3, 48, 48))
    with pytest.raises(LayerError) as caught:
        cam_sites(model, ["features", "featurez.4"], calls, "tiny")
    message = str(caught.value)
    assert message.startswith("no layer 'featurez.4' in tiny; did you mean ") and "\n" not in message
    assert message.endswith("(`hookviz layers --model tiny` lists them)")
    with pytest.raises(LayerError, match=r"^layer 'fc' \(Linear\) outputs shape \(1, 3\), not a"):
        cam_sites(model, ["fc"], calls, "tiny")
    with pytest.raises(LayerError, match=r"^pattern 'fc\*' matches no layer of tiny with a spatial map"):
        cam_sites(model, ["fc*"], calls, "tiny")
    # From Python, the hooks refuse a bad name on entry, and leave nothing on the model.
    refused = r"^no layer 'pool2' in the model; did you mean 'pool'\?$"
    with pytest.raises(LayerError, match=refused), capture(model, ["pool2"]):
        pass
    assert hook_counts(model) == 0
    assert sites_of(model, ["pool"]) == [Site("pool", "pool", "output", model.pool)]
    assert bind(model, [*sites_of(model, ["pool"]), "pool"])[0].runs == -1  # not traced: no shape, no layout


def test_the_cam_job_hands_its_sites_to_the_hooks_and_its_maps_are_the_names_maps(
    trained: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = tiny_loaded(trained.model)
    built = classifier_job(loaded, CamSettings(layers=("features.[48]", "pool:input")), probe(loaded), Top(1))
    job = built.job
    assert [s.name for s in job.sites] == list(job.layers) == ["features.4", "features.8", "pool:input"]
    x = torch.randn(3, 3, 48, 48, generator=torch.Generator().manual_seed(3))
    seen = walks(loaded.model, monkeypatch)
    with_sites = job.compute(x)
    sites_walks = seen[0]
    by_names = dataclasses.replace(job, sites=[]).compute(x)
    # The names walk the model once more per batch (to find their modules); the sites not at all.
    assert seen[0] - sites_walks == sites_walks + 1
    assert with_sites.maps.keys() == by_names.maps.keys()
    for key, value in with_sites.maps.items():
        assert value.std() > 0
        torch.testing.assert_close(value, by_names.maps[key], rtol=0, atol=0)
