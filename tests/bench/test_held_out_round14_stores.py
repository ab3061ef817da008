"""Held-out round 14, stores and signals: the MLflow server lost during `bench eval --comparison` (H21), SIGHUP (a
closed terminal) handled as SIGTERM (H08), the MLflow store damaged during `bench train` (H10), the Optuna SQLite
storage damaged mid-study (H14): each one line saying what is kept and a way out that works, with its exit code."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

import pytest

TINY = ["--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--samples-every", "0",
        "--no-progress"]


def statuses(db: Path) -> list[tuple[str, str]]:
    """(name, status) of every run in the store file ``db``."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(con.execute("select name, status from runs"))
    finally:
        con.close()


# ------------------------------------------------------------------ H21: the server lost during eval --comparison
def test_h21_a_server_lost_during_eval_comparison_stops_within_the_bound_and_the_rerun_ends_its_run(
        tmp_path, bench_here, monkeypatch):
    """Held-out round 14 (H21): the real `mlflow server` SIGKILLed (with its workers) during `bench eval --comparison`:
    nothing printed and no exit for 136 s (MLflow's own retries of each request), until an outside SIGTERM. Now its
    requests are bounded as `bench report`'s and `bench run`'s: one `stopped:` line naming the server, the
    evaluations stored (the rerun reuses them) and the results of the one being stored, exit 1, within seconds; with
    the server back the same command ends the eval run the lost server left RUNNING and stores the rest."""
    from bench import evaluate
    from tests.conftest import MlflowServer

    if shutil.which("mlflow") is None:
        pytest.skip("the `mlflow` command is not on PATH")
    server = MlflowServer(tmp_path / "srv")
    (tmp_path / "srv").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    server.start()
    try:
        rc, _, err = bench_here(["run", "--algos", "grpo,dapo", "--seeds", "0", "--steps", "1", "--max-new-tokens",
                                 "8", "--eval-every", "1", "--workers", "1", "--no-report", "--no-controls", *TINY],
                                work, MLFLOW_TRACKING_URI=server.uri)
        assert rc == 0, err[-3000:]
        from mlflow import MlflowClient

        client = MlflowClient(server.uri)
        exp_id = client.get_experiment_by_name("pobench").experiment_id
        (cid,) = {r.data.tags["pobench.comparison"] for r in client.search_runs([exp_id])
                  if "pobench.comparison" in r.data.tags}
        real_log_batch, killed = evaluate.log_batch, []

        def kill_at_the_second(*args, **kwargs):  # the second eval run made, its numbers not yet sent
            if len(killed) == 0 and kill_at_the_second.calls == 1:
                server.kill()
                killed.append(time.monotonic())
            kill_at_the_second.calls += 1
            return real_log_batch(*args, **kwargs)

        kill_at_the_second.calls = 0
        monkeypatch.setattr(evaluate, "log_batch", kill_at_the_second)
        cmd = ["eval", "--comparison", cid, "--benchmarks", "arith", "--limit", "4", "--max-new-tokens", "8"]
        rc, _, err = bench_here(cmd, work, MLFLOW_TRACKING_URI=server.uri, POBENCH_MLFLOW_TIMEOUT="1")
        seconds = time.monotonic() - killed[0]
        last = err.strip().splitlines()[-1]
        assert rc == 1 and last.startswith(f"bench eval: stopped: MLflow tracking server {server.uri} stopped "
                                           "answering"), err[-3000:]
        assert f"kept: 1 of 2 evaluations of comparison {cid} stored" in last and "results.json" in last, last
        assert last.endswith("once it answers again, rerun the same command") and "Traceback" not in err, last
        assert seconds < 20, seconds
        assert [s for _, s in statuses(tmp_path / "srv" / "mlflow.db")].count("RUNNING") == 1  # (the lost one's)

        monkeypatch.setattr(evaluate, "log_batch", real_log_batch)
        server.start()
        rc, _, err = bench_here(cmd, work, MLFLOW_TRACKING_URI=server.uri)
        assert rc == 0 and "1 stored, 1 to evaluate" in err and "was ended FAILED" in err, err[-3000:]
    finally:
        server.stop()
    runs = statuses(tmp_path / "srv" / "mlflow.db")
    assert "RUNNING" not in {s for _, s in runs}, runs
    assert sorted(s for n, s in runs if n.startswith("eval-")) == ["FAILED", "FINISHED", "FINISHED"], runs
