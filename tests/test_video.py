"""Video models: a 3D CNN trained here on a shape moving across noise (where and when its maps look), the
files people have (six containers, folders of frames, truncated, empty, long and variable-rate videos), the
run contract on clips, and the Kinetics preprocessing against torchvision's own transform."""

from __future__ import annotations

import fractions
import json
import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hookviz.errors import InputError
from hookviz.io.inputs import Item, clip_items
from hookviz.io.video import VideoPreprocess, plan_clips, probe, read_clip
from tests.conftest import ball_video, evaluation_file, invoke, records
from tests.video_net import CLASSES, FRAMES, SIDE, ShapesVideoNet, moving_shape, normalised, trained

NET = str(Path(__file__).with_name("video_net.py")) + ":ShapesVideoNet"
FPS = 15.0  # the default sampling rate of a model of one's own: every frame is taken


@pytest.fixture(scope="module")
def video_net(tmp_path_factory: pytest.TempPathFactory) -> tuple[ShapesVideoNet, Path]:
    """The 3D CNN of :func:`tests.video_net.trained`, and its weights' file."""
    model = trained()
    path = tmp_path_factory.mktemp("video_net") / "video_net.pt"
    torch.save(model.state_dict(), path)
    return model, path


def test_the_trained_net_tells_the_shapes_apart(video_net: tuple[ShapesVideoNet, Path]) -> None:
    rng = np.random.default_rng(9)
    clips = [moving_shape(rng, i % 3)[0] for i in range(90)]
    with torch.no_grad():
        pred = video_net[0](torch.from_numpy(np.stack([normalised(v) for v in clips]))).argmax(1)
    assert (pred == torch.arange(90) % 3).float().mean() >= 0.9


@pytest.mark.parametrize("method", ["gradcam", "layercam", "eigencam"])
def test_the_map_peak_follows_the_moving_shape(video_net: tuple[ShapesVideoNet, Path], method: str) -> None:
    """In at least 90 % of the frames (measured: 100 %), the map's peak, upsampled in time and space, lies
    on the shape (its box, 1 px of margin: 14x14 of 32x32, chance 19 %)."""
    from hookviz.engine.explain import explain

    rng = np.random.default_rng(5)
    made = [moving_shape(rng, i % 2) for i in range(30)]
    x = torch.from_numpy(np.stack([normalised(v) for v, _ in made]))
    ex = explain(video_net[0], x, ["features"], [method])
    maps = ex.maps[(method, "features")]
    assert maps.shape == (30, 1, FRAMES, SIDE // 2, SIDE // 2)
    up = F.interpolate(maps[:, :1], size=(FRAMES, SIDE, SIDE), mode="trilinear")[:, 0]
    hits = 0
    for i, (_, boxes) in enumerate(made):
        for k, box in enumerate(boxes):
            assert box is not None
            y, xx = divmod(int(up[i, k].argmax()), SIDE)
            hits += box[0] - 1 <= xx < box[2] + 1 and box[1] - 1 <= y < box[3] + 1
    assert hits / (30 * FRAMES) >= 0.9


@pytest.mark.parametrize("visible", [range(0, 4), range(4, 8), range(2, 5)])
def test_the_map_mass_falls_in_the_frames_that_show_the_shape(
    video_net: tuple[ShapesVideoNet, Path], visible: range
) -> None:
    """A shape shown in some frames only: Grad-CAM's mass over time lies in those frames (measured 0.86,
    0.91 and 0.71 of it, where an even spread would give 0.5, 0.5 and 0.375)."""
    from hookviz.engine.explain import explain

    rng = np.random.default_rng(11)
    x = torch.from_numpy(
        np.stack([normalised(moving_shape(rng, i % 2, visible=visible)[0]) for i in range(12)])
    )
    maps = explain(video_net[0], x, ["features"], ["gradcam"]).maps[("gradcam", "features")][:, 0]
    mass = maps.clamp_min(0).sum(dim=(2, 3))
    share = mass[:, list(visible)].sum(1) / mass.sum(1)
    even = len(visible) / FRAMES
    assert float(share.min()) >= even + 0.15 and float(share.mean()) >= even + 0.25


def _write(path: Path, frames: np.ndarray, fps: float = FPS) -> Path:
    """RGB frames as a video file in the container its suffix names (an animated GIF, a folder of PNGs
    named f1.png ... f24.png, or OpenCV's writer with a codec that container takes)."""
    if path.suffix == ".gif":
        from PIL import Image

        images = [Image.fromarray(f) for f in frames]
        images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
        return path
    if path.suffix == "":
        path.mkdir()
        for k, f in enumerate(frames, start=1):  # natural order: f2 before f10
            cv2.imwrite(str(path / f"f{k}.png"), cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
        return path
    codec = {".avi": "MJPG", ".webm": "VP80"}.get(path.suffix, "mp4v")
    h, w = frames.shape[1:3]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*codec), fps, (w, h))
    assert writer.isOpened(), path
    for f in frames:
        writer.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
    writer.release()
    return path


CONTAINERS = [".mp4", ".avi", ".mov", ".mkv", ".webm", ".gif", ""]


def test_gradcam_on_a_folder_of_videos_from_the_cli(
    video_net: tuple[ShapesVideoNet, Path], tmp_path: Path
) -> None:
    """Six containers and a folder of frames, two clips each: every clip is decoded, predicted right, and
    gets a playable WebM of its 8 frames, a contact sheet, raw arrays and a record with its span; each video
    a whole-video record; a second run skips everything."""
    _, weights = video_net
    rng = np.random.default_rng(3)
    videos = tmp_path / "videos"
    videos.mkdir()
    truth = {}
    for n, suffix in enumerate(CONTAINERS):
        label = n % 2
        video = np.concatenate([moving_shape(rng, label, frames=12)[0] for _ in range(2)])  # 24 frames
        truth[str(_write(videos / f"clip{n}{suffix}", video))] = label
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(CLASSES) + "\n")
    out = tmp_path / "out"
    args = ["gradcam", str(videos), "--model", NET, "--weights", str(weights), "--labels", str(labels),
            "--input-size", str(SIDE), "--resize", "squash", "--clip-len", "8", "--clips", "2",
            "--layer", "features", "--save-raw", "--out", str(out)]  # fmt: skip
    res = invoke(*args, "--json")
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.stdout.splitlines()]
    clips = [r for r in recs if "clip" in r]
    whole = [r for r in recs if "video" in r]
    assert len(clips) == 2 * len(CONTAINERS) and len(whole) == len(CONTAINERS)
    for r in clips:
        assert r["status"] == "ok", r
        assert r["predicted"]["index"] == truth[r["input"]], r["input"]
        clip = r["clip"]
        assert (
            clip["of"] == 2
            and len(clip["indices"]) == 8
            and clip["frames"] == [clip["indices"][0], clip["indices"][-1]]
        )
        if Path(r["input"]).is_dir():
            assert clip["seconds"] is None
        else:  # the frames' own times: index / the file's rate (a GIF's is 1 / 0.06 s: centiseconds)
            fps = probe(Path(r["input"])).fps
            assert fps is not None and abs(fps - FPS) < 2
            assert clip["seconds"] == pytest.approx(
                [clip["frames"][0] / fps, clip["frames"][1] / fps], abs=0.011
            )
        (m,) = r["maps"]
        assert m["shape"] == [FRAMES, SIDE // 2, SIDE // 2] and sum(m["time_mass"]) == pytest.approx(
            1, abs=1e-3
        )
        webm = next(Path(o) for o in r["outputs"] if o.endswith(".webm"))
        cap = cv2.VideoCapture(str(webm))
        decoded = 0
        while cap.read()[0]:
            decoded += 1
        assert decoded == 8 and cap.get(cv2.CAP_PROP_FRAME_WIDTH) >= SIDE
        raw = np.load(next(o for o in r["outputs"] if o.endswith(".gradcam.features.npy")))
        full = np.load(next(o for o in r["outputs"] if o.endswith(".full.npy")))
        assert raw.shape == (FRAMES, SIDE // 2, SIDE // 2) and full.shape == (8, SIDE, SIDE)
        assert any(o.endswith(".frames.png") for o in r["outputs"])
    for r in whole:
        assert r["video"]["index"] == truth[r["input"]] and r["video"]["clips"] == 2
    # The run contract: the same command again writes nothing and skips every clip.
    again = invoke(*args, "--json")
    assert again.exit_code == 0
    statuses = [json.loads(line)["status"] for line in again.stdout.splitlines()]
    assert statuses == ["skipped"] * len(clips)


def test_a_bad_video_is_one_error_and_the_others_go_on(
    video_net: tuple[ShapesVideoNet, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A truncated file, an empty one, a text file named .mp4 and a photo: one line each; the good video's
    clips are done; exit code 1."""
    _, weights = video_net
    rng = np.random.default_rng(4)
    good = _write(tmp_path / "good.mp4", moving_shape(rng, 0, frames=16)[0])
    long = np.concatenate([moving_shape(rng, 1, frames=8)[0] for _ in range(8)])
    cut = _write(tmp_path / "cut.avi", long)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size * 2 // 5])
    empty = tmp_path / "empty.mp4"
    writer = cv2.VideoWriter(str(empty), cv2.VideoWriter.fourcc(*"mp4v"), FPS, (SIDE, SIDE))
    writer.release()
    (tmp_path / "notes.mp4").write_text("not a video")
    cv2.imwrite(str(tmp_path / "photo.png"), np.zeros((SIDE, SIDE, 3), np.uint8))
    out = tmp_path / "out"
    names = [str(good), str(cut), str(empty), str(tmp_path / "notes.mp4"), str(tmp_path / "photo.png")]
    res = invoke("gradcam", *names, "--model", NET, "--weights", str(weights), "--input-size", str(SIDE),
                 "--resize", "squash", "--clip-len", "8", "--clips", "all", "--out", str(out))  # fmt: skip
    assert res.exit_code == 1, res.output
    recs = records(out)
    ok = [r for r in recs if r["status"] == "ok" and "clip" in r]
    assert {r["input"] for r in ok} >= {str(good)}
    errors = {r["input"]: r["error"] for r in recs if r["status"] == "error"}
    assert any(w in errors[str(empty)] for w in ("no frames", "cannot open", "damaged or truncated"))
    assert "cannot open as a video" in errors[str(tmp_path / "notes.mp4")]
    assert "a photo, and the model takes videos" in errors[str(tmp_path / "photo.png")]
    # The cut file: its readable clips are done, a clip past the cut is an error naming the truncation.
    cut_recs = [r for r in recs if r["input"] == str(cut)]
    assert cut_recs and all(
        r["status"] == "ok" or "truncated" in r["error"] or "no frames" in r["error"] for r in cut_recs
    )
    for line in res.stderr.splitlines():
        assert line.startswith("hookviz:"), line
    assert "FFMPEG" not in capfd.readouterr().err  # no FFmpeg or OpenCV chatter reaches the user


def test_a_long_video_is_read_clip_by_clip_in_bounded_memory(tmp_path: Path) -> None:
    """A 2400-frame video (22 MB decoded): reading its clips holds one clip's frames at a time (the measured
    peak stays under a tenth of the decoded video), and each clip gets the frames its indices name."""
    path = tmp_path / "long.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 30.0, (64, 48))
    for k in range(2400):  # frame k is grey (7 k) mod 256: which frame a clip got shows in its pixels
        writer.write(np.full((48, 64, 3), 7 * k % 256, np.uint8))
    writer.release()
    p = VideoPreprocess(clip_len=16, resize=(48, 64), crop=48, clips=None)
    info = probe(path)
    assert info.frames == 2400 and not info.sequential
    clips = plan_clips(info, p)
    assert len(clips) == 1200 // 16  # every clip, back to back, at 15 of the 30 frames per second
    tracemalloc.start()
    try:
        for clip in clips[:: len(clips) // 6]:
            frames, times = read_clip(path, clip, info)
            assert frames.shape == (16, 48, 64, 3)
            assert times[0] == pytest.approx(clip.indices[0] / 30, abs=0.02)
            got = frames[:, 24, 32, 1].astype(int)
            assert np.abs(got - np.asarray(clip.indices) * 7 % 256).max() <= 3
            del frames
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2400 * 48 * 64 * 3 / 10, peak


def test_a_variable_frame_rate_video_keeps_its_own_times(tmp_path: Path) -> None:
    """Frames at irregular times (PyAV writes the timestamps): the container's guessed frame count is not
    trusted, clips are read from the start, and each frame's time is the one in the file."""
    import av  # the dev extra has it: it writes the timestamps OpenCV cannot

    path = tmp_path / "vfr.mkv"
    times_ms = [0, 50, 100, 150, 200, 400, 600, 800, 1000, 1033, 1066, 1100]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for k, ms in enumerate(times_ms):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), k * 20, np.uint8), format="rgb24")
            frame.pts, frame.time_base = ms, fractions.Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    info = probe(path)
    assert info.frames == len(times_ms) and info.sequential
    (clip,) = plan_clips(info, VideoPreprocess(clip_len=6, frame_stride=2, clips=1))
    frames, times = read_clip(path, clip, info)
    assert list(clip.indices) == [0, 2, 4, 6, 8, 10]
    assert [round(f[0, 0, 0] / 20) for f in frames] == [0, 2, 4, 6, 8, 10]  # the frames the indices name
    assert times == pytest.approx([times_ms[i] / 1000 for i in clip.indices], abs=0.02)
    # Sampled by frame index: this clip spans a second where its rate says a third; its record says so.
    from hookviz.jobs.video import _uneven

    assert info.fps is not None
    assert "the file's frame rate varies" in _uneven(list(clip.indices), times, info.fps / 2)["sampling"]


def test_clip_sampling_follows_the_weights_and_the_options() -> None:
    """r3d_18's weights: 16 frames at 15 fps, 5 clips evenly spaced from the first to the last; one clip: the
    middle one; --clips all: back to back; a video shorter than a clip: one clip of repeated frames."""
    from hookviz.io.video import VideoInfo
    from hookviz.tasks import load_model

    p = load_model("r3d_18", "none").video
    assert p is not None and (p.clip_len, p.frame_rate, p.clips, p.resize, p.crop) == (
        16,
        15.0,
        5,
        (128, 171),
        112,
    )
    info = VideoInfo(300, 30.0, 320, 240)
    clips = plan_clips(info, p)
    assert len(clips) == 5 and all(np.diff(c.indices).tolist() == [2] * 15 for c in clips)
    starts = [c.indices[0] for c in clips]  # 150 resampled frames, starts 0 .. 134: as UniformClipSampler
    assert starts == [2 * round(v) for v in np.linspace(0, 150 - 16, 5)] and clips[-1].indices[-1] == 298
    (middle,) = plan_clips(info, p.sampled(clips=1))
    assert middle.indices[0] == 2 * ((150 - 16) // 2)
    every = plan_clips(info, p.sampled(clips="all", frame_stride=1))
    assert [c.indices[0] for c in every] == list(range(0, 300 - 15, 16))
    (short,) = plan_clips(VideoInfo(5, 30.0, 320, 240), p)
    assert len(short.indices) == 16 and short.indices[0] == 0 and short.indices[-1] == 4


@pytest.mark.parametrize("name", ["r3d_18", "mvit_v1_b", "s3d"])
def test_the_clip_preprocessing_equals_torchvision_s_transform(name: str) -> None:
    """Pixel for pixel the weights' own ``VideoClassification`` (fixed 128x171 resize, shorter side 256,
    squashed 256x256), and the crop's box on the frame."""
    import torchvision

    from hookviz.models.torchvision import video_preprocess

    weights = torchvision.models.get_model_weights(name).DEFAULT
    frames = np.random.default_rng(0).integers(0, 256, (4, 240, 320, 3), dtype=np.uint8)
    ours, box = video_preprocess(weights)(frames)
    theirs = weights.transforms()(torch.from_numpy(frames).permute(0, 3, 1, 2))
    assert ours.shape == tuple(theirs.shape)
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-5)
    # The crop's place on the 320x240 frame: centred, its side the crop over the resize's scale.
    resize = [int(v) for v in weights.transforms().resize_size]
    crop = int(weights.transforms().crop_size[0])
    sy = 240 / resize[0]
    sx = 320 / (resize[1] if len(resize) == 2 else int(resize[0] * 320 / 240))
    assert abs(box.height - crop * sy) <= 1 and abs(box.width - crop * sx) <= 1
    assert abs(box.x0 + box.x1 - 320) <= 2 and abs(box.y0 + box.y1 - 240) <= 2  # half a pixel off centre


def test_video_options_are_refused_for_a_photo_model_and_pixel_methods_for_a_video_model(
    tmp_path: Path,
) -> None:
    photo = tmp_path / "p.png"
    cv2.imwrite(str(photo), np.zeros((32, 32, 3), np.uint8))
    res = invoke(
        "gradcam",
        str(photo),
        "--model",
        "resnet18",
        "--weights",
        "none",
        "--clips",
        "3",
        "--out",
        str(tmp_path / "o"),
    )
    assert res.exit_code == 2 and "--clips is for video models" in res.stderr
    clip = _write(tmp_path / "v.mp4", np.zeros((8, 32, 32, 3), np.uint8))
    res = invoke(
        "gradcam",
        str(clip),
        "--model",
        NET,
        "--weights",
        "none",
        "--method",
        "scorecam",
        "--out",
        str(tmp_path / "o"),
    )
    assert res.exit_code == 2 and "does not apply to a video model" in res.stderr


def test_clip_items_say_why_a_video_cannot_be_read(tmp_path: Path) -> None:
    p = VideoPreprocess(clip_len=4, clips=2)
    (tmp_path / "bad.webm").write_bytes(b"\x1aE\xdf\xa3 broken")
    (empty := tmp_path / "frames").mkdir()
    items = list(clip_items([Item("bad.webm", tmp_path / "bad.webm"), Item("frames", empty)], p))
    assert [i.path for i in items] == [None, None]
    assert "damaged or truncated" in str(items[0].error) and "no image files" in str(items[1].error)
    with pytest.raises(InputError, match="no such file"):
        probe(tmp_path / "missing.mp4")


class _ChannelsLast(torch.nn.Module):
    """A Swin3D-like tail: a block whose output is channels-last ``(B, T, H, W, C)``, then global pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 6, 3, stride=(1, 2, 2), padding=1)
        self.norm = torch.nn.LayerNorm(6)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.conv(x).permute(0, 2, 3, 4, 1))  # (B, T, H, W, C)
        return self.head(y.mean(dim=(1, 2, 3)))


@pytest.mark.parametrize("kind", ["ncthw", "nthwc"])
def test_grad_cam_over_time_equals_its_formula(kind: str) -> None:
    """Grad-CAM and HiResCAM on a 5-D layer equal the papers' formulas computed here from hooks, time step
    by time step: weights = gradients averaged over T x H x W, map = ReLU(sum_k w_k A^k) (HiResCAM:
    element-wise)."""
    from hookviz.engine.explain import explain

    torch.manual_seed(0)
    model = (ShapesVideoNet() if kind == "ncthw" else _ChannelsLast()).eval()
    layer = "features" if kind == "ncthw" else "norm"
    x = torch.randn(2, 3, 6, 16, 16)
    got: dict[str, torch.Tensor] = {}
    handle = dict(model.named_modules())[layer].register_forward_hook(lambda m, a, out: got.update(a=out))
    logits = model(x)
    handle.remove()
    top = logits.argmax(1)
    (g,) = torch.autograd.grad(logits.gather(1, top[:, None]).sum(), got["a"])
    a = got["a"].detach()
    if kind == "nthwc":
        a, g = a.permute(0, 4, 1, 2, 3), g.permute(0, 4, 1, 2, 3)
    expected = {
        "gradcam": torch.relu((g.mean(dim=(2, 3, 4), keepdim=True) * a).sum(1)),
        "hirescam": torch.relu((g * a).sum(1)),
    }
    ex = explain(model, x, [layer], ["gradcam", "hirescam"])
    for method, want in expected.items():
        torch.testing.assert_close(ex.maps[(method, layer)][:, 0], want, rtol=1e-4, atol=1e-6)


def test_evaluate_and_sanity_on_a_trained_video_model(
    video_net: tuple[ShapesVideoNet, Path], tmp_path: Path
) -> None:
    """evaluate: deleting Grad-CAM's voxels first drops the class faster than deleting random ones (a lower
    deletion AUC by over 0.1); sanity: randomising the network changes Grad-CAM's map over time while the
    edge-map control stays the same."""
    _, weights = video_net
    rng = np.random.default_rng(21)
    folder = tmp_path / "videos"
    folder.mkdir()
    for n in range(6):
        _write(folder / f"v{n}.mp4", moving_shape(rng, n % 2, frames=8)[0])
    common = ["--model", NET, "--weights", str(weights), "--input-size", str(SIDE), "--resize", "squash",
              "--clip-len", "8", "--clips", "1", "--layer", "features"]  # fmt: skip
    families = "faithfulness,complexity,robustness,randomisation"  # what applies to clips
    res = invoke("evaluate", str(folder), *common, "--metric", families, "--robust-samples", "2",
                 "--out", str(tmp_path / "ev"))  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = {r["method"]: r for r in json.loads(evaluation_file(tmp_path / "ev").read_text())["rows"]}
    assert rows["gradcam"]["images"] == 6 and rows["gradcam"]["max_sensitivity"] >= 0
    assert rows["gradcam"]["random_logit"] < rows["center"]["random_logit"] == 1.0
    refused = invoke("evaluate", str(folder), *common, "--metric", "road", "--out", str(tmp_path / "r"))
    assert refused.exit_code == 2 and "on a video model's clips use faithfulness" in refused.output
    assert rows["gradcam"]["deletion_auc"] < rows["random"]["deletion_auc"] - 0.1, rows
    res = invoke("sanity", str(folder), *common, "--out", str(tmp_path / "san"))
    assert res.exit_code == 0, res.output
    steps = json.loads((tmp_path / "san" / "sanity.json").read_text())["steps"]
    last = {s["method"]: s for s in steps if s["randomized_up_to"] == steps[-1]["randomized_up_to"]}
    assert last["gradcam"]["spearman"] < 0.6 and last["edges"]["spearman"] == pytest.approx(1.0)


def test_explain_videos_from_the_library(video_net: tuple[ShapesVideoNet, Path], tmp_path: Path) -> None:
    """The library call behind the CLI: a folder of videos in, overlay videos, contact sheets and records out
    (the whole-video record names the class every clip explained)."""
    import dataclasses

    from hookviz import explain_videos, load_model
    from hookviz.jobs.settings import CamSettings

    _, weights = video_net
    rng = np.random.default_rng(8)
    (folder := tmp_path / "videos").mkdir()
    for n in range(2):
        _write(folder / f"v{n}.avi", moving_shape(rng, n, frames=10)[0])
    loaded = load_model(NET, str(weights), input_size=SIDE, resize="squash", labels=list(CLASSES))
    assert loaded.video is not None
    loaded = dataclasses.replace(loaded, inputs=loaded.video.sampled(clip_len=8, clips=1))
    recs = explain_videos(loaded, folder, tmp_path / "out", CamSettings(target="cross"))
    clips, whole = [r for r in recs if "clip" in r], [r for r in recs if "video" in r]
    assert len(clips) == 2 and len(whole) == 2
    assert [r["predicted"]["name"] for r in clips] == ["square", "cross"]
    assert all(w["video"]["target"]["name"] == "cross" for w in whole)
    assert all(Path(o).exists() for r in clips for o in r["outputs"])
    assert {Path(o).suffix for r in clips for o in r["outputs"]} == {".webm", ".png"}
    with pytest.raises(Exception, match="takes photos"):
        explain_videos(load_model("resnet18", "none"), folder, tmp_path / "o2")


def test_gradflow_runs_on_clips_and_dropblock_is_refused_in_one_line(tmp_path: Path) -> None:
    clip = ball_video(tmp_path / "ball.mp4", frames=12, size=(40, 32))
    common = ["--model", NET, "--weights", "none", "--input-size", str(SIDE), "--resize", "squash"]
    res = invoke("gradflow", str(clip), *common, "--out", str(tmp_path / "gf"), "--json")
    assert res.exit_code == 0, res.output
    assert any(o.endswith(".clip01.gradflow.png") for o in json.loads(res.stdout.splitlines()[0])["outputs"])
    res = invoke("dropblock", str(clip), *common, "--out", str(tmp_path / "db"))
    assert res.exit_code == 2 and "a video model's (B, C, T, H, W)" in res.stderr


def test_a_truncated_mp4_is_called_damaged(tmp_path: Path) -> None:
    import cv2

    from hookviz.errors import InputError
    from hookviz.io.video import probe

    path = tmp_path / "v.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), 10, (32, 32))
    for k in range(20):
        writer.write(np.full((32, 32, 3), k * 10, np.uint8))
    writer.release()
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(InputError, match="damaged or truncated"):
        probe(path)
    (tmp_path / "t.mp4").write_text("not a video")
    with pytest.raises(InputError, match="not a video file"):
        probe(tmp_path / "t.mp4")


def test_a_clip_of_a_variable_rate_file_says_its_span_differs() -> None:
    from hookviz.jobs.video import _uneven

    assert _uneven([0, 1, 2, 3], [0.0, 0.1, 0.2, 0.3], 10.0) == {}
    note = _uneven([0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0], 10.0)
    assert "frame rate varies" in note["sampling"] and "3.00 s" in note["sampling"]
