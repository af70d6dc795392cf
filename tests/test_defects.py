"""One test per defect a careful user found on real models and real folders (issue #20), reproducing it."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from hookviz.engine.explain import explain
from tests.conftest import ROOT, TinyCNN, hook_counts, invoke, records, run_cli, write_image

FAST = ["--weights", "none", "--input-size", "64", "--device", "cpu"]


def _strict(line: str) -> dict[str, object]:
    """Parse as strict JSON: NaN / Infinity are not JSON."""

    def refuse(name: str) -> object:
        raise ValueError(f"non-JSON constant {name}")

    value = json.loads(line, parse_constant=refuse)
    assert isinstance(value, dict)
    return value


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    d = tmp_path / "in"
    d.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        write_image(d / name, rng.integers(0, 256, (50, 60, 3), dtype=np.uint8))
    return d


# -- key: a factory that loads its own checkpoint ----------------------------------------------------


def test_a_retrained_checkpoint_loaded_by_its_factory_changes_the_key(photos: Path, tmp_path: Path) -> None:
    code = tmp_path / "net.py"
    code.write_text(
        "import torch\nfrom pathlib import Path\nfrom tests.shapes_net import ShapesNet\n"
        "def make():\n    m = ShapesNet()\n"
        "    state = torch.load(Path(__file__).with_name('w.pt'), weights_only=True)\n"
        "    m.load_state_dict(state)\n    return m\n"
    )
    from tests.shapes_net import ShapesNet

    out = tmp_path / "out"
    keys = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        torch.save(ShapesNet().state_dict(), tmp_path / "w.pt")
        r = invoke("gradcam", str(photos / "a.png"), "--model", f"{code}:make", "--input-size", "48",
                   "--labels", str(_labels(tmp_path)), "--out", str(out), "-q", "--json")  # fmt: skip
        assert r.exit_code == 0, r.stderr
        (rec,) = [_strict(line) for line in r.stdout.splitlines()]
        assert rec["status"] == "ok"  # not "skipped" with the old checkpoint's results
        keys.append(rec["key"])
    assert keys[0] != keys[1]


def _labels(tmp_path: Path) -> Path:
    p = tmp_path / "labels.txt"
    p.write_text("square\ndisc\ncross\n")
    return p


# -- non-finite numbers ------------------------------------------------------------------------------


class NaNForBright(nn.Module):
    """A classifier that diverges (NaN logits) on bright images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        logits = self.fc(h.mean(dim=(2, 3)))
        bright = (x.mean(dim=(1, 2, 3)) > 0.5)[:, None]
        return torch.where(bright, torch.full_like(logits, float("nan")), logits)


def make_nan() -> nn.Module:
    torch.manual_seed(0)
    return NaNForBright()


def test_non_finite_numbers_are_strict_json_and_a_nan_prediction_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    write_image(d / "dark.png", np.full((40, 40, 3), 20, np.uint8))
    write_image(d / "bright.png", np.full((40, 40, 3), 240, np.uint8))
    out = tmp_path / "out"
    r = invoke("gradcam", str(d), "--model", "tests.test_defects:make_nan", "--input-size", "40",
               "--mean", "0,0,0", "--std", "1,1,1", "--out", str(out), "--json", "-q")  # fmt: skip
    assert r.exit_code == 1
    recs = {Path(str(x["input"])).name: x for x in map(_strict, r.stdout.splitlines())}
    assert recs["dark.png"]["status"] == "ok"
    assert recs["bright.png"]["status"] == "error" and "not finite" in str(recs["bright.png"]["error"])
    for line in (out / "manifest.jsonl").read_text().splitlines():
        _strict(line)
    from hookviz.run.pipeline import to_json

    assert to_json({"a": float("nan"), "b": [float("inf"), 1.5]}) == '{"a": null, "b": [null, 1.5]}'


# -- the report on hand-edited or foreign manifests ---------------------------------------------------


def test_report_skips_wrong_typed_records_with_a_warning(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    lines = [
        json.dumps({"input": "a.png", "status": "ok", "predicted": "tabby", "maps": "none", "outputs": 3}),
        json.dumps({"input": "b.png", "status": "ok", "maps": [{"file": "b.png", "metrics": {
            "deletion_auc": None, "insertion_auc": 0.5}}],
            "predicted": {"index": 1, "name": "x", "score": "hi"}}),
        "not json at all",
        json.dumps([1, 2]),
        json.dumps({"input": "seg.png", "status": "ok", "score": "share of pixels",
                    "predicted": {"index": 3, "name": "class 3", "score": 1.0}}),
    ]  # fmt: skip
    (out / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    r = invoke("report", str(out))
    assert r.exit_code == 0, r.stderr
    assert "manifest line 3 is not a hookviz record" in r.stderr and "line 4" in r.stderr
    page = (out / "index.html").read_text()
    data = json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0])
    cards = {c["input"]: c for c in data}
    assert set(cards) == {"a.png", "b.png", "seg.png"}
    assert cards["a.png"]["predicted"] is None and cards["a.png"]["pictures"] == []
    assert cards["b.png"]["pictures"][0]["metrics"] is None and cards["b.png"]["score"] is None
    assert cards["seg.png"]["share"] is True  # shown as a share of the pixels, not "p=1.000"


# -- torchrun ----------------------------------------------------------------------------------------


def test_two_jobs_in_one_folder_merge_only_their_own_parts(tmp_path: Path) -> None:
    from hookviz.run.distributed import merge_parts

    mine = tmp_path / f".manifest.jobA.rank1.{os.getpid()}.jsonl"
    theirs = tmp_path / f".manifest.jobB.rank0.{os.getpid()}.jsonl"
    mine.write_text('{"input": "a"}\n')
    theirs.write_text('{"input": "b"}\n')
    assert merge_parts(tmp_path, "manifest.jsonl", only_dead=False, job="jobA") == 1
    assert not mine.exists() and theirs.exists()  # the other job's live part is left alone


def test_a_killed_jobs_parts_are_merged_before_a_one_process_resume(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q")
    assert r.exit_code == 0
    stale = out / ".manifest.jobZ.rank1.999999.jsonl"  # a dead process's part
    stale.write_text(json.dumps({"input": "old.png", "status": "error", "error": "killed"}) + "\n")
    r = invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q")
    assert r.exit_code == 0 and not stale.exists()
    inputs = [x["input"] for x in records(out)]
    assert inputs.index("old.png") < len(inputs) - 2  # before this run's records, not after them


def test_a_usage_error_under_torchrun_is_said_once(tmp_path: Path) -> None:
    said = []
    for rank in ("0", "1"):
        env = {**os.environ, "RANK": rank, "WORLD_SIZE": "2", "LOCAL_RANK": rank}
        res = run_cli([sys.executable, "-m", "hookviz", "gradcam", "-", *FAST, "--out", str(tmp_path / "o")],
                      input="x.png\n", cwd=ROOT, env=env)  # fmt: skip
        assert res.returncode == 2 and "Traceback" not in res.stderr
        said.append(res.stderr.strip())
    assert "not supported under torchrun" in said[0] and said[1] == ""


@pytest.mark.slow
def test_layer_auto_is_one_choice_per_torchrun_job(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    for i in range(4):
        write_image(d / f"p{i}.png", np.random.default_rng(i).integers(0, 256, (50, 60, 3), np.uint8))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "hookviz", "gradcam", "in", *FAST, "--layer", "auto", "--probe", "2",
           "--out", "o", "-q"]  # fmt: skip
    res = run_cli(cmd, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    recs = records(tmp_path / "o")
    assert len(recs) == 4 and len({r["key"] for r in recs}) == 1 and len({r["layer"] for r in recs}) == 1
    assert res.stderr.count("--layer auto chose") == 1


# -- inputs silently dropped -------------------------------------------------------------------------


def test_folder_symlinks_are_followed_without_loops(tmp_path: Path) -> None:
    from hookviz.run.pipeline import expand_inputs

    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    write_image(real / "sub" / "x.png", np.zeros((4, 4, 3), np.uint8))
    top = tmp_path / "top"
    top.mkdir()
    (top / "link").symlink_to(real)
    (real / "sub" / "back").symlink_to(top)  # a loop through the link
    write_image(top / "y.jpg", np.zeros((4, 4, 3), np.uint8))
    (top / "y.jpg").rename(top / "y.jpg ")  # a suffix with a trailing space, as some zips leave it
    names = sorted(Path(i.name).name for i in expand_inputs([str(top)]) if i.error is None)
    assert names == ["x.png", "y.jpg "]


def test_a_file_name_that_is_not_utf8_is_processed_and_kept(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    raw = os.fsencode(d) + b"/caf\xe9.png"
    write_image(Path(os.fsdecode(raw)), np.full((40, 50, 3), 90, np.uint8))
    out = tmp_path / "out"
    r = invoke("gradcam", str(d), *FAST, "--out", str(out), "-q", "--json")
    assert r.exit_code == 0, r.stderr
    (rec,) = records(out)
    assert rec["status"] == "ok" and os.fsencode(str(rec["input"])) == raw  # lossless
    (line,) = (out / "manifest.jsonl").read_bytes().splitlines()
    line.decode("utf-8")  # valid UTF-8 on disk


# -- --save-raw added to a finished run --------------------------------------------------------------


def test_save_raw_added_to_a_finished_run_writes_only_the_arrays(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q").exit_code == 0
    pngs = {p: p.stat().st_mtime_ns for p in out.glob("*.png")}
    r = invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q", "--save-raw")
    assert r.exit_code == 0, r.stderr
    assert len(list(out.glob("*.npy"))) == 4  # map and full map, per photo
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.png")} == pngs
    assert [x["status"] for x in records(out)][-2:] == ["ok", "ok"]


# -- labels ------------------------------------------------------------------------------------------


def test_labels_duplicates_keras_json_imagenet_and_class_n(tmp_path: Path) -> None:
    from hookviz.errors import TargetError
    from hookviz.models.classes import find_class, parse_target, parse_targets, read_labels
    from hookviz.tasks import load_model

    with pytest.raises(TargetError, match="classes 1, 3 all have this name"):
        find_class("crane", ["a", "crane", "b", "crane"])
    keras = tmp_path / "imagenet_class_index.json"
    keras.write_text(json.dumps({"0": ["n01440764", "tench"], "1": ["n01443537", "goldfish"]}))
    assert read_labels(keras) == ("tench", "goldfish")
    lm = load_model("resnet18", "none", labels="imagenet")
    assert lm.categories[281] == "tabby" and lm.describe(281) == "tabby (281)"
    plain = load_model("resnet18", "none", labels=[f"c{i}" for i in range(1000)])
    object.__setattr__(plain, "categories", ())
    assert plain.describe(282) == "class 282"  # not "class 282 (282)"
    assert parse_target("class 3", plain, 1000) == 3
    for bad in ("²", "top²", "3²"):
        with pytest.raises(TargetError):
            parse_targets(bad, plain, 1000)


def test_a_wrapper_prefix_on_every_key_is_stripped(tmp_path: Path) -> None:
    from tests.shapes_net import ShapesNet

    torch.manual_seed(3)
    net = ShapesNet()
    for prefix in ("model.", "net.", "model.module."):
        path = tmp_path / f"{prefix.strip('.')}.ckpt"
        torch.save({"state_dict": {prefix + k: v for k, v in net.state_dict().items()}}, path)
        from hookviz.tasks import load_model

        lm = load_model("tests.shapes_net:make", str(path), input_size=48)
        for k, v in net.state_dict().items():
            torch.testing.assert_close(lm.model.state_dict()[k], v)


# -- threads -----------------------------------------------------------------------------------------


def test_two_threads_explaining_one_model() -> None:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    xs = [torch.rand(4, 3, 32, 32) for _ in range(2)]
    expected = [explain(model, x, ["features"], ["gradcam"]).maps[("gradcam", "features")] for x in xs]
    got: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(5):
                got[i] = explain(model, xs[i], ["features"], ["gradcam"]).maps[("gradcam", "features")]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(2):
        torch.testing.assert_close(got[i], expected[i])
    assert hook_counts(model) == 0


# -- evaluate ----------------------------------------------------------------------------------------


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


# -- files in a shared folder -------------------------------------------------------------------------


def test_planted_links_never_redirect_a_write(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    from hookviz.io.files import atomic_write

    # The old predictable temp names, planted for this process: mkstemp never opens them.
    target = out / "x.png"
    (out / f".x.png.{os.getpid()}.tmp").symlink_to(victim)
    atomic_write(target, b"png")
    assert victim.read_text() == "precious" and target.read_bytes() == b"png"
    # A link at the final name is replaced by the file, not written through.
    link = out / "y.png"
    link.symlink_to(victim)
    atomic_write(link, b"new")
    assert victim.read_text() == "precious" and not link.is_symlink()
    # A manifest that is a link is refused in one line (exit 3).
    (out / "manifest.jsonl").symlink_to(victim)
    r = invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q")
    assert r.exit_code == 3 and "a symlink is refused" in r.stderr, r.stderr
    assert victim.read_text() == "precious"


def test_a_manifest_without_its_last_newline_keeps_the_next_record(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.jsonl").write_text('{"input": "old.png", "status": "error", "error": "cut"}')
    assert invoke("gradcam", str(photos), *FAST, "--out", str(out), "-q").exit_code == 0
    recs = records(out)
    assert [Path(str(x["input"])).name for x in recs] == ["old.png", "a.png", "b.png"]


# -- small ones --------------------------------------------------------------------------------------


def test_json_records_keep_input_order_with_a_missing_input(photos: Path, tmp_path: Path) -> None:
    args = [str(photos / "a.png"), str(photos / "missing.png"), str(photos / "b.png")]
    r = invoke("gradcam", *args, *FAST, "--out", str(tmp_path / "o"), "--json", "-q", "--batch-size", "8")
    assert r.exit_code == 1
    names = [Path(str(json.loads(line)["input"])).name for line in r.stdout.splitlines()]
    assert names == ["a.png", "missing.png", "b.png"]


def test_superscript_target_is_a_usage_error(photos: Path, tmp_path: Path) -> None:
    r = invoke("gradcam", str(photos), *FAST, "--target", "²", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_one_option_string_serves_every_command() -> None:
    common = ["--model", "resnet18", "--weights", "none", "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5"]
    for command in ("layers", "summary"):
        r = invoke(command, *common)
        assert r.exit_code == 0, (command, r.stderr)


def test_timm_levit_defaults_to_its_token_map() -> None:
    timm = pytest.importorskip("timm")
    from hookviz.core.hooks import trace_shapes
    from hookviz.core.layers import default_cam_layer

    model = timm.create_model("levit_128s", pretrained=False).eval()
    layer = default_cam_layer(model, trace_shapes(model, torch.zeros(1, 3, 224, 224)))
    assert layer == "stages"  # the tokens its head averages, not a key/value projection
    ex = explain(model, torch.rand(1, 3, 224, 224), [layer], ["gradcam"])
    assert ex.maps[("gradcam", layer)].shape == (1, 1, 4, 4)
