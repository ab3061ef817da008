"""Held-out round 13: a user's file where pobench writes a run's final model folder (kept, named), a pool worker
killed during `bench run`, a stop signal a plugin swallowed, a plugin's shell-started background process: each said in
one line, as their earlier counterparts are."""

from __future__ import annotations

import shutil

import pytest

from tests.bench.test_containment import TINY, errors, scratch, snapshot  # noqa: F401 (scratch: a fixture)
from tests.bench.test_held_out_round12 import _comparison_with_a_final_model
from tests.conftest import fresh_store


# ------------------------------------------------------------------ H23 / H22: a user's file named `final`
def test_bench_run_force_keeps_a_user_s_file_named_final_in_a_pobench_run_folder(scratch, bench_here):  # noqa: F811
    """Held-out round 13 (H23): a user's plain file ``final`` (where pobench writes the run's final model folder) in
    pobench's marked run folder; `bench run ... --force` retrained and deleted it without a word (the name is one
    pobench writes, so it was taken for pobench's). Now it is refused in one line naming the file, before any
    record: the file and the folder stay as they were."""
    from mlflow import MlflowClient

    from bench.comparison.plan import base_config, plan, run_dir
    from bench.runs.folders import claim_run_folder

    root, work = scratch
    cfg = base_config(None, steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8, samples_every=0,
                      checkpoint_every=1, eval_problems=4, eval_every=0)
    _, (pair,) = plan(cfg, ["grpo"], [0], {"grpo": {}})
    target = claim_run_folder(work / run_dir(cfg, pair))
    (target / "final").write_text("my notes, not pobench's")
    before = snapshot(target)
    rc, _, err = bench_here(["run", "--force", "--algos", "grpo", "--seeds", "0", "--workers", "1", "--no-progress",
                             "--no-report", "--eval-every", "0", *TINY], work)
    lines = errors(err)
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    name = (target / "final").relative_to(work)
    assert f"{name} is a file pobench did not write" in lines[0] and "move it away" in lines[0], lines[0]
    assert snapshot(target) == before and (target / "final").read_text() == "my notes, not pobench's"
    client = MlflowClient(f"sqlite:///{work}/mlflow.db")
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])  # no record opened


def test_eval_comparison_names_a_file_where_the_final_model_folder_goes(tmp_path, bench_here):
    """Held-out round 13 (H22): the run's ``final/`` moved away and a file ``final`` in its place; `bench eval
    --comparison` said "final model(s) not found (run bench eval from the folder bench run ran in)" although the path
    exists and the command runs there. Now: one line saying it is a file, not pobench's final model folder, rc 2."""
    uri = fresh_store(tmp_path)
    _comparison_with_a_final_model(tmp_path, uri)
    final = tmp_path / ".pobench" / "runs" / "pobench" / "grpo-s0" / "final"
    shutil.rmtree(final)
    final.write_text("not a folder")
    rc, _, err = bench_here(["eval", "--comparison", "c1", "--benchmarks", "arith", "--limit", "4", "--tracking-uri",
                             uri], tmp_path)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert f"{final} is a file, not pobench's final model folder" in lines[0], lines[0]
    assert "run bench eval from the folder" not in lines[0] and final.read_text() == "not a folder"


# ------------------------------------------------------------------ H15: a pool worker killed during `bench run`
def _holder(lock: str, skip: int) -> int | None:
    """The pid of the process (not ``skip``) that holds file ``lock`` open."""
    import os

    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == skip:
            continue
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == lock for fd in os.listdir(f"/proc/{pid}/fd")):
                return int(pid)
        except OSError:
            continue
    return None


def test_a_pool_worker_killed_during_bench_run_is_named_and_its_run_ended(tmp_path):
    """Held-out round 13 (H15): `bench run --workers 2`, one pool worker SIGKILLed (as the out-of-memory killer
    does): both pairs failed in Python's words (`BrokenProcessPool: A process in the process pool was terminated
    abruptly ...`, six lines), no cause, no "rerun the same command", and the killed worker's run stayed RUNNING
    after the command ended. Now: one line per pair naming the cause (its worker process killed by SIGKILL; the
    other pair stopped when the pool broke, naming the pair whose worker died), the summary says to rerun the same
    command, and no run is left RUNNING (the killed one KILLED: it has checkpoints to resume from)."""
    import os
    import re
    import signal
    import subprocess
    import time

    from mlflow import MlflowClient

    from tests import launch
    from tests.bench.test_compare import FAKE_CLI, env

    fresh_store(tmp_path)
    # (200 steps of 0.3 s: the other pair is still training when the worker is killed, however late the first pair's
    # first checkpoint comes on a busy machine: with 40, dapo once finished first and its line was "finished")
    cmd = [*FAKE_CLI, "run", "--algos", "grpo,dapo", "--seeds", "0", "--no-controls", "--workers", "2", "--steps",
           "200", "--checkpoint-every", "1", "--no-report", "--no-progress", "--eval-every", "0",
           "--prompts-per-step", "2", "--group-size", "2"]
    proc = launch.Popen(cmd, cwd=tmp_path, env={**env(), "FAKE_STEP_S": "0.3"}, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    folder = tmp_path / ".pobench" / "runs" / "pobench"
    deadline = time.time() + 120
    try:
        while len({c.parent for c in folder.glob("*/ckpt-*")}) < 2:  # both pairs have trained a step
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        (lock,) = (folder / ".locks").glob("grpo-*.run.lock")
        worker = _holder(str(lock.resolve()), proc.pid)
        assert worker is not None
        os.kill(worker, signal.SIGKILL)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out[-3000:]
    assert "BrokenProcessPool" not in out and "terminated abruptly" not in out and "Traceback" not in out, out
    killed = f"process {worker} was killed by SIGKILL (signal 9: out of memory?"
    # (each pair's line as it ends, then the summary's)
    assert len(re.findall(rf"grpo +seed 0: failed: lost its worker: {re.escape(killed)}", out)) == 2, out
    assert len(re.findall(rf"dapo +seed 0: failed: lost its worker: stopped when the process pool broke: the worker "
                          rf"process {worker} of grpo seed 0 was killed by SIGKILL", out)) == 2, out
    assert "2 pair(s) lost their worker process: resume by rerunning the same command: bench run --algos grpo,dapo" \
        in out, out
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    status = {r.info.run_name.split("-")[0]: r.info.status for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()])}
    assert status == {"grpo": "KILLED", "dapo": "KILLED", "comparison": "FAILED"}, status


# ------------------------------------------------------------------ H20: a plugin that swallows the stop
SWALLOW = ("import pathlib, time\nfrom algorithms import register, register_advantage\n\n\n"
           "def adv(rewards):\n"
           "    (pathlib.Path(__file__).parent / 'in_adv').write_text('1')\n"
           "    try:\n        time.sleep(1.5)\n    except BaseException:\n        pass\n"
           "    return rewards - rewards.mean(dim=1, keepdim=True)\n\n\n"
           "register_advantage('adv-swallow', adv, description='swallows every exception while it sleeps')\n"
           "register('grpo-swallow', base='grpo', description='its estimator swallows a stop', "
           "advantage_estimator='adv-swallow')\n")


def test_a_sigterm_a_plugin_swallowed_still_stops_bench_train_at_the_step_s_end(tmp_path):
    """Held-out round 13 (H20): a plugin's advantage estimator `try: time.sleep(...) except BaseException: pass`
    swallowed the KeyboardInterrupt pobench raises for SIGTERM: the signal was lost, training went on to its last
    step, rc 0, the run FINISHED (under a scheduler: SIGKILL after the grace period). pobench has recorded the
    signal: at the end of the step it stops as for the signal (checkpoint, run KILLED, its `stopped by SIGTERM` line,
    143), saying first that the code it interrupted caught it."""
    import os
    import signal

    from tests.bench.test_signals import BENCH, Proc, statuses

    uri = fresh_store(tmp_path)
    (tmp_path / "p_swallow.py").write_text(SWALLOW)
    run_dir = tmp_path / ".pobench" / "runs" / "sw" / "r"
    proc = Proc([*BENCH, "train", "--plugin", "p_swallow.py", "--algo", "grpo-swallow", "--steps", "4",
                 "--eval-every", "0", "--checkpoint-every", "1", "--prompts-per-step", "2", "--group-size", "2",
                 "--max-new-tokens", "8", "--samples-every", "0", "--no-progress", "--tracking-uri", uri,
                 "--experiment", "sw", "--run-name", "r"], tmp_path)
    proc.wait_for(lambda: (tmp_path / "in_adv").exists(), "the estimator's first call", timeout=120)
    os.kill(proc.p.pid, signal.SIGTERM)
    rc = proc.finish(timeout=120)
    lines = proc.lines()
    assert rc == 143, proc.text()
    assert len(lines) == 2 and "Traceback" not in proc.text(), proc.text()
    assert lines[0] == ("pobench: note: the SIGTERM was caught by the code it interrupted (a plugin's `except "
                        "BaseException` or bare `except`?) and training went on: stopping at the end of step 1"), lines
    assert lines[1].startswith("bench train: stopped by SIGTERM; kept ") and "(step 1)" in lines[1], lines
    assert statuses(uri, "sw") == ["KILLED"]
    assert sorted(p.name for p in run_dir.glob("ckpt-*")) == ["ckpt-0000001"] and not (run_dir / "final").exists()


# ------------------------------------------------------------------ H13: a background process started through a shell
SHELLBG = ("import os, subprocess\nfrom algorithms import register, register_advantage\n_done = []\n\n\n"
           "def adv(rewards):\n    if not _done:\n        _done.append(1)\n        {start}\n"
           "    return rewards - rewards.mean(dim=1, keepdim=True)\n\n\n"
           "register_advantage('adv-bg', adv, description='starts a background sleep through a shell, once')\n"
           "register('grpo-bg', base='grpo', description='its estimator starts a background sleep', "
           "advantage_estimator='adv-bg')\n")


@pytest.mark.parametrize("start", ["subprocess.Popen('sleep 37 &', shell=True)", "os.system('sleep 37 &')"],
                         ids=["popen-shell", "os-system"])
def test_a_process_a_plugin_left_in_the_background_through_a_shell_is_named_when_the_command_ends(tmp_path, start):
    """Held-out round 13 (H13): a plugin's estimator starting a background process through a shell
    (``subprocess.Popen('sleep 42 &', shell=True)``, ``os.system('sleep 43 &')``): nothing said at the end, and a
    pipeline reading the command's output waited ~50 s for the orphaned `sleep` (round 12's H03 names direct
    children only). Now the processes holding the command's output pipe open are named in the same one line at its
    end, after the plugin; not killed; the exit code is the command's."""
    import re

    from tests.bench.test_held_out_round12 import end_reading_stderr, train_reading_stderr

    (tmp_path / "bg.py").write_text(SHELLBG.format(start=start))
    proc = train_reading_stderr(tmp_path, "grpo-bg", "bg.py", "--max-new-tokens", "8")
    code, pids, text = end_reading_stderr(proc, lambda err: [int(p) for p in re.findall(rb"(\d+) \(sleep 37\)", err)])
    assert code == 0, text[-3000:]
    found = re.findall(r"bench: warning: child process\(es\) (\d+) \(sleep 37\) \(started by plugin bg.py\) still "
                       r"running after the command ended: not waiting for them; they keep the command's output open",
                       text)
    assert found == [str(pids[0])], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
