"""Held-out round 13: a plugin's forgotten ``signal.alarm`` (H30), a folder in the place of the MLflow store's lock file
(H31), a `bench run` pool worker whose plugin ignores SIGTERM (H32), a frozen `bench tune` pool worker on the stop
path (H33): each ends in one line with the documented exit code, and no run is left RUNNING."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

from tests.conftest import fresh_store

TINY = ["--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--samples-every", "0",
        "--no-progress"]


def statuses(db: Path) -> dict[str, str]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return dict(con.execute("select name, status from runs"))
    finally:
        con.close()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}


# ------------------------------------------------------------------ H31: a folder where the store's lock file goes
def test_a_folder_in_place_of_the_store_s_lock_file_is_refused_before_any_work(tmp_path, bench_here):
    """Held-out round 13 (H31): a folder ``mlflow.db.lock`` beside the store (the file pobench locks it with while it
    opens it) stopped `bench train` once its work had begun: "stopped: ... Is a directory", exit 1, ``.pobench``
    made. Now refused before any work: one line naming the folder, exit 2, nothing made."""
    (tmp_path / "mlflow.db.lock").mkdir()
    rc, out, err = bench_here(["train", "--steps", "2", *TINY], tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert lines[0].startswith(f"bench train: error: {tmp_path / 'mlflow.db.lock'} is a folder") \
        and "move it away" in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db.lock"]


# ------------------------------------------------------------------ H30: a plugin's forgotten signal.alarm
ALARM = '''import signal
from algorithms import register, register_advantage
CALLS = []
def adv(rewards):
    CALLS.append(1)
    if len(CALLS) == 3:  # (a timeout helper that forgot to cancel its alarm; steps 1 and 2 checkpointed)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
    return rewards - rewards.mean(dim=1, keepdim=True)
register_advantage("adv-alarm", adv, description="test")
register("grpo-alarm", base="grpo", description="test", advantage_estimator="adv-alarm")
'''


def test_a_plugin_s_forgotten_alarm_fails_the_run_in_one_line_not_a_silent_exit_142(tmp_path):
    """Held-out round 13 (H30): a plugin's advantage estimator arming an alarm it never cancels killed `bench train`
    by SIGALRM (exit 142, nothing printed) and left its run RUNNING. Now the alarm is a plugin's fault like any other:
    one line naming SIGALRM and the plugin's line that set it, exit 1, the run FAILED with that cause and its
    checkpoint kept. (The process itself is the subject: a forked `bench`, tests/launch.py.)"""
    import subprocess

    from tests import launch

    (tmp_path / "p_alarm.py").write_text(ALARM)
    uri = fresh_store(tmp_path)
    argv = ["train", "--plugin", "p_alarm.py", "--algo", "grpo-alarm", "--steps", "200", "--run-name", "al",
            "--checkpoint-every", "2", "--eval-every", "0", *TINY, "--tracking-uri", uri]
    done = launch.run([sys.executable, "-m", "bench", *argv], cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL,
                      stderr=subprocess.PIPE, text=True, timeout=300)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip() and " INFO mlflow" not in ln]
    assert done.returncode == 1 and len(lines) == 1, (done.returncode, done.stderr[-3000:])
    assert lines[0].startswith("bench train: error: SIGALRM: an alarm set by plugin p_alarm.py at ") \
        and "p_alarm.py:7 (in adv: signal.setitimer) fired with no handler set" in lines[0], lines[0]
    assert statuses(tmp_path / "mlflow.db") == {"al": "FAILED"}
    con = sqlite3.connect(tmp_path / "mlflow.db")
    (cause,) = con.execute("select value from tags where key = 'pobench.failure'").fetchone()
    con.close()
    assert cause.startswith("PluginAlarm: SIGALRM"), cause
    assert sorted(p.name for p in (tmp_path / ".pobench" / "runs" / "pobench" / "al").glob("ckpt-*")), \
        "no checkpoint kept"
