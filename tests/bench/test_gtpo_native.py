"""GTPO in the native engine: one update of the built-in model hands the loss a PolicyBatch whose ``token_advantages``
are ``gtpo_advantages`` computed over whole groups from the completions' token ids, the shaped rewards and π_old's
per-token entropies of one scoring pass (without Σπ²), whatever the minibatches, epochs, micro-batches, shared-prefix
scoring or zero-advantage skipping; TRL and verl refuse it before any work."""

from __future__ import annotations

import pytest
import torch

from algorithms.gtpo import gtpo_advantages
from bench.config import TrainConfig
from bench.engines.entry import check
from tests.bench.test_token_advantages import TEMPERATURE, G, P, rollout, rows_of, run  # noqa: F401 (fixture)


def expected(model, groups, **kw):
    """(N, T) GTPO advantages from an independent scoring: the entropies of softmax(logits / TEMPERATURE) of each
    (prompt + completion) row, the completions' token ids, the groups' rewards; with π_old's log-probs and the mask."""
    rows = [(g.prompt_ids, c) for g in groups for c in g.completion_ids]
    T = max(len(c) for _, c in rows)
    N = len(rows)
    old, ent, mask = (torch.zeros(N, T, dtype=torch.float64) for _ in range(3))
    ids = torch.zeros(N, T, dtype=torch.long)
    with torch.no_grad():
        for i, (p, c) in enumerate(rows):
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1].double() / TEMPERATURE
            logp = torch.log_softmax(logits, -1)
            old[i, :len(c)] = logp.gather(-1, torch.tensor(c)[:, None])[:, 0]
            ent[i, :len(c)] = -(logp.exp() * logp).sum(-1)
            mask[i, :len(c)] = 1.0
            ids[i, :len(c)] = torch.tensor(c)
    rewards = torch.stack([g.rewards for g in groups]).double()
    shape = (len(groups), G, T)
    tok, d = gtpo_advantages(rewards, ids.view(shape), mask.view(shape), ent.view(shape), **kw)
    return tok.view(N, T), old, mask, d


CASES = [  # fields of the update: on-policy; off-policy (2 minibatches, 2 epochs) with shared-prefix scoring;
    # a sampler whose log-probs are not the trainer's, with zero-advantage skipping and a threshold that drops some
    # completions of mixed groups (the built-in model's mean entropies at T = 1.3 are 0.3 to 0.75)
    (0.7, dict(minibatches=1, micro_batch_size=64)),
    (0.7, dict(minibatches=2, update_epochs=2, micro_batch_size=3, shared_prefix=True)),
    (0.32, dict(minibatches=1, micro_batch_size=5, exact=False, skip_zero_advantage=True)),
]


@pytest.mark.parametrize(("threshold", "fields"), CASES, ids=["on-policy", "off-policy-shared-prefix", "inexact-skip"])
def test_the_loss_receives_gtpo_advantages_of_an_independent_scoring(rollout, monkeypatch, threshold,  # noqa: F811
                                                                     fields):
    model, _, groups = rollout
    overrides = {"entropy_threshold": threshold}
    want, old, mask, d = expected(model, groups, entropy_threshold=threshold)
    # the case is informative: conflicts from both ends, weights 2 and 0 on completions the filter keeps, a normaliser
    # above 1; with the low threshold, completions of mixed groups dropped
    m = mask.view(d["delta"].shape) > 0
    kept = (d["shaped"] != 0)[..., None] & m
    assert d["forward"].any() and d["backward"].any() and (d["n_conflict"] > 1).any()
    assert ((d["delta"] == 0) & m).any()
    if threshold > 0.5:
        assert ((d["delta"] == 2) & kept).any() and ((d["shaped"] != 0) | (d["adv"] == 0)).all()
    else:
        assert ((d["shaped"] == 0) & (d["adv"] != 0)).any() and ((d["shaped"] != 0) & (d["adv"] != 0)).any()
    batches, passes, out = run(rollout, "gtpo", overrides, monkeypatch, **fields)
    # first one π_old pass over every row in micro-batches, without Σπ²; no reference pass (no KL); later passes
    # without gradient only for the rows a zero-advantage skip leaves out (every Â_it = 0), for their metrics
    k = -(-P * G // fields["micro_batch_size"])
    assert sum(n for n, _ in passes[:k]) == P * G and not any(s2 for _, s2 in passes)
    dead = int(((want != 0).sum(-1) == 0).sum())
    assert sum(n for n, _ in passes[k:]) <= dead * fields.get("update_epochs", 1) * fields["minibatches"]
    seen, rows = set(), 0
    for batch in batches:
        rows += batch.mask.shape[0]
        for b, i in enumerate(rows_of(batch, old, mask)):
            n = int(mask[i].sum())
            torch.testing.assert_close(batch.token_advantages[b, :n].double(), want[i, :n], atol=1e-4, rtol=1e-3)
            assert (batch.token_advantages[b, n:] == 0).all()
            seen.add(i)
    N = want.shape[0]
    first = {i: min(j for j in range(N) if int(mask[j].sum()) == int(mask[i].sum()) and torch.equal(old[j], old[i]))
             for i in range(N)}
    live = {i for i in range(N) if (want[i] != 0).any()}
    if fields.get("skip_zero_advantage"):  # the rows whose every Â_it is 0 get no forward with gradient; their
        # metrics pass before the first optimizer step reads the scoring pass's log-probs: still every row is seen
        assert {first[i] for i in live} <= seen
    assert seen == set(first.values()) and rows > 0
    assert all(torch.isfinite(torch.tensor(v)) for v in out.values())


@pytest.mark.parametrize(("engine", "why"), [("trl", "--engine trl does not support objective 'gtpo'.*token_ids"),
                                             ("verl", "token_ids, old_entropy over whole groups")])
def test_trl_and_verl_refuse_gtpo_before_any_work(tmp_path, engine, why):
    cfg = TrainConfig(algo="gtpo", engine=engine, output_dir=str(tmp_path), tracking_uri=f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(ValueError, match=why):
        check(cfg)
    assert not any(tmp_path.iterdir())


def test_a_short_native_run_trains_gtpo(tmp_path):
    """Two steps of the native loop end to end (sampling, the scoring pass, the update, metrics, samples)."""
    from bench.engines.entry import train
    from tests.conftest import fresh_store

    cfg = TrainConfig(algo="gtpo", steps=2, prompts_per_step=4, group_size=4, max_new_tokens=16, eval_every=0,
                      checkpoint_every=0, samples_every=1, output_dir=str(tmp_path / "run"),
                      tracking_uri=fresh_store(tmp_path / "mlflow"), experiment="test-gtpo", run_name="gtpo")
    assert train(cfg).steps_done == 2
