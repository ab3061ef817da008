"""`bench run` on several processes: the worker count, the shared step-0 evaluation equal to each run's own (real
model), and processes creating one fresh local MLflow store at once. The pool against one pair after another, failures,
two commands on one folder and Ctrl-C are in test_compare.py (fake trainer)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from bench.comparison import DEFAULTS, base_config
from bench.workers import resolve_workers
from reports import metric_keys as K
from tests.conftest import fresh_store

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
