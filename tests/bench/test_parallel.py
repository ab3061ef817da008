"""`bench run` on several processes: the pool gives the same results as one after another, the step-0 evaluation is
shared, failures name their pair, and concurrent processes never corrupt the local MLflow store or train a pair twice.
Real MLflow stores (SQLite) and real processes throughout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient

from bench.harness import DEFAULTS, base_config, resolve_workers, run_comparison

ROOT = Path(__file__).resolve().parents[2]
# wall-clock measurements: the only metrics allowed to differ
TIMING = ("time/", "rollout/tokens_per_s", "perf/throughput")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """The shipped warm-started tiny model when present, else a randomly initialised one (an ordinary HF folder)."""
    from bench.model import BUILTIN_MODELS

    if (BUILTIN_MODELS["builtin:tiny-arith"] / "config.json").exists():
        return "builtin:tiny-arith"
    from transformers import AutoModelForCausalLM

    from bench.model import build_char_tokenizer, tiny_config

    out = tmp_path_factory.mktemp("tiny-random")
    tok = build_char_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(tiny_config(tok)).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


TINY = dict(steps=2, prompts_per_step=2, group_size=2, eval_problems=8, eval_every=1, checkpoint_every=1,
            max_new_tokens=16, samples_every=0)


def tiny(folder: Path, model: str, experiment: str, **kw):
    return base_config(None, model=model, **{**TINY, **kw}, experiment=experiment,
                       tracking_uri=f"sqlite:///{folder}/mlflow.db", output_dir=str(folder / "runs"))


def all_series(client, experiment: str) -> dict[tuple[str, int], dict[str, list[tuple[int, float]]]]:
    """{(objective, seed): {metric key: [(step, value)]}} of the experiment's training runs, timings left out."""
    exp = client.get_experiment_by_name(experiment)
    out = {}
    for r in client.search_runs([exp.experiment_id], "tags.`pobench.kind` = 'train'"):
        key = (r.data.tags["pobench.objective"], int(r.data.tags["pobench.seed"]))
        assert key not in out, f"two runs of {key}"
        out[key] = {k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k))
                    for k in r.data.metrics if not k.startswith(TIMING)}
    return out


def test_resolve_workers_defaults_to_cores_capped_by_pairs():
    cfg = base_config(None, device="cpu")
    cores = len(os.sched_getaffinity(0))
    assert DEFAULTS.workers == 0 and DEFAULTS.seeds == (0, 1, 2)
    assert resolve_workers(None, 100, cfg) == cores
    assert resolve_workers(None, 1, cfg) == 1
    assert resolve_workers(3, 2, cfg) == 2 and resolve_workers(1, 9, cfg) == 1
    with pytest.raises(ValueError, match="--workers"):
        resolve_workers(-1, 3, cfg)


# ------------------------------------------------------------------ pool == one after another (slow)
@pytest.mark.slow
def test_pool_gives_the_same_runs_as_one_after_another(tmp_path, model_dir):
    got = {}
    for w in (1, 2):
        cfg = tiny(tmp_path / f"w{w}", model_dir, "par")
        res = run_comparison(cfg, ["grpo", "tepo"], [0], workers=w, report=False, progress=False)
        assert res.workers == w
        assert [(p.variant, p.outcome) for p in res.pairs] == [("grpo", "finished"), ("tepo", "finished")]
        got[w] = all_series(MlflowClient(cfg.tracking_uri), "par")
    assert set(got[1]) == {("grpo", 0), ("tepo", 0)}
    for key in got[1]:
        assert got[1][key].keys() == got[2][key].keys()
        assert [s for s, _ in got[1][key]["eval/accuracy"]] == [0, 1, 2]
        for metric, series in got[1][key].items():
            assert got[2][key][metric] == series, (key, metric)   # bit-identical, step by step


@pytest.mark.slow
def test_shared_step0_eval_equals_each_runs_own(tmp_path, model_dir):
    """A run given the comparison's shared step-0 evaluation logs exactly what it logs when it evaluates
    itself (interval bounds included), and trains exactly the same afterwards."""
    from bench.data import eval_problems
    from bench.model import load_policy
    from bench.parallel import initial_evals
    from bench.rollout import make_engine
    from bench.train import eval_metrics, held_out_result, train

    cfg = tiny(tmp_path, model_dir, "s0", steps=1)
    shared = initial_evals(cfg, list(range(12)))   # one greedy evaluation, summarized per seed
    model, tok = load_policy(cfg.model, cfg.device, cfg.dtype)
    engine = make_engine(cfg.backend, model, tok)
    b, problems = eval_problems(cfg.task, limit=cfg.eval_problems, difficulty=cfg.difficulty)

    def untimed(m):
        return {k: v for k, v in m.items() if not k.startswith(TIMING)}

    own = {s: untimed(eval_metrics(held_out_result(replace(cfg, seed=s), engine, tok, b, problems))) for s in shared}
    assert {s: untimed(m) for s, m in shared.items()} == own
    # a seed whose bootstrap interval differs from seed 0's (the interval is the only seeded part of a greedy eval):
    # its run, given the shared metrics, must log exactly what it logs when it evaluates itself
    seed = next((s for s in own if own[s] != own[0]), 1)
    cfg = replace(cfg, seed=seed)
    train(replace(cfg, run_name="given"), step0_eval=shared[seed])
    train(replace(cfg, run_name="own"))
    client = MlflowClient(cfg.tracking_uri)
    exp = client.get_experiment_by_name("s0")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    series = {name: {k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k))
                     for k in r.data.metrics if not k.startswith(TIMING)} for name, r in runs.items()}
    assert series["given"] == series["own"]
    assert series["own"]["eval/accuracy"][0] == (0, shared[seed]["eval/accuracy"])


def fail_tepo(pair, step, metrics):
    """on_eval that breaks one pair (picklable: it runs in a worker process)."""
    if pair.objective == "tepo" and step == 1:
        raise RuntimeError("boom in tepo")


@pytest.mark.slow
def test_a_failing_pair_is_named_and_the_others_finish(tmp_path, model_dir, capsys):
    cfg = tiny(tmp_path, model_dir, "fail", steps=1)
    res = run_comparison(cfg, ["grpo", "tepo"], [0], workers=2, report=False, progress=False, on_eval=fail_tepo)
    out = {p.objective: p.outcome for p in res.pairs}
    assert out["grpo"] == "finished"
    assert out["tepo"] == "failed: RuntimeError: boom in tepo"
    assert [p.objective for p in res.failed] == ["tepo"]
    assert "tepo seed 0: failed: RuntimeError: boom in tepo" in capsys.readouterr().err
    client = MlflowClient(cfg.tracking_uri)
    runs = {r.data.tags["pobench.objective"]: r for r in client.search_runs(
        [client.get_experiment_by_name("fail").experiment_id], "tags.`pobench.kind` = 'train'")}
    assert runs["grpo"].info.status == "FINISHED" and runs["tepo"].info.status == "FAILED"


# ------------------------------------------------------------------ concurrent processes on one folder (slow)
@pytest.mark.slow
def test_processes_creating_a_fresh_store_at_once_do_not_corrupt_it(tmp_path):
    script = textwrap.dedent("""
        import sys
        from reports.record import get_or_create_experiment, open_client
        uri = "sqlite:///mlflow.db"
        client = open_client(uri)
        exp = get_or_create_experiment(client, uri, "shared")
        client.set_terminated(client.create_run(exp, run_name=sys.argv[1]).info.run_id)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    procs = [subprocess.Popen([sys.executable, "-c", script, f"p{i}"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(o[-1500:] for o in outs)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("shared")
    assert sorted(r.info.run_name for r in client.search_runs([exp.experiment_id])) == ["p0", "p1", "p2"]
    assert len([e for e in client.search_experiments() if e.name == "shared"]) == 1


@pytest.mark.slow
def test_two_bench_runs_at_once_in_a_fresh_folder_train_each_pair_once(tmp_path, model_dir):
    # long enough (a few seconds per pair) that both processes are at the pairs at the same time
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "steps": 6, "eval_every": 3, "model": model_dir}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the default store: sqlite:///mlflow.db in the working folder
    cmd = [sys.executable, "-m", "bench.cli", "run", "--config", "tiny.yaml", "--algos", "grpo", "--seeds", "0,1",
           "--no-report", "--no-progress"]
    procs = [subprocess.Popen(cmd + ["--workers", w], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for w in ("2", "2")]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n----\n".join(o[-3000:] for o in outs)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("pobench")
    train_runs = client.search_runs([exp.experiment_id], "tags.`pobench.kind` = 'train'")
    assert sorted(int(r.data.tags["pobench.seed"]) for r in train_runs) == [0, 1]   # one run per pair
    assert {r.info.status for r in train_runs} == {"FINISHED"}
    assert len(client.search_runs([exp.experiment_id], "tags.`pobench.kind` = 'comparison'")) == 1
    text = "\n".join(outs)
    assert "pass --resume" not in text and "Traceback" not in text
    # every pair trained by exactly one of the two; the other waited (saying so) or found it finished
    for seed in (0, 1):
        finished = sum(f"{'grpo':<24} seed {seed}: finished" in o for o in outs)
        reused = sum(f"{'grpo':<24} seed {seed}: reused" in o for o in outs)
        assert (finished, reused) == (1, 1), text[-4000:]


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_cleanly(tmp_path, model_dir):
    """Ctrl-C in a terminal (SIGINT to the whole process group) while two workers train: exit 130 with one line, both
    runs KILLED with a checkpoint to resume from, and no process of the group left behind."""
    import signal
    import time

    (tmp_path / "long.yaml").write_text(yaml.safe_dump({**TINY, "steps": 200, "eval_every": 0, "model": model_dir}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", "run", "--config", "long.yaml", "--algos", "grpo,tepo",
                             "--seeds", "0", "--workers", "2", "--no-report", "--no-progress"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    runs = tmp_path / ".pobench" / "runs" / "pobench"
    deadline = time.time() + 400
    while len({c.parent for c in runs.glob("*/ckpt-*")}) < 2:   # both pairs have trained a step
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted; rerun the same command to resume" in out and "Traceback" not in out, out[-3000:]
    for _ in range(30):   # the workers (and multiprocessing's helper) have exited with the parent
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(1)
    else:
        pytest.fail("processes of the interrupted `bench run` are still alive")
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("pobench")
    train_runs = client.search_runs([exp.experiment_id], "tags.`pobench.kind` = 'train'")
    assert sorted(r.info.status for r in train_runs) == ["KILLED", "KILLED"]
    assert all(len(list(d.glob("ckpt-*"))) >= 1 for d in runs.iterdir() if d.is_dir() and d.name != ".locks")
