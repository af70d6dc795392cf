"""The defects a careful user found in round 5 (issue #46), each reproduced first: a server that changed or
deleted what was not its own and served stale models, several inputs paired wrongly, outputs replaced by later
runs, a monitor that stopped the training it watched, inputs read otherwise than their libraries read them,
and the small slips."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.serve.wire import ask
from tests.conftest import PATIENCE, ROOT, invoke, run_cli, started, write_image

TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]
unix_only = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="Unix sockets only")


# --- the warm server ----------------------------------------------------------------------------------------


def _env(sock: Path, pythonpath: str = str(ROOT)) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return env | {"HOOKVIZ_SERVER": str(sock), "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath}


def _hookviz(sock: Path, *args: str, pythonpath: str = str(ROOT)) -> subprocess.CompletedProcess[str]:
    return run_cli([sys.executable, "-m", "hookviz", *args], cwd=ROOT, env=_env(sock, pythonpath))


def _server(sock: Path, pythonpath: str = str(ROOT)) -> Any:
    from tests.test_serve import running_server

    return running_server(sock, ["-m", "hookviz"], "--idle-timeout", "300", pythonpath=pythonpath)


@unix_only
def test_serve_never_changes_a_folder_it_did_not_create(tmp_path: Path) -> None:
    team = tmp_path / "team"
    team.mkdir()
    os.chmod(team, 0o2775)
    r = _hookviz(tmp_path / "x.sock", "serve", "--socket", str(team / "hv.sock"))
    assert r.returncode == 3, r.stderr
    assert "open to others" in r.stderr and "mkdir -m 700" in r.stderr
    assert stat.S_IMODE(team.stat().st_mode) == 0o2775 and not (team / "hv.sock").exists()


@unix_only
def test_serve_replaces_no_file_at_its_socket_path(tmp_path: Path) -> None:
    private = tmp_path / "p"
    private.mkdir(mode=0o700)
    results = private / "results.json"
    results.write_text('{"auc": 0.9}')
    r = _hookviz(tmp_path / "x.sock", "serve", "--socket", str(results))
    assert r.returncode == 3 and "not a socket of yours" in r.stderr, r.stderr
    assert results.read_text() == '{"auc": 0.9}'


@unix_only
@pytest.mark.slow
def test_a_server_removes_only_its_own_socket_on_the_way_out(tmp_path: Path) -> None:
    """A file put where the socket was while the server ran is left there when the server stops."""
    from hookviz.serve.paths import claim, identity

    private = tmp_path / "p"
    private.mkdir(mode=0o700)
    sock = private / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))  # a socket of a server that died: claimed
    stale.close()
    claim(sock)
    assert not sock.exists()
    with _server(sock) as proc:
        bound = identity(sock)
        assert bound is not None
        sock.unlink()
        sock.write_text("someone else's")
        ask(sock, {"op": "stop"})  # no answer: the path is not a socket any more
        proc.send_signal(15)
        proc.wait(timeout=PATIENCE)
    assert sock.read_text() == "someone else's"


@unix_only
@pytest.mark.slow
def test_serving_on_is_said_once_the_server_listens(tmp_path: Path) -> None:
    private = tmp_path / "p"
    private.mkdir(mode=0o700)
    sock = private / "s.sock"
    cmd = [sys.executable, "-m", "hookviz", "serve", "--socket", str(sock)]
    with started(cmd, cwd=ROOT, env=_env(sock), stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stderr is not None
            while True:
                line = proc.stderr.readline()
                assert line, "the server exited"
                if "serving on" in line:
                    break
            # The line comes once a client is served: a status asked at once is answered.
            assert ask(sock, {"op": "status"}, timeout=5.0) is not None
        finally:
            ask(sock, {"op": "stop"})
            proc.communicate(timeout=PATIENCE)


def _vit(folder: Path, seed: int) -> None:
    import torch
    import transformers

    config = transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=32,
        patch_size=8, num_labels=3,
    )  # fmt: skip
    torch.manual_seed(seed)
    transformers.ViTForImageClassification(config).save_pretrained(folder)


def _module(folder: Path, classes: int) -> None:
    pkg = folder / "hvround5pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(
        f"from tests.conftest import TinyCNN\n\n\ndef net():\n    return TinyCNN(classes={classes})\n"
    )


@unix_only
@pytest.mark.slow
def test_the_server_serves_the_files_and_modules_the_client_names(tmp_path: Path, photos: Path) -> None:
    """Warm models keyed by their files' content (#5, #6), the client's PYTHONPATH (#7)."""
    pytest.importorskip("transformers")
    four, seven = tmp_path / "four", tmp_path / "seven"
    _module(four, 4)
    _module(seven, 7)
    private = tmp_path / "p"
    private.mkdir(mode=0o700)
    sock = private / "s.sock"
    photo = str(photos / "p0.png")
    with _server(sock, pythonpath=f"{ROOT}{os.pathsep}{four}"):
        # 7: the client's module, not the server's.
        model = [
            "--model",
            "hvround5pkg.mod:net",
            "--weights",
            "none",
            "--input-size",
            "32",
            "--device",
            "cpu",
        ]
        r = _hookviz(sock, "gradcam", photo, *model, "--target", "6", "--json", "-q", "--out",
                     str(tmp_path / "m"), pythonpath=f"{ROOT}{os.pathsep}{seven}")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.splitlines()[0])["target"]["index"] == 6

        # 5: an hf:DIR re-saved into its folder is loaded again.
        folder = tmp_path / "vit"
        _vit(folder, 0)
        hf = ["--model", f"hf:{folder}", "--device", "cpu", "--save-raw", "--json", "-q"]
        first = _hookviz(sock, "gradcam", photo, *hf, "--out", str(tmp_path / "h1"))
        assert first.returncode == 0, first.stderr
        _vit(folder, 1)
        served = _hookviz(sock, "gradcam", photo, *hf, "--out", str(tmp_path / "h2"))
        here = _hookviz(sock, "gradcam", photo, *hf, "--no-server", "--out", str(tmp_path / "h3"))
        a, b = (json.loads(x.stdout.splitlines()[0]) for x in (served, here))
        assert a["key"] == b["key"] != json.loads(first.stdout.splitlines()[0])["key"]
        assert a["target"] == b["target"]
        raw = [np.load(next(Path(r["outputs"][0]).parent.glob("*.npy"))) for r in (a, b)]
        np.testing.assert_allclose(raw[0], raw[1], atol=1e-5)

        # 6: a weights file copied over with its size and time kept (cp -p) is loaded again.
        import torch
        import torchvision

        w1, w2, weights = tmp_path / "w1.pt", tmp_path / "w2.pt", tmp_path / "weights.pt"
        tv = ["--model", "resnet18", "--input-size", "32", "--device", "cpu", "--json", "-q", "--weights"]
        for w, seed in ((w1, 0), (w2, 1)):
            torch.manual_seed(seed)
            torch.save(torchvision.models.resnet18(num_classes=5).state_dict(), w)
        shutil.copy2(w1, weights)
        st = weights.stat()
        one = _hookviz(sock, "gradcam", photo, *tv, str(weights), "--out", str(tmp_path / "w1"))
        shutil.copy2(w2, weights)
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert weights.stat().st_size == st.st_size and weights.stat().st_mtime_ns == st.st_mtime_ns
        two = _hookviz(sock, "gradcam", photo, *tv, str(weights), "--out", str(tmp_path / "w2"))
        ref = _hookviz(
            sock, "gradcam", photo, *tv, str(weights), "--no-server", "--out", str(tmp_path / "w3")
        )
        assert one.returncode == two.returncode == ref.returncode == 0, (one.stderr, two.stderr)
        r1, r2, r3 = (json.loads(x.stdout.splitlines()[0]) for x in (one, two, ref))
        assert r2["key"] == r3["key"] != r1["key"]
        assert r2["target"]["score"] == pytest.approx(r3["target"]["score"], abs=1e-5)
        assert r1["target"]["score"] != pytest.approx(r2["target"]["score"], abs=1e-5)


# --- several inputs -----------------------------------------------------------------------------------------


def _touch(*paths: Path) -> None:
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_image(p, np.zeros((8, 8, 3), np.uint8))


def test_two_files_of_one_name_make_their_sample_fail_naming_both(tmp_path: Path) -> None:
    from hookviz.io.samples import pair_inputs

    rgb, depth = tmp_path / "rgb", tmp_path / "depth"
    _touch(rgb / "001.png", rgb / "001.jpg", rgb / "002.png", depth / "001.png", depth / "002.png",
           depth / "002.jpg")  # fmt: skip
    items = {Path(i.name).stem: i for i in pair_inputs([("rgb", str(rgb)), ("depth", str(depth))])}
    assert set(items) == {"001", "002"}
    assert "001.png" in items["001"].error and "001.jpg" in items["001"].error
    assert "one rgb sample" in items["001"].error
    assert "depth partner is ambiguous" in items["002"].error
    assert "002.png" in items["002"].error and "002.jpg" in items["002"].error
    assert all(i.path is None for i in items.values())


def test_the_stem_pairs_only_where_it_is_unique_and_never_twice(tmp_path: Path) -> None:
    from hookviz.io.samples import pair_inputs

    rgb, depth = tmp_path / "rgb", tmp_path / "depth"
    _touch(rgb / "a" / "001.png", rgb / "c" / "001.png", depth / "b" / "001.png", rgb / "a" / "007.png",
           depth / "x" / "007.png", rgb / "k" / "009.png", depth / "k" / "009.png")  # fmt: skip
    items = pair_inputs([("rgb", str(rgb)), ("depth", str(depth))])
    partners = [dict(i.partners)["depth"] for i in items if i.error is None]
    assert len(partners) == len(set(partners))  # no depth map given to two photos
    ok = {str(Path(i.name).relative_to(rgb)): dict(i.partners)["depth"] for i in items if i.error is None}
    assert ok == {"a/007.png": depth / "x" / "007.png", "k/009.png": depth / "k" / "009.png"}
    failed = {Path(i.name) for i in items if i.error is not None}
    assert failed == {rgb / "a" / "001.png", rgb / "c" / "001.png", depth / "b" / "001.png"}


# --- concept outputs keyed like every output --------------------------------------------------------------


def _tcav_folders(root: Path) -> tuple[str, str, list[str]]:
    """Inputs, a concept and five random folders of noise photos (32 px); the concept is a copy of random
    folder 0 under another path (its CAVs cannot beat chance)."""
    rng = np.random.default_rng(5)

    def folder(name: str, n: int = 10) -> str:
        (root / name).mkdir(parents=True)
        for i in range(n):
            write_image(root / name / f"{i}.png", rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
        return str(root / name)

    inputs = folder("inputs", 6)
    randoms = [folder(f"random{i}") for i in range(5)]
    shutil.copytree(randoms[0], root / "concept")
    return inputs, str(root / "concept"), randoms


@pytest.mark.slow
def test_tcav_outputs_are_keyed_a_rerun_skipped_and_folders_distinct(tmp_path: Path) -> None:
    inputs, concept, randoms = _tcav_folders(tmp_path)
    rand = [a for r in randoms for a in ("--random", r)]
    head = ["tcav", inputs, *TINY, "--target", "1", "--layer", "features.4"]
    args = [*head, "--concept", f"c={concept}", *rand, "--out", str(tmp_path / "out")]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    (one,) = (tmp_path / "out").glob("tcav.*.json")
    data = json.loads(one.read_text())
    assert one.name == f"tcav.{data['key']}.json"
    # A copy of a random folder: CAVs at chance, never significant, said so.
    (c,) = data["layers"][0]["concepts"]
    assert c["meaningful"] is False and c["significant"] is False and c["cav_accuracy"] <= 0.65
    assert "not meaningful" in first.output
    before = one.read_bytes()
    again = invoke(*args)
    assert again.exit_code == 0 and "skipped" in again.output and one.read_bytes() == before
    other = invoke(*args[:-2], "--seed", "1", "--out", str(tmp_path / "out"))
    assert other.exit_code == 0, other.output
    assert len(list((tmp_path / "out").glob("tcav.*.json"))) == 2 and one.read_bytes() == before
    # The same random folder five times, a concept that is a random folder, or inside one: refused.
    for bad, why in (
        ([a for _ in range(5) for a in ("--random", randoms[1])], "the same folder as --random"),
        (["--random", concept, *rand[2:]], "the same folder as --concept c"),
        (["--random", str(tmp_path), *rand[2:]], "overlaps"),
    ):
        r = invoke(*head, "--concept", f"c={concept}", *bad, "--out", str(tmp_path / "bad"))
        assert r.exit_code == 2 and why in r.output, r.output
    twice = invoke(*head, "--concept", f"c={concept}", "--concept", f"c={randoms[1]}", *rand[4:])
    assert twice.exit_code == 2 and "given twice" in twice.output


def test_a_concept_its_cavs_tell_apart_is_meaningful() -> None:
    """The chance test passes a real concept: bright photos against noise."""
    import torch

    from hookviz.concepts.tcav import Seeds, above_chance, train_cav

    g = torch.Generator().manual_seed(0)
    noise = [torch.rand(30, 16, generator=g) for _ in range(3)]
    bright = torch.rand(30, 16, generator=g) + 0.6
    seeds = Seeds(0)
    assert above_chance([train_cav(bright, n, seeds=seeds) for n in noise]) is True
    assert above_chance([train_cav(noise[0], n, seeds=seeds) for n in noise[1:]]) is False
    assert above_chance([train_cav(bright, n, method="mean") for n in noise]) is None


def test_channels_outputs_of_other_settings_stand_side_by_side(photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    base = ["channels", str(photos), *TINY, "--layer", "features.4", "--out", str(out), "-q"]
    assert invoke(*base, "--top", "2").exit_code == 0
    assert invoke(*base, "--top", "3").exit_code == 0
    found = sorted(out.glob("channels.*.json"))
    assert len(found) == 2
    tops = sorted(json.loads(f.read_text())["top"] for f in found)
    assert tops == [2, 3]
    for f in found:
        data = json.loads(f.read_text())
        sheets = {c["sheet"] for c in data["layers"]["features.4"]["channels"] if "sheet" in c}
        assert sheets and all(s.startswith(f"{f.stem}/") and (out / s).is_file() for s in sheets)


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


# --- visualize --direction --------------------------------------------------------------------------------


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


# --- the training monitor -------------------------------------------------------------------------------


class _Block(torch.nn.Module):
    """An attention-like block whose own code makes the NaN: a softmax over a row masked whole."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.armed = False

    def forward(self, x: Any) -> Any:
        h = self.qkv(x)
        if self.armed:
            h = h.masked_fill(h == h, float("-inf"))  # every position masked
        return self.proj(h.softmax(-1))


def _train(model: Any, steps: int, arm: Any, tmp_path: Path, every: int = 100) -> Any:
    import torch

    from hookviz.training.monitor import Monitor

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    probe = torch.randn(2, 3, 4, generator=g)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with Monitor(model, probe, layer="0", every=every, log_dir=tmp_path) as mon:
            for step in range(steps):
                arm(step)
                loss = model(torch.randn(5, 3, 4, generator=g)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                mon.step(step)
    return mon, [str(w.message) for w in said]


def test_a_nan_made_in_a_composite_modules_own_code_names_that_module(tmp_path: Path) -> None:
    import torch

    block = _Block()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), block, torch.nn.Linear(4, 2))

    def arm(step: int) -> None:
        block.armed = step == 2

    mon, said = _train(model, 4, arm, tmp_path)
    assert mon.first_nonfinite is not None and mon.first_nonfinite.step == 2
    assert mon.first_nonfinite.module == "1 (1's own code, between 1.qkv and 1.proj)"
    assert any("1's own code, between 1.qkv and 1.proj" in s for s in said)


def test_a_nan_made_in_the_models_forward_is_said_to_be_there(tmp_path: Path) -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
            self.armed = False

        def forward(self, x: Any) -> Any:
            h = self.a(x)
            return self.b(h * float("nan") if self.armed else h)

    net = Net()
    mon, _ = _train(torch.nn.Sequential(net), 3, lambda s: setattr(net, "armed", s == 1), tmp_path)
    assert mon.first_nonfinite is not None
    assert mon.first_nonfinite.module == "0 (0's own code, between 0.a and 0.b)"


def test_a_nan_that_persists_across_logging_steps_never_stops_the_training(tmp_path: Path) -> None:
    """Weights turned NaN at step 1: every later logging step sees only NaN activations."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def arm(step: int) -> None:
        if step == 1:
            with torch.no_grad():
                model[0].weight.fill_(float("nan"))

    mon, _ = _train(model, 7, arm, tmp_path, every=2)  # logs at 0, 2, 4, 6
    assert mon.first_nonfinite is not None and mon.first_nonfinite.module.startswith("0")
    ea = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    ea.Reload()
    share = {e.step: e.value for e in ea.Scalars("activations/0/nonfinite")}
    assert share == {0: 0.0, 2: 1.0, 4: 1.0, 6: 1.0}
    assert [e.step for e in ea.Histograms("activations/0")] == [0]  # none of nothing
    assert [e.step for e in ea.Scalars("activations/0/mean")] == [0]


# --- detectors -------------------------------------------------------------------------------------------


def test_every_detector_method_on_a_photo_without_detections(tmp_path: Path) -> None:
    from hookviz.engine.detection import detection_methods

    photo = write_image(tmp_path / "grey.png", np.full((96, 128, 3), 127, np.uint8))
    methods = detection_methods()
    model = ["--model", "fasterrcnn_mobilenet_v3_large_320_fpn", "--weights", "none", "--device", "cpu"]
    r = invoke("gradcam", str(photo), *model, "--method", ",".join(methods), "--out", str(tmp_path / "o"),
               "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout.splitlines()[0])
    assert rec["status"] == "ok" and rec["detections"] == [] and rec["predicted"] is None
    from hookviz.jobs.detection import _per_photo

    whole = {m for m in methods if _per_photo(m)}
    assert whole and {m["method"] for m in rec["maps"]} == whole  # no box, so only the whole-photo maps
    for m in rec["maps"]:  # a class-agnostic map of the whole photo, explaining no box
        assert m["box"] is None and m["target"] is None and m["finite"]


def test_a_box_beyond_the_right_or_bottom_edge_is_left_out_with_a_note(photos: Path, tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("square\ndisc\ncross\n")
    rows = [
        "file,class,x0,y0,x1,y1",
        "p0.png,disc,50,5,90,20",
        "p1.png,disc,5,60,20,90",
        "p2.png,1,8,8,30,30",
        "p3.png,2,10,10,30,30",
    ]
    (tmp_path / "b.csv").write_text("\n".join(rows))
    r = invoke("evaluate", str(photos), *TINY, "--labels", str(tmp_path / "labels.txt"), "--resize", "squash",
               "--boxes", str(tmp_path / "b.csv"), "--metric", "localisation", "--out",
               str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert (
        "a box lies wholly outside its photo and is left out" in r.stderr and "the photo is 40x40" in r.stderr
    )
    from tests.conftest import records

    by = {Path(x["input"]).name: x for x in records(tmp_path / "o")}
    assert by["p0.png"]["objects"] == [] and by["p1.png"]["objects"] == []
    assert [o["class"]["index"] for o in by["p2.png"]["objects"]] == [1]


# --- reading inputs as their libraries read them ---------------------------------------------------------


def test_a_yolo_reads_an_rgba_png_as_predict_does(tmp_path: Path) -> None:
    """Shapes painted under a transparent alpha: predict (cv2.imread) sees them, a viewer does not; the
    boxes hookviz explains are predict's."""
    from hookviz.models.ultralytics import process_kept

    with process_kept():
        pytest.importorskip("ultralytics")
        from ultralytics import YOLO
    import cv2

    from hookviz.io.inputs import Item, read_input
    from hookviz.io.shapes import shapes_scene
    from hookviz.models.sources import Options
    from hookviz.models.ultralytics import build

    fixture = ROOT / "tests" / "fixtures" / "shapes_yolo.pt"
    built = build(f"ultralytics:{fixture}", "DEFAULT", Options())
    rng = np.random.default_rng(4)
    compared = 0
    for i in range(3):
        img, *_ = shapes_scene(rng, 130, 200, 3, (9, 16))
        rgb = (img * 255).round().astype(np.uint8)
        alpha = np.full(rgb.shape[:2], 255, np.uint8)
        alpha[:, : rgb.shape[1] // 2] = 0  # the left half transparent
        path = tmp_path / f"s{i}.png"
        cv2.imwrite(str(path), np.dstack([rgb[..., ::-1], alpha]))
        drawn, _, _ = read_input(Item(str(path), path), built.preprocess, 10**8)
        np.testing.assert_array_equal(drawn, cv2.imread(str(path))[..., ::-1])
        ours = built.model.detect([torch.from_numpy(drawn.copy()).permute(2, 0, 1).float() / 255], 0.25)[0]
        theirs = YOLO(str(fixture)).predict(str(path), conf=0.25, verbose=False)[0].boxes
        assert ours.labels.tolist() == theirs.cls.long().tolist()
        assert torch.allclose(ours.boxes, theirs.xyxy, atol=0.1)
        compared += len(theirs)
    assert compared >= 3


def test_a_png_cut_short_is_said_to_be_truncated(tmp_path: Path) -> None:
    from hookviz.errors import InputError
    from hookviz.io.images import load_rgb

    whole = write_image(tmp_path / "whole.png", np.zeros((40, 40, 3), np.uint8)).read_bytes()
    for n in (12, 30, len(whole) // 2):
        (tmp_path / "cut.png").write_bytes(whole[:n])
        with pytest.raises(InputError, match="cut short|truncated"):
            load_rgb(tmp_path / "cut.png")
    (tmp_path / "text.png").write_text("not a picture at all")
    with pytest.raises(InputError, match="not an image file"):
        load_rgb(tmp_path / "text.png")


# --- cost -------------------------------------------------------------------------------------------------


def test_method_all_holds_the_cheap_ones_its_words_promise() -> None:
    from hookviz.methods.registry import REGISTRY, MethodOptions, parse

    chosen = parse(["all"])
    options = MethodOptions()
    for name in chosen:
        passes = REGISTRY[name].passes
        if passes is None:
            continue
        for k in (64, 512):  # whatever the layer's width
            forward, backward = passes(k, 3, options, (224, 224))
            assert forward <= 1 and backward <= 2 * 3, (name, k, forward, backward)
    assert "scorecam" not in chosen and "fullgrad" not in chosen
    assert {"gradcam", "hirescam", "eigencam", "saliency"} <= set(chosen)


# --- volumes ------------------------------------------------------------------------------------------------


def _header_only(path: Path, shape: tuple[int, ...]) -> Path:
    """A .nii.gz whose header names ``shape`` and whose voxels are cut short (nothing to decode)."""
    import gzip

    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_shape(shape)
    header.set_data_dtype(np.uint8)
    header["vox_offset"] = 352
    path.write_bytes(gzip.compress(header.binaryblock + b"\0" * 4 + b"\0" * 1024))
    return path


def test_a_huge_nifti_is_refused_by_its_header_before_decoding(tmp_path: Path) -> None:
    pytest.importorskip("nibabel")
    from hookviz.errors import InputError
    from hookviz.io.volume import DEFAULT_MAX_VOXELS, read_volume

    started = time.monotonic()
    with pytest.raises(InputError, match=r"2048x2048x2048 is 8,589,934,592 voxels, over the limit") as got:
        read_volume(_header_only(tmp_path / "huge.nii.gz", (2048, 2048, 2048)), DEFAULT_MAX_VOXELS)
    assert time.monotonic() - started < 5 and "--input-size" not in str(got.value)
    # An .npy's header names its shape too (a sparse file: nothing written past the header).
    big = np.lib.format.open_memmap(tmp_path / "wide.npy", "w+", np.uint8, (1, 600, 600, 600))
    del big
    with pytest.raises(InputError, match="over the limit"):
        read_volume(tmp_path / "wide.npy", DEFAULT_MAX_VOXELS)


def test_the_default_limit_fits_a_plain_ct(tmp_path: Path) -> None:
    """512x512x320 passes the size check with the default --max-pixels (then fails: its voxels are cut)."""
    pytest.importorskip("nibabel")
    from hookviz.errors import InputError
    from hookviz.io.images import DEFAULT_MAX_PIXELS
    from hookviz.io.inputs import Item
    from hookviz.tasks.volume import VOLUME

    ct = _header_only(tmp_path / "ct.nii.gz", (512, 512, 320))
    with pytest.raises(InputError) as got:
        VOLUME.read(Item(str(ct), ct), None, DEFAULT_MAX_PIXELS)
    assert "over the limit" not in str(got.value) and "cannot be read" in str(got.value)
    with pytest.raises(InputError, match="over the limit of 1,000,000"):
        VOLUME.read(Item(str(ct), ct), None, 1_000_000)  # a limit given is the limit


def test_a_dicom_series_with_a_missing_or_doubled_slice(tmp_path: Path) -> None:
    pytest.importorskip("pydicom")
    from hookviz.errors import InputError
    from hookviz.io.volume import read_volume
    from tests.test_volume import _dicom_series

    v = np.round(np.random.default_rng(5).uniform(-50, 50, (8, 8, 10)) * 2) / 2
    _dicom_series(tmp_path / "gap", v, (1.0, 1.0, 2.5))
    (tmp_path / "gap" / "im4.dcm").unlink()
    said = r"not evenly spaced: 5 mm between slices 4 and 5 .* 2.5 mm apart \(a missing slice\?\)"
    with pytest.raises(InputError, match=said):
        read_volume(tmp_path / "gap")
    _dicom_series(tmp_path / "twice", v, (1.0, 1.0, 2.5))
    shutil.copy(tmp_path / "twice" / "im3.dcm", tmp_path / "twice" / "zz_copy.dcm")
    got = read_volume(tmp_path / "twice")
    assert got.shape == (8, 8, 10) and got.spacing[2] == pytest.approx(2.5)
    np.testing.assert_allclose(got.data[0], v, atol=1e-4)
    assert got.notes == ("1 DICOM slice(s) given twice (the same pixels at one position) were dropped",)
    import pydicom

    other = pydicom.dcmread(tmp_path / "twice" / "zz_copy.dcm")
    other.PixelData = bytes(len(other.PixelData))
    other.save_as(tmp_path / "twice" / "zz_copy.dcm")
    with pytest.raises(InputError, match="two different slices at position"):
        read_volume(tmp_path / "twice")


def test_volume_errors_name_their_file_and_maps_keep_the_inputs_codes(tmp_path: Path) -> None:
    nib = pytest.importorskip("nibabel")
    from tests.test_volume import FIXTURE, NET

    fmri = tmp_path / "run.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((12, 12, 12, 100), np.float32), np.eye(4)), str(fmri))
    out = tmp_path / "o"
    r = invoke("gradcam", str(fmri), "--model", NET, "--weights", str(FIXTURE), "-o", str(out))
    assert r.exit_code == 1
    assert "run.nii.gz" in r.output and "fMRI" in r.output and "img.slicer" in r.output, r.output
    img = nib.Nifti1Image(np.random.default_rng(0).normal(size=(24, 24, 24)).astype(np.float32), np.eye(4))
    img.set_sform(np.diag([2.0, 2.0, 2.0, 1.0]), code=4)  # MNI space
    img.set_qform(np.diag([2.0, 2.0, 2.0, 1.0]), code=1)
    nib.save(img, str(tmp_path / "aligned.nii.gz"))
    r = invoke("gradcam", str(tmp_path / "aligned.nii.gz"), "--model", NET, "--weights", str(FIXTURE), "-o",
               str(tmp_path / "o2"))  # fmt: skip
    assert r.exit_code == 0, r.output
    from tests.conftest import records

    (rec,) = records(tmp_path / "o2")
    written = nib.load(str(tmp_path / "o2" / rec["maps"][0]["nifti"])).header
    assert (int(written["sform_code"]), int(written["qform_code"])) == (4, 1)


# --- Hugging Face segmenters' inputs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        "Mask2FormerImageProcessor(size={'shortest_edge': 64, 'longest_edge': 96})",
        "Mask2FormerImageProcessor(size={'shortest_edge': 800, 'longest_edge': 1333})",
        "MaskFormerImageProcessor(size={'shortest_edge': 64, 'longest_edge': 128}, size_divisor=32)",
        "DPTImageProcessor(size={'height': 64, 'width': 64}, keep_aspect_ratio=True, ensure_multiple_of=14)",
        "DPTImageProcessor(size={'height': 96, 'width': 96}, keep_aspect_ratio=True, ensure_multiple_of=32)",
        "DPTImageProcessor(size={'height': 64, 'width': 64}, keep_aspect_ratio=False, ensure_multiple_of=32)",
        "SegformerImageProcessor(size={'height': 64, 'width': 64})",
    ],
)
def test_a_segmenters_input_is_the_shape_its_processor_gives(make: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    import transformers  # noqa: F401  (the processors named by ``make``)

    from hookviz.io.images import Preprocess
    from hookviz.models.hf import _preprocessing

    processor = eval(f"transformers.{make}")
    processor.save_pretrained(tmp_path)
    built = SimpleNamespace(preprocess=Preprocess())
    _preprocessing(built, str(tmp_path), None)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    sizes = [
        (100, 300),
        (300, 100),
        (64, 64),
        (37, 211),
        (480, 640),
        *[tuple(rng.integers(20, 700, 2)) for _ in range(6)],
    ]
    for h, w in sizes:
        photo = rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8)
        want = processor(images=photo, return_tensors="pt")["pixel_values"][0]
        x, box = built.preprocess(photo)
        assert x.shape == tuple(want.shape), (make, (h, w), x.shape, tuple(want.shape))
        assert (box.x0, box.y0, box.x1, box.y1) == (0, 0, int(w), int(h))  # the whole photo, as they see it
        assert float(np.abs(x - want.numpy()).mean()) < 0.25  # the same picture (resamplers differ a little)


def test_one_input_over_the_memory_budget_is_said(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "p.png", np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8))
    model = [
        "--model",
        "tests.conftest:TinyCNN",
        "--weights",
        "none",
        "--input-size",
        "448",
        "--device",
        "cpu",
    ]
    r = invoke("gradcam", str(photo), *model, "--max-memory", "1M", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    assert "one input of 448x448 alone holds about" in r.stderr and "over --max-memory 1 MB" in r.stderr
    assert "it runs anyway" in r.stderr and r.stderr.count("alone holds") == 1
    fits = invoke("gradcam", str(photo), *model, "--max-memory", "4G", "--out", str(tmp_path / "o2"))
    assert fits.exit_code == 0 and "alone holds" not in fits.stderr


# --- what the captions and messages say ----------------------------------------------------------------


def test_top_k_on_a_model_of_one_output_says_there_is_one_value(tmp_path: Path) -> None:
    from tests.test_heads import REGRESSOR

    photo = write_image(tmp_path / "p.png", np.random.default_rng(1).integers(0, 256, (32, 32, 3), np.uint8))
    args = ["--model", REGRESSOR, "--weights", "DEFAULT", "--input-size", "32", "--head", "raw"]
    r = invoke("gradcam", str(photo), *args, "--target", "top3", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "has one output, so there is one value to explain" in r.output, r.output
    assert "top1..top1" not in r.output
    assert (
        invoke("gradcam", str(photo), *args, "--target", "top1", "--out", str(tmp_path / "o")).exit_code == 0
    )


def test_a_segmenter_that_finds_only_background_says_so(tmp_path: Path) -> None:
    """Every pixel background: the caption's prediction is the background, not "disc 0.0 % of pixels"."""
    from types import SimpleNamespace

    from hookviz.jobs.cam import CamJob

    names = ["background", "square", "disc"]
    job = SimpleNamespace(
        loaded=SimpleNamespace(describe=lambda k: f"{names[k]} ({k})"),
        _scored=lambda ex, score: f"{score:.1%} of pixels",
    )
    only = SimpleNamespace(labels=torch.zeros(1, 8, 8, dtype=torch.long))
    said = CamJob._predicted(job, only, 0, 2, 0.0)  # type: ignore[arg-type]
    assert said == "nothing but background (0) (every pixel; disc (2), the likeliest other class, has none)"
    some = SimpleNamespace(labels=torch.tensor([[[0, 2], [2, 2]]]))
    assert CamJob._predicted(job, some, 0, 2, 0.75) == "disc (2) 75.0% of pixels"  # type: ignore[arg-type]


def test_prompts_that_differ_only_past_the_limit_are_said_to_read_as_one() -> None:
    from hookviz.models.scores import _truncated

    class Tok:
        model_max_length = 5

        def __call__(self, texts: list[str], truncation: bool = False) -> dict[str, Any]:
            return {"input_ids": [t.split() for t in texts]}

        def decode(self, ids: list[str], skip_special_tokens: bool = True) -> str:
            return " ".join(ids)

    notes = _truncated(Tok(), ["a photo of a cat on a mat", "a photo of a cat in a hat", "a dog"])
    assert "2 prompt(s) are longer" in notes[0] and "cut after 'a photo of a cat'" in notes[0]
    assert notes[1].startswith("prompts 1 and 2 differ only past the 5-token limit")
    assert len(_truncated(Tok(), ["a photo of a cat on a mat", "a b"])) == 1
