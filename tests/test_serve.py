"""``hookviz serve``: the same outputs as a command run here, a private socket, a fallback when the server
is gone, concurrent clients, a cancelled request, a failing request that leaves the server serving."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.serve.wire import ask
from tests.conftest import PATIENCE, ROOT, run_cli, started, write_image
from tests.test_golden_runs import COMMANDS, _run_everything, assert_golden

pytestmark = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="Unix sockets only")
TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]


def _env(sock: Path | str, pythonpath: str = str(ROOT)) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env |= {"HOOKVIZ_SERVER": str(sock), "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath}
    return env


def hookviz(sock: Path | str, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    """The installed ``hookviz`` entry point in a process of its own, with ``HOOKVIZ_SERVER`` set."""
    cmd = [sys.executable, "-m", "hookviz", *args]
    return run_cli(cmd, cwd=kw.pop("cwd", ROOT), env=_env(sock), **kw)


@contextlib.contextmanager
def running_server(
    sock: Path, python: list[str], *flags: str, pythonpath: str = str(ROOT)
) -> Iterator[subprocess.Popen[str]]:
    """A server started by ``python`` (``-m hookviz`` or a script) at ``sock`` with ``pythonpath``, stopped on
    the way out; its process is given."""
    cmd = [sys.executable, *python, "serve", "--socket", str(sock), *flags]
    with started(cmd, cwd=ROOT, env=_env(sock, pythonpath), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                 text=True) as proc:  # fmt: skip
        try:
            deadline = time.monotonic() + PATIENCE
            while ask(sock, {"op": "status"}, timeout=2.0) is None:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
            yield proc
        finally:
            ask(sock, {"op": "stop"})
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=PATIENCE)  # then started() ends whatever is left


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    sock = tmp_path_factory.mktemp("srv") / "private" / "server.sock"
    with running_server(sock, ["-m", "hookviz"], "--idle-timeout", "600"):
        yield sock


def test_the_socket_is_private(server: Path) -> None:
    assert stat.S_IMODE(server.parent.stat().st_mode) == 0o700
    assert stat.S_ISSOCK(server.stat().st_mode) and stat.S_IMODE(server.stat().st_mode) == 0o600
    status = ask(server, {"op": "status"})
    assert status is not None and status["socket"] == str(server)


@pytest.mark.slow
def test_every_command_through_the_server_writes_what_it_writes_here(server: Path, tmp_path: Path) -> None:
    """The golden run (tests/test_golden_runs.py, in process) repeated through the server: the same files,
    text and exit codes, compared as the golden test compares them."""

    def served(*args: str) -> SimpleNamespace:
        r = hookviz(server, *args)
        assert "went away" not in r.stderr
        return SimpleNamespace(exit_code=r.returncode, stdout=r.stdout, stderr=r.stderr)

    assert_golden(_run_everything(tmp_path, served))
    status = ask(server, {"op": "status"})
    assert status is not None and status["served"] >= len(COMMANDS)


def test_records_on_stdout_and_exit_codes_are_the_commands_own(
    server: Path, photos: Path, tmp_path: Path
) -> None:
    (photos / "broken.png").write_bytes(b"not a png")
    args = ["gradcam", str(photos), *TINY, "--json", "-q"]
    served = hookviz(server, *args, "--out", str(tmp_path / "a"))
    here = hookviz("none", *args, "--out", str(tmp_path / "b"))
    assert served.returncode == here.returncode == 1  # one input failed, the others were done
    a = [json.loads(line) for line in served.stdout.splitlines()]
    b = [json.loads(line) for line in here.stdout.splitlines()]
    assert [(r["status"], Path(r["input"]).name) for r in a] == [
        (r["status"], Path(r["input"]).name) for r in b
    ]
    assert len(a) == 5 and sum(r["status"] == "ok" for r in a) == 4
    # --no-server runs here even with a server running; a usage error is exit 2 either way.
    assert hookviz(server, "gradcam", str(photos / "p0.png"), *TINY, "--no-server", "-q", "--out",
                   str(tmp_path / "c")).returncode == 0  # fmt: skip
    assert hookviz(server, "gradcam", str(photos), *TINY, "--batch-size", "0").returncode == 2


def test_stdin_paths_and_the_working_directory_are_the_clients(server: Path, photos: Path) -> None:
    r = run_cli([sys.executable, "-m", "hookviz", "gradcam", "-", *TINY, "--out", "rel_out", "--json", "-q"],
                input="p1.png\np2.png\n", cwd=photos, env=_env(server))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["status"] for line in r.stdout.splitlines()] == ["ok", "ok"]
    assert (photos / "rel_out" / "manifest.jsonl").is_file()  # relative to the client's directory


def test_concurrent_clients(server: Path, photos: Path, tmp_path: Path) -> None:
    env = _env(server)
    with contextlib.ExitStack() as stack:
        cmds = [[sys.executable, "-m", "hookviz", "gradcam", str(photos / f"p{i}.png"), *TINY, "--out",
                 str(tmp_path / f"o{i}"), "--json", "-q"] for i in range(4)]  # fmt: skip
        pipe = subprocess.PIPE
        procs = [
            stack.enter_context(started(cmd, cwd=ROOT, env=env, stdout=pipe, stderr=pipe, text=True))
            for cmd in cmds
        ]
        outs = [p.communicate(timeout=PATIENCE) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [e for _, e in outs]
    for i, (out, err) in enumerate(outs):
        (rec,) = [json.loads(line) for line in out.splitlines()]
        assert rec["status"] == "ok" and rec["input"].endswith(f"p{i}.png") and "went away" not in err


def test_a_failing_request_leaves_the_server_serving(server: Path, photos: Path, tmp_path: Path) -> None:
    bad = hookviz(server, "gradcam", str(photos / "p0.png"), "--model", "no_such_net", "--out", str(tmp_path))
    assert bad.returncode == 2 and "no_such_net" in bad.stderr
    good = hookviz(server, "gradcam", str(photos / "p0.png"), *TINY, "-q", "--out", str(tmp_path / "o"))
    assert good.returncode == 0, good.stderr
    assert ask(server, {"op": "status"}) is not None


def test_ctrl_c_in_a_client_cancels_its_request_only(server: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    big = write_image(tmp_path / "big.png", rng.integers(0, 256, (256, 256, 3), dtype=np.uint8))
    slow = [sys.executable, "-m", "hookviz", "gradcam", str(big), "--model", "resnet18", "--weights", "none",
            "--method", "scorecam", "--out", str(tmp_path / "slow"), "-q"]  # fmt: skip
    # As a shell's foreground command: Ctrl-C not ignored (pytest-xdist's workers ignore SIGINT, and a child
    # inherits that; Python then installs no KeyboardInterrupt handler, and the Ctrl-C below would be lost).
    with started(slow, cwd=ROOT, env=_env(server), stderr=subprocess.PIPE, text=True,
                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as client:  # fmt: skip
        deadline = time.monotonic() + PATIENCE
        while (ask(server, {"op": "status"}) or {}).get("running", 0) < 1:
            assert time.monotonic() < deadline and client.poll() is None
            time.sleep(0.1)
        time.sleep(0.5)
        client.send_signal(signal.SIGINT)
        _, err = client.communicate(timeout=PATIENCE)
    assert client.returncode == 130, err
    deadline = time.monotonic() + PATIENCE
    while (ask(server, {"op": "status"}) or {}).get("running", 1) != 0:  # the child was interrupted
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert not list((tmp_path / "slow").glob("*.png"))  # nothing half-written


#: A server whose children are sent Ctrl-C the moment they are forked, before any line of theirs runs.
_EARLY_CTRL_C = """
import os, signal, sys
real = os.fork
def fork():
    pid = real()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGINT)
    return pid
os.fork = fork
sys.argv[0] = "hookviz"
from hookviz.cli import main
main()
"""


@pytest.mark.slow  # a server of its own / a whole run: in make test, not test-fast
def test_ctrl_c_the_moment_a_child_is_forked_cancels_it_and_the_server_serves_on(
    photos: Path, tmp_path: Path
) -> None:
    """The Ctrl-C that reaches a child before its own handlers are set: held back over the fork, so it
    cancels the request (130), never runs the server's own cleanup in the child (which answered 0 and
    unlinked the server's socket); the server still serves."""
    sock = tmp_path / "private" / "server.sock"
    with running_server(sock, ["-c", _EARLY_CTRL_C], "--idle-timeout", "120"):
        for i in range(2):
            out = tmp_path / f"o{i}"
            r = hookviz(sock, "gradcam", str(photos / "p0.png"), *TINY, "-q", "--out", str(out))
            assert r.returncode == 130, r.stderr
            assert not list(out.glob("*.png"))
            status = ask(sock, {"op": "status"})
            assert sock.exists() and status is not None and status["served"] == i + 1


@pytest.mark.slow  # servers started and killed: in make test, not the inner loop
def test_no_server_or_a_dead_one_runs_the_command_here(photos: Path, tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir(mode=0o700)
    stale = folder / "server.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))  # a socket file nobody listens on: a server that died
    s.close()
    os.chmod(stale, 0o600)
    for where in (stale, tmp_path / "missing.sock", "none"):
        r = hookviz(where, "gradcam", str(photos / "p0.png"), *TINY, "-q", "--out", str(tmp_path / "o"),
                    "--overwrite")  # fmt: skip
        assert r.returncode == 0 and "went away" not in r.stderr, r.stderr


@pytest.mark.slow  # servers started and killed: in make test, not the inner loop
def test_a_server_that_dies_mid_request_falls_back_once(tmp_path: Path) -> None:
    folder = tmp_path / "private"
    sock = folder / "server.sock"
    with started([sys.executable, "-m", "hookviz", "serve", "--socket", str(sock)], cwd=ROOT, env=_env(sock),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:  # fmt: skip
        deadline = time.monotonic() + PATIENCE
        while ask(sock, {"op": "status"}, timeout=2.0) is None:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        rng = np.random.default_rng(2)
        big = write_image(tmp_path / "big.png", rng.integers(0, 256, (128, 128, 3), dtype=np.uint8))
        cmd = [sys.executable, "-m", "hookviz", "gradcam", str(big), "--model", "resnet18", "--weights",
               "none", "--input-size", "64", "--method", "scorecam", "--out", str(tmp_path / "o"), "--json",
               "-q"]  # fmt: skip
        pipe = subprocess.PIPE
        with started(cmd, cwd=ROOT, env=_env(sock), stdout=pipe, stderr=pipe, text=True) as client:
            while (ask(sock, {"op": "status"}) or {}).get("running", 0) < 1:
                assert time.monotonic() < deadline and client.poll() is None
                time.sleep(0.05)
            proc.kill()
            out, err = client.communicate(timeout=PATIENCE)
        assert client.returncode == 0, err
        assert err.count("the server went away during the command; running it here") == 1
        recs = [json.loads(line) for line in out.splitlines()]
        assert recs and recs[-1]["status"] in ("ok", "skipped")


def test_the_client_imports_neither_torch_nor_typer(server: Path, photos: Path, tmp_path: Path) -> None:
    args = ["gradcam", str(photos / "p0.png"), *TINY, "-q", "--out", str(tmp_path)]
    code = (
        "import sys; from hookviz.serve.client import run_on_server; "
        f"c = run_on_server({args!r}); print(c, 'torch' in sys.modules, 'typer' in sys.modules)"
    )
    run = [sys.executable, "-c", code]
    r = run_cli(run, cwd=ROOT, env=_env(server))
    assert r.stdout.split() == ["0", "False", "False"], r.stderr


def test_warm_models_are_kept_under_the_budget_least_recently_used_first(tmp_path: Path) -> None:
    from hookviz.cli import loading
    from hookviz.cli.loading import ModelOptions
    from hookviz.cli.serve import CliHost
    from hookviz.serve.server import Server

    small, big = (ModelOptions(model=n, weights="none", device="cpu") for n in ("resnet18", "resnet34"))
    user = ModelOptions(model="tests.conftest:TinyCNN", weights="none", device="cpu")
    srv = Server(tmp_path / "s.sock", CliHost(), max_memory=100 * 2**20)  # resnet18 45 MB, resnet34 87 MB
    try:
        srv._keep_warm(small)
        assert [k[0].model for k in srv.warm] == ["resnet18"] and loading.warm_key(small) in loading.WARM
        srv._keep_warm(big)  # 132 MB together: the least recently used goes
        assert [k[0].model for k in srv.warm] == ["resnet34"] and loading.warm_key(small) not in loading.WARM
        srv._keep_warm(user)  # the user's own code: loaded afresh by every call, never kept
        assert [k[0].model for k in srv.warm] == ["resnet34"] and loading.warm_key(user) is None
        # A child finds the warm model: the very object, no second load.
        assert loading.load_warm(big, quiet=True) is loading.WARM[loading.warm_key(big)]
    finally:
        loading.WARM.clear()
        loading.USED.clear()


def test_serve_detach_status_and_stop_from_the_command_line(tmp_path: Path) -> None:
    sock = tmp_path / "private" / "server.sock"

    def serve(*flags: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "hookviz", "serve", "--socket", str(sock), *flags]
        return run_cli(cmd, cwd=ROOT, env=_env(sock))

    started = serve("--detach")
    assert started.returncode == 0 and "listening on" in started.stderr, started.stderr
    try:
        again = serve("--detach")
        assert again.returncode == 0 and "already running" in again.stderr
        assert json.loads(serve("--status").stdout)["socket"] == str(sock)
    finally:
        stopped = serve("--stop")
    assert stopped.returncode == 0 and "stopping" in stopped.stdout
    deadline = time.monotonic() + PATIENCE
    while sock.exists():  # the socket goes with the server
        assert time.monotonic() < deadline
        time.sleep(0.1)
    gone = serve("--status")
    assert gone.returncode == 1 and "no server" in gone.stderr


unix_only = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="Unix sockets only")


def _hookviz(sock: Path, *args: str, pythonpath: str = str(ROOT)) -> subprocess.CompletedProcess[str]:
    return run_cli([sys.executable, "-m", "hookviz", *args], cwd=ROOT, env=_env(sock, pythonpath))


def _server(sock: Path, pythonpath: str = str(ROOT)) -> Any:
    return running_server(sock, ["-m", "hookviz"], "--idle-timeout", "300", pythonpath=pythonpath)


def _vit(folder: Path, seed: int) -> None:
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
