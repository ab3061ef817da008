"""Held-out round 11's `bench tune` and plugin cases (issue 29): H14 / H15 (a stopped study on a PostgreSQL Optuna
storage, and that storage hung), H13 (an objective's inverted search range), H01 (a held-out problem count past any
bound), H16 (`bench warmstart --out` a file), H18 (a plugin's KeyboardInterrupt at import), H04 (a plugin moving the
MLflow store through the environment), H05 (a plugin's child process left running)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.bench import fake_trainer
from tests.bench.test_held_out_faults import _lines
from tests.bench.test_signals import FAKE_CLI, Proc, checkpointed, fresh_stop, statuses  # noqa: F401
from tests.conftest import fresh_store

from .test_plugins import _registries_as_they_were  # noqa: F401  (autouse: the registries as they were)


def _tune_argv(storage: str, uri: str, *extra: str) -> list[str]:
    return ["tune", "--algo", "grpo", "--trials", "2", "--steps", "2", "--seeds", "0", "--study", "st",
            "--storage", storage, "--tracking-uri", uri, "--experiment", "tx", "--eval-every", "1",
            "--samples-every", "0", "--sampler-seed", "0", "--workers", "1", *extra]


def _sigterm_in_first_trial(monkeypatch) -> None:
    """`bench tune` trains with the fake trainer, which sends this process SIGTERM as the first trial starts."""
    fake_trainer.inject(monkeypatch.setattr)
    real = fake_trainer.fake_train

    def train(cfg, **kw):
        os.kill(os.getpid(), signal.SIGTERM)  # (the handler raises KeyboardInterrupt here: a real stop)
        return real(cfg, **kw)

    monkeypatch.setattr(fake_trainer, "fake_train", train)


# ------------------------------------------------------------------ H14: a stopped study on PostgreSQL
@pytest.mark.usefixtures("fresh_stop")  # (the signal this test sends is forgotten after it)
def test_h14_a_stopped_bench_tune_on_a_plain_postgresql_url_says_stopped_and_ends_its_run(tmp_path, bench_here,
                                                                                          monkeypatch, postgres):
    """Held-out round 11 (H14): SIGTERM to `bench tune --storage postgresql://...` (the URL as the README writes it,
    no driver named): the stop path opened the storage with SQLAlchemy's default driver (psycopg 3, not installed),
    a 200-line traceback, exit 1, the study's MLflow run left RUNNING. Now the usual stopped line, exit 143."""
    postgres.create_database("h14")
    storage = f"postgresql://postgres@127.0.0.1:{postgres.port}/h14"
    uri = fresh_store(tmp_path)
    _sigterm_in_first_trial(monkeypatch)
    rc, _, err = bench_here(_tune_argv(storage, uri), tmp_path)
    lines = [ln for ln in _lines(err) if not ln.startswith("[")]
    assert rc == 143 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "stopped by SIGTERM; kept 0 of 2 trials finished of study 'st' in postgresql://" in lines[0], lines
    assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")
    assert statuses(uri, "tx", "tune-study") == ["KILLED"]
    trials = optuna.load_study(study_name="st", storage=postgres.url("h14")).trials
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"], trials  # queued again


def _server_processes(server) -> list[int]:
    """The PostgreSQL server's processes: the postmaster and its children."""
    main = int((server.data / "postmaster.pid").read_text().split()[0])
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == main]
    return [main, *children]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.mark.slow
def test_h15_a_hung_optuna_postgresql_storage_stops_on_sigterm_in_seconds_in_one_line(tmp_path, postgres):
    """Held-out round 11 (H15): the Optuna PostgreSQL server hung (SIGSTOPped: the kernel accepts, nothing answers)
    while `bench tune` ran: the command hung for good and a SIGTERM did nothing until the server resumed (7 min),
    then H14's traceback, the study run RUNNING. Now each request to the storage is bounded and waits interruptibly:
    the SIGTERM ends the command within seconds, one line naming the storage, no run RUNNING."""
    postgres.create_database("h15")
    storage = f"postgresql://postgres@127.0.0.1:{postgres.port}/h15"
    uri = fresh_store(tmp_path)
    argv = _tune_argv(storage, uri, "--steps", "200", "--checkpoint-every", "1", "--out", "out")
    proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.2", POBENCH_MLFLOW_TIMEOUT="2")
    stopped = []
    try:
        proc.wait_for(lambda: checkpointed(tmp_path / ".pobench" / "runs"), "the first trial's checkpoint")
        for pid in _server_processes(postgres):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        time.sleep(3)  # (a heartbeat / report of the trial now waits on the server)
        os.killpg(proc.p.pid, signal.SIGTERM)
        start = time.time()
        rc = proc.finish(timeout=120)
        took = time.time() - start
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        if proc.p.poll() is None:
            os.killpg(proc.p.pid, signal.SIGKILL)
    lines = [ln for ln in proc.lines() if not ln.startswith("[")]
    assert "Traceback" not in proc.text() and len(lines) == 1, (took, proc.text())
    assert took < 40, (took, proc.text())
    assert rc in (1, 143) and f"127.0.0.1:{postgres.port}/h15" in lines[0], (rc, proc.text())
    assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")


def test_h15_a_request_to_a_bounded_storage_that_gets_no_answer_fails_within_its_bound(monkeypatch):
    """H15 without a signal: a PostgreSQL "server" that accepts and never answers (a listening socket nobody reads:
    what a SIGSTOPped server is to its clients) fails the connection within the storage's bound, then the requests
    after it at once, instead of waiting for ever."""
    import socket

    import psycopg2

    from bench.tune import pgwait

    monkeypatch.setattr(pgwait, "_BOUNDS", {})
    monkeypatch.setattr(pgwait, "_HUNG", {})
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        port = hung.getsockname()[1]
        pgwait.bound(f"postgresql+psycopg2://u@127.0.0.1:{port}/db", 1.0)
        for most in (10.0, 7.0):  # (the first waits its bound; the second shares the 5 s left after a hang)
            start = time.monotonic()
            with pytest.raises(psycopg2.OperationalError, match="did not answer within 1 s"):
                psycopg2.connect(host="127.0.0.1", port=port, dbname="db", user="u", connect_timeout=60)
            assert time.monotonic() - start < most


@pytest.mark.usefixtures("fresh_stop")
def test_h15_a_stop_whose_storage_does_not_answer_still_ends_the_study_run(tmp_path, bench_here, monkeypatch):
    """H15's stop path: the storage not answering when the study is stopped (hung, or lost just then) no longer
    raises out of the stop: the line says the finished trials are kept in the storage, and the study's MLflow run,
    found in the store by the study's name, ends KILLED."""
    from bench.tune import workers

    def hung(spec):
        raise ValueError("--storage ...: cannot be reached: the server did not answer within 30 s")

    uri = fresh_store(tmp_path)
    _sigterm_in_first_trial(monkeypatch)
    monkeypatch.setattr(workers, "_load", hung)
    rc, _, err = bench_here(_tune_argv(f"sqlite:///{tmp_path}/optuna.db", uri), tmp_path)
    lines = [ln for ln in _lines(err) if not ln.startswith("[")]
    assert rc == 143 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "stopped by SIGTERM; kept the finished trials of study 'st' in sqlite:///" in lines[0], lines
    assert "it did not answer just now" in lines[0]
    assert statuses(uri, "tx", "tune-study") == ["KILLED"]


# ------------------------------------------------------------------ H13: an objective's inverted search range
ODD_SPACE = """from dataclasses import dataclass
from algorithms import register, param
from algorithms.policy_gradient import PGConfig, PolicyGradient, clipped_surrogate
@dataclass(frozen=True)
class C(PGConfig):
    weird: float = param(0.5, "x", search=(0.9, 0.1, False))
class O(PolicyGradient):
    config_class = C
    def policy_term(self, batch, ratio, adv, is_w):
        return clipped_surrogate(ratio, adv, 0.2, 0.2) + ({},)
register("oddspace", O, description="x")
"""


def test_h13_an_objective_declaring_an_inverted_search_range_is_refused_when_registered(tmp_path, bench_here):
    """Held-out round 11 (H13): `param(0.5, ..., search=(0.9, 0.1, False))` was accepted at registration; `bench
    tune` made the store, the study and a study run (FAILED) before Optuna's "low <= high" error, naming neither the
    field nor the plugin. Now the plugin fails to load: one line naming it, the objective and the field, exit 2,
    nothing made."""
    (tmp_path / "regodd2.py").write_text(ODD_SPACE)
    rc, _, err = bench_here(["tune", "--plugin", "regodd2.py", "--algo", "oddspace", "--trials", "1", "--steps", "1",
                             "--workers", "1"], tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "plugin regodd2.py failed to load" in lines[0], lines
    assert "objective 'oddspace': field weird: search range (0.9, 0.1, False) is inverted" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["regodd2.py"]


# ------------------------------------------------------------------ H01: --eval-problems past any bound
@pytest.mark.parametrize("how", ["flag", "config"])
def test_h01_a_held_out_problem_count_past_the_maximum_is_refused_before_any_work(tmp_path, bench_here, how):
    """Held-out round 11 (H01): `bench train --eval-problems 100000000000` (or such an int in --config) built its
    held-out problem set for minutes before any run. Now refused in one line naming the field and the maximum, exit 2,
    nothing made."""
    if how == "flag":
        argv = ["train", "--eval-problems", "100000000000", "--steps", "1"]
    else:
        (tmp_path / "c.yaml").write_text("eval_problems: 100000000000000000000000\n")
        argv = ["train", "--config", "c.yaml", "--steps", "1"]
    start = time.time()
    rc, _, err = bench_here(argv, tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "`eval_problems`" in lines[0] and "at most 1,000,000 held-out problems" in lines[0], lines
    assert time.time() - start < 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if how == "flag" else ["c.yaml"])


# ------------------------------------------------------------------ H16: bench warmstart --out a file
def test_h16_warmstart_out_naming_a_file_is_refused_before_any_work(tmp_path, bench_here):
    """Held-out round 11 (H16): `bench warmstart --out wsfile` (a regular file): exit 1 with a `stopped:` line worded
    as a fault met during work, and `.locks/` made beside it. Now the refusal every `--out` gives, exit 2, nothing
    made, the file untouched."""
    (tmp_path / "wsfile").write_text("hi\n")
    rc, _, err = bench_here(["warmstart", "--out", "wsfile", "--steps", "30"], tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0] == "bench warmstart: error: --out wsfile: not a folder; give a folder (it is created when missing)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wsfile"] and (tmp_path / "wsfile").read_text() == "hi\n"


# ------------------------------------------------------------------ H18: a plugin's KeyboardInterrupt at import
@pytest.mark.usefixtures("fresh_stop")  # (no signal received before, in this process)
def test_h18_a_plugin_raising_keyboardinterrupt_at_import_failed_to_load(tmp_path, bench_here):
    """Held-out round 11 (H18): a plugin raising KeyboardInterrupt while imported (no signal sent): exit 1 and not
    worded as a plugin that failed to load, as every other exception at import is. Now that line, exit 2 (a real
    Ctrl-C during the import stays a stop: bench.runs.stop.raised_by_code)."""
    from bench.runs import stop

    (tmp_path / "kbi.py").write_text('raise KeyboardInterrupt("at import")\n')
    before = signal.signal(signal.SIGINT, stop.interrupt)  # (as `bench` has it: pytest's own handler records nothing)
    try:
        rc, _, err = bench_here(["train", "--plugin", "kbi.py", "--steps", "1"], tmp_path)
    finally:
        signal.signal(signal.SIGINT, before)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith("bench train: error: plugin kbi.py failed to load: KeyboardInterrupt: at import"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kbi.py"]


def test_h18_a_signal_during_a_plugin_s_import_stays_a_stop(monkeypatch):
    """The other side of H18: a KeyboardInterrupt that a signal raised while the plugin was imported is a stop."""
    from bench import plugins
    from bench.runs import stop

    monkeypatch.setitem(stop._RECEIVED, "signal", signal.SIGINT)
    e = KeyboardInterrupt()
    assert plugins._failed("kbi.py", e) is e


# ------------------------------------------------------------------ H04: a plugin moving the MLflow store
TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8", "--eval-every", "0",
        "--samples-every", "0", "--checkpoint-every", "1", "--no-progress"]


def test_h04_a_plugin_setting_mlflow_tracking_uri_at_import_is_put_back_and_named(tmp_path, bench_here):
    """Held-out round 11 (H04): a plugin setting os.environ['MLFLOW_TRACKING_URI'] at import silently moved the run
    to another store (`other.db`), which later commands without the plugin never read. Now the variable is put back
    (as a plugin's os.chdir, dtype, warning filters and signal handlers are) and the warning names it; the run is in
    the command's store."""
    (tmp_path / "envmut.py").write_text("import os\nos.environ['MLFLOW_TRACKING_URI'] = 'sqlite:///other.db'\n")
    rc, _, err = bench_here(["train", "--plugin", "envmut.py", *TINY], tmp_path)
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    warned = [ln for ln in _lines(err) if "warning: plugin envmut.py changed" in ln]
    assert len(warned) == 1 and "MLFLOW_TRACKING_URI" in warned[0] and "put them back" in warned[0], err[-3000:]
    assert "other.db" not in warned[0]  # (the names only: a value may be a password)
    assert not (tmp_path / "other.db").exists() and "MLFLOW_TRACKING_URI" not in os.environ
    assert statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench", "train") == ["FINISHED"]


# ------------------------------------------------------------------ H05: a plugin's child process left running
def test_h05_a_child_process_a_plugin_left_running_is_named_when_the_command_ends(tmp_path):
    """Held-out round 11 (H05): a plugin starting a child process at import (not waited for) kept the command's
    output open after `bench` exited (a pipeline waited 45 s), nothing said; a plugin's left-behind thread gets a
    warning. Now the child is named the same way (its pid, its command, the plugin). (The process itself is the
    subject: a forked `bench`, tests/launch.py.)"""
    import re

    from tests import launch

    (tmp_path / "spawn.py").write_text(
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n")
    p = launch.run([sys.executable, "-m", "bench.cli", "list", "--plugin", "spawn.py"], cwd=tmp_path,
                   capture_output=True, text=True, timeout=120)
    found = re.search(r"child process\(es\) (\d+) \(\S+ -c import time; time.sleep\(60\)\) \(started by plugin "
                      r"spawn.py\) still running after the command ended", p.stderr)
    for pid in re.findall(r"child process\(es\) (\d+)", p.stderr):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    assert p.returncode == 0 and found, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
