"""Hand-made comparisons logged into a real MLflow store with the training loop's keys and tags."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import fresh_store

STEPS = 20
EVAL_EVERY = 5


def handmade_series(objective: str, seed: int) -> dict[str, list[tuple[int, float]]]:
    """Deterministic series: `tepo` learns faster than `grpo`; seeds add noise."""
    rng = np.random.default_rng(1000 * seed + sum(i * ord(c) for i, c in enumerate(objective, 1)))
    rate = {"grpo": 0.03, "tepo": 0.05}.get(objective, 0.02)
    acc = [(s, float(min(0.95, 0.2 + rate * s + rng.normal(0, 0.02)))) for s in range(0, STEPS + 1, EVAL_EVERY)]
    out = {"eval/accuracy": acc, "eval/accuracy_sampled": [(s, v * 0.9) for s, v in acc]}
    steps = range(1, STEPS + 1)
    ent0 = 1.5 + 0.1 * seed
    decay = 0.97 if objective == "grpo" else 0.9
    out["rollout/entropy_mean"] = [(s, ent0 * decay ** s) for s in steps]
    out["rollout/reward_mean"] = [(s, float(0.2 + rate * s + rng.normal(0, 0.05))) for s in steps]
    out["rollout/zero_adv_frac"] = [(s, float(rng.uniform(0, 0.5))) for s in steps]
    grad = [float(1.0 + rng.uniform(0, 0.2)) for _ in steps]
    grad[12] = 9.0  # one spike at step 13
    out["train/grad_norm"] = list(zip(steps, grad))
    out["train/kl_ref"] = [(s, 0.001 * s * (1 + seed)) for s in steps]
    out["objective/clip_frac_low"] = [(s, float(rng.uniform(0, 0.05))) for s in steps]
    out["objective/clip_frac_high"] = [(s, float(rng.uniform(0, 0.1))) for s in steps]
    if objective == "tepo":
        out["objective/masked_frac"] = [(s, float(rng.uniform(0.1, 0.3))) for s in steps]
    out["time/elapsed_s"] = [(s, 1.7 * s + 0.1 * seed) for s in steps]
    out["time/cpu_s"] = [(s, 0.9 * s + 0.05 * s * s + 0.02 * seed) for s in steps]    # not proportional to the step
    out["sys/load_avg_1m"] = [(s, 1.0 + 0.5 * seed + 0.01 * s) for s in steps]
    length = {"tepo": 30.0}.get(objective, 20.0)                                     # tepo samples longer answers
    out["rollout/gen_tokens"] = [(s, 16 * (length + 0.5 * s) + seed) for s in steps]
    return out


def log_run(client, exp_id: str, objective: str, seed: int, comparison: str, config_hash: str = "cfg000000001",
            status: str = "FINISHED", series=None) -> str:
    from mlflow.entities import Metric

    run = client.create_run(exp_id, run_name=f"{objective}-s{seed}", tags={
        "pobench.kind": "train", "pobench.objective": objective, "pobench.seed": str(seed),
        "pobench.comparison": comparison, "pobench.config_hash": config_hash})
    rid = run.info.run_id
    for k, v in {"model": "builtin:tiny-arith", "task": "arith", "steps": STEPS}.items():
        client.log_param(rid, k, v)
    metrics = [Metric(k, v, 1_700_000_000_000 + s, s)
               for k, ser in (series or handmade_series(objective, seed)).items() for s, v in ser]
    for i in range(0, len(metrics), 900):
        client.log_batch(rid, metrics=metrics[i:i + 900])
    client.set_terminated(rid, status=status)
    return rid


def log_comparison(uri: str, experiment: str = "cmp-test", comparison: str = "c1",
                   objectives=("grpo", "tepo"), seeds=(0, 1), artifacts=None) -> list[str]:
    from mlflow import MlflowClient

    from reports.record import get_or_create_experiment

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if artifacts and not exp:
        exp_id = client.create_experiment(experiment, artifact_location=str(artifacts))
    else:  # (its files beside the store, as pobench's)
        exp_id = get_or_create_experiment(client, uri, experiment)
    return [log_run(client, exp_id, o, s, comparison) for o in objectives for s in seeds]


@pytest.fixture
def handmade():
    """The helpers above: `handmade.log_comparison(uri, ...)`, `handmade.log_run(client, exp_id, ...)`."""
    import types

    return types.SimpleNamespace(log_comparison=log_comparison, log_run=log_run, series=handmade_series)


@pytest.fixture(scope="module")
def local_uri(tmp_path_factory):
    """One local SQLite store per test module (creating its schema takes seconds); tests use their own experiments."""
    return fresh_store(tmp_path_factory.mktemp("store"))
