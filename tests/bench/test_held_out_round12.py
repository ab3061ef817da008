"""Held-out round 12: a check of plain `bench eval` that `--comparison` skipped, a report's note on a pair whose process
is gone, a child a plugin starts while training: each said in one line, as their round-11 counterparts are."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

from tests.conftest import fresh_store


# ------------------------------------------------------------------ H01: `bench eval --comparison`, a row too long
def _comparison_with_a_final_model(tmp_path, uri: str) -> str:
    """A hand-made comparison `c1` (experiment pobench) of one grpo run whose final model (the built-in tiny model's
    files) lies where `bench run` leaves it, ``<output_dir>/<run name>/final``. -> the run's id."""
    from mlflow import MlflowClient

    from bench.model import resolve_model_path
    from reports.record import get_or_create_experiment
    from tests.reports.conftest import log_run

    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, uri, "pobench")
    rid = log_run(client, exp_id, "grpo", 0, "c1")
    out = tmp_path / ".pobench" / "runs" / "pobench"
    client.log_param(rid, "output_dir", str(out))
    shutil.copytree(resolve_model_path("builtin:tiny-arith"), out / "grpo-s0" / "final")
    run = client.create_run(exp_id, run_name="comparison-c1", tags={
        "pobench.kind": "comparison", "pobench.comparison": "c1", "pobench.config_hash": "cfg000000001",
        "pobench.objectives": "grpo", "pobench.seeds": "0", "pobench.baseline": "grpo"})
    client.set_terminated(run.info.run_id)
    return rid


def test_eval_comparison_refuses_a_row_longer_than_the_model_s_context_naming_it(tmp_path, bench_here):
    """Held-out round 12 (H01): `bench eval --comparison` on a JSONL whose one row is longer than the final models'
    context evaluated it with a warning and stored the result (`--skip-bad-rows` had no effect); plain `bench eval`
    refuses it naming `file:line` (round 11, H03). Now `--comparison` runs the same check, before any model loads:
    one line, exit 2, nothing evaluated; with --skip-bad-rows the row is skipped, counted, and the rest evaluated."""
    from mlflow import MlflowClient

    uri = fresh_store(tmp_path)
    rid = _comparison_with_a_final_model(tmp_path, uri)
    rows = "".join(json.dumps({"question": f"What is {i}+1?" + (" x" * 2000 if i == 1 else ""), "answer": str(i + 1)})
                   + "\n" for i in range(3))
    (tmp_path / "d.jsonl").write_text(rows)
    args = ["eval", "--comparison", "c1", "--benchmarks", "gsm8k", "--data", "d.jsonl", "--tracking-uri", uri,
            "--temperature", "0", "--max-new-tokens", "4"]
    rc, out, err = bench_here(args, tmp_path)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert lines[0].startswith("bench eval: error: d.jsonl:2: its prompt is") and "context of 256 tokens" in lines[0] \
        and "--skip-bad-rows" in lines[0], lines[0]
    client = MlflowClient(tracking_uri=uri)
    evals = lambda: client.search_runs([client.get_run(rid).info.experiment_id], "tags.`pobench.kind` = 'eval'")  # noqa: E731
    assert evals() == [] and not (tmp_path / ".pobench" / "eval").exists()

    rc, out, err = bench_here([*args, "--skip-bad-rows"], tmp_path)
    assert rc == 0, err[-3000:]
    assert "gsm8k: skipped 1 row(s) whose prompt is not shorter than the model's context of 256 tokens: d.jsonl:2" \
        in err, err
    assert "Traceback" not in err and "exceed the model's context" not in err, err
    (e,) = evals()
    assert e.data.tags["mlflow.parentRunId"] == rid
    table = (tmp_path / ".pobench" / "eval" / "c1" / "grpo-s0" / "gsm8k" / "gsm8k.csv").read_text()
    assert len(table.splitlines()) == 1 + 2, table  # (the header and the two rows that fit)


# ------------------------------------------------------------------ H02: a pair run whose process is gone
HOLD = ("import sys, time\nfrom bench.runs.locks import folder_held\n"
        "with folder_held(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n")


def test_a_report_says_a_running_pair_s_process_is_gone_and_how_to_complete_it(tmp_path, bench_here, monkeypatch):
    """Held-out round 12 (H02): after the MLflow server was lost during `bench run`, its pair's run stays RUNNING
    (its end kept in the run folder's run.json, no process left); `bench report` said only "is RUNNING, not FINISHED:
    left out". Now the note says, where the run folder is here and names that run: a process still trains it while
    one holds the folder's run lock (a live process here), else that its process has ended and rerunning the same
    `bench run` completes it."""
    import signal
    import subprocess
    import sys

    from mlflow import MlflowClient

    from bench.runs.run import left_running
    from bench.runs.tracking import write_run_record
    from reports.load import load_comparison
    from reports.record import get_or_create_experiment
    from tests import launch
    from tests.reports.conftest import log_run

    uri = fresh_store(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, uri, "pobench")
    crun = client.create_run(exp_id, run_name="comparison-c1", tags={
        "pobench.kind": "comparison", "pobench.comparison": "c1", "pobench.config_hash": "cfg000000001",
        "pobench.objectives": "grpo,dapo", "pobench.seeds": "0", "pobench.baseline": "grpo"})
    log_run(client, exp_id, "grpo", 0, "c1")
    left = log_run(client, exp_id, "dapo", 0, "c1", status="RUNNING")  # what the lost server left (bench run's pair)
    client.set_tag(left, "mlflow.parentRunId", crun.info.run_id)
    client.log_param(left, "output_dir", ".pobench/runs/pobench")
    folder = tmp_path / ".pobench" / "runs" / "pobench" / "dapo-s0"
    folder.mkdir(parents=True)
    write_run_record(folder, {"run_id": left, "tracking_uri": uri, "experiment": "pobench", "unsent_end": {
        "status": "FAILED", "failure": f"the MLflow tracking server {uri} did not answer within 3 s"}})
    assert client.get_run(left).info.status == "RUNNING"

    def note() -> str:
        rc, out, err = bench_here(["report", "--tracking-uri", uri, "--no-store", "--comparison", "c1"], tmp_path)
        assert rc == 0, err[-3000:]
        (line,) = [ln for ln in out.splitlines() if "dapo-s0" in ln and "not FINISHED" in ln]
        return line

    trainer = launch.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True,
                           cwd=tmp_path)
    try:
        assert trainer.stdout.readline().strip() == "held"
        # a live process holds the run folder: still training (what the report's note adds, asked of that run here)
        monkeypatch.chdir(tmp_path)  # (the run records its output_dir relative to the folder `bench run` ran in)
        (run,) = load_comparison("pobench", "c1", uri, client=client, with_series=False).not_finished
        assert run.run_id == left
        assert left_running(run) == f"a process is still training it (it holds its run folder {folder})"
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
    line = note()  # its process gone (killed, as the lost server's `bench run` ended)
    assert f"is RUNNING, not FINISHED: left out; its process has ended (no process holds its run folder {folder})" \
        in line and "kept in its run.json" in line \
        and line.endswith("run the same `bench run` again to complete it."), line
    assert client.get_run(left).info.status == "RUNNING"  # (a report only says it; it ends nothing)
    assert "dapo-s0" in (tmp_path / "reports" / "out" / "pobench" / "c1" / "report.md").read_text()


# ------------------------------------------------------------------ H03: a child a plugin starts while training
SPAWN = ("import pathlib, subprocess\nfrom algorithms import register\n"
         "from algorithms.policy_gradient import ClippedPG\n\nSTARTED = []\n\n\n"
         "class SpawnPG(ClippedPG):\n    def policy_term(self, batch, ratio, adv, is_w):\n"
         "        if not STARTED:  # once; the Popen dropped (its process goes on)\n"
         "            STARTED.append(subprocess.Popen(['sleep', '60']).pid)\n"
         "            (pathlib.Path(__file__).parent / 'child.pid').write_text(str(STARTED[0]))\n"
         "        return super().policy_term(batch, ratio, adv, is_w)\n\n\n"
         "register('spawnpg', SpawnPG, description='starts a sleep child in its loss, once')\n")


def test_a_child_process_a_plugin_s_loss_started_is_named_when_the_command_ends(tmp_path):
    """Held-out round 12 (H03): a plugin objective whose loss starts a child process (not waited for, its output the
    command's): `bench train` ended, nothing said, and a pipeline reading its output waited for the child (round 11's
    H05 names only a child started at import). Now it is named the same way, in one line, at the command's end:
    its pid, its command, the plugin, that it keeps the output open; not killed (pobench ends only what it started);
    the exit code is the command's. (The process itself is the subject: a forked `bench`, tests/launch.py.)"""
    (tmp_path / "spawn.py").write_text(SPAWN)
    child_named_at_end(tmp_path, "spawnpg", "spawn.py", "sleep 60", "--eval-problems", "4")


def child_named_at_end(tmp_path, run_name: str, plugin: str, what: str, *flags: str) -> None:
    """`bench train` with ``plugin`` (its code leaves a process running and writes its pid to child.pid) ends with
    exit 0, no traceback, and one line naming that process (as ``what``), the plugin, and the output it holds."""
    import re

    proc = train_reading_stderr(tmp_path, run_name, plugin, *flags)
    code, (pid,), text = end_reading_stderr(proc, lambda err: [int((tmp_path / "child.pid").read_text())])
    assert code == 0, text[-3000:]
    named = re.escape(f"({what}) (started by plugin {plugin})")
    found = re.findall(r"bench: warning: child process\(es\) (\d+) " + named + r" still running after the command "
                       r"ended: not waiting for them; they keep the command's output open", text)
    assert found == [str(pid)], text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def end_reading_stderr(proc, left: Callable[[bytes], list[int]]) -> tuple[int, list[int], str]:
    """(exit code, pids, stderr) of ``proc`` (``train_reading_stderr``'s): waits for the command's end, reads its
    stderr until the line naming processes left "after the command ended" came (10 s at most), checks that the
    processes ``left(stderr so far)`` names are alive (pobench names them, never ends them), then SIGKILLs them and
    reads the rest (they held the pipe open)."""
    import os
    import select
    import signal
    import time

    err, pids = b"", []
    try:
        code = proc.wait(timeout=180)  # (the command ends; its stderr stays open while the processes hold it)
        deadline = time.monotonic() + 10
        while b"after the command ended" not in err and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 0.5)[0]:
                err += os.read(proc.stderr.fileno(), 65536)
        pids = left(err)
        assert pids and all(launch_alive(p) for p in pids), f"gone (ended by pobench?): {pids}\n{err.decode()[-3000:]}"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        err += proc.stderr.read()
        proc.stderr.close()
    return code, pids, err.decode()


def launch_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not a zombie)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def train_reading_stderr(tmp_path, algo: str, plugin: str, *extra: str):
    """A one-step `bench train` of plugin objective ``algo`` (a forked command, its own store), its stderr a pipe the
    test reads after the command ended (the plugin's processes may hold it): the H03 / round 13 H13 tests."""
    import os
    import subprocess
    import sys

    from tests import launch

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    argv = ["train", "--algo", algo, "--plugin", plugin, "--steps", "1", "--prompts-per-step", "2", "--group-size",
            "2", *extra, "--eval-every", "0", "--samples-every", "0", "--checkpoint-every", "1", "--no-progress",
            "--tracking-uri", fresh_store(tmp_path)]
    return launch.Popen([sys.executable, "-m", "bench", *argv], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE)
