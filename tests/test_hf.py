"""Loading ``--model hf:DIR`` (:mod:`hookviz.models.hf`, :mod:`hookviz.models.hf_folder`): a folder that is
missing something or broken is refused in one line with exit 3 by every command, never loaded with a random
head, an empty tokenizer or a guessed preprocessing said nowhere."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import invoke, records, write_image

transformers = pytest.importorskip("transformers")

CLIP = Path(__file__).parent / "fixtures" / "shapes_clip"
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random models (seed 0) as save_pretrained writes them: a ViT classifier with its processor, a bare
    ViT backbone, a CLIP vision tower alone, and broken copies."""
    t = transformers
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    vit = t.ViTConfig(image_size=32, patch_size=8, num_labels=3, **TINY)
    proc = t.ViTImageProcessor(size={"height": 32, "width": 32})
    for name, model in (("vit", t.ViTForImageClassification(vit)), ("vitbare", t.ViTModel(vit))):
        model.save_pretrained(root / name)
        proc.save_pretrained(root / name)
    t.CLIPVisionModel(t.CLIPVisionConfig(image_size=32, patch_size=8, **TINY)).save_pretrained(root / "tower")
    proc.save_pretrained(root / "tower")
    shutil.copytree(root / "vit", root / "trunc")
    with open(root / "trunc" / "model.safetensors", "r+b") as f:
        f.truncate(5000)
    shutil.copytree(root / "vit", root / "noproc")
    (root / "noproc" / "preprocessor_config.json").unlink()
    shutil.copytree(root / "vit", root / "noconfig")
    (root / "noconfig" / "config.json").unlink()
    (root / "afile").write_text("{}\n")
    for name, drop in (("clip_notok", ("tokenizer.json", "tokenizer_config.json")),
                       ("clip_noproc", ("preprocessor_config.json",))):  # fmt: skip
        shutil.copytree(CLIP, root / name)
        for f in drop:
            (root / name / f).unlink()
    return root


@pytest.fixture(scope="module")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rgb = np.random.default_rng(0).integers(0, 256, (40, 48, 3), np.uint8)
    return write_image(tmp_path_factory.mktemp("photo") / "p.png", rgb)


def _every_command(spec: str, photo: Path, out: Path) -> list[list[str]]:
    """gradcam, featuremaps, layers and summary on ``spec``."""
    return [
        ["gradcam", str(photo), "--model", spec, "--out", str(out / "g")],
        ["featuremaps", str(photo), "--model", spec, "--out", str(out / "f")],
        ["layers", "--model", spec],
        ["summary", "--model", spec],
    ]


def _refused(args: list[str], message: str) -> str:
    r = invoke(*args)
    assert r.exit_code == 3, (args, r.exit_code, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert message in line, line
    return line


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("vitbare", "holds ViTModel, a backbone saved without its classification head"),
        ("tower", "holds CLIPVisionModel, a vision tower alone"),
        ("trunc", "model.safetensors: corrupt weights file, cut short"),
    ],
)
def test_a_headless_or_truncated_folder_is_refused_in_one_line_by_every_command(
    folders: Path, photo: Path, tmp_path: Path, name: str, message: str
) -> None:
    """Before: ViTModel got a random 2-class head (exit 0, a different one each load); the tower gave exit 70
    to layers/summary and a misleading weights line to gradcam; a truncated file exit 70 or exit 0."""
    for args in _every_command(f"hf:{folders / name}", photo, tmp_path):
        line = _refused(args, message)
        assert "random head" in line or name == "trunc"


def test_a_folder_that_is_a_file_or_has_no_config_is_named_as_such(folders: Path, photo: Path) -> None:
    base = ["gradcam", str(photo), "--out", str(folders / "o")]
    _refused([*base, "--model", f"hf:{folders / 'afile'}"], "is a file, not a folder")
    _refused([*base, "--model", f"hf:{folders / 'noconfig'}"], "no config.json in the folder")


def test_prompts_without_a_tokenizer_are_refused_not_scored_alike(folders: Path, photo: Path) -> None:
    """Before: transformers built an empty tokenizer and both prompts scored 0.5 exactly, exit 0. With its
    tokenizer the same model tells the two prompts apart."""
    args = ["gradcam", str(photo), "--prompt", "a square", "--prompt", "a disc", "-q"]
    line = _refused(
        [*args, "--model", f"hf:{folders / 'clip_notok'}", "--out", str(folders / "t1")],
        "no tokenizer beside it",
    )
    assert "tokenizer.save_pretrained(DIR)" in line
    r = invoke(*args, "--model", f"hf:{CLIP}", "--out", str(folders / "t2"))
    assert r.exit_code == 0, r.stderr
    (rec,) = records(folders / "t2")
    assert abs(float(rec["predicted"]["score"]) - 0.5) > 0.01


def test_a_classifier_without_its_processor_says_what_it_guessed(folders: Path, photo: Path) -> None:
    """The guess (ImageNet's mean and std, the config's 32 x 32) is said in one note naming --mean/--std, and
    the record holds it; given --mean and --std, nothing is guessed and nothing said."""
    spec = f"hf:{folders / 'noproc'}"
    r = invoke("gradcam", str(photo), "--model", spec, "--out", str(folders / "n1"))
    assert r.exit_code == 0, r.stderr
    (note,) = [line for line in r.stderr.splitlines() if "no image processor" in line]
    assert "mean 0.485, 0.456, 0.406" in note and "--mean" in note and "--std" in note
    (rec,) = records(folders / "n1")
    assert rec["settings"]["input"]["mean"] == pytest.approx([0.485, 0.456, 0.406])
    assert rec["settings"]["input"]["crop_size"] == 32
    r = invoke("gradcam", str(photo), "--model", spec, "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5",
               "--out", str(folders / "n2"))  # fmt: skip
    assert r.exit_code == 0 and "no image processor" not in r.stderr, r.stderr
    with_proc = invoke(
        "gradcam", str(photo), "--model", f"hf:{folders / 'vit'}", "--out", str(folders / "n3")
    )
    assert with_proc.exit_code == 0 and "no image processor" not in with_proc.stderr
    assert (
        json.loads((folders / "n3" / "manifest.jsonl").read_text())["settings"]["input"]["mean"] == [0.5] * 3
    )


def test_an_image_text_model_without_its_processor_is_refused(folders: Path, photo: Path) -> None:
    """Its tower's size, mean and std are the processor's: no default stands in (before: LLaVA said its
    3x224x224 input was wrong, CLIP ran on ImageNet's numbers)."""
    spec = f"hf:{folders / 'clip_noproc'}"
    for args in _every_command(spec, photo, folders / "c")[1:]:
        _refused(args, "no image processor in the folder")


def test_weights_file_saved_by_save_pretrained_loads_as_the_folder_does(folders: Path, photo: Path) -> None:
    """``--weights DIR/model.safetensors`` holds the checkpoint's key names, not the modules' (transformers
    5): it loads through transformers' own key mapping and predicts what ``DEFAULT`` predicts (before: exit
    3, "32 missing key(s)"); a file of another architecture is still refused, its keys named."""
    spec = f"hf:{folders / 'vit'}"
    own = folders / "vit" / "model.safetensors"
    args = ["gradcam", str(photo), "--model", spec, "-q", "--save-raw"]
    r = invoke(*args, "--weights", str(own), "--out", str(folders / "w1"))
    assert r.exit_code == 0, r.stderr
    assert invoke(*args, "--out", str(folders / "w2")).exit_code == 0
    (a,), (b,) = records(folders / "w1"), records(folders / "w2")
    assert a["predicted"] == b["predicted"] and a["weights"] == str(own)
    maps = [np.load(next(Path(o) for o in rec["outputs"] if o.endswith(".full.npy"))) for rec in (a, b)]
    np.testing.assert_allclose(maps[0], maps[1], rtol=1e-5, atol=1e-6)
    other = folders / "tower" / "model.safetensors"
    line = _refused([*args, "--weights", str(other), "--out", str(folders / "w3")], "does not fit hf:vit")
    assert "missing key(s)" in line


@pytest.mark.parametrize("command", ["summary", "vlm"])
def test_a_hub_id_offline_fails_at_once_in_one_line(
    monkeypatch: pytest.MonkeyPatch, photo: Path, tmp_path: Path, command: str
) -> None:
    """The hub unreachable (its connection refused here): one try, then the cache alone, then one line
    (before: five retries of each file with a log line each, about 40 s); the hub's offline switch is put
    back after."""
    import socket
    import time

    from huggingface_hub import constants

    def refused(*args: object, **kwargs: object) -> socket.socket:
        raise OSError("no network")

    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "create_connection", refused)
    spec = "hf:hookviz-tests/no-such-model-7f3a"
    args = {
        "summary": ["summary", "--model", spec],
        "vlm": ["vlm", str(photo), "--model", spec, "--prompt", "<image> what", "--out", str(tmp_path / "v")],
    }[command]
    start = time.perf_counter()
    line = _refused(args, "the hub cannot be reached (offline?) and it is not in the cache")
    assert time.perf_counter() - start < 20 and "no-such-model-7f3a" in line
    assert constants.HF_HUB_OFFLINE is False
