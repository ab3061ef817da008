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
