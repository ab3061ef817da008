"""`bench run --executor ray`: each (objective, seed) pair is a Ray task running the local pool's pair function, so the
runs, their metrics and the reuse / --force / failure rules are those of the local executor. A REAL local Ray
instance (2 CPUs) and real MLflow stores (SQLite); no mock anywhere. Fast tests: the flags' checks and the pure helpers.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from bench.cli import main
from bench.comparison import ComparisonSpec, run_comparison
from bench.executors import EXECUTORS, make_executor
from bench.workers import absolute_tracking_uri, task_resources
from tests import launch
from tests.conftest import ON_RAY

from .test_parallel import TIMING, TINY, all_series, model_dir, tiny  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]
HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (pip install 'pobench[ray]')")


# ------------------------------------------------------------------ flags and helpers (fast)
def test_ray_address_without_ray_executor_is_a_clear_error(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/m.db"
    assert main(["run", "--ray-address", "auto", "--tracking-uri", uri, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--ray-address 'auto' needs --executor ray" in err and "Traceback" not in err
    assert main(["run", "--executor", "local", "--ray-address", "auto", "--tracking-uri", uri]) == 2
    assert "needs --executor ray" in capsys.readouterr().err
    assert not (tmp_path / "m.db").exists()   # nothing was started


def test_unknown_executor_lists_the_choices(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/m.db"
    assert main(["run", "--executor", "dask", "--tracking-uri", uri, "--no-progress"]) == 2
    assert "unknown executor 'dask'; choices: local, ray" in capsys.readouterr().err
    assert not (tmp_path / "m.db").exists()
    with pytest.raises(ValueError, match="choices: local, ray"):
        make_executor("slurm")
    with pytest.raises(ValueError, match="--workers must be >= 0"):
        make_executor("ray", workers=-1)
    assert make_executor(None).name == "local" and make_executor("LOCAL").name == "local"


def test_run_help_shows_the_executor_flags(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--executor NAME" in out and "--ray-address ADDR" in out
    for name in EXECUTORS:
        assert f"{name} = " in out
    assert "pip install 'pobench[ray]'" in out and "(default: local)" in out


def test_missing_ray_names_the_extra(monkeypatch):
    import bench.workers as ex

    monkeypatch.setitem(sys.modules, "ray", None)   # `import ray` raises ImportError, as when it is not installed
    with pytest.raises(ValueError, match=r"pip install 'pobench\[ray\]'"):
        ex.import_ray()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ValueError, match=r"needs Ray, which is not installed: pip install 'pobench\[ray\]'"):
        make_executor("ray")


def test_task_resources_one_gpu_when_the_cluster_has_gpus_else_one_cpu():
    assert task_resources({"CPU": 2.0}) == {"num_cpus": 1}
    assert task_resources({"CPU": 16.0, "GPU": 4.0}) == {"num_gpus": 1}
    assert task_resources({"CPU": 16.0, "GPU": 4.0}, device="cpu") == {"num_cpus": 1}   # the run asks for the CPU


def test_local_stores_get_absolute_paths(tmp_path):
    assert absolute_tracking_uri("sqlite:///mlflow.db", tmp_path) == f"sqlite:///{tmp_path}/mlflow.db"
    assert absolute_tracking_uri("sqlite:///sub/m.db", tmp_path) == f"sqlite:///{tmp_path}/sub/m.db"
    assert absolute_tracking_uri(f"sqlite:///{tmp_path}/m.db", "/elsewhere") == f"sqlite:///{tmp_path}/m.db"
    assert absolute_tracking_uri("mlruns", tmp_path) == str(tmp_path / "mlruns")
    for remote in ("http://127.0.0.1:5000", "postgresql+psycopg2://u@h/db", "sqlite:///:memory:"):
        assert absolute_tracking_uri(remote, tmp_path) == remote


def test_task_setup_forwards_the_environment_and_notes_other_code(tmp_path, monkeypatch):
    from bench.workers import code_root, forwarded_env, task_setup

    monkeypatch.setenv("POBENCH_MLFLOW_TIMEOUT", "7")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    env = forwarded_env("sqlite:////abs/m.db")
    assert env["MLFLOW_TRACKING_URI"] == "sqlite:////abs/m.db" and env["POBENCH_MLFLOW_TIMEOUT"] == "7"
    assert "UNRELATED_SECRET" not in env
    monkeypatch.chdir(tmp_path)
    for key in env:  # restored after the test, also those task_setup sets
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    seen = []
    task_setup({"env": env, "cwd": str(tmp_path), "cpu": False, "code_root": code_root()},
                lambda *e: seen.append(e), 0)
    assert seen == [] and os.environ["MLFLOW_TRACKING_URI"] == "sqlite:////abs/m.db"
    task_setup({"env": {}, "cwd": "/no/such/folder", "cpu": False, "code_root": str(tmp_path)},
                lambda *e: seen.append(e), 3)
    assert seen == [("msg", 3, f"note: a Ray worker runs pobench from {code_root()}, this process from {tmp_path}")]
    assert os.getcwd() == str(tmp_path)   # a folder this node lacks: the working folder stays


# ------------------------------------------------------------------ a real local Ray instance (slow)
@pytest.fixture
def ray_cluster(ray_local):
    """The session's local Ray instance (tests/conftest.py): the ray executor uses a connection that exists."""
    return ray_local


def _train_runs(client, experiment: str, cid: str) -> dict[tuple[str, int], object]:
    """{(objective, seed): run} of the comparison's current members."""
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.`pobench.kind` = 'train' and tags.`pobench.in.{cid}` = '1'")
    out = {(r.data.tags["pobench.objective"], int(r.data.tags["pobench.seed"])): r for r in runs}
    assert len(out) == len(runs), "two member runs of one pair"
    return out


def _series(client, run) -> dict[str, list[tuple[int, float]]]:
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
            for k in run.data.metrics if not k.startswith(TIMING)}


# params that differ between two folders: their paths (absolute under Ray) and the folder's comparison run
PER_FOLDER = ("output_dir", "tracking_uri", "tags.mlflow.parentRunId")


@needs_ray
@ON_RAY
@pytest.mark.slow
def test_ray_gives_the_local_runs_then_reuses_and_force_retrains(tmp_path, model_dir, ray_cluster, capsys):  # noqa: F811
    # the local executor, one pair after another in this process
    local = tiny(tmp_path / "local", model_dir, "rx")
    res = run_comparison(ComparisonSpec(local, ["grpo", "tepo"], [0], workers=1, report=False, progress=False))
    assert [p.outcome for p in res.pairs] == ["finished", "finished"]
    # the same comparison as Ray tasks, in another folder
    cfg = tiny(tmp_path / "ray", model_dir, "rx")
    res = run_comparison(ComparisonSpec(cfg, ["grpo", "tepo"], [0], report=False, progress=False, executor="ray"))
    assert (res.executor, res.workers) == ("ray", 2)
    assert [(p.variant, p.outcome, p.action) for p in res.pairs] == [("grpo", "finished", "train"),
                                                                     ("tepo", "finished", "train")]
    got = {w: all_series(MlflowClient(c.tracking_uri), "rx") for w, c in (("local", local), ("ray", cfg))}
    assert set(got["ray"]) == {("grpo", 0), ("tepo", 0)}
    for key, series in got["local"].items():
        assert got["ray"][key].keys() == series.keys()
        assert [s for s, _ in series["eval/accuracy"]] == [0, 1, 2]
        for metric, values in series.items():
            assert got["ray"][key][metric] == values, (key, metric)   # bit-identical, step by step
    cid = res.comparison
    runs = {w: _train_runs(MlflowClient(c.tracking_uri), "rx", cid) for w, c in (("local", local), ("ray", cfg))}
    for key, r in runs["local"].items():
        q = runs["ray"][key]
        assert q.info.status == r.info.status == "FINISHED"
        assert {k: v for k, v in q.data.params.items() if k not in PER_FOLDER} == \
               {k: v for k, v in r.data.params.items() if k not in PER_FOLDER}
        differ = {k for k in r.data.tags.keys() | q.data.tags.keys() if r.data.tags.get(k) != q.data.tags.get(k)}
        assert differ == {"mlflow.parentRunId"}, differ      # each folder has its own comparison run
    first = {p.objective: p.run_id for p in res.pairs}
    client = MlflowClient(cfg.tracking_uri)
    n_runs = len(client.search_runs([client.get_experiment_by_name("rx").experiment_id]))

    # a second invocation (the command line): every pair reused, nothing trained, so no Ray task at all
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "model": model_dir}))
    flags = ["run", "--config", str(tmp_path / "tiny.yaml"), "--algos", "grpo,tepo", "--seeds", "0", "--experiment",
             "rx", "--tracking-uri", cfg.tracking_uri, "--output-dir", cfg.output_dir, "--executor", "ray",
             "--no-report", "--no-progress"]
    capsys.readouterr()
    assert main(flags) == 0
    out = capsys.readouterr().out
    assert f"comparison {cid} " in out and "(Ray tasks)" in out, out
    for algo in ("grpo", "tepo"):
        assert f"{algo:<24} seed 0: reused" in out, out
    assert {k: r.info.run_id for k, r in _train_runs(client, "rx", cid).items()} == \
           {(a, 0): run_id for a, run_id in first.items()}
    assert len(client.search_runs([client.get_experiment_by_name("rx").experiment_id])) == n_runs

    # --force: a fresh `bench run` process starts its own local Ray instance and retrains every pair
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = launch.run([sys.executable, "-m", "bench.cli", *flags, "--force", "--workers", "2"], cwd=tmp_path,
                      env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "on 2 worker(s) (Ray tasks)" in proc.stdout, proc.stdout
    for algo in ("grpo", "tepo"):
        assert f"{algo:<24} seed 0: finished" in proc.stdout, proc.stdout
    now = _train_runs(client, "rx", cid)
    assert now.keys() == {("grpo", 0), ("tepo", 0)}
    for (algo, seed), r in now.items():
        assert r.info.run_id != first[algo] and r.info.status == "FINISHED"
        assert client.get_run(first[algo]).data.tags[f"pobench.in.{cid}"] == "0"
        assert _series(client, r) == got["ray"][(algo, seed)]   # retrained: the same numbers again


def fail_some(pair, step, metrics):
    """on_eval run inside the Ray tasks: tepo raises, dapo's worker process dies (a failure of the Ray task itself)."""
    if step == 1 and pair.objective == "tepo":
        raise RuntimeError("boom in tepo")
    if step == 1 and pair.objective == "dapo":
        os._exit(3)


@needs_ray
@ON_RAY
@pytest.mark.slow
def test_a_failing_ray_task_is_named_and_the_other_pairs_are_kept(tmp_path, model_dir, ray_cluster, capsys):  # noqa: F811
    cfg = tiny(tmp_path, model_dir, "rfail", steps=1)
    res = run_comparison(ComparisonSpec(cfg, ["grpo", "tepo", "dapo"], [0], report=False, progress=False,
                                        executor="ray", on_eval=fail_some))
    out = {p.objective: p.outcome for p in res.pairs}
    assert out["grpo"] == "finished"
    assert out["tepo"] == "failed: RuntimeError: boom in tepo"
    assert out["dapo"].startswith("failed: Ray task ended (WorkerCrashedError"), out["dapo"]
    assert [p.objective for p in res.failed] == ["tepo", "dapo"]
    err = capsys.readouterr().err
    assert "tepo seed 0: failed: RuntimeError: boom in tepo" in err
    assert "dapo seed 0: failed: Ray task ended (WorkerCrashedError" in err
    runs = _train_runs(MlflowClient(cfg.tracking_uri), "rfail", res.comparison)
    assert runs[("grpo", 0)].info.status == "FINISHED" and runs[("tepo", 0)].info.status == "FAILED"
    parent = MlflowClient(cfg.tracking_uri).search_runs(
        [MlflowClient(cfg.tracking_uri).get_experiment_by_name("rfail").experiment_id],
        "tags.`pobench.kind` = 'comparison'")
    assert [r.info.status for r in parent] == ["FAILED"]
