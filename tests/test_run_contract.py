"""The run contract: results a script can trust (output identity, manifest rules, scales, stdout, targets,
labels, checkpoints, inputs, messages), each through the CLI as a script would use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from typer.testing import CliRunner

from hookviz import methods as registry
from hookviz.cli import app
from hookviz.engine.explain import explain
from hookviz.io.images import decode_png
from hookviz.models.classes import find_class
from hookviz.models.torchvision import imagenet_categories
from tests.conftest import PATIENCE, ROOT, invoke, records, run_cli, started, write_image

FAST = ["--weights", "none", "--input-size", "64", "--device", "cpu"]


def latest(out: Path) -> dict[str, dict[str, object]]:
    """What a script does with the manifest: the last line per (input, settings key) wins."""
    last: dict[str, dict[str, object]] = {}
    for rec in records(out):
        last[f"{Path(str(rec['input'])).name}|{rec['key']}"] = rec
    return last


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    d = tmp_path / "in"
    d.mkdir()
    write_image(d / "a.jpg", rng.integers(0, 256, (70, 90, 3), dtype=np.uint8))
    write_image(d / "b.png", rng.integers(0, 256, (80, 60, 3), dtype=np.uint8))
    return d


# -- 1. output identity --------------------------------------------------------------------------


def test_two_models_with_the_same_default_layer_name_share_a_folder(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    for model in ("mobilenet_v2", "mobilenet_v3_small"):  # both default to the layer named "features"
        r = invoke("gradcam", str(photos), "--model", model, *FAST, "--out", str(out), "-q")
        assert r.exit_code == 0, r.stderr
    recs = records(out)
    assert len(recs) == 4 and {r["status"] for r in recs} == {"ok"}
    assert {r["layer"] for r in recs} == {"features"}
    outputs = [o for r in recs for o in r["outputs"]]  # type: ignore[union-attr]
    assert len(set(outputs)) == 4 and all(Path(str(o)).exists() for o in outputs)
    assert len({r["key"] for r in recs}) == 2
    for r in recs:
        assert f".{r['model']}.{r['key']}.gradcam.features.png" in str(r["outputs"][0])  # type: ignore[index]


def test_the_key_changes_with_everything_that_changes_the_picture(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    one = photos / "a.jpg"
    sd = tmp_path / "w.pth"
    torch.manual_seed(5)
    torch.save(torchvision.models.resnet18().state_dict(), sd)
    variants = [
        [],
        ["--target", "3"],
        ["--alpha", "0.3"],
        ["--colormap", "turbo"],
        ["--no-relu"],
        ["--method", "layercam"],
        ["--layer", "layer3"],
        ["--resize", "squash"],
        ["--input-size", "96"],
        ["--normalize", "none", "--vmax", "2"],
    ]
    keys = []
    for extra in variants:
        r = invoke("gradcam", str(one), *FAST, *extra, "--out", str(out), "-q", "--json")
        assert r.exit_code == 0, (extra, r.stderr)
        (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
        assert rec["status"] == "ok", (extra, rec)
        keys.append(rec["key"])
    # Other weights: a file's content, not its name, identifies them; --skip-existing must not skip.
    base = ["gradcam", str(one), "--input-size", "64", "--device", "cpu", "--out", str(out), "-q", "--json"]
    r = invoke(*base, "--weights", str(sd), "--skip-existing")
    (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert rec["status"] == "ok" and rec["settings"]["weights"].startswith("sha256:")
    keys.append(rec["key"])
    assert len(set(keys)) == len(keys)
    sd.rename(tmp_path / "renamed.pth")
    r = invoke(*base, "--weights", str(tmp_path / "renamed.pth"))
    (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert rec["status"] == "skipped" and rec["key"] == keys[-1]  # same content, same outputs


# -- 2. manifest semantics -------------------------------------------------------------------------


def test_a_rerun_reports_complete_outputs_as_skipped_with_their_results(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q", "--target", "top3").exit_code == 0
    first = latest(out)
    for extra in ([], ["--skip-existing"]):
        r = invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q", "--target", "top3", *extra)
        assert r.exit_code == 0, r.stderr
        now = latest(out)
        assert now.keys() == first.keys()
        for k, rec in now.items():
            assert rec["status"] == "skipped" and rec["error"] is None
            for field in ("predicted", "target", "outputs", "maps", "box", "settings", "prefix"):
                assert rec[field] == first[k][field], field
    # Without an earlier record (manifest deleted) the results are computed again, nothing is written.
    (out / "manifest.jsonl").unlink()
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*.png")}
    r = invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q", "--target", "top3")
    assert r.exit_code == 0
    for k, rec in latest(out).items():
        assert rec["status"] == "skipped" and rec["predicted"] == first[k]["predicted"]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.png")} == stamps


def test_partial_outputs_need_skip_existing_and_overwrite_conflicts(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["gradcam", str(photos / "a.jpg"), *FAST, "--out", str(out), "-q", "--method", "all"]
    assert invoke(*args).exit_code == 0
    victim = sorted(out.glob("*.layercam.*.png"))[0]
    victim.unlink()
    r = invoke(*args)
    assert r.exit_code == 1
    n = len(registry.parse(["all"])) + 1  # a map per method, and the sheet
    assert f"{n - 1} of {n} outputs exist from an earlier run with these settings" in r.stderr
    assert "--skip-existing to complete them" in r.stderr
    assert invoke(*args, "--skip-existing").exit_code == 0 and victim.exists()
    assert latest(out)[f"a.jpg|{records(out)[-1]['key']}"]["status"] == "ok"
    r = invoke(*args, "--skip-existing", "--overwrite")
    assert r.exit_code == 2 and "contradict each other" in r.stderr


# -- 3. scales -------------------------------------------------------------------------------------


def test_fixed_scale_pictures_do_not_depend_on_the_batch(photos: Path, tmp_path: Path) -> None:
    runs = {
        "alone": [str(photos / "a.jpg"), "-b", "1"],
        "batched": [str(photos / "b.png"), str(photos / "a.jpg"), "-b", "2"],
    }
    pictures = {}
    for name, extra in runs.items():
        out = tmp_path / name
        r = invoke("gradcam", *extra, *FAST, "--normalize", "none", "--vmax", "0.5", "--out", str(out), "-q")
        assert r.exit_code == 0, r.stderr
        (png,) = out.glob("a-*.png")
        pictures[name] = decode_png(png.read_bytes())
    assert np.array_equal(pictures["alone"], pictures["batched"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--normalize", "none"], "--normalize none needs --vmax"),
        (["--vmax", "2"], "--vmax goes with --normalize none (not image)"),
        (["--normalize", "none", "--vmax", "0"], "--vmax 0.0: must be a finite number greater than 0"),
        (["--normalize", "none", "--vmax", "inf"], "--vmax inf: must be a finite number greater than 0"),
        (["--fuse", "mean"], "--fuse combines the maps of several layers: give two or more --layer"),
    ],
)
def test_scale_options_that_cannot_work_are_usage_errors(
    photos: Path, extra: list[str], message: str
) -> None:
    r = invoke("gradcam", str(photos), *FAST, *extra, "--out", str(photos.parent / "o"))
    assert r.exit_code == 2 and f"hookviz: error: {message}" in r.stderr


# -- 4. stdout holds records only ----------------------------------------------------------------

_NOISY = """
import os, sys, warnings
import hookviz.tasks as models
real = models.load_model
def noisy(*a, **k):
    print('Downloading: "https://example.invalid/w.pth" to /tmp/x')
    os.write(1, b"a C library writes here\\n")
    warnings.warn("something a user should know", UserWarning)
    warnings.warn("old API", DeprecationWarning)
    return real(*a, **k)
models.load_model = noisy
from hookviz.cli import main
sys.argv = ["hookviz", *sys.argv[1:]]
main()
"""


def test_json_stdout_holds_records_whatever_a_dependency_prints(photos: Path, tmp_path: Path) -> None:
    r = run_cli(
        [sys.executable, "-c", _NOISY, "gradcam", str(photos), *FAST, "--out", str(tmp_path / "o"), "--json"],
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(json.loads(line)["status"] == "ok" for line in lines)
    assert "Downloading:" in r.stderr and "a C library writes here" in r.stderr
    assert "hookviz: warning: something a user should know" in r.stderr
    assert "UserWarning" not in r.stderr and "old API" not in r.stderr


def test_a_closed_stdout_pipe_ends_the_run_quietly(photos: Path, tmp_path: Path) -> None:
    """`hookviz ... --json | head -c 1`: the reader goes away; exit 141, no traceback, no internal error."""
    with started(
        [
            sys.executable,
            "-m",
            "hookviz",
            "gradcam",
            str(photos),
            *FAST,
            "--out",
            str(tmp_path / "o"),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # nobody reads the records
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=PATIENCE) == 141, err
    assert "Traceback" not in err and "internal error" not in err and "Exception ignored" not in err


# -- 5. targets ------------------------------------------------------------------------------------


def test_class_names_exact_first_then_case_then_unique_partial() -> None:
    names = imagenet_categories()
    assert find_class("cardigan", names) == 474 and find_class("Cardigan", names) == 264
    assert find_class("TABBY", names) == 281 and find_class("persian", names) == 283
    ambiguous = r"'CARDIGAN' is ambiguous: it matches 'Cardigan' \(264\), 'cardigan'"
    with pytest.raises(Exception, match=ambiguous):
        find_class("CARDIGAN", names)
    with pytest.raises(Exception, match=r"'cat' is ambiguous: it matches .*'tiger cat' \(282\)"):
        find_class("cat", names)


def test_one_class_named_twice_is_explained_once(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = invoke("gradcam", str(photos / "a.jpg"), *FAST, "--target", "281,tabby", "--out", str(out), "-q")
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    assert rec["target"]["index"] == 281 and len(rec["maps"]) == 1  # type: ignore[index,arg-type]


def test_top1_explains_the_predicted_class_even_when_scores_tie() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            f = self.conv(x)
            return f.mean(dim=(1, 2, 3))[:, None] * 0 + torch.tensor([0.0, 2.0, 2.0, 2.0, 1.0])

    ex = explain(Tied(), torch.randn(3, 3, 16, 16), ["conv"], ["gradcam"], None)
    assert ex.predicted.tolist() == [1, 1, 1] and ex.targets[:, 0].tolist() == [1, 1, 1]
    ex = explain(Tied(), torch.randn(3, 3, 16, 16), ["conv"], ["gradcam"], "top3")
    assert ex.targets.tolist() == [[1, 2, 3]] * 3 and ex.predicted.tolist() == [1, 1, 1]


# -- 6. labels and 7. checkpoints ----------------------------------------------------------------


@pytest.fixture
def finetuned(tmp_path: Path) -> Path:
    """A resnet18 with a 3-class head, saved as a checkpoint without BatchNorm's step counters."""
    torch.manual_seed(3)
    state = torchvision.models.resnet18(num_classes=3).state_dict()
    state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "ft.pth"
    torch.save({"epoch": 7, "ema": {"module." + k: v for k, v in state.items()}, "optimizer": {}}, path)
    return path


def test_labels_name_the_classes_of_a_finetuned_head(photos: Path, tmp_path: Path, finetuned: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("healthy\nrust\nscab\n")
    out = tmp_path / "o"
    args = ["gradcam", str(photos / "a.jpg"), "--weights", str(finetuned), "--weights-key", "ema"]
    args += ["--input-size", "64", "--out", str(out), "-q", "--labels", str(labels), "--target", "Scab"]
    r = invoke(*args)
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    assert rec["target"] == {**rec["target"], "index": 2, "name": "scab"}  # type: ignore[dict-item]
    assert rec["predicted"]["name"] in ("healthy", "rust", "scab")  # type: ignore[index]
    (tmp_path / "labels.json").write_text(json.dumps(["a", "b", "c", "d"]))
    args[args.index(str(labels))] = str(tmp_path / "labels.json")
    r = invoke(*args)
    assert r.exit_code == 2
    assert "has 4 class names but the head of resnet18 has 3 outputs" in r.stderr


def test_checkpoint_dicts_users_have(photos: Path, tmp_path: Path, finetuned: Path) -> None:
    base = ["gradcam", str(photos / "a.jpg"), "--input-size", "64", "--out", str(tmp_path / "o"), "-q"]
    r = invoke(*base, "--weights", str(finetuned))
    assert r.exit_code == 3
    assert "holds no state_dict" in r.stderr and "'epoch' (int), 'ema' (dict), 'optimizer' (dict)" in r.stderr
    assert "--weights-key KEY" in r.stderr
    r = invoke(*base, "--weights", str(finetuned), "--weights-key", "model_ema")
    assert r.exit_code == 3 and "--weights-key 'model_ema': no key 'model_ema'" in r.stderr


def test_a_torchscript_archive_is_refused_in_one_line(photos: Path, tmp_path: Path) -> None:
    ts = tmp_path / "scripted.pt"
    with pytest.warns(FutureWarning):  # torch.jit.script itself is deprecated
        torch.jit.script(torchvision.models.resnet18()).save(str(ts))
    r = invoke("gradcam", str(photos), "--weights", str(ts), "--out", str(tmp_path / "o"))
    assert r.exit_code == 3
    (line,) = r.stderr.strip().splitlines()
    assert "is a TorchScript archive: Python hooks do not run inside TorchScript" in line


# -- 8. inputs -------------------------------------------------------------------------------------


def test_hidden_files_skipped_and_every_pillow_suffix_accepted(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    rgb = np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    for name in ("x.jfif", "y.jpe", "z.JPG"):
        Image.fromarray(rgb).save(d / name, format="JPEG")
    Image.fromarray(rgb).save(d / "t.tga")
    (d / "._x.jpg").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    write_image(d / ".hidden.png", rgb)
    out = tmp_path / "o"
    r = invoke("gradcam", str(d), *FAST, "--out", str(out), "-q")
    assert r.exit_code == 0, r.stderr
    assert sorted(Path(str(x["input"])).name for x in records(out)) == ["t.tga", "x.jfif", "y.jpe", "z.JPG"]


def test_nul_separated_stdin_and_quoted_paths(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    odd = write_image(d / "new\nline .png", np.zeros((20, 30, 3), np.uint8))
    out = tmp_path / "o"
    missing = str(d / "trailing.jpg ")
    r = invoke("gradcam", "-", "-0", *FAST, "--out", str(out), "-q", input=f"{odd}\0{missing}\0")
    assert r.exit_code == 1
    assert f"hookviz: {missing!r}: no such file or directory" in r.stderr
    assert {x["input"]: x["status"] for x in records(out)} == {str(odd): "ok", missing: "error"}


def test_empty_stdin_and_an_empty_folder_end_the_same_way(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    r1 = invoke("gradcam", "-", *FAST, "--out", str(tmp_path / "o1"), input="")
    r2 = invoke("gradcam", str(tmp_path / "empty"), *FAST, "--out", str(tmp_path / "o2"))
    assert r1.exit_code == r2.exit_code == 1
    assert "hookviz: stdin: no paths were given (empty input)" in r1.stderr
    assert f"hookviz: {str(tmp_path / 'empty')!r}: no images found in this folder" in r2.stderr
    for out in ("o1", "o2"):
        (rec,) = records(tmp_path / out)
        assert rec["status"] == "error"


# -- 9. messages -----------------------------------------------------------------------------------


def test_messages_with_meaning(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "p.png", np.zeros((300, 451, 3), np.uint8))
    r = invoke("gradcam", str(photo), *FAST, "--max-pixels", "1000", "--out", str(tmp_path / "o"))
    assert "451x300 = 135,300 px, over the limit of 1,000 px" in r.stderr
    r = invoke("gradcam", str(photo), *FAST, "--target", "zebraa", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "--target 'zebraa' is not a class of resnet18" in r.stderr
    r = invoke("summary", "--plot", str(tmp_path / "missing" / "x.png"))
    assert r.exit_code == 2 and "does not exist; create it first" in r.stderr
    r = invoke("summary", "--input-size", "1,224,224")
    assert r.exit_code == 2
    assert r.stderr.startswith("hookviz: error: --input-size 1,224,224: resnet18 cannot run on an input")
    assert "internal error" not in r.stderr


# -- 10. CLI polish --------------------------------------------------------------------------------


def test_version_and_help_panels_fit_80_columns() -> None:
    from hookviz import __version__

    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"hookviz {__version__}"
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    for command in ("gradcam", "featuremaps", "gradflow", "dropblock", "summary"):
        r = CliRunner(env=env).invoke(app, [command, "--help"], terminal_width=80)
        assert r.exit_code == 0
        assert max(len(line) for line in r.stdout.splitlines()) <= 80, command
        if command != "summary":
            for panel in ("Model", "Maps", "Output", "Run"):
                assert f"─ {panel} ─" in r.stdout, (command, panel)
    r = CliRunner(env=env).invoke(app, ["gradcam", "--help"], terminal_width=80)
    assert "gradcam|gradcampp" in r.stdout.replace("\n", "").replace("│", "").replace(" ", "")
    assert "<image|batch|none>" in r.stdout


def test_scorecam_says_it_is_slow(photos: Path, tmp_path: Path) -> None:
    r = invoke("gradcam", str(photos / "a.jpg"), *FAST, "--method", "scorecam", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.stderr
    note = (
        "hookviz: note: Score-CAM runs 512 forward passes per image at layer4 "
        "(one masked forward pass per channel)"
    )
    assert note in r.stderr


# -- 12. every command's record carries the crop box and the prediction ----------------------------


@pytest.mark.parametrize("command", ["featuremaps", "gradflow", "dropblock"])
def test_records_carry_the_box_and_the_predicted_class(photos: Path, tmp_path: Path, command: str) -> None:
    out = tmp_path / "o"
    extra = ["--layers", "layer1.0.conv1"] if command == "featuremaps" else []
    r = invoke(command, str(photos / "a.jpg"), *FAST, *extra, "--out", str(out), "-q")
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    # 90x70 photo, --input-size 64: resized side 73, so the crop is 70 * 64 / 73 = 61 px, centred.
    assert rec["box"] == [14, 4, 75, 65]
    pred = rec["predicted"]
    assert (
        isinstance(pred, dict)
        and 0 <= pred["index"] < 1000
        and pred["name"] == imagenet_categories()[pred["index"]]
    )


@pytest.mark.parametrize("side", [1, 3])
def test_tiny_photos_get_readable_captions(tmp_path: Path, side: int) -> None:
    photo = write_image(tmp_path / "tiny.png", np.full((side, side, 3), 200, np.uint8))
    out = tmp_path / "o"
    r = invoke("gradcam", str(photo), *FAST, "--out", str(out), "-q")
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    picture = decode_png(Path(str(rec["outputs"][0])).read_bytes())  # type: ignore[index]
    assert picture.shape[1] >= 128
    # The overlay, enlarged by a whole factor k (nearest neighbour), above the caption band.
    k = picture.shape[1] // side
    assert picture.shape[1] == side * k
    blocks = picture[: side * k].reshape(side, k, side, k, 3).astype(int)
    assert (blocks == blocks[:, :1, :, :1]).all()
    r = invoke("featuremaps", str(photo), *FAST, "--layers", "layer4", "--out", str(out), "-q")
    assert r.exit_code == 0, r.stderr
