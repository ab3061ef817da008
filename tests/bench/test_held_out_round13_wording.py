"""Held-out round 13's low cases left after the round (issue 29): H12 (`--seeds 0,0` trained seed 0 once without a
word) and H27 (an Optuna storage whose database driver is missing, or in a read-only folder: "cannot be reached" with
Optuna's or the system's words and nothing on what to do). Each is the command the user ran, refused before any
work in one line, exit 2."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from tests import launch
from tests.conftest import fresh_store

TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4"]


def _only_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO mlflow" not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.mark.parametrize("argv", [["run", "--algos", "grpo", "--seeds", "0,1,0", "--no-controls", *TINY],
                                  ["tune", "--algo", "grpo", "--trials", "1", "--seeds", "3,3", *TINY]],
                         ids=["run", "tune"])
def test_a_seed_named_twice_is_refused_before_any_work(argv, tmp_path, bench_here):
    """H12: `bench run --seeds 0,0` trained seed 0 once, exit 0, the repeat dropped silently (the user may have meant
    another seed)."""
    rc, _, err = bench_here(argv, tmp_path)
    seeds = argv[argv.index("--seeds") + 1]
    assert rc == 2, err[-3000:]
    assert _only_line(err) == (f"bench {argv[0]}: error: --seeds {seeds}: seed {seeds.split(',')[-1]} is named "
                               "twice; name each seed once")
    assert list(tmp_path.iterdir()) == []  # nothing made: no store, no .pobench


def test_an_optuna_storage_without_its_database_driver_names_the_module_and_what_to_do(tmp_path, bench_here):
    """H27: `bench tune --storage mysql://...` without a MySQL driver was `cannot be reached: Failed to import DB
    access module for the specified storage URL. Please install appropriate one.`: no module, no way out."""
    if importlib.util.find_spec("MySQLdb") is not None:
        pytest.skip("a MySQL driver (MySQLdb) is installed here: its absence cannot be shown")
    uri = fresh_store(tmp_path)
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--trials", "1", "--storage", "mysql://u@127.0.0.1:1/db",
                             "--tracking-uri", uri, *TINY], tmp_path)
    assert rc == 2, err[-3000:]
    assert _only_line(err) == (
        "bench tune: error: --storage mysql://u@127.0.0.1:1/db: the database driver for mysql is not installed (no "
        "module named 'MySQLdb'); install a driver SQLAlchemy has for mysql (for MySQL: pip install pymysql, and a "
        "mysql+pymysql:// URL), or give a sqlite:/// or postgresql:// storage")


def test_a_sqlite_storage_in_a_read_only_folder_says_so_and_what_to_do(tmp_path):
    """H27: `--storage sqlite:///<read-only mount>/x.db` (a new study) was `cannot be reached: [Errno 30] Read-only
    file system: '.../x.db.lock'`: the system's words, no advice. The folder is a read-only bind mount in a private
    mount namespace (root), or a folder without write permission (another user)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    code = ("import sys\nfrom bench.tune.storage import open_storage\n"
            "try:\n    open_storage(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n    sys.exit(2)\n")
    command = [sys.executable, "-c", code, f"sqlite:///{ro}/x.db"]
    mounts = []
    if os.geteuid() == 0:
        if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
            pytest.skip("running as root without a private mount namespace (unshare -m): no read-only file system")
        mounts = [f"mount --bind {ro} {ro}", f"mount -o remount,bind,ro {ro}"]
        why = "a read-only file system"
    else:
        ro.chmod(0o555)
        why = "no write permission (read-only for this user)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    done = launch.run(command, capture_output=True, text=True, env=env, timeout=300, mounts=mounts)
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip() == (f"{ro} cannot be written ({why}); make it writable, or choose another folder "
                                   f"for --storage sqlite:///{ro}/x.db")
    assert list(ro.iterdir()) == []
