"""Held-out round 13: a plugin's forgotten ``signal.alarm`` (H30), a folder in the place of the MLflow store's lock file
(H31), a `bench run` pool worker whose plugin ignores SIGTERM (H32), a frozen `bench tune` pool worker on the stop
path (H33): each ends in one line with the documented exit code, and no run is left RUNNING."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
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


# ------------------------------------------------------------------ H32: a pool worker whose plugin ignores SIGTERM
IGNTERM = '''import multiprocessing
import signal
import time
from algorithms import register
from algorithms.policy_gradient import ClippedPG

_sleep = time.sleep


def _step(seconds):  # (the stand-in trainer sleeps once a step: the plugin's code, called as the pair trains)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _sleep(seconds)


class IgnTermPG(ClippedPG):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if multiprocessing.parent_process() is not None:  # (built in a pool worker, to train)
            time.sleep = _step


register("grpo-ignterm", IgnTermPG, description="ignores SIGTERM at each step in a worker (test)")
'''


@pytest.mark.parametrize("case", ["killed", "finishes"])
def test_a_pool_worker_ignoring_sigterm_is_killed_after_the_grace_and_the_count_is_right(tmp_path, case):
    """Held-out round 13 (H32): in `bench run --workers 2` a plugin set SIGTERM to SIG_IGN in its pool worker; a
    SIGTERM to `bench run` then waited until that pair had trained to its end (50 s), and the line said `kept 0 of 2
    pairs finished` while that pair was FINISHED. Now the stop waits ``$POBENCH_POOL_STOP_GRACE`` seconds for a
    busy worker: one still training then is named (its pid, the run it trains) and SIGKILLed, its run ended KILLED
    (its checkpoint kept), exit 143 at once ("killed"); a pair that trained to its end meanwhile is counted as
    finished ("finishes"). (The trainer is injected, tests/bench/fake_trainer.py, which sleeps once a step: the
    plugin's code, in its pool worker, takes that sleep's place and sets SIGTERM to SIG_IGN at each step, as the
    user's advantage estimator did; the pool's processes are real.)"""
    import signal
    import time

    from tests.bench.test_signals import FAKE_CLI, Proc, checkpointed

    (tmp_path / "p_ignterm.py").write_text(IGNTERM)
    fresh_store(tmp_path)
    steps = "40" if case == "killed" else "10"
    argv = ["run", "--plugin", "p_ignterm.py", "--algos", "grpo-ignterm,grpo", "--seeds", "0", "--no-controls",
            "--workers", "2", "--steps", steps, "--checkpoint-every", "1", "--eval-every", "0", "--samples-every", "0",
            "--no-report", "--no-progress"]
    folder = tmp_path / ".pobench" / "runs" / "pobench"
    proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.3",
                POBENCH_POOL_STOP_GRACE="1" if case == "killed" else "60")
    proc.wait_for(lambda: len(checkpointed(folder)) == 2, "a checkpoint of both pairs")
    sent = time.monotonic()
    os.kill(proc.p.pid, signal.SIGTERM)
    rc = proc.finish(timeout=120)
    took = time.monotonic() - sent
    assert rc == 143, proc.text()
    assert proc.group_gone(), "processes of the stopped `bench run` are still alive"
    status = statuses(tmp_path / "mlflow.db")
    ign = next(n for n in status if n.startswith("grpo-ignterm-s0-"))
    lines = [ln for ln in proc.lines() if ln.startswith("bench")]  # (not the probe's warning, the pairs' lines)
    if case == "killed":
        assert took < 9, (took, proc.text())  # (40 steps of 0.3 s: the pair would have trained on for ~10 s)
        assert len(lines) == 2 and "Traceback" not in proc.text(), proc.text()
        assert lines[0].startswith("bench: worker process ") and f"(training {ign}) did not stop within 1 s of " \
            "SIGTERM" in lines[0] and "killed it (SIGKILL); its MLflow run " in lines[0], lines[0]
        assert "kept 0 of 2 pairs finished and 2 checkpointed" in lines[1], lines[1]
        assert status[ign] == "KILLED", status
    else:
        assert len(lines) == 1 and "Traceback" not in proc.text(), proc.text()
        assert status[ign] == "FINISHED", status
        assert "kept 1 of 2 pairs finished and 1 checkpointed" in lines[0], lines[0]
    assert sorted(status.values()) == ["FINISHED" if case == "finishes" else "KILLED", "KILLED", "KILLED"], status


# ------------------------------------------------------------------ H33: a frozen `bench tune` pool worker
def _trainers(folder: Path) -> dict[int, list[Path]]:
    """{pid: the run folders under ``folder`` it trains (holds open the run lock ``.locks/<run>.run.lock`` of)} of
    the processes here (from ``/proc``)."""
    out: dict[int, list[Path]] = {}
    for e in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{e}/fd"):
                with contextlib.suppress(OSError):
                    lock = Path(os.readlink(f"/proc/{e}/fd/{fd}"))
                    if lock.name.endswith(".run.lock") and folder in lock.parents:
                        out.setdefault(int(e), []).append(lock.parent.parent / lock.name.removesuffix(".run.lock"))
    return out


@pytest.mark.slow
def test_a_frozen_pool_worker_does_not_hold_the_stop_of_bench_tune_for_ever(tmp_path):
    """Held-out round 13 (H33): `bench tune --workers 2`, one pool worker frozen (SIGSTOP: a cgroup freezer, a
    debugger, a hung NFS read), then SIGTERM to `bench tune`: no exit until the worker was SIGCONTed. Now the stop
    waits ``$POBENCH_POOL_STOP_GRACE`` seconds for it, then names it (its pid, the run it trains), SIGKILLs it and
    ends that run KILLED; the command exits 143 with its stopped line; no process of it is left. (The trainer is
    injected, tests/bench/fake_trainer.py; the pool's processes and the study are real.)"""
    import signal
    import time

    from tests.bench.test_signals import FAKE_CLI, Proc, checkpointed

    uri = fresh_store(tmp_path)
    argv = ["tune", "--algo", "grpo", "--trials", "2", "--steps", "40", "--seeds", "0", "--study", "fz",
            "--storage", f"sqlite:///{tmp_path}/optuna.db", "--tracking-uri", uri, "--out", "out", "--eval-every",
            "20", "--samples-every", "0", "--sampler-seed", "0", "--checkpoint-every", "1", "--workers", "2"]
    runs = tmp_path / ".pobench" / "runs"
    proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.3", POBENCH_POOL_STOP_GRACE="1")
    frozen = None
    try:
        proc.wait_for(lambda: len(checkpointed(runs)) == 2 and len(_trainers(runs)) == 2, "both trials training")
        frozen, held = sorted(_trainers(runs).items())[0]
        os.kill(frozen, signal.SIGSTOP)
        sent = time.monotonic()
        os.kill(proc.p.pid, signal.SIGTERM)
        rc = proc.finish(timeout=60)
        took = time.monotonic() - sent
    finally:
        if frozen is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(frozen, sig)
    assert rc == 143 and took < 10, (rc, took, proc.text())  # (40 steps of 0.3 s: it would wait for ever)
    assert proc.group_gone(), "processes of the stopped `bench tune` are still alive"
    lines = [ln for ln in proc.lines() if ln.startswith("bench")]
    assert len(lines) == 2 and "Traceback" not in proc.text(), proc.text()
    assert lines[0].startswith(f"bench: worker process {frozen} (training {held[0].name}) did not stop within 1 s "
                               "of SIGTERM") and "the process is frozen" in lines[0], lines[0]
    assert lines[1].startswith("bench tune: stopped by SIGTERM; kept 0 of 2 trials finished of study 'fz'"), lines[1]
    assert "RUNNING" not in statuses(tmp_path / "mlflow.db").values(), statuses(tmp_path / "mlflow.db")
