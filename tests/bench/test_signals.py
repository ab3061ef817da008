"""SIGTERM (a cluster scheduler's stop) and SIGINT (Ctrl-C) on the commands, as a user meets them: `python -m
bench.cli ...` in a scratch folder, the signal sent once a deterministic point is reached (a checkpoint folder, a
line of output), then: exit 143 / 130, one line on stderr saying what was kept with the exact command to go on, no
traceback, no MLflow run left RUNNING, no process left behind, and the printed command continues and finishes."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests import launch
from tests.bench import fake_trainer
from tests.conftest import fresh_store

ROOT = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "bench.cli"]
FAKE_CLI = [sys.executable, str(ROOT / "tests" / "bench" / "fake_trainer.py")]
DATA = Path("/work/shared/data")
TINY_TRAIN = ["--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "24", "--samples-every", "0",
              "--lr", "1e-3"]


def env(**extra: str) -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}
    e.pop("MLFLOW_TRACKING_URI", None)
    return e


class Proc:
    """A command started in its own process group, its stderr read line by line as it comes."""

    def __init__(self, argv: list[str], cwd: Path, fresh: bool = False, **env_extra: str) -> None:
        """``fresh``: a new interpreter (``subprocess``), not a process forked by tests/launch.py (whose zygote made a
        store already: its new stores are copies, not MLflow's migrations)."""
        start = subprocess.Popen if fresh else launch.Popen
        self.p = start(argv, cwd=cwd, env=env(**env_extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       start_new_session=True)
        self.err: list[str] = []
        self.out: list[str] = []
        self._threads = [threading.Thread(target=self._read, args=(s, b), daemon=True)
                         for s, b in ((self.p.stderr, self.err), (self.p.stdout, self.out))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_for(self, ready, what: str, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while not ready():
            assert self.p.poll() is None, f"ended (rc {self.p.returncode}) before {what}:\n" + self.text()
            assert time.time() < deadline, f"no {what} after {timeout} s:\n" + self.text()
            time.sleep(0.05)

    def finish(self, timeout: float = 600) -> int:
        self.p.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        return self.p.returncode

    def text(self) -> str:
        return "\n".join(self.err[-60:] + ["-- stdout --"] + self.out[-30:])

    def lines(self) -> list[str]:
        """stderr without MLflow's and Optuna's own INFO log lines."""
        return [ln for ln in self.err if ln.strip() and " INFO mlflow" not in ln and not ln.startswith("[I ")]

    def group_gone(self, within: float = 30) -> bool:
        deadline = time.time() + within
        while time.time() < deadline:
            try:
                os.killpg(self.p.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.5)
        return False


def stopped_line(proc: Proc, rc: int, sig: signal.Signals) -> str:
    """The one line a stopped command printed (after checking the exit code and that nothing else was said)."""
    assert rc == 128 + sig, proc.text()
    lines = proc.lines()
    assert len(lines) == 1 and f"stopped by {sig.name}; kept " in lines[0], proc.text()
    assert "Traceback" not in "\n".join(proc.err), proc.text()
    return lines[0]


def command_in(line: str, prefix: list[str] = BENCH) -> list[str]:
    """The command the line says to run (``bench ...``), as argv with ``prefix`` for ``bench``."""
    cmd = shlex.split(line[line.rindex(": bench ") + 2:])
    return [*prefix, *cmd[1:]]


def checkpointed(folder: Path) -> set[Path]:
    """The run folders under ``folder`` that hold a complete checkpoint (renamed into place: not ``.tmp``)."""
    return {c.parent.parent for c in folder.glob("*/ckpt-*/state.json") if not c.parent.name.endswith(".tmp")}


def statuses(uri: str, experiment: str, kind: str | None = None) -> list[str]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.`pobench.kind` = '{kind}'" if kind else "")
    return sorted(r.info.status for r in runs)


# ------------------------------------------------------------------ the handler and the line (in this process)
@pytest.fixture
def fresh_stop(monkeypatch):
    from bench.runs import stop

    monkeypatch.setitem(stop._RECEIVED, "signal", None)
    monkeypatch.setitem(stop._HELD, "pending", False)
    monkeypatch.setitem(stop._LOST, "signal", None)
    return stop


def test_sigterm_interrupts_once_and_sigint_every_time(fresh_stop):
    from bench.runs.stop import sigterm_as_interrupt

    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        # a second SIGTERM while stopping (a pool's parent forwarding the scheduler's) does not break the stop path
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
        except KeyboardInterrupt:
            pytest.fail("a second SIGTERM interrupted the stop under way")
    assert fresh_stop.received() == signal.SIGTERM and fresh_stop.exit_code() == 143
    with pytest.raises(KeyboardInterrupt):
        fresh_stop.interrupt(signal.SIGINT)  # each Ctrl-C interrupts (a second one stops a wait)
    assert fresh_stop.exit_code() == 143  # (the first signal decides)


def test_a_sigterm_that_lands_in_a_finalizer_still_stops(fresh_stop, capsys):
    """Held-out round 11: SIGTERM's KeyboardInterrupt raised inside a garbage-collector callback (a finalizer, a
    WeakKeyDictionary's) was dropped by Python ("Exception ignored in ...") and the stop was lost: later SIGTERMs are
    ignored while stopping, so the command went on. It is delivered again outside the callback, once."""
    import gc

    from bench.runs.stop import sigterm_as_interrupt

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # (Python runs the handler at the next instruction: here, in the finalizer)
                pass

    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            cycle = Finalized()
            cycle.self = cycle
            del cycle
            gc.collect()  # (the finalizer runs inside the collection, where an exception cannot be raised)
            time.sleep(5)
    assert fresh_stop.received() == signal.SIGTERM and fresh_stop._LOST["signal"] is None
    assert "Exception ignored" not in capsys.readouterr().err


def test_a_signal_during_a_store_call_interrupts_once_the_call_is_complete(fresh_stop, tmp_path):
    """The stuck `bench tune` of CI: a worker's SIGTERM cut an MLflow write to SQLite in the middle, its transaction
    stayed open with the database's lock, and both workers waited minutes on it. A signal that comes during a call
    of the store now interrupts once the call has returned: the metrics are written, the lock released."""
    from bench.runs.stop import sigterm_as_interrupt
    from bench.runs.tracking import RunLogger

    log = RunLogger(fresh_store(tmp_path), "held")
    log.start("r", {}, {})
    real = log.client.log_batch

    def signalled_in_the_middle(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # (the handler runs here: held, not raised)
        return real(*args, **kwargs)

    log.client.log_batch = signalled_in_the_middle
    log.log({"m": 1.0}, 1)
    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            log.flush()
    assert [m.step for m in MlflowClient(log.uri).get_metric_history(log.run_id, "m")] == [1]
    conn = sqlite3.connect(tmp_path / "mlflow.db", timeout=0.5)  # nobody holds the write lock
    conn.execute("BEGIN IMMEDIATE")
    conn.rollback()
    conn.close()
    # a second Ctrl-C interrupts at once (a store that hangs can still be left)
    with pytest.raises(KeyboardInterrupt), fresh_stop.uninterrupted():
        fresh_stop.interrupt(signal.SIGINT)
        fresh_stop.interrupt(signal.SIGINT)
        pytest.fail("the second SIGINT was held")


def test_a_signal_during_bench_runs_own_store_write_stops_the_comparison_once_the_write_is_done(fresh_stop, tmp_path):
    """`bench run`'s own records (the comparison's run, the membership of the runs it reuses or redoes) are written
    with the same whole calls as a training run's: a SIGTERM while SQLite executes `--force`'s "no longer a member"
    mark of the old run stops the comparison once that write is committed (cut there, the write was rolled back and
    the old run still counted as a member); the comparison's run ends KILLED, nobody holds the store's lock."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from bench.comparison import ComparisonSpec, ComparisonStopped, base_config, run_comparison
    from bench.runs.stop import sigterm_as_interrupt

    cfg = base_config(None, steps=2, eval_every=1, checkpoint_every=1, samples_every=0, experiment="held",
                      tracking_uri=fresh_store(tmp_path), output_dir=str(tmp_path / "runs"))

    def spec(**kw) -> ComparisonSpec:
        return ComparisonSpec(cfg, ["grpo"], [0], train_fn=fake_trainer.fake_train,
                              step0_fn=fake_trainer.fake_step0, progress=False, report=False, workers=1, **kw)

    first = run_comparison(spec())
    old = first.pairs[0].run_id
    signalled: list[str] = []

    def signal_during_the_mark(conn, cursor, statement, parameters, context, executemany):
        if statement.split()[0] in ("UPDATE", "INSERT") and " tags " in statement and not signalled \
                and any(str(v).startswith("pobench.in.") for v in parameters) and "0" in parameters:
            signalled.append(statement.split()[0])
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # (the handler runs here, inside SQLite's write)

    event.listen(Engine, "before_cursor_execute", signal_during_the_mark)
    try:
        with sigterm_as_interrupt(), pytest.raises(ComparisonStopped):
            run_comparison(spec(force=True))
    finally:
        event.remove(Engine, "before_cursor_execute", signal_during_the_mark)
    assert signalled == ["UPDATE"]  # the signal came during the write of the mark
    assert MlflowClient(cfg.tracking_uri).get_run(old).data.tags[f"pobench.in.{first.comparison}"] == "0"
    assert statuses(cfg.tracking_uri, "held", "comparison") == ["KILLED"]
    conn = sqlite3.connect(tmp_path / "mlflow.db", timeout=0.5)  # nobody holds the write lock
    conn.execute("BEGIN IMMEDIATE")
    conn.rollback()
    conn.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_command_that_keeps_nothing_says_so_and_how_to_rerun_it(fresh_stop, monkeypatch, capsys, sig):
    from bench.cli import list as list_cmd
    from bench.cli import main

    def stopped(args):
        fresh_stop.interrupt(sig)

    monkeypatch.setattr(list_cmd, "run", stopped)
    monkeypatch.setattr(sys, "argv", ["bench", "list", "--markdown"])
    assert main(["list", "--markdown"]) == 128 + sig
    assert capsys.readouterr().err == f"bench list: stopped by {sig.name}; kept nothing; rerun: bench list --markdown\n"


# ------------------------------------------------------------------ bench train
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stopped_bench_train_names_its_checkpoint_and_the_resume_command_continues_it(tmp_path, sig,
                                                                                     bench_here):
    uri = fresh_store(tmp_path)
    argv = [*BENCH, "train", "--algo", "grpo", "--steps", "12", "--eval-every", "0", "--checkpoint-every", "1",
            *TINY_TRAIN, "--tracking-uri", uri, "--experiment", "sig", "--run-name", "r"]
    run_dir = tmp_path / ".pobench" / "runs" / "sig" / "r"
    proc = Proc(argv, tmp_path)
    proc.wait_for(lambda: (run_dir / "ckpt-0000001" / "state.json").exists(), "first checkpoint")
    os.kill(proc.p.pid, sig)
    line = stopped_line(proc, proc.finish(), sig)
    kept = sorted(run_dir.glob("ckpt-*"))[-1]
    step = int(kept.name.split("-")[1])
    assert 1 <= step < 12
    assert f"kept {kept.relative_to(tmp_path)} (step {step}); resume with: bench train " in line, line
    assert line.endswith(" --resume"), line
    assert statuses(uri, "sig") == ["KILLED"]
    assert not list(run_dir.glob("*.tmp"))  # nothing half-written
    if sig == signal.SIGINT:
        return  # (the same state as after SIGTERM, asserted above: its resume is run once, there)
    # the printed command resumes the run from the kept checkpoint and finishes it: steps step+1..12 only
    rc, _, err = bench_here(command_in(line, []), tmp_path)  # (in this process: the printed command is tested)
    assert rc == 0, err[-3000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("sig").experiment_id])
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward_mean")]
    assert sorted(steps) == list(range(1, 13)), steps  # no step missing or trained twice


@pytest.mark.slow
def test_bench_train_stopped_before_its_first_checkpoint_says_it_restarts_from_step_0(tmp_path,
                                                                                     bench_here):
    uri = fresh_store(tmp_path)
    # the step-0 evaluation of 64 problems takes a while: the signal comes during it (the run exists, no step yet)
    argv = [*BENCH, "train", "--algo", "grpo", "--steps", "2", "--eval-every", "2", "--eval-problems", "64",
            "--checkpoint-every", "1", *TINY_TRAIN, "--tracking-uri", uri, "--experiment", "sig", "--run-name", "r"]
    run_dir = tmp_path / ".pobench" / "runs" / "sig" / "r"
    proc = Proc(argv, tmp_path)
    proc.wait_for(lambda: (run_dir / "config.yaml").exists(), "the run's MLflow record")
    os.kill(proc.p.pid, signal.SIGTERM)
    line = stopped_line(proc, proc.finish(), signal.SIGTERM)
    if list(run_dir.glob("ckpt-*")):
        pytest.skip("the machine trained a step before the signal came")
    assert "kept nothing: no checkpoint yet; the run restarts from step 0; rerun: bench train " in line, line
    assert "--resume" not in line
    assert statuses(uri, "sig") == ["KILLED"]
    rc, _, err = bench_here(command_in(line, []), tmp_path)
    assert rc == 0, err[-3000:]
    assert statuses(uri, "sig") == ["FINISHED", "KILLED"]


# ------------------------------------------------------------------ bench run --workers 2 (injected fake trainer)
@pytest.mark.slow
@pytest.mark.parametrize("group", [True, False], ids=["to-the-group", "to-the-parent"])
def test_stopped_bench_run_with_two_workers_ends_the_pool_and_the_same_command_resumes(tmp_path,
                                                                                       group, bench_here,
                                                                                       monkeypatch):
    """SLURM signals every process of the job (the group); Kubernetes only the first one: either way the pool
    ends, each pair checkpoints and ends KILLED, and the same command resumes and finishes them."""
    (tmp_path / "long.yaml").write_text("steps: 12\neval_every: 0\ncheckpoint_every: 1\nsamples_every: 0\n")
    fresh_store(tmp_path)   # (the default store of the working folder)
    argv = ["run", "--config", "long.yaml", "--algos", "grpo,tepo", "--seeds", "0", "--workers", "2",
            "--no-report", "--no-progress"]
    folder = tmp_path / ".pobench" / "runs" / "pobench"
    proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.5")
    proc.wait_for(lambda: len(checkpointed(folder)) == 2, "a checkpoint of both pairs")
    (os.killpg if group else os.kill)(proc.p.pid, signal.SIGTERM)
    line = stopped_line(proc, proc.finish(timeout=300), signal.SIGTERM)
    assert proc.group_gone(), "processes of the stopped `bench run` are still alive"
    assert "kept 0 of 2 pairs finished and 2 checkpointed of comparison " in line, \
        (line, sorted(str(p.relative_to(folder)) for p in folder.glob("*/*")))
    assert "; resume by rerunning the same command: bench run " + shlex.join(argv[1:]) in line, line
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert statuses(uri, "pobench", "train") == ["KILLED", "KILLED"]
    assert statuses(uri, "pobench", "comparison") == ["KILLED"]
    if not group:
        return  # (the same state as after the signal to the group, asserted above: its resume is run once, there)
    fake_trainer.inject(monkeypatch.setattr)  # the printed command, in this process
    rc, out, err = bench_here(command_in(line, []), tmp_path)
    assert rc == 0, err[-3000:]
    assert out.count(": finished") == 2, out
    assert statuses(uri, "pobench", "train") == ["FINISHED", "FINISHED"]  # the same two runs, resumed
    assert statuses(uri, "pobench", "comparison") == ["FINISHED"]


# ------------------------------------------------------------------ bench tune --workers 2 (injected fake trainer)
@pytest.mark.slow
@pytest.mark.parametrize("group", [True, False], ids=["to-the-group", "to-the-parent"])
def test_stopped_bench_tune_queues_its_trials_and_the_same_command_finishes_the_study(tmp_path, group,
                                                                                      bench_here, monkeypatch):
    """As `bench run`'s: the pool's trials end FAIL and are queued again, their runs KILLED, the study's run KILLED;
    the same command runs the queued trials. (The trainer is injected: a real one stopped by a signal is
    test_stopped_bench_train_...; the pool's processes and the study are real.)"""
    uri = fresh_store(tmp_path)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    argv = ["tune", "--algo", "grpo", "--trials", "2", "--steps", "30", "--seeds", "0", "--study", "st",
            "--storage", storage, "--tracking-uri", uri, "--experiment", "tx", "--out", "out", "--eval-every", "15",
            "--samples-every", "0", "--sampler-seed", "0", "--checkpoint-every", "1", "--workers", "2"]
    runs = tmp_path / ".pobench" / "runs"
    proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.5")  # (30 steps: 15 s a trial, till the signal)
    proc.wait_for(lambda: len(checkpointed(runs)) == 2, "a checkpoint of both trials")
    (os.killpg if group else os.kill)(proc.p.pid, signal.SIGTERM)  # SLURM: every process; Kubernetes: the first
    line = stopped_line(proc, proc.finish(timeout=300), signal.SIGTERM)
    assert proc.group_gone(), "processes of the stopped `bench tune` are still alive"
    assert f"kept 0 of 2 trials finished of study 'st' in {storage} (the running trials are queued again); resume " \
           "by rerunning the same command: bench tune --algo grpo" in line, line
    study = optuna.load_study(study_name="st", storage=storage)
    assert sorted(t.state.name for t in study.trials) == ["FAIL", "FAIL", "WAITING", "WAITING"], proc.text()
    assert "RUNNING" not in statuses(uri, "tx")
    assert statuses(uri, "tx", "tune-study") == ["KILLED"]
    if not group:
        return  # (the same state as after the signal to the group, asserted above: its resume is run once, there)
    fake_trainer.inject(monkeypatch.setattr)  # the printed command, in this process
    rc, _, err = bench_here(command_in(line, []), tmp_path)
    assert rc == 0, err[-3000:]
    study = optuna.load_study(study_name="st", storage=storage)
    # the two queued trials ran (under new numbers, with the interrupted ones' parameters) and completed; (a worker
    # may start one trial more before it sees the quota reached)
    states = [t.state.name for t in study.trials]
    assert states.count("FAIL") == 2 and states.count("COMPLETE") in (2, 3), states
    failed = [t.params for t in study.trials if t.state.name == "FAIL"]
    assert all(p in [t.params for t in study.trials if t.state.name == "COMPLETE"] for p in failed)
    assert statuses(uri, "tx", "tune-study") == ["FINISHED"]


# ------------------------------------------------------------------ bench eval
@pytest.mark.slow
def test_stopped_bench_eval_writes_the_finished_benchmarks_marked_partial(tmp_path):
    if not (DATA / "gsm8k").is_dir():
        pytest.skip(f"{DATA / 'gsm8k'} not found (the shared benchmark data)")
    uri = fresh_store(tmp_path)
    # (40 problems: arith takes ~2 s, gsm8k's longer prompts ~25 s, the window for the signal; 300 took ~15 CPU-s)
    argv = [*BENCH, "eval", "--benchmarks", "arith,gsm8k", "--data", f"gsm8k={DATA / 'gsm8k'}", "--limit", "40",
            "--k", "4", "--max-new-tokens", "48", "--out", "out", "--tracking-uri", uri,
            "--skip-bad-rows"]  # (gsm8k rows whose prompt alone is longer than the built-in model's context)
    proc = Proc(argv, tmp_path)
    proc.wait_for(lambda: any(ln.startswith("bench eval: arith:") for ln in proc.err), "arith evaluated")
    said = len(proc.err)  # (its warnings and progress lines so far)
    os.kill(proc.p.pid, signal.SIGTERM)
    rc = proc.finish()
    if rc == 0:
        pytest.skip("the machine evaluated gsm8k before the signal came")
    assert rc == 143, proc.text()
    lines = [ln for ln in proc.err[said:] if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in "\n".join(proc.err), proc.text()
    assert lines[0].startswith("bench eval: stopped by SIGTERM; kept the results of arith (1 of 2 benchmarks) in out,")
    assert "; rerun: bench eval --benchmarks arith,gsm8k" in lines[0], lines[0]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["partial"] is True and results["not_evaluated"] == ["gsm8k"]
    assert [b["benchmark"] for b in results["benchmarks"]] == ["arith"]
    assert (tmp_path / "out" / "arith.csv").is_file() and not (tmp_path / "out" / "gsm8k.csv").exists()
    exp = MlflowClient(uri).get_experiment_by_name("pobench")  # (logged to MLflow only once complete)
    assert exp is None or not MlflowClient(uri).search_runs([exp.experiment_id])
