"""Held-out round 14, plugins: an exit hook (``atexit``) of a plugin's that never ends (H03) or calls ``os._exit``
(H01), a process a plugin's code makes by ``os.fork`` (H16), an exception ending a plugin's thread (H07), a plugin's
``os.umask`` at import (H06). Each is one line naming the plugin, and the command ends with its own exit code; the
process's end is the subject, so each runs a real command process (a forked one: tests/launch.py), `bench run` on the
fake trainer where what trains does not matter."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from tests.conftest import fresh_store

FAKE_RUN = ["run", "--seeds", "0", "--no-controls", "--workers", "1", "--steps", "1", "--checkpoint-every", "1",
            "--eval-every", "0", "--samples-every", "0", "--prompts-per-step", "2", "--group-size", "2", "--no-report",
            "--no-progress"]


def _fake_run(tmp_path, plugin: str, algo: str):
    """`bench run --plugin PLUGIN --algos ALGO` (one pair, one step of the fake trainer) started in ``tmp_path``, its
    own store, its stderr read as it comes (tests/bench/test_signals.py ``Proc``)."""
    from tests.bench.test_signals import FAKE_CLI, Proc

    fresh_store(tmp_path)
    return Proc([*FAKE_CLI, *FAKE_RUN, "--plugin", plugin, "--algos", algo], tmp_path)


def _warnings(proc) -> list[str]:
    return [ln for ln in proc.lines() if ln.startswith("bench: warning:")]


# ------------------------------------------------------------------ H03: a plugin's exit hook that never ends
HANG = ("import atexit, pathlib, time\nfrom algorithms import register\n\n\n"
        "def clean_up():\n"
        "    (pathlib.Path(__file__).parent / 'in_hook').write_text('1')\n"
        "    time.sleep(1000)  # (a flush to a server that is gone, a join on a stuck thread)\n\n\n"
        "atexit.register(clean_up)\n"
        "register('grpo-hang', base='grpo', description='grpo, from a plugin whose exit hook never ends')\n")


@pytest.mark.parametrize("stop", [None, signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["grace", "sigterm", "sigint", "sighup"])
def test_a_plugin_s_exit_hook_that_never_ends_is_bounded_and_a_signal_ends_it(tmp_path, stop):
    """Held-out round 14 (H03): a plugin registering ``atexit.register(lambda: time.sleep(1000))`` at import:
    `bench train` printed its result, then never exited, SIGTERM and SIGINT ignored (pobench ignores them for the
    interpreter's shutdown); only SIGKILL ended it. Now the plugins' exit hooks get ``PLUGIN_EXIT_GRACE_S`` (5 s)
    after the command, then one line names the hook and the process exits with the command's code; a SIGTERM, SIGINT
    or SIGHUP while the hook runs ends the process at once, its line naming the signal, the exit code the command's."""
    from bench.plugin_hooks import PLUGIN_EXIT_GRACE_S

    (tmp_path / "p_hang.py").write_text(HANG)
    proc = _fake_run(tmp_path, "p_hang.py", "grpo-hang")
    try:
        proc.wait_for(lambda: (tmp_path / "in_hook").exists(), "the plugin's exit hook", timeout=120)
        started = time.monotonic()
        if stop is not None:
            os.kill(proc.p.pid, stop)
        rc = proc.finish(timeout=60)  # (the old code: never; killed below)
        took = time.monotonic() - started
    finally:
        if proc.p.poll() is None:
            os.killpg(proc.p.pid, signal.SIGKILL)
            proc.p.wait()
    assert rc == 0, proc.text()
    assert any("grpo-hang" in ln and "finished" in ln for ln in proc.out), proc.text()  # (the work was done)
    hook = f"plugin p_hang.py's exit hook clean_up ({tmp_path}/p_hang.py:5, registered with atexit)"
    if stop is None:
        assert _warnings(proc) == [
            f"bench: warning: {hook} did not end within {PLUGIN_EXIT_GRACE_S:g} s after the command ended: not waiting "
            "for it; exit 0, the command's (the exit hooks after it are not run; a plugin's exit hook should end "
            "promptly: bound its waits)"], proc.text()
    else:
        assert _warnings(proc) == [
            f"bench: warning: {hook} was still running after the command ended when {stop.name} came: not waiting "
            "for it; exit 0, the command's (the exit hooks after it are not run)"], proc.text()
        assert took < PLUGIN_EXIT_GRACE_S + 20, took
    assert "Traceback" not in proc.text(), proc.text()


# ------------------------------------------------------------------ H01: os._exit in a plugin's exit hook
EXIT5 = ("import atexit, os\nfrom algorithms import register\n\n"
         "atexit.register(lambda: os._exit(5))  # (its own exit code at the end)\n"
         "register('grpo-exit5', base='grpo', description='grpo, from a plugin whose exit hook calls os._exit(5)')\n")


def test_os_exit_in_a_plugin_s_exit_hook_is_one_line_and_the_exit_code_stays_the_command_s(tmp_path):
    """Held-out round 14 (H01): a plugin's exit hook calling ``os._exit(5)``: the run finished, then "Exception ignored
    in atexit callback" and a traceback ending in pobench's own ``bench.plugin_guard.PluginExit: 5`` (round 10's guard
    raises a plugin's ``os._exit`` where no command handles it), exit 0. Now one line names the plugin's hook and what
    it did; the exit code stays the command's (0: its work finished; a plugin's clean-up after it does not change
    what pobench's codes say), the hooks after it run."""
    (tmp_path / "p_exit5.py").write_text(EXIT5)
    proc = _fake_run(tmp_path, "p_exit5.py", "grpo-exit5")
    rc = proc.finish(timeout=120)
    assert rc == 0, proc.text()
    assert any("grpo-exit5" in ln and "finished" in ln for ln in proc.out), proc.text()
    assert _warnings(proc) == [
        f"bench: warning: plugin p_exit5.py's exit hook <lambda> ({tmp_path}/p_exit5.py:4, registered with atexit) "
        "called os._exit(5) after the command ended: ignored, the exit code stays the command's (0) (fix the plugin: "
        "an exit hook should not end the process)"], proc.text()
    text = proc.text()
    assert "Traceback" not in text and "PluginExit" not in text and "Exception ignored" not in text, text


# ------------------------------------------------------------------ H16: a process a plugin's code forked
FORK = ("import os, pathlib, time\nfrom algorithms import register, register_advantage\n_done = []\n\n\n"
        "def adv(rewards):\n    if not _done:\n        _done.append(1)\n        pid = os.fork()\n"
        "        if pid == 0:\n            time.sleep(40)\n            os._exit(0)\n"
        "        (pathlib.Path(__file__).parent / 'child.pid').write_text(str(pid))\n"
        "    return rewards - rewards.mean(dim=1, keepdim=True)\n\n\n"
        "register_advantage('adv-fork', adv, description='forks a child that sleeps, once')\n"
        "register('grpo-fork', base='grpo', description='its estimator forks', advantage_estimator='adv-fork')\n")


def test_a_process_a_plugin_forked_is_named_when_the_command_ends(tmp_path):
    """Held-out round 14 (H16): a plugin's advantage estimator calling ``os.fork()``, its child sleeping 30 s: the
    command ended, nothing said, and a pipeline reading its output waited for the child (round 12's H03 and round
    13's H13 name processes started through ``subprocess`` or a shell). Now a fork a plugin's code made is named in
    the same one line at the command's end, as a fork of the command's process; not killed, the exit code the
    command's."""

    from tests.bench.test_held_out_round12 import child_named_at_end

    (tmp_path / "p_fork.py").write_text(FORK)
    child_named_at_end(tmp_path, "grpo-fork", "p_fork.py", "a fork of this command's process, by os.fork",
                       "--eval-problems", "4", "--max-new-tokens", "8")


# ------------------------------------------------------------------ H07: an exception ending a plugin's thread
THREAD = ("import threading\nfrom algorithms import register, register_advantage\n_done = []\n\n\n"
          "def boom():\n    raise RuntimeError('plugin thread boom')\n\n\n"
          "def adv(rewards):\n    if not _done:\n        _done.append(1)\n"
          "        t = threading.Thread(target=boom, daemon=True)\n        t.start()\n        t.join()\n"
          "    return rewards - rewards.mean(dim=1, keepdim=True)\n\n\n"
          "register_advantage('adv-thr', adv, description='starts a thread that raises, once')\n"
          "register('grpo-thr', base='grpo', description='its estimator starts a thread that raises', "
          "advantage_estimator='adv-thr')\n")


def test_an_exception_ending_a_plugin_s_thread_is_one_line_and_the_run_goes_on(tmp_path):
    """Held-out round 14 (H07): a plugin's estimator starting a thread that raises: Python's ``Exception in thread
    Thread-1 (boom):`` and its traceback mid-run (the run was fine). Now, while plugins are loaded, one line names the
    plugin's thread, the exception and the plugin's line; the run trains on to FINISHED, exit 0."""
    from tests import launch
    from tests.bench.test_held_out_round13_signals import _env, statuses

    uri = fresh_store(tmp_path)
    (tmp_path / "p_thr.py").write_text(THREAD)
    done = launch.run([sys.executable, "-m", "bench", "train", "--plugin", "p_thr.py", "--algo", "grpo-thr", "--steps",
                       "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--max-new-tokens",
                       "8", "--eval-every", "0", "--samples-every", "0", "--no-progress", "--tracking-uri", uri],
                      cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if "boom" in ln]
    assert len(lines) == 1 and re.fullmatch(
        rf"bench: warning: thread Thread-\d+ \(boom\) of plugin p_thr.py raised RuntimeError: plugin thread boom at "
        rf"{re.escape(str(tmp_path))}/p_thr.py:7 \(in boom\): the thread ended, the command went on \(fix the plugin; "
        r"POBENCH_TRACEBACK=1 shows the traceback\)", lines[0]), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr, done.stderr[-3000:]
    assert list(statuses(tmp_path / "mlflow.db").values()) == ["FINISHED"]


# ------------------------------------------------------------------ H06: a plugin's umask at import
UMASK = ("import os\nfrom algorithms import register\n\n"
         "os.umask(0o777)\n"
         "register('grpo-umask', base='grpo', description='grpo, from a plugin that sets the umask to 0777')\n")


def test_a_plugin_s_umask_at_import_is_put_back_and_named(tmp_path):
    """Held-out round 14 (H06): a plugin calling ``os.umask(0o777)`` at import: every file and folder pobench then
    wrote (the store, ``.pobench/``, ``mlartifacts/``, the run folder, its checkpoints) was made mode 000, nothing
    said (unusable by any user but root). As for the working folder and the other process-wide state a plugin's
    import changes (bench.plugin_guard.KeepProcessState): put back right after the import, one warning naming the
    plugin; what the command writes has the modes the user's umask gives."""
    mask = os.umask(0o022)
    os.umask(mask)
    (tmp_path / "p_umask.py").write_text(UMASK)
    proc = _fake_run(tmp_path, "p_umask.py", "grpo-umask")
    rc = proc.finish(timeout=120)
    assert rc == 0, proc.text()
    assert [ln for ln in proc.lines() if "process's umask" in ln] == [
        f"bench run: warning: plugin p_umask.py changed the process's umask to 0777 while imported; pobench put back "
        f"{mask:04o} (with 0777 every file pobench writes, the MLflow store and the run folders among them, would be "
        "made with mode 000; a plugin should give the files it makes their mode instead: os.open(path, flags, mode), "
        "os.chmod)"], proc.text()
    made = [tmp_path / ".pobench", tmp_path / "mlartifacts", *(tmp_path / ".pobench").rglob("*")]
    assert any(p.name.startswith("ckpt-") for p in made), made  # (the run's folder and checkpoint among them)
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in made}
    wrong = {k: m for (k, m), p in zip(modes.items(), made, strict=True)  # (folders as the umask makes them; files
             if (p.is_dir() and int(m, 8) != 0o777 & ~mask) or int(m, 8) & 0o600 != 0o600}  # at least the owner's)
    assert not wrong, modes
