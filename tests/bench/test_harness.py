"""`bench run`: resolving objectives, seeds and params; one real comparison on the tiny model (training, report, reuse).
Its orchestration (resume, --force, failures, Ctrl-C, executors) is tested on a fake trainer in test_compare.py."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
import yaml
from mlflow import MlflowClient

from bench.comparison import ComparisonSpec, run_comparison
from bench.comparison.plan import DEFAULTS, base_config, comparison_id, load_params, resolve_algos, variant_label
from bench.workers import parse_seeds
from tests.conftest import fresh_store

FIGURES = ["accuracy_vs_step", "accuracy_vs_time", "accuracy_vs_cpu", "entropy_vs_step", "reward_vs_step",
           "clip_masked_fractions", "time_to_convergence"]
TABLES = ["accuracy", "convergence", "compute_fit", "stability", "paired_test", "runs"]


# ------------------------------------------------------------------ resolving what to run (fast)
def test_resolve_algos_names_groups_and_ablation():
    from algorithms import objective_groups

    assert resolve_algos("grpo,dapo") == ["grpo", "dapo"]
    assert resolve_algos(None) == list(DEFAULTS.algos)
    tepo_group = objective_groups()["tepo"]
    assert resolve_algos("grpo", "tepo") == ["grpo", *tepo_group]
    assert resolve_algos("@tepo") == tepo_group
    with pytest.raises(ValueError, match="unknown objective 'grpoo'.*did you mean 'grpo'"):
        resolve_algos("grpoo,dapo")
    with pytest.raises(ValueError, match="no ablation group 'dapo'"):
        resolve_algos(None, "dapo")


def test_parse_seeds():
    assert parse_seeds("0, 1,2", DEFAULTS.seeds) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"--seeds 0,1,2,1: seed 1 is named twice; name each seed once"):
        parse_seeds("0, 1,2,1", DEFAULTS.seeds)
    assert parse_seeds(None, DEFAULTS.seeds) == list(DEFAULTS.seeds)
    with pytest.raises(ValueError, match="comma-separated integers"):
        parse_seeds("0,a", DEFAULTS.seeds)


def test_load_params_forms_and_errors(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text(yaml.safe_dump({"objective_overrides": {"entropy_threshold": 0.1, "clip_high": 0.3}}))
    got = load_params(flat, ["grpo", "tepo"])   # a field goes to every objective that has it
    assert got == {"grpo": {"clip_high": 0.3}, "tepo": {"entropy_threshold": 0.1, "clip_high": 0.3}}
    per = tmp_path / "per.yaml"
    per.write_text(yaml.safe_dump({"tepo": {"kl_coef": 0.2}}))
    assert load_params(per, ["grpo", "tepo"]) == {"grpo": {}, "tepo": {"kl_coef": 0.2}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"no_such_field": 1}))
    with pytest.raises(ValueError, match="no_such_field"):
        load_params(bad, ["grpo"])
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"dapo": {"clip_high": 0.3}}))
    with pytest.raises(ValueError, match="not among the objectives run"):
        load_params(other, ["grpo"])


def test_comparison_id_is_deterministic_and_distinguishes():
    v = {"grpo": {}, "tepo": {}}
    a = comparison_id("abc", v, [0, 1])
    assert a == comparison_id("abc", {"tepo": {}, "grpo": {}}, [1, 0])
    assert a != comparison_id("abd", v, [0, 1])
    assert a != comparison_id("abc", v, [0, 1, 2])
    assert a != comparison_id("abc", {"grpo": {}, variant_label("tepo", {"kl_coef": 0.1}): {"kl_coef": 0.1}}, [0, 1])


def test_base_config_layers(tmp_path):
    cfg = base_config(None)
    for k, v in DEFAULTS.train.items():
        assert getattr(cfg, k) == v
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"steps": 7, "lr": 3e-4}))
    cfg = base_config(f, steps=9)
    assert (cfg.steps, cfg.lr, cfg.eval_problems) == (9, 3e-4, DEFAULTS.train["eval_problems"])
    f.write_text(yaml.safe_dump({"stepz": 7}))
    with pytest.raises(ValueError, match="stepz"):
        base_config(f)


def test_cli_unknown_objective_clear_error_before_any_run(tmp_path, capsys):
    from bench.cli import main

    uri = f"sqlite:///{tmp_path}/m.db"
    assert main(["run", "--algos", "grpo,nope", "--tracking-uri", uri, "--experiment", "x", "--no-progress"]) == 2
    assert "unknown objective 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "m.db").exists()


# ------------------------------------------------------------------ real comparisons on the tiny model (slow)
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """The shipped warm-started tiny model when present, else a randomly initialised one (an ordinary HF folder)."""
    from bench.model import BUILTIN_MODELS

    shipped = BUILTIN_MODELS["builtin:tiny-arith"]
    if (shipped / "config.json").exists():
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


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny(tmp_path, model: str, experiment: str):
    return base_config(None, model=model, steps=3, prompts_per_step=2, group_size=2, eval_problems=8, eval_every=1,
                       checkpoint_every=1, max_new_tokens=16, samples_every=0, experiment=experiment,
                       tracking_uri=fresh_store(tmp_path), output_dir=str(tmp_path / "runs"))


def _runs(client, experiment, kind="train"):
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], f"tags.`pobench.kind` = '{kind}'")


def _history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_two_objectives_two_seeds_report_equals_mlflow_series(tmp_path, model_dir):
    cfg = tiny(tmp_path, model_dir, "e2e")
    # (one pair after another in this process: the report is the subject; real training in a local pool is
    # test_plugins.py's two spawned workers, the pool's runs equal to these test_compare.py's)
    res = run_comparison(ComparisonSpec(cfg, ["grpo", "tepo"], [0, 1], out_root=tmp_path / "out", progress=False,
                                        workers=1))
    assert [(p.variant, p.seed, p.outcome) for p in res.pairs] == [
        ("grpo", 0, "finished"), ("grpo", 1, "finished"), ("tepo", 0, "finished"), ("tepo", 1, "finished")]
    out = tmp_path / "out" / "e2e" / res.comparison
    assert res.report.out_dir == out
    from reports.figures import fraction_panels

    for f in FIGURES:
        if f == "clip_masked_fractions" and not fraction_panels(res.report.comparison.runs):
            # on-policy updates clip nothing: an all-zero panel is not drawn, report.md says why
            assert not (out / f"{f}.png").exists() and "fraction varies in any run" in (out / "report.md").read_text()
            continue
        if f == "time_to_convergence" and isinstance(res.report.figures["ttc"], str):
            # three steps of a tiny model: no objective may reach the target at every seed; report.md says why
            assert "time to convergence: not drawn:" in (out / "report.md").read_text()
            continue
        assert (out / f"{f}.png").exists(), f  # (the suite draws PNG only: tests/conftest.py)
    for t in TABLES:
        for ext in ("md", "tex", "csv"):
            assert (out / f"{t}.{ext}").exists(), (t, ext)

    client = MlflowClient(cfg.tracking_uri)
    runs = _runs(client, "e2e")
    assert len(runs) == 4
    parent = _runs(client, "e2e", "comparison")
    assert len(parent) == 1 and parent[0].data.tags["pobench.comparison"] == res.comparison
    for r in runs:
        t = r.data.tags
        assert t["pobench.comparison"] == res.comparison and t[f"pobench.in.{res.comparison}"] == "1"
        assert t["mlflow.parentRunId"] == parent[0].info.run_id and r.info.status == "FINISHED"
    # every number recomputed from the MLflow series
    with open(out / "runs.csv") as f:
        per_run = {row["run_id"]: row for row in csv.DictReader(f)}
    finals: dict[str, list[float]] = {}
    for r in runs:
        acc = _history(client, r.info.run_id, "eval/accuracy")
        assert [s for s, _ in acc] == [0, 1, 2, 3]
        row = per_run[r.info.run_id]
        assert float(row["final_acc"]) == pytest.approx(acc[-1][1])
        assert float(row["best_acc"]) == pytest.approx(max(v for _, v in acc))
        ent = _history(client, r.info.run_id, "rollout/entropy_mean")
        assert float(row["entropy_slope"]) == pytest.approx(np.polyfit([s for s, _ in ent], [v for _, v in ent], 1)[0])
        kl = _history(client, r.info.run_id, "train/kl_ref")
        assert float(row["kl_max"]) == pytest.approx(max(v for _, v in kl))
        zero = _history(client, r.info.run_id, "rollout/zero_adv_frac")
        assert float(row["zero_adv_frac"]) == pytest.approx(np.mean([v for _, v in zero]))
        finals.setdefault(r.data.tags["pobench.objective"], []).append(acc[-1][1])
        assert client.get_run(r.info.run_id).data.metrics["derived/final_acc"] == pytest.approx(acc[-1][1])
    with open(out / "accuracy.csv") as f:
        acc_rows = {row["objective"]: row for row in csv.DictReader(f)}
    for o, v in finals.items():
        assert float(acc_rows[o]["final_mean"]) == pytest.approx(np.mean(v))
    art = [a.path for a in client.list_artifacts(parent[0].info.run_id, "report")]
    assert "report/report.md" in art

    # the same command again: every pair reused, nothing retrained
    again = run_comparison(ComparisonSpec(cfg, ["grpo", "tepo"], [0, 1], out_root=tmp_path / "out", progress=False,
                                          workers=1))
    assert again.comparison == res.comparison
    assert all(p.outcome == "reused" for p in again.pairs)
    assert len(_runs(client, "e2e")) == 4
