"""Every end of an MLflow run, logged with whether the run's final weights were complete at that moment (for
tests/bench/test_faults.py: a run must never be FINISHED before its final weights are)."""

from __future__ import annotations


def logging_end(end, log: str):
    """``RunLogger.end`` that first appends ``<status> complete|absent`` to the file ``log``."""

    def logged_end(self, status="FINISHED"):
        weights = self.run_dir / "final" / "model.safetensors"
        with open(log, "a") as fh:
            fh.write(f"{status} {'complete' if weights.is_file() and weights.stat().st_size > 0 else 'absent'}\n")
        return end(self, status)

    return logged_end
