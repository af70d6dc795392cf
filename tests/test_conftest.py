"""The tests' own harness (tests/conftest.py): a subprocess a test starts cannot outlive it, whatever the
machine's load, and every test that starts one goes through that harness."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PATIENCE, ROOT, run_cli, started


def _gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for its new parent to reap it has ended too)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + PATIENCE
    while not _gone(pid):
        assert time.monotonic() < deadline, f"process {pid} outlived the test that started it"
        time.sleep(0.05)


# A shell that starts a child of its own and waits for it: the child is what a plain subprocess.run's
# timeout left running (torchrun's ranks, a server's workers).
def _shell(pidfile: Path) -> list[str]:
    return ["bash", "-c", f"sleep 1000 & echo $! > {pidfile}.part && mv {pidfile}.part {pidfile}; wait"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_timed_out_command_leaves_nothing_running(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    for timeout in (2.0, 20.0, PATIENCE):  # long enough, on a busy machine too, for the shell to start it
        with pytest.raises(subprocess.TimeoutExpired):
            run_cli(_shell(pidfile), timeout=timeout)
        if pidfile.exists():
            break
    _wait_gone(int(pidfile.read_text()))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_started_process_ends_with_its_group_when_the_test_fails(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    with pytest.raises(AssertionError), started(_shell(pidfile)) as proc:
        deadline = time.monotonic() + PATIENCE
        while not pidfile.exists():  # the child is running
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        raise AssertionError("a failing test")
    assert proc.returncode is not None
    _wait_gone(int(pidfile.read_text()))


def test_run_cli_is_subprocess_run(tmp_path: Path) -> None:
    r = run_cli(["bash", "-c", "cat; echo err >&2; exit 3"], input="in\n")
    assert (r.returncode, r.stdout, r.stderr) == (3, "in\n", "err\n")
    with pytest.raises(subprocess.CalledProcessError):
        run_cli(["false"], check=True)


def test_every_test_starts_its_subprocesses_through_the_harness() -> None:
    """subprocess.run / Popen / check_output outside tests/conftest.py would bring back a fixed, short timeout
    and a process group left running when it expires: use ``run_cli`` or ``started``."""
    direct = re.compile(r"\bsubprocess\.(run|Popen|call|check_call|check_output)\(|\bPopen\(")
    found = [
        f"{path.name}:{n}"
        for path in sorted((ROOT / "tests").glob("*.py"))
        if path.name != "conftest.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if direct.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == [], found
