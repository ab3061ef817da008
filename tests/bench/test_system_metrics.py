"""MLflow's system metrics in every training run (issue 30, part 1): sampled by MLflow's monitors, written with the
run's own metrics (bench/runs/system_metrics.py)."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from bench.runs.system_metrics import ENV, SystemMetrics
from tests.bench.test_held_out_faults import TINY
from tests.conftest import fresh_store


def _system_keys(uri: str) -> dict[str, list[int]]:
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("pobench").experiment_id])
    return {k: [m.step for m in client.get_metric_history(run.info.run_id, k)]
            for k in run.data.metrics if k.startswith("system/")}


@pytest.mark.parametrize("every", ["", "0"])
def test_a_training_run_records_the_machine_in_mlflows_system_metrics(tmp_path, bench_here, every):
    """The UI's "System metrics" tab: CPU, memory, disk, network under `system/`, sampled at the first step (then
    every $POBENCH_SYSTEM_METRICS_S seconds, default 10: one sample in a run of seconds); `0` turns them off."""
    uri = fresh_store(tmp_path)
    rc, out, err = bench_here(["train", "--run-name", "r", "--tracking-uri", uri, *TINY[:1], "3", *TINY[2:]],
                              tmp_path, **{ENV: every})
    assert rc == 0, err[-3000:]
    keys = _system_keys(uri)
    if every == "0":
        assert keys == {}
        return
    for k in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
              "system/disk_usage_percentage"):
        assert len(keys.get(k, [])) == 1, keys  # one sample, with the first metrics (not one per step)


def test_samples_are_taken_once_per_interval_and_a_bad_interval_is_one_line(monkeypatch):
    s = SystemMetrics(interval=3600)
    first = s.due()
    assert 0 <= first["system/cpu_utilization_percentage"] <= 100 and first["system/system_memory_usage_megabytes"] > 0
    assert s.due() == {}  # not due again within the hour
    assert SystemMetrics(interval=0).due() == {}
    for bad in ("-1", "nan", "soon"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"\\${ENV}="):
            SystemMetrics()
