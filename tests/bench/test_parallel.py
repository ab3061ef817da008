"""`bench run` on several processes: the worker count, the shared step-0 evaluation equal to each run's own (real
model), and processes creating one fresh local MLflow store at once. The pool against one pair after another, failures,
two commands on one folder and Ctrl-C are in test_compare.py (fake trainer)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from bench.comparison import DEFAULTS, base_config
from bench.workers import resolve_workers
from reports import metric_keys as K
from tests.conftest import forkserver_context, fresh_store

ROOT = Path(__file__).resolve().parents[2]
# measurements of the machine (wall clock, CPU time, load): the only metrics allowed to differ
TIMING = K.TIMING_PREFIXES


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
    uri = fresh_store(folder)
    return base_config(None, model=model, **{**TINY, **kw}, experiment=experiment, tracking_uri=uri,
                       output_dir=str(folder / "runs"))


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


@pytest.mark.slow
def test_shared_step0_eval_equals_each_runs_own(tmp_path, model_dir):
    """A run given the comparison's shared step-0 evaluation logs exactly what it logs when it evaluates
    itself (interval bounds included), and trains exactly the same afterwards."""
    from bench.comparison.pairs import initial_evals
    from bench.data import eval_problems
    from bench.engines.entry import train
    from bench.evaluate import eval_metrics, held_out_result
    from bench.model import load_policy
    from bench.rollout import make_sampler

    cfg = tiny(tmp_path, model_dir, "s0", steps=1)
    shared = initial_evals(cfg, list(range(12)))   # one greedy evaluation, summarized per seed
    model, tok = load_policy(cfg.model, cfg.device, cfg.dtype)
    engine = make_sampler(cfg.backend, model, tok)
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


# ------------------------------------------------------------------ concurrent processes on one folder (slow)
def _create_a_run(folder: str, name: str, barrier) -> str:
    """One process of the test below: at the same moment as the others, open the store ``folder/mlflow.db`` (that
    may not exist yet) and record a run in it; the error, if any."""
    try:
        from reports.record import get_or_create_experiment, open_client

        uri = f"sqlite:///{folder}/mlflow.db"
        barrier.wait(timeout=120)
        client = open_client(uri)
        exp = get_or_create_experiment(client, uri, "shared")
        client.set_terminated(client.create_run(exp, run_name=name).info.run_id)
        return ""
    except Exception as e:  # noqa: BLE001  (whatever it is, the test reports it)
        barrier.abort()
        return f"{name}: {type(e).__name__}: {e}"


@pytest.mark.slow
def test_processes_creating_a_fresh_store_at_once_do_not_corrupt_it(tmp_path):
    """Three processes open one store that does not exist yet, at the same moment (a barrier), and each records a
    run. (Forked from a forkserver that imported MLflow's store once: three `python -c` processes imported it each,
    ~3 CPU-seconds apiece; separate processes all the same, each with its own connections.)"""
    from concurrent.futures import ProcessPoolExecutor

    with forkserver_context("reports.record", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store",
                            __name__) as ctx, ctx.Manager() as manager, ProcessPoolExecutor(3, mp_context=ctx) as pool:
        barrier = manager.Barrier(3)
        done = [pool.submit(_create_a_run, str(tmp_path), f"p{i}", barrier) for i in range(3)]
        errors = [e for d in done if (e := d.result(timeout=300))]
    assert not errors, errors
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("shared")
    assert sorted(r.info.run_name for r in client.search_runs([exp.experiment_id])) == ["p0", "p1", "p2"]
    assert len([e for e in client.search_experiments() if e.name == "shared"]) == 1
