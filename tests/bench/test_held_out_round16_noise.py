"""Held-out round 16 (issue 29): what MLflow and matplotlib print by themselves in the middle of pobench's lines
(H03, H04): a command says what it does in its own lines only."""

from __future__ import annotations

import sys

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
