"""Every command through CliRunner (success, usage error, hookviz error), plus real subprocess runs."""

from __future__ import annotations

import inspect
import itertools
import json
import os
import shutil
import sys
import typing
import urllib.error
from pathlib import Path
from typing import Annotated

import numpy as np
import pytest
import torch
from PIL import Image

from hookviz.cli.options import RunOptions, grouped, omit, told
from tests.conftest import ROOT, SAMPLES, invoke, picture, records, run_cli, write_image

FAST = ["--model", "resnet18", "--weights", "none", "--input-size", "64", "--device", "cpu"]


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    d = tmp_path / "in"
    d.mkdir()
    write_image(d / "wide.jpg", rng.integers(0, 256, (60, 100, 3), dtype=np.uint8))
    write_image(d / "tall.png", rng.integers(0, 256, (90, 50, 3), dtype=np.uint8))
    return d


def test_gradcam_writes_overlays_at_the_original_size_and_a_manifest(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke("gradcam", str(photos), *FAST, "--out", str(out), "--save-raw", "--target", "281")
    assert r.exit_code == 0, r.stderr
    assert "using layer layer4 (the default for resnet18" in r.stderr and "RANDOM weights" in r.stderr
    recs = records(out)
    assert [Path(str(x["input"])).name for x in recs] == ["tall.png", "wide.jpg"]
    for rec in recs:
        assert rec["status"] == "ok" and rec["model"] == "resnet18" and rec["weights"] == "none (random init)"
        assert rec["layer"] == "layer4" and rec["target"]["index"] == 281 and rec["target"]["name"] == "tabby"
        png, npy, full = map(Path, rec["outputs"])
        with Image.open(str(rec["input"])) as src_img:
            src = src_img.size
        with Image.open(png) as im:
            k = -(-128 // src[0])  # photos under 128 px wide are enlarged by a whole factor
            assert im.width == src[0] * k and im.height > src[1] * k  # the photo plus a caption band
        assert np.load(npy).shape == (2, 2)
        full_map = np.load(full)
        assert full_map.shape == (src[1], src[0])
        x0, y0, x1, y1 = rec["box"]
        assert np.isnan(full_map).sum() == src[0] * src[1] - (x1 - x0) * (y1 - y0)
        assert str(png) in r.stdout


def test_one_bad_input_does_not_stop_the_others(photos: Path, tmp_path: Path) -> None:
    (photos / "broken.png").write_text("not a png")
    out = tmp_path / "out"
    r = invoke("gradcam", str(photos), str(photos / "missing.jpg"), *FAST, "--out", str(out), "-q")
    assert r.exit_code == 1
    err = r.stderr.strip().splitlines()
    assert any("broken.png': not an image file" in e for e in err)
    assert any("missing.jpg': no such file or directory" in e for e in err)
    assert "Traceback" not in r.stderr
    status = {Path(str(x["input"])).name: x["status"] for x in records(out)}
    assert status == {"broken.png": "error", "tall.png": "ok", "wide.jpg": "ok", "missing.jpg": "error"}


def test_existing_outputs_are_kept_unless_asked(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q").exit_code == 0
    first = {p: p.stat().st_mtime_ns for p in out.glob("*.png")}
    r = invoke("gradcam", str(photos), *FAST, "--out", str(out), "--json")
    assert r.exit_code == 0, r.stderr
    assert [json.loads(line)["status"] for line in r.stdout.splitlines()] == ["skipped", "skipped"]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.png")} == first
    r = invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q", "--overwrite")
    assert r.exit_code == 0
    assert all(p.stat().st_mtime_ns != t for p, t in first.items())  # rewritten, same names
    assert set(out.glob("*.png")) == set(first)


def test_stdin_and_json(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke(
        "gradcam", "-", *FAST, "--out", str(out), "--json", "-q", input=f"{photos / 'wide.jpg'}\r\n\r\n"
    )
    assert r.exit_code == 0, r.stderr
    (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert rec["status"] == "ok" and rec["predicted"]["score"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer", "fc"], "layer 'fc' (Linear) outputs shape (1, 1000), not a (B, C, H, W) feature map"),
        (["--layer", "layer9"], "no layer 'layer9' in resnet18; did you mean 'layer4'"),
        (["--layer", "layer1.0.relu"], "runs 2 times per forward pass"),
        (["--layer", "avgpool"], "layer 'avgpool' (AdaptiveAvgPool2d) outputs shape (1, 512, 1, 1)"),
        (["--target", "1000"], "--target 1000 is out of range: resnet18 has classes 0..999"),
        (["--target", "tabbby"], "did you mean 'tabby'"),
        (["--model", "resnet19"], "unknown model 'resnet19'; did you mean 'resnet18'"),
    ],
)
def test_bad_option_values_exit_2_with_one_clear_line(
    photos: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    base = FAST[2:] if "--model" in args else FAST
    r = invoke("gradcam", str(photos), *base, *args, "--out", str(tmp_path / "o"))
    assert r.exit_code == 2, r.stderr
    assert message in r.stderr
    assert r.stderr.startswith("hookviz: error: "), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gradcam", "P", "--batch-size", "0"], "Invalid value for '--batch-size'"),
        (["gradcam", "P", "--colormap", "rainbowish"], "Invalid value for '--colormap'"),
        (["featuremaps", "P", "--stage", "middle"], "Invalid value for '--stage'"),
        (["trust", "P", "--max-photos", "0"], "greater than or equal to 2 (see hookviz trust -h)"),
        (["gradcam", "P", "--input-size", "abc"], "'abc': give one side (224)"),
        (["gradcam", "P", "--bogus"], "No such option: --bogus (see hookviz gradcam -h)"),
        (["gradcam", "P", "--methd", "x"], "No such option: --methd; did you mean --method? (see"),
        (["gradcm", "P"], "No such command 'gradcm'. Did you mean 'gradcam'? (see hookviz -h)"),
    ],
)
def test_option_parser_errors_are_one_line_and_exit_2(
    photos: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """The parser's own errors read like every other error: one line, not a framed box (the docs promise one
    line); the installed script and the warm server run the command line through the same function."""
    import typer

    from hookviz.cli import app
    from hookviz.cli.app import run_line
    from hookviz.cli.serve import CliHost

    argv = [str(photos) if a == "P" else a for a in args]
    assert run_line(typer.main.get_command(app), argv) == 2
    host = CliHost()
    host.command = typer.main.get_command(app)
    assert host.run(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 2 and len(set(err.splitlines())) == 1, err
    assert err.startswith("hookviz: error: ") and message in err, err


def test_the_installed_script_says_a_usage_error_in_one_line_and_hookviz_alone_shows_the_help() -> None:
    exe = shutil.which("hookviz", path=str(Path(sys.executable).parent)) or shutil.which("hookviz")
    assert exe, "the hookviz console script is not installed"
    bad = run_cli([exe, "gradcam", "x", "--no-server", "--method", "nosuch"])
    assert bad.returncode == 2 and bad.stdout == "", bad.stderr
    assert bad.stderr.startswith("hookviz: error: Invalid value for '--method': 'nosuch' is not one of")
    assert len(bad.stderr.splitlines()) == 1, bad.stderr
    bare = run_cli([sys.executable, "-m", "hookviz", "--no-server"], cwd=ROOT)
    assert bare.returncode == 2 and "Usage: hookviz [OPTIONS] COMMAND" in bare.stdout + bare.stderr
    assert "gradcam" in bare.stdout + bare.stderr and "error" not in bare.stderr


def test_cuda_without_cuda_is_a_usage_error(photos: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = invoke("gradcam", str(photos), "--weights", "none", "--device", "cuda")
    assert r.exit_code == 2 and "CUDA is not available on this machine; use --device cpu" in r.stderr


def test_unavailable_weights_exit_3_naming_the_alternatives(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("offline")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    r = invoke("gradcam", str(photos), "--out", str(tmp_path / "o"))
    assert r.exit_code == 3
    assert "cannot get the pretrained weights for resnet18" in r.stderr
    assert "--weights PATH" in r.stderr and "--weights none" in r.stderr


def test_out_that_is_a_file_or_an_input_folder(photos: Path, tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("keep me")
    r = invoke("gradcam", str(photos), *FAST, "--out", str(f))
    assert r.exit_code == 3 and "is a file, not a folder" in r.stderr and f.read_text() == "keep me"
    r = invoke("gradcam", str(photos), *FAST, "--out", str(photos))
    assert r.exit_code == 2 and "is also an input folder" in r.stderr


def test_featuremaps_grids(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke(
        "featuremaps",
        str(photos / "wide.jpg"),
        *FAST,
        "--layers",
        "layer1.0.conv1",
        "--layers",
        "layer2.*.conv2",
        "--stage",
        "both",
        "--max-channels",
        "16",
        "--out",
        str(out),
    )
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    names = sorted(Path(p).name.split(".featuremap.")[1] for p in rec["outputs"])
    assert names == [
        f"{layer}.{s}.png"
        for layer in ("layer1.0.conv1", "layer2.0.conv2", "layer2.1.conv2")
        for s in ("input", "output")
    ]
    assert all(len(m["channels"]) == 16 for m in rec["maps"])
    r = invoke("featuremaps", str(photos / "wide.jpg"), *FAST, "--layers", "fc", "--out", str(out))
    assert r.exit_code == 2 and "not a feature map" in r.stderr


def test_featuremaps_default_is_every_conv(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke("featuremaps", str(photos / "tall.png"), *FAST, "--out", str(out), "-q")
    assert r.exit_code == 0
    assert len(list(out.glob("*.png"))) == 20  # resnet18 has 20 Conv2d


def test_layers_and_models() -> None:
    r = invoke("layers", "--model", "resnet18", "--depth", "1")
    assert r.exit_code == 0
    line = next(line for line in r.stdout.splitlines() if line.startswith("layer4 "))
    assert "Sequential" in line and "1x512x7x7" in line and "default Grad-CAM layer" in line
    assert "layer4.0" not in r.stdout
    r = invoke("models")
    assert r.exit_code == 0 and "resnet18" in r.stdout.split()


def test_every_command_has_help() -> None:
    for command in ("gradcam", "featuremaps", "layers", "models"):
        r = invoke(command, "--help")
        assert r.exit_code == 0 and len(r.stdout) > 100


def test_out_s_help_promises_a_manifest_only_where_one_is_written(photos: Path, tmp_path: Path) -> None:
    """visualize and tcav write a record of their own, no manifest.jsonl: their --out says what goes there
    (it said "manifest.jsonl is appended there", as the per-input commands' does); a group's option told anew
    for one command is that command's only."""
    for command, written in (
        ("visualize", "visualize.*.json"),
        ("tcav", "tcav.KEY.json"),
        ("gradcam", "manifest"),
    ):
        page = " ".join(w for w in invoke(command, "--help").stdout.split() if w != "│")
        assert ("manifest.jsonl is appended there" in page) == (command == "gradcam"), page
        assert written in page
    out = tmp_path / "v"
    r = invoke(
        "visualize", *FAST[:4], "--layer", "layer4", "--channel", "1", "--steps", "2", "--out", str(out)
    )
    assert r.exit_code == 0, r.stderr
    assert sorted(p.suffix for p in out.iterdir()) == [".json", ".png"]  # no manifest.jsonl
    with pytest.raises(TypeError, match="not fields of RunOptions"):
        grouped(_told_wrong)
    (out_param,) = [p for p in inspect.signature(grouped(_told_out)).parameters.values() if p.name == "out"]
    (info,) = [a for a in typing.get_args(out_param.annotation)[1:] if hasattr(a, "help")]
    (shared,) = typing.get_args(typing.get_type_hints(RunOptions, include_extras=True)["out"])[1:]
    assert info.help == "here." and shared.help == "output folder; manifest.jsonl is appended there."


def _told_wrong(run: Annotated[RunOptions, told(outt="x")] = RunOptions()) -> None:
    """A command telling a field its group does not have."""


def _told_out(run: Annotated[RunOptions, omit("report"), told(out="here.")] = RunOptions()) -> None:
    """A command telling its --out anew."""


def _hard_breaks(help_page: str) -> list[str]:
    """Lines of a rendered ``--help`` (no colour) broken where the wrapper would not have broken them: the
    next line of the same paragraph or cell starts with a word that fits at this line's end (a hard newline in
    the help text, a gap in mid-sentence)."""
    found: list[str] = []
    lines = help_page.splitlines()
    panel: list[str] = []
    for a, b in itertools.pairwise(lines):  # prose: the command's own help, the usage line
        prose = not a.startswith("│") and a.strip() and b.strip() and not b.startswith(("│", "╭"))
        if prose and len(a.rstrip()) + 1 + len(b.split()[0]) < len(a) - 1:  # padded: a space each side
            found.append(a.strip())
    # Boxes: in each panel, the description column starts where its continuation rows' text starts.
    for line in lines:
        if line.startswith("╭"):
            panel = []
        elif line.startswith("│"):
            panel.append(line)
        elif line.startswith("╰") and panel:
            starts = [len(r) - len(r[1:].lstrip()) for r in panel if len(r) - len(r[1:].lstrip()) > 6]
            starts = [s for s in starts if panel[0][s:].strip()]
            if not starts:
                continue
            col = max(starts)
            width = len(panel[0]) - 2 - col  # up to the right edge's padding
            for a, b in itertools.pairwise(panel):
                text, after = a[col:-1].rstrip(), b[col:-1].strip()
                new_row = len(b) - len(b[1:].lstrip()) <= 6  # an option's (``*`` if required) or a command's
                same = text and after and not new_row and not after.startswith("[")  # not [default: ...]
                if same and len(text) + 1 + len(after.split()[0]) < width:
                    found.append(text.strip())
    return found


def test_help_text_flows_as_text_at_a_fixed_width() -> None:
    """No help string holds a newline inside a paragraph (Typer's rich help keeps a docstring's line breaks,
    a gap in mid-sentence), and every ``--help`` at 100 columns wraps only where the line is full."""
    import typer
    from typer.testing import CliRunner

    from hookviz.cli import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    texts = [("hookviz", group.help or "")]
    for name, command in group.commands.items():
        texts.append((name, command.help or ""))
        texts += [(f"{name} --{p.name}", getattr(p, "help", None) or "") for p in command.params]
    for where, text in texts:
        assert all("\n" not in paragraph for paragraph in text.split("\n\n")), (where, text)
    first = (group.help or "").split("\n")[0]
    assert "vision-language" in first and "ViT" in first and "convolutional networks" not in first
    for name in ["", *group.commands]:
        r = CliRunner().invoke(
            app, [name, "--help"] if name else ["--help"], env={"COLUMNS": "100", "NO_COLOR": "1"}
        )
        assert r.exit_code == 0, r.output
        assert max(map(len, r.stdout.splitlines())) == 100  # the width the test means
        assert _hard_breaks(r.stdout) == [], (name, _hard_breaks(r.stdout))


def test_help_does_not_import_heavy_modules() -> None:
    code = (
        "import sys\nfrom hookviz.cli import main\nsys.argv = ['hookviz', 'gradcam', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'cv2', 'matplotlib', 'numpy', 'torchvision') if m in sys.modules))"
    )
    res = run_cli([sys.executable, "-c", code], check=True, cwd=ROOT)
    assert res.stdout.strip().splitlines()[-1] == "[]"


def test_gradcam_imports_torch_first_at_the_top_of_the_import_stack(photos: Path, tmp_path: Path) -> None:
    """CPython 3.11 gives a thread's frames 16 KiB chunks and frees one each time the stack falls back out
    of it: a loop of calls at a chunk's edge maps and unmaps memory on every call. torch's import-time
    registrations (torch.distributed.tensor._ops, reached through torchvision) are such loops, so the depth
    they run at is a cost: nested three imports deeper (under run.verdicts, run.trust, run.kinds) a gradcam
    run made 30,600 frame-chunk mmap/munmap pairs instead of 3,100 (27,000 more page faults, 0.3 s). gradcam
    imports hookviz.tasks (torch, torchvision) first, at the top, where the run before the refactor did."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-X", "importtime", "-m", "hookviz", "gradcam", str(photos), *FAST, "-q"]
    res = run_cli([*cmd, "--out", str(out)], cwd=ROOT)
    assert res.returncode == 0, res.stderr
    nested = []  # (depth, module), in the order their imports finished: a child before its parent
    for line in res.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "imported package" not in line:
            name = line.split("|", 2)[2]
            nested.append(((len(name) - len(name.lstrip(" "))) // 2, name.strip()))
    at = next(i for i, (_, name) in enumerate(nested) if name == "torchvision")
    chain, depth = [nested[at][1]], nested[at][0]
    for d, name in nested[at + 1 :]:
        if d < depth:  # the import this one was nested in
            chain.append(name)
            depth = d
    assert chain[-1] == "hookviz.tasks" and len(chain) <= 4, (
        chain
    )  # tasks, tasks.detection, models, torchvision
    assert len(records(out)) == 2


def test_installed_script_on_the_sample_images(tmp_path: Path) -> None:
    exe = shutil.which("hookviz", path=str(Path(sys.executable).parent)) or shutil.which("hookviz")
    assert exe, "the hookviz console script is not installed"
    out = tmp_path / "out"
    env = {**os.environ, "TORCH_HOME": str(tmp_path / "hub")}
    cmd = [exe, "gradcam", str(SAMPLES), "--weights", "none", "--out", str(out), "--device", "cpu"]
    res = run_cli(cmd, env=env)
    assert res.returncode == 0, res.stderr
    recs = records(out)
    assert sorted(Path(str(r["input"])).name for r in recs) == [
        "astronaut.jpg",
        "cat.jpg",
        "coffee.jpg",
        "rocket.jpg",
    ]
    assert all(r["status"] == "ok" and r["pretrained"] is False for r in recs)
    for rec in recs:
        (png,) = rec["outputs"]
        with Image.open(str(rec["input"])) as src:
            width = src.width
        assert picture(png).shape[1] == width and Path(png).parent == out  # the photo's own width
    res = run_cli([sys.executable, "-m", "hookviz", "--help"], cwd=ROOT)
    assert res.returncode == 0 and "gradcam" in res.stdout


def test_skip_existing_redoes_an_input_whose_outputs_are_incomplete(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["gradcam", str(photos / "wide.jpg"), *FAST, "--out", str(out), "-q", "--method", "gradcam"]
    assert invoke(*args, "--method", "layercam").exit_code == 0
    (layercam,) = out.glob("*.layercam.*.png")
    layercam.unlink()  # as if the run had been killed between the two files
    r = invoke(*args, "--method", "layercam", "--skip-existing", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["status"] == "ok" and layercam.exists()
    r = invoke(*args, "--method", "layercam", "--skip-existing", "--json")
    assert json.loads(r.stdout.splitlines()[-1])["status"] == "skipped"


def test_layers_and_gradflow_usage_errors() -> None:
    r = invoke("layers", "--model", "resnet-18")
    assert r.exit_code == 2 and "unknown model 'resnet-18'; did you mean 'resnet18'" in r.stderr
    r = invoke("gradflow", str(SAMPLES / "cat.jpg"), *FAST, "--label", "5000")
    assert r.exit_code == 2 and "--label 5000 is out of range" in r.stderr


def test_featuremaps_glob_keeps_layers_with_maps_and_each_call(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke(
        "featuremaps", str(photos / "wide.jpg"), *FAST, "--layers", "layer1.0*", "--out", str(out), "-q"
    )
    assert r.exit_code == 0, r.stderr
    names = sorted(p.name.split(".featuremap.")[1] for p in out.glob("*.png"))
    assert names == [
        "layer1.0.bn1.output.png",
        "layer1.0.bn2.output.png",
        "layer1.0.conv1.output.png",
        "layer1.0.conv2.output.png",
        "layer1.0.output.png",
        "layer1.0.relu.output.call2.png",
        "layer1.0.relu.output.png",
    ]
    r = invoke("featuremaps", str(photos / "wide.jpg"), *FAST, "--layers", "fc*", "--out", str(out))
    assert r.exit_code == 2 and "matches no layer with a (B, C, H, W) output" in r.stderr


def test_the_collector_waits_for_the_model_then_runs_as_usual() -> None:
    """The entry point holds Python's collector back over the start (torch's import, the model's build); the
    loaded model releases it, with what the start made frozen out of its passes; held twice or released
    without a hold, nothing changes."""
    import gc

    from hookviz.cli.loading import ModelOptions, load_options
    from hookviz.startup import hold_collector, release_collector

    assert gc.isenabled()
    release_collector()  # never held: nothing happens
    assert gc.isenabled() and gc.get_freeze_count() == 0
    try:
        hold_collector()
        hold_collector()
        assert not gc.isenabled()
        load_options(ModelOptions(model="tests.conftest:TinyCNN", weights="none", device="cpu"), quiet=True)
        assert gc.isenabled() and gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
        gc.enable()


RANDOM_64 = ["--weights", "none", "--input-size", "64", "--device", "cpu"]


def test_json_records_keep_input_order_with_a_missing_input(two_photos: Path, tmp_path: Path) -> None:
    args = [str(two_photos / "a.png"), str(two_photos / "missing.png"), str(two_photos / "b.png")]
    r = invoke(
        "gradcam", *args, *RANDOM_64, "--out", str(tmp_path / "o"), "--json", "-q", "--batch-size", "8"
    )
    assert r.exit_code == 1
    names = [Path(str(json.loads(line)["input"])).name for line in r.stdout.splitlines()]
    assert names == ["a.png", "missing.png", "b.png"]


def test_one_option_string_serves_every_command() -> None:
    common = ["--model", "resnet18", "--weights", "none", "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5"]
    for command in ("layers", "summary"):
        r = invoke(command, *common)
        assert r.exit_code == 0, (command, r.stderr)


@pytest.mark.parametrize("command", ["trust", "gradcam", "sanity", "evaluate"])
@pytest.mark.parametrize("seed", ["18446744073709551615", "-1", "4294967296"])
def test_a_seed_out_of_range_is_one_line_naming_the_range(tmp_path: Path, command: str, seed: str) -> None:
    r = invoke(command, str(tmp_path), "--model", "tests.conftest:TinyCNN", "--weights", "none",
               "--input-size", "48", "--seed", seed, "--out", str(tmp_path / "o"))  # fmt: skip
    assert (
        r.exit_code == 2
        and r.stderr == f"hookviz: error: --seed {seed}: a whole number from 0 to 4294967295\n"
    )
    assert not (tmp_path / "o").exists()
