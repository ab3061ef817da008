"""Held-out round 16 (issue 29): what MLflow prints by itself in the middle of pobench's lines (H03: a command says
what it does in its own lines only); a malformed environment variable ignored (H28)."""

from __future__ import annotations

import sys

import pytest

from tests import launch


def test_a_first_run_with_no_progress_prints_no_mlflow_bar_or_store_creation_lines(tmp_path):
    """H03: `bench run ... --no-progress` (and `bench train`) in a new folder printed MLflow's "Downloading
    artifacts: 100%" bar (the run's own sample files, read back to log them as one table when it finishes) and its
    INFO lines "Creating initial MLflow database tables..." / "Updating database tables" (the store's creation).
    Now neither: stderr holds nothing but pobench's lines; the table and the store are made as before."""
    proc = launch.run([sys.executable, "-m", "bench", "train", "--steps", "2", "--prompts-per-step", "2",
                       "--group-size", "2", "--eval-problems", "4", "--samples-every", "1", "--no-progress",
                       "--run-name", "quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for noise in ("Downloading artifacts", "Creating initial MLflow database tables", "Updating database tables",
                  "INFO"):
        assert noise not in proc.stderr, proc.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("pobench").experiment_id])[0]
    assert "samples.json" in [a.path for a in client.list_artifacts(run.info.run_id)]


@pytest.mark.parametrize("value, why", [("abc", "give a number of seconds"), ("-5", "give a number of seconds >= 0"),
                                        ("inf", "give a number of seconds >= 0")])
def test_a_malformed_pool_stop_grace_is_refused_before_any_work(bench_here, tmp_path, value, why):
    """Held-out round 16 (H28): `POBENCH_POOL_STOP_GRACE=abc bench run ...` (the README: it "sets that wait") trained
    and stopped with the default 30 s, the value ignored without a word, while a malformed POBENCH_PROGRESS_EVERY or
    POBENCH_MLFLOW_TIMEOUT is refused. Now `bench run` and `bench tune` refuse it in one line before any work (exit
    2, nothing made in the folder)."""
    for argv in (["run", "--algos", "grpo", "--seeds", "0", "--no-controls", "--steps", "1", "--no-report"],
                 ["tune", "--algo", "grpo", "--trials", "1", "--steps", "1"]):
        rc, _, err = bench_here(argv, tmp_path, POBENCH_POOL_STOP_GRACE=value)
        assert rc == 2, err
        assert err.strip() == f"bench {argv[0]}: error: POBENCH_POOL_STOP_GRACE={value!r}: {why}", err
        assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
