"""What ``hookviz trust`` checks before it computes: the budget (compound durations, nonsense refused, counted
from the process's start) and the ``--out`` folder (a run going there, or its result, refused at once)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from hookviz.errors import OutputError, UsageError
from hookviz.io.shapes import shapes_batch
from hookviz.run.trust_guard import LOCK, claimed, parse_budget, process_started
from tests.conftest import invoke, run_cli, write_image


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("600", 600.0), ("90s", 90.0), ("10m", 600.0), ("1m30s", 90.0), ("1h15m", 4500.0), ("1.5h", 5400.0),
     ("2h 5m 3s", 7503.0), (45, 45.0)],
)  # fmt: skip
def test_a_budget_is_seconds_or_a_compound_duration(text: str | float, seconds: float) -> None:
    assert parse_budget(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1e9", 1e9, "8d", "1m30", "soon", "0", "", "m", "-5", float("nan"), "200h"])
def test_nonsense_and_absurd_budgets_are_refused_in_one_line(text: str | float) -> None:
    with pytest.raises(UsageError, match="a time above zero and at most a week") as caught:
        parse_budget(text)
    assert "\n" not in str(caught.value)


def test_the_budget_counts_from_the_process_start() -> None:
    """A child process that sleeps before asking: its start lies that far back (the model's load, which
    comes after the start, is inside the budget)."""
    code = (
        "import time; time.sleep(1.5); from hookviz.run.trust_guard import process_started; "
        "print(time.monotonic() - process_started())"
    )
    root = Path(__file__).resolve().parents[1]
    done = run_cli([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(root)})
    assert float(done.stdout) >= 1.4
    assert 0 <= time.monotonic() - process_started() < 24 * 3600


FILES = ("trust.json",)


def test_a_folder_held_by_a_live_run_is_refused_and_a_stale_lock_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(str(os.getpid()))  # a live process holds it
    busy = rf"another hookviz trust \(process {os.getpid()}\) is writing"
    with pytest.raises(OutputError, match=busy), claimed(out, ("trust.json",), overwrite=False):
        pytest.fail("entered a folder another run holds")
    assert (out / LOCK).read_text() == str(os.getpid())  # not ours to remove
    gone = run_cli([sys.executable, "-c", "import os; print(os.getpid())"], check=True)
    (out / LOCK).write_text(gone.stdout.strip())  # its process has ended: stale
    with claimed(out, ("trust.json",), overwrite=False):
        assert (out / LOCK).read_text() == str(os.getpid())
    assert not (out / LOCK).exists()
    (out / "trust.json").write_text("{}")
    with (
        pytest.raises(OutputError, match="trust.json exists .*--overwrite"),
        claimed(out, ("trust.json",), False),
    ):
        pytest.fail("entered a folder with a result")
    with claimed(out, ("trust.json",), overwrite=True):
        pass


def test_a_second_run_into_a_busy_folder_stops_before_computing(tmp_path: Path) -> None:
    x, _, _ = shapes_batch(3, np.random.default_rng(1))
    photos = tmp_path / "photos"
    photos.mkdir()
    for i, image in enumerate(x):
        write_image(photos / f"s{i}.png", (image.numpy().transpose(1, 2, 0) * 255).astype(np.uint8))
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(str(os.getpid()))
    model = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "48"]
    r = invoke("trust", str(photos), *model, "--method", "gradcam", "--out", str(out))
    assert r.exit_code == 3 and "another hookviz trust" in r.stderr, r.stderr
    assert "hookviz: trust: photos" not in r.stderr  # nothing computed
    assert len(r.stderr.strip().splitlines()) == 1 and sorted(p.name for p in out.iterdir()) == [LOCK]


def test_an_out_that_is_a_file_or_not_writable_is_one_line_exit_3(tmp_path: Path) -> None:
    """A file, a read-only folder and a folder that cannot be made in one: an OutputError (exit 3), not an
    internal error; run as root, the read-only cases run with another user's effective id."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputError, match="is a file, not a folder"), claimed(tmp_path / "afile", (), False):
        pytest.fail("entered a file")
    base = Path(tempfile.mkdtemp(prefix="hookviz-ro-", dir="/tmp"))  # reachable by another user
    ro = base / "ro"
    try:
        base.chmod(0o755)
        ro.mkdir(mode=0o555)
        ro.chmod(0o555)
        said = []
        user = os.geteuid() == 0
        if user:
            os.setegid(65534)
            os.seteuid(65534)
        try:
            for out in (ro, ro / "sub"):
                with pytest.raises(OutputError) as refused, claimed(out, ("trust.json",), False):
                    pytest.fail(f"entered {out}")
                said.append(str(refused.value))
        finally:
            if user:
                os.seteuid(0)
                os.setegid(0)
        assert said == [
            f"--out {ro}: the folder is not writable (Permission denied); choose another --out",
            f"--out {ro / 'sub'}: cannot create the folder (Permission denied)",
        ]
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)
        shutil.rmtree(base)
