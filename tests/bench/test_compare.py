"""`bench run`'s orchestration (bench/comparison/) on the injected fake trainer (tests/bench/fake_trainer.py): reuse,
resume, ``--force``, variants, failures named by their pair, Ctrl-C, the local pool against one pair after another,
two commands on one folder. Real MLflow stores (SQLite), real processes, the real command line; only the training is
a stand-in. What needs a real model (learning, resume exactness, engine parity, Ray) is in test_train.py,
test_harness.py, test_executor_ray.py, test_engine_trl.py."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from bench.comparison import ComparisonSpec, base_config, run_comparison, variant_label
from reports.metric_keys import TIMING_PREFIXES
from tests import launch
from tests.conftest import fresh_store

from .fake_trainer import FAKE_METRICS, fake_step0, fake_train

ROOT = Path(__file__).resolve().parents[2]
FAKE_CLI = [sys.executable, str(ROOT / "tests" / "bench" / "fake_trainer.py")]
TINY = dict(steps=3, eval_every=1, checkpoint_every=1, samples_every=0)


def tiny(folder: Path, experiment: str, **kw):
    """A config whose local store (``folder/mlflow.db``) starts as a copy of the empty one."""
    return base_config(None, **{**TINY, **kw}, experiment=experiment, tracking_uri=fresh_store(folder),
                       output_dir=str(folder / "runs"))


def spec(cfg, algos, seeds, **kw) -> ComparisonSpec:
    return ComparisonSpec(cfg, algos, seeds, train_fn=fake_train, step0_fn=fake_step0, progress=False,
                          **{"report": False, "workers": 1, **kw})


def runs(client, experiment: str, kind: str = "train") -> list:
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], f"tags.`pobench.kind` = '{kind}'")


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _own(run) -> set[str]:
    """The metrics a (fake) training logged itself: not the machine's samples every run records."""
    return {k for k in run.data.metrics if not k.startswith("system/")}


def all_series(client, experiment: str) -> dict[tuple[str, int], dict[str, list[tuple[int, float]]]]:
    out = {}
    for r in runs(client, experiment):
        key = (r.data.tags["pobench.objective"], int(r.data.tags["pobench.seed"]))
        assert key not in out, f"two runs of {key}"
        out[key] = {k: history(client, r.info.run_id, k) for k in r.data.metrics if not k.startswith(TIMING_PREFIXES)}
    return out


def env() -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    e.pop("MLFLOW_TRACKING_URI", None)  # the default store: sqlite:///mlflow.db in the working folder
    return e


# ------------------------------------------------------------------ reuse, resume, force, variants
def test_variant_is_reused_then_force_redone(tmp_path):
    cfg = tiny(tmp_path, "force", steps=2)
    params = {"grpo": {"kl_coef": 0.0}}
    first = run_comparison(spec(cfg, ["grpo"], [0], params=params, report=True, out_root=tmp_path / "out"))
    label = variant_label("grpo", {"kl_coef": 0.0})
    assert [p.variant for p in first.pairs] == [label] and label.startswith("grpo+")
    client = MlflowClient(cfg.tracking_uri)
    (old,) = runs(client, "force")
    assert old.data.tags["pobench.variant"] == label and old.data.params["objective.kl_coef"] == "0.0"
    assert "| " + label + " |" in (tmp_path / "out" / "force" / first.comparison / "accuracy.md").read_text()

    again = run_comparison(spec(cfg, ["grpo"], [0], params=params))
    assert again.pairs[0].outcome == "reused"           # the overrides are part of the run's identity
    other = run_comparison(spec(cfg, ["grpo"], [0], params={"grpo": {"kl_coef": 0.1}}))
    assert other.pairs[0].outcome == "finished"          # other overrides: another variant, trained
    redo = run_comparison(spec(cfg, ["grpo"], [0], params=params, force=True, report=True,
                               out_root=tmp_path / "out"))
    assert redo.pairs[0].outcome == "finished" and redo.pairs[0].run_id != old.info.run_id
    assert client.get_run(old.info.run_id).data.tags[f"pobench.in.{redo.comparison}"] == "0"
    with open(tmp_path / "out" / "force" / redo.comparison / "runs.csv") as f:
        assert [r["run_id"] for r in csv.DictReader(f)] == [redo.pairs[0].run_id]


def test_interrupted_comparison_resumes_only_missing_pairs(tmp_path):
    cfg = tiny(tmp_path, "resume")

    def interrupt(pair, step, metrics):
        if pair.objective == "tepo" and step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_comparison(spec(cfg, ["grpo", "tepo"], [0], on_eval=interrupt))
    client = MlflowClient(cfg.tracking_uri)
    before = {r.data.tags["pobench.objective"]: r for r in runs(client, "resume")}
    assert before["grpo"].info.status == "FINISHED" and before["tepo"].info.status == "KILLED"
    (parent,) = runs(client, "resume", "comparison")
    assert parent.info.status == "KILLED"

    trained: list[tuple[str, int]] = []
    res = run_comparison(spec(cfg, ["grpo", "tepo"], [0], on_eval=lambda p, step, m: trained.append((p.objective,
                                                                                                      step))))
    assert {p.objective: p.action for p in res.pairs} == {"grpo": "reuse", "tepo": "resume"}
    assert {a for a, _ in trained} == {"tepo"}            # only the missing pair ran
    assert [s for _, s in trained] == [2, 3]              # from its checkpoint at step 1, not from scratch
    after = {r.data.tags["pobench.objective"]: r for r in runs(client, "resume")}
    assert len(after) == 2 and after["tepo"].info.run_id == before["tepo"].info.run_id
    assert client.get_run(after["tepo"].info.run_id).info.status == "FINISHED"
    assert [s for s, _ in history(client, after["tepo"].info.run_id, "eval/accuracy")] == [0, 1, 2, 3]
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"


def test_shared_step0_goes_to_the_runs_that_start_from_scratch(tmp_path):
    cfg = tiny(tmp_path, "step0", steps=1)
    res = run_comparison(spec(cfg, ["grpo", "tepo"], [3, 4]))
    client = MlflowClient(cfg.tracking_uri)
    for r in runs(client, "step0"):
        seed = int(r.data.tags["pobench.seed"])
        assert history(client, r.info.run_id, "eval/accuracy")[0] == (0, fake_step0(cfg, [seed])[seed]["eval/accuracy"])
    assert all(p.outcome == "finished" for p in res.pairs)


# ------------------------------------------------------------------ executors: the pool, failures
def test_pool_gives_the_same_runs_as_one_after_another(tmp_path):
    got = {}
    for w in (1, 2):
        cfg = tiny(tmp_path / f"w{w}", "par")
        res = run_comparison(spec(cfg, ["grpo", "tepo"], [0, 1], workers=w))
        assert res.workers == w and res.executor == "local"
        assert [(p.variant, p.seed, p.outcome) for p in res.pairs] == [
            ("grpo", 0, "finished"), ("grpo", 1, "finished"), ("tepo", 0, "finished"), ("tepo", 1, "finished")]
        assert {p.run_id for p in res.pairs} == {r.info.run_id for r in runs(MlflowClient(cfg.tracking_uri), "par")}
        got[w] = all_series(MlflowClient(cfg.tracking_uri), "par")
    assert set(got[1]) == {("grpo", 0), ("grpo", 1), ("tepo", 0), ("tepo", 1)}
    assert got[2] == got[1]   # the same runs, step by step, the shared step 0 of each seed included


def fail_tepo(pair, step, metrics):
    """on_eval that breaks one pair (picklable: it runs in a worker process)."""
    if pair.objective == "tepo" and step == 1:
        raise RuntimeError("boom in tepo")


def die_in_dapo(pair, step, metrics):
    if pair.objective == "dapo" and step == 1:
        os._exit(3)  # the worker process itself dies


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_pair_is_named_and_the_others_finish(tmp_path, capsys, workers):
    cfg = tiny(tmp_path, "fail", steps=1)
    res = run_comparison(spec(cfg, ["grpo", "tepo"], [0], workers=workers, on_eval=fail_tepo))
    out = {p.objective: p.outcome for p in res.pairs}
    assert out == {"grpo": "finished", "tepo": "failed: RuntimeError: boom in tepo"}
    assert [p.objective for p in res.failed] == ["tepo"]
    assert "tepo seed 0: failed: RuntimeError: boom in tepo" in capsys.readouterr().err
    client = MlflowClient(cfg.tracking_uri)
    status = {r.data.tags["pobench.objective"]: (r.info.status, r.data.tags.get("pobench.failure")) for r in
              runs(client, "fail")}
    assert status == {"grpo": ("FINISHED", None), "tepo": ("FAILED", "RuntimeError: boom in tepo")}
    assert [r.info.status for r in runs(client, "fail", "comparison")] == ["FAILED"]


def refuse_tepo_resume(pair, step, metrics):
    if pair.objective == "tepo":
        raise ValueError("--resume: the checkpoint in runs/x continues MLflow run 1, which the store no longer has")


def test_a_pair_whose_resume_is_refused_says_resuming_not_a_flag_nobody_gave(tmp_path, capsys):
    """Issue 29 (C44): a pair `bench run` resumes itself and the resume refused showed `failed: ValueError: --resume:
    ...`, a flag the user never gave and Python's class name: now `failed: resuming it: ...`."""
    cfg = tiny(tmp_path, "resume-refused", steps=1)
    res = run_comparison(spec(cfg, ["grpo", "tepo"], [0], on_eval=refuse_tepo_resume))
    out = {p.objective: p.outcome for p in res.pairs}
    assert out == {"grpo": "finished", "tepo": "failed: resuming it: the checkpoint in runs/x continues MLflow run 1, "
                                               "which the store no longer has"}
    assert "--resume" not in capsys.readouterr().err


def test_a_pool_worker_that_dies_is_named(tmp_path, capsys):
    cfg = tiny(tmp_path, "die", steps=1)
    res = run_comparison(spec(cfg, ["grpo", "dapo"], [0], workers=2, on_eval=die_in_dapo))
    out = {p.objective: p.outcome for p in res.pairs}
    assert re.fullmatch(r"failed: lost its worker: process \d+ ended abruptly \(exit code 3\)", out["dapo"]), out
    assert "dapo seed 0: failed: lost its worker: process" in capsys.readouterr().err
    # (the pool is broken from then on: a pair still running in it ends the same way, and a rerun resumes it)
    assert out["grpo"] == "finished" or out["grpo"].startswith("failed: lost its worker: stopped when the process "
                                                               "pool broke: the worker process")


def test_an_unpicklable_hook_is_refused_before_anything_runs(tmp_path):
    cfg = tiny(tmp_path, "pickle")
    with pytest.raises(ValueError, match="on_eval runs in the worker processes and must be picklable"):
        run_comparison(spec(cfg, ["grpo", "tepo"], [0], workers=2, on_eval=lambda *a: None))
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("ckpt-*"))


# ------------------------------------------------------------------ processes: two commands, Ctrl-C
@pytest.mark.slow
def test_two_bench_runs_at_once_in_a_fresh_folder_train_each_pair_once(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "steps": 4, "eval_every": 2}))
    fresh_store(tmp_path)   # (the default store of the working folder)
    cmd = [*FAKE_CLI, "run", "--config", "tiny.yaml", "--algos", "grpo", "--seeds", "0,1", "--no-report",
           "--no-progress", "--workers", "1"]
    procs = [launch.Popen(cmd, cwd=tmp_path, env={**env(), "FAKE_STEP_S": "0.5"}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n----\n".join(o[-3000:] for o in outs)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    train_runs = runs(client, "pobench")
    assert all(_own(r) <= FAKE_METRICS for r in train_runs)   # (the fake trained them)
    assert sorted(int(r.data.tags["pobench.seed"]) for r in train_runs) == [0, 1]   # one run per pair
    assert {r.info.status for r in train_runs} == {"FINISHED"}
    assert len(runs(client, "pobench", "comparison")) == 1
    text = "\n".join(outs)
    assert "pass --resume" not in text and "Traceback" not in text
    # every pair trained by exactly one of the two; the other waited (saying so) or found it finished
    for seed in (0, 1):
        finished = sum(f"{'grpo':<24} seed {seed}: finished" in o for o in outs)
        reused = sum(f"{'grpo':<24} seed {seed}: reused" in o for o in outs)
        assert (finished, reused) == (1, 1), text[-4000:]


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_cleanly(tmp_path):
    """Ctrl-C in a terminal (SIGINT to the whole process group) while two workers train: exit 130 with one line, both
    runs KILLED with a checkpoint to resume from, and no process of the group left behind."""
    (tmp_path / "long.yaml").write_text(yaml.safe_dump({**TINY, "steps": 40, "eval_every": 0, "checkpoint_every": 1}))
    fresh_store(tmp_path)   # (the default store of the working folder)
    cmd = [*FAKE_CLI, "run", "--config", "long.yaml", "--algos", "grpo,tepo", "--seeds", "0", "--workers", "2",
           "--no-report", "--no-progress"]
    proc = launch.Popen(cmd, cwd=tmp_path, env={**env(), "FAKE_STEP_S": "0.5"}, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    folder = tmp_path / ".pobench" / "runs" / "pobench"
    deadline = time.time() + 300
    while len({c.parent for c in folder.glob("*/ckpt-*")}) < 2:   # both pairs have trained a step
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, out[-3000:]
    assert "stopped by SIGINT; kept 0 of 2 pairs finished and " in out and "Traceback" not in out, out[-3000:]
    for _ in range(30):   # the workers (and multiprocessing's helper) have exited with the parent
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(1)
    else:
        pytest.fail("processes of the interrupted `bench run` are still alive")
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    killed = runs(client, "pobench")
    assert all(_own(r) <= FAKE_METRICS for r in killed)   # (the fake trained them)
    assert sorted(r.info.status for r in killed) == ["KILLED", "KILLED"]
    assert [r.info.status for r in runs(client, "pobench", "comparison")] == ["KILLED"]
    assert all(len(list(d.glob("ckpt-*"))) >= 1 for d in folder.iterdir() if d.is_dir() and d.name != ".locks")


def test_a_local_stores_run_files_go_beside_its_database_not_into_the_working_folder(tmp_path, monkeypatch):
    """`bench run --tracking-uri sqlite:////data/mlflow.db` from a repository: the runs' files (config.yaml, a
    report, a study's outputs) are kept in ``mlartifacts/<experiment>`` beside the database (MLflow alone put them in
    ``./mlruns`` of the working folder, wherever that was)."""
    work, data = tmp_path / "repo", tmp_path / "data"
    work.mkdir()
    monkeypatch.chdir(work)
    cfg = tiny(data, "beside my/db", steps=2)
    run_comparison(spec(cfg, ["grpo"], [0]))
    assert list(work.iterdir()) == []  # nothing in the working folder
    client = MlflowClient(cfg.tracking_uri)
    (files,) = (data / "mlartifacts").iterdir()   # the name made one safe path component (a slug and a hash)
    assert files.name.startswith("beside_my_db-") and len(files.name) == len("beside_my_db-") + 8
    assert client.get_experiment_by_name("beside my/db").artifact_location == str(files)
    (run,) = runs(client, "beside my/db")
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["config.yaml"]
    assert (files / run.info.run_id / "artifacts" / "config.yaml").is_file()


def test_a_run_folder_being_trained_is_not_trained_into_and_once_killed_its_run_is_ended_by_the_next(tmp_path,
                                                                                                   bench_here,
                                                                                                   monkeypatch):
    """A training process holds its run folder's lock while its MLflow run is open (every engine:
    bench/runs/lifecycle.py). Two trainings into one folder at once (two `bench train --run-name r`, a job array
    given one name) wrote their checkpoints into one folder: two runs mixed, and a resume could continue the other's.
    Now the second is refused with one line naming the folder, before it creates a run, and `bench run --force`
    refuses to delete the folder. Then SIGKILL (out of memory, a scheduler's hard kill) before the first checkpoint
    leaves the run RUNNING with nothing to resume: the same command trains the pair again in a new run and ends the
    abandoned one FAILED, saying so (it stayed RUNNING beside the new one: a run nobody would ever end)."""
    from bench.runs.lifecycle import ABANDONED
    from bench.runs.locks import RunFolderBusy, folder_in_use

    from .fake_trainer import inject

    fields = {**TINY, "steps": 40, "eval_every": 0, "checkpoint_every": 0}
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(fields))
    fresh_store(tmp_path)   # (the default store of the working folder)
    argv = ["run", "--config", "long.yaml", "--algos", "grpo", "--seeds", "0", "--no-report", "--no-progress"]
    proc = launch.Popen([*FAKE_CLI, *argv], cwd=tmp_path, env={**env(), "FAKE_STEP_S": "0.5"},
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    folder = tmp_path / ".pobench" / "runs" / "pobench"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    try:
        record, deadline = None, time.time() + 120
        while record is None:   # the pair's run exists (run.json names it): the process is training
            record = next(folder.glob("*/run.json"), None)
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.1)
        cfg = base_config(None, **fields, tracking_uri=uri, output_dir=str(folder), experiment="pobench",
                          run_name=record.parent.name)
        assert cfg.run_dir() == record.parent
        with pytest.raises(RunFolderBusy, match=f"{record.parent} is in use: another process is training a run"):
            fake_train(cfg)
        base = base_config(None, **fields, tracking_uri=uri, output_dir=str(tmp_path / ".pobench" / "runs"))
        with pytest.raises(RunFolderBusy, match=f"--force: {record.parent} is being trained by another process"):
            run_comparison(spec(base, ["grpo"], [0], force=True))
        client = MlflowClient(uri)
        (killed,) = runs(client, "pobench")   # the refused ones created no run; the first's goes on
        assert record.is_file() and proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not list(record.parent.glob("ckpt-*")) and not folder_in_use(record.parent)
    assert client.get_run(killed.info.run_id).info.status == "RUNNING"   # nobody ended it
    inject(monkeypatch.setattr)
    rc, out, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    assert f"its MLflow run {killed.info.run_id} was left RUNNING by a process that ended before its first " \
           "checkpoint; ended FAILED, a new run starts" in out + err, (out + err)[-3000:]
    after = {r.info.run_id: r for r in runs(client, "pobench")}
    assert after[killed.info.run_id].info.status == "FAILED"
    assert after[killed.info.run_id].data.tags["pobench.failure"] == ABANDONED
    (new,) = [r for rid, r in after.items() if rid != killed.info.run_id]
    assert new.info.status == "FINISHED" and [m.step for m in client.get_metric_history(
        new.info.run_id, "rollout/reward_mean")] == list(range(1, 41))


def test_a_run_whose_end_fails_lets_its_folder_go(tmp_path, monkeypatch):
    """The store refusing a run's end (here: every end) is raised, and the run folder's lock is released all the
    same: a retry in the same process (a notebook, `bench run`'s next pair) is not told another process trains there."""
    from mlflow.exceptions import MlflowException

    from bench.runs.locks import folder_in_use
    from bench.runs.tracking import RunLogger

    cfg = tiny(tmp_path, "end-fails", steps=1, eval_every=0)
    cfg = replace(cfg, run_name="r")

    alive = []  # (the run's logger kept, as a notebook's last traceback keeps it: no garbage collection frees it)

    def refused(self, status):
        alive.append(self)
        raise MlflowException(f"the store refused the end ({status})")

    monkeypatch.setattr(RunLogger, "end", refused)
    with pytest.raises(MlflowException, match="refused the end"):
        fake_train(cfg)
    assert alive and not folder_in_use(cfg.run_dir())


def test_a_notebook_call_is_checked_as_the_command_is(tmp_path):
    """Every check `bench run` makes before any work lives in the library (issue 30: cli/run.py made them, a notebook's
    run_comparison did not): an unreachable server, an output folder that is a file, a report folder in the way,
    params outside their declared range (a warning, to the spec's on_warning)."""
    from tests.net import free_port

    base = tiny(tmp_path, "nb")
    with pytest.raises(ValueError, match="cannot be reached"):
        run_comparison(spec(replace(base, tracking_uri=f"http://127.0.0.1:{free_port()}"), ["grpo"], [0]))
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(ValueError, match="--output-dir"):
        run_comparison(spec(replace(base, output_dir=str(tmp_path / "afile")), ["grpo"], [0]))
    (tmp_path / "out" / "nb").mkdir(parents=True)  # a folder of the user's where the report's experiment folder goes
    with pytest.raises(ValueError, match="not created by pobench"):
        run_comparison(spec(base, ["grpo"], [0], report=True, out_root=str(tmp_path / "out")))
    assert not (tmp_path / "runs").exists() and (tmp_path / "afile").read_text() == "mine"
    said: list[str] = []
    run_comparison(spec(base, ["grpo"], [0], params={"grpo": {"clip_low": 0.9}}, on_warning=said.append))
    assert said and any("clip_low" in w for w in said), said
