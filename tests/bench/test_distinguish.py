"""Off-policy updates by default: the HF rollout's log-probs are exact for the training module, so the
loop takes π_old from the rollout; the drift metrics; the probe under `bench run`'s configuration (`bench list
--compare`, the warning before training, probe.json on the comparison run)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from bench.cli import main
from bench.comparison.distinguish import probe_config, regime_of, warn_before_run
from bench.comparison.plan import DEFAULTS, base_config
from bench.config import TrainConfig
from bench.engines.entry import train
from bench.model import format_prompt, load_policy
from bench.rollout import HFSampler, SamplingParams, make_sampler
from bench.rollout.scoring import score
from evaluators.arith import ArithTask
from reports.record import get_or_create_experiment
from tests.conftest import fresh_store


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return fresh_store(tmp_path_factory.mktemp("mlflow"))


def test_hf_rollout_logprobs_are_the_scoring_pass_under_the_loop_settings():
    """16 prompts x 8 completions of the built-in model at the training defaults, scored in the loop's micro-batch
    layout: π_old from the rollout equals the scoring pass (float32 rounding only)."""
    cfg = TrainConfig()
    model, tok = load_policy(cfg.model)
    prompts = [format_prompt(tok, p.question) for p in ArithTask(cfg.difficulty).test_set(cfg.prompts_per_step)]
    r = make_sampler("hf", model, tok).generate(prompts, cfg.group_size, SamplingParams(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature), seed=1)
    rows = [r.prompt_ids[i // r.n] for i in range(len(r))]
    diffs, ent_diffs = [], []
    for s in range(0, len(r), 32):  # one mini-batch of the default regime per scoring call
        lp, ent, _ = score(model, rows[s:s + 32], r.completion_ids[s:s + 32], cfg.temperature, grad=True)
        for j in range(min(32, len(r) - s)):
            n = len(r.completion_ids[s + j])
            diffs.append((lp[j, :n].detach() - torch.tensor(r.logprobs[s + j])).abs())
            ent_diffs.append((ent[j, :n].detach() - torch.tensor(r.entropies[s + j])).abs())
    d, e = torch.cat(diffs), torch.cat(ent_diffs)
    assert d.numel() > 1000
    assert float(d.mean()) < 1e-6 and float(e.mean()) < 1e-6  # measured: 1e-7
    assert float(d.max()) < 1e-4 and float(e.max()) < 1e-4    # measured: <= 4e-5 on a few low-probability tokens
    assert float((d > 1e-5).float().mean()) < 0.01


def tiny(tmp_path: Path, uri: str, **kw) -> TrainConfig:
    base = dict(steps=1, prompts_per_step=4, group_size=4, max_new_tokens=24, eval_every=0, eval_problems=8,
                checkpoint_every=10, samples_every=0, output_dir=str(tmp_path / "runs"), tracking_uri=uri,
                experiment="test-distinguish", track_ref_kl=False)
    base.update(kw)
    return TrainConfig(**base)


def _metrics(uri: str, run_id: str) -> dict[str, float]:
    return MlflowClient(uri).get_run(run_id).data.metrics


def test_off_policy_loop_takes_pi_old_from_the_rollout(tmp_path, uri, monkeypatch):
    """With a learning rate too small to move the policy, |log r| measures how well π_old matches the policy: it
    is float32 rounding when taken from the rollout (and from the scoring pass when the engine is not exact), and
    no scoring pass of π_old runs. A misaligned or stale π_old (wrong rows, shifted tokens) would show here."""
    import bench.engines.native.step

    calls = []
    real = bench.engines.native.step._score_rows
    monkeypatch.setattr(bench.engines.native.step, "_score_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    res = train(tiny(tmp_path, uri, algo="dapo", minibatches=2, lr=1e-12, run_name="exact"))
    m = _metrics(uri, res.run_id)
    assert m["train/abs_log_ratio"] < 1e-6 and m["train/abs_log_ratio_max"] < 1e-4
    assert calls == []  # neither π_old nor π_ref scored (track_ref_kl off, dapo has no KL)
    monkeypatch.setattr(HFSampler, "exact_logprobs", False)  # as for vLLM: one scoring pass instead
    res2 = train(tiny(tmp_path, uri, algo="dapo", minibatches=2, lr=1e-12, run_name="scored"))
    m2 = _metrics(uri, res2.run_id)
    assert calls == [1] and m2["train/abs_log_ratio"] < 1e-6
    assert m2["objective/policy_loss"] == pytest.approx(m["objective/policy_loss"], abs=1e-5)


def test_off_policy_updates_move_the_policy_and_log_it(tmp_path, uri):
    res = train(tiny(tmp_path, uri, algo="grpo", minibatches=4, lr=1e-3, run_name="moves"))
    m = _metrics(uri, res.run_id)
    assert m["train/abs_log_ratio"] > 1e-3 and m["train/abs_log_ratio_max"] >= m["train/abs_log_ratio"]
    assert m["train/abs_seq_log_ratio"] > 0
    assert "objective/clip_frac_low" in m and "objective/clip_frac_high" in m


def test_defaults_are_off_policy_and_the_probe_separates_the_default_objectives():
    assert TrainConfig().minibatches > 1
    cfg = base_config()
    regime = regime_of(cfg)
    assert regime.updates_before == cfg.update_epochs * cfg.minibatches - 1 >= 1
    res = probe_config(cfg, list(DEFAULTS.algos))
    assert res.groups == []
    assert min(res.distance.values()) > 1e3 * res.tolerance


def test_bench_list_compare_prints_the_probe(capsys):
    assert main(["list", "--compare", "grpo,dapo,kl_cov", "--minibatches", "1"]) == 0
    out = capsys.readouterr().out
    assert "on-policy" in out and "dapo == kl_cov" in out and "kl_cov_coef=1" in out
    assert main(["list", "--compare", "grpo,dapo,kl_cov"]) == 0
    out = capsys.readouterr().out
    assert "off-policy after k=3" in out and "same gradient (" not in out


def test_warning_before_a_run_and_probe_artifact(tmp_path):
    uri = fresh_store(tmp_path, "m.db")
    client = MlflowClient(uri)
    run = client.create_run(get_or_create_experiment(client, uri, "w"))
    err = io.StringIO()
    cfg = base_config(minibatches=1)
    warn_before_run(cfg, ["gspo", "grpo", "dapo"], {"grpo": {"kl_coef": 0.0}}, client=client,
                    run_id=run.info.run_id, stream=err)
    text = err.getvalue()
    assert text.startswith("WARNING:") and "gspo == grpo+" in text and "clip never binds" in text
    data = json.loads(Path(client.download_artifacts(run.info.run_id, "probe.json", str(tmp_path))).read_text())
    assert data["groups"] == [["gspo", next(lab for lab in data["labels"] if lab.startswith("grpo+"))]]
    quiet = io.StringIO()
    warn_before_run(base_config(), ["grpo", "dapo"], stream=quiet)
    assert quiet.getvalue() == ""  # nothing coincides, no inert term: no warning


def test_fewer_completions_than_minibatches_still_updates():
    """Dynamic sampling can keep fewer completions than `minibatches` (one group of 2 with M = 4): the loop makes one
    update per completion instead of failing on empty mini-batches."""
    from algorithms import get_objective
    from bench.engines.native.step import Group, update

    cfg = TrainConfig(prompts_per_step=2, group_size=2, minibatches=4, max_new_tokens=16, lr=1e-4)
    model, tok = load_policy(cfg.model)
    engine = make_sampler("hf", model, tok)
    r = engine.generate([format_prompt(tok, ArithTask(2).test_set(1)[0].question)], 2,
                        SamplingParams(max_new_tokens=16), seed=0)
    group = Group("q", r.prompt_ids[0], r.completion_ids, r.texts, torch.tensor([1.0, 0.0]),
                  torch.tensor([1.0, 0.0]), torch.tensor([0.7, -0.7]), logprobs=r.logprobs, entropies=r.entropies)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    out = update(cfg, get_objective("dapo"), model, None, opt, engine, [group], 1)
    assert out["train/abs_log_ratio"] > 0  # the second completion was trained after one update
