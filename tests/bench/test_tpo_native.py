"""TPO in the native engine: one update of the built-in model hands the loss micro-batches of WHOLE groups (each
group's G rows contiguous and in their order, ``PolicyBatch.group_size`` = G, max(1, ⌊micro_batch_size / G⌋) groups
each), skips no row (not even an all-equal group's, with ``skip_zero_advantage``), and the loss it computes is the
formula on the batch it received; TRL and verl refuse it before any work."""

from __future__ import annotations

import copy

import pytest
import torch

from algorithms.tpo import population_standardized
from bench.config import TrainConfig
from bench.engines.entry import check
from tests.bench.test_token_advantages import TEMPERATURE, G, P, rollout, run  # noqa: F401 (fixture)


def old_rows(model, groups):
    """(N, T) π_old log-probs of every rollout row from an independent scoring, and the mask."""
    rows = [(g.prompt_ids, c) for g in groups for c in g.completion_ids]
    T = max(len(c) for _, c in rows)
    old, mask = torch.zeros(len(rows), T, dtype=torch.float64), torch.zeros(len(rows), T, dtype=torch.float64)
    with torch.no_grad():
        for i, (p, c) in enumerate(rows):
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1].double() / TEMPERATURE
            old[i, :len(c)] = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
            mask[i, :len(c)] = 1.0
    return old, mask


def formula(batch, eta=1.0):
    """The TPO loss written out on a batch: per group of G rows, −Σ_i q_i log softmax(ℓ^θ)_i, q = softmax(ℓ^old + u/η),
    ℓ the token sums; the mean over groups."""
    G_ = batch.group_size
    total = 0.0
    for k in range(0, batch.mask.shape[0], G_):
        sl = slice(k, k + G_)
        m = batch.mask[sl].double()
        ell = (batch.logprobs[sl].detach().double() * m).sum(-1)
        ell_old = (batch.old_logprobs[sl].double() * m).sum(-1)
        q = torch.softmax(ell_old + batch.advantages[sl].double() / eta, -1)
        total += float(-(q * torch.log_softmax(ell, -1)).sum())
    return total / (batch.mask.shape[0] // G_)


CASES = [  # on-policy, all groups in one micro-batch; off-policy (2 minibatches, 2 epochs) with a micro-batch size
    # that is not a multiple of G (rounded down to one group) and shared-prefix scoring; two groups per micro-batch
    # with zero-advantage skipping asked for (TPO skips nothing)
    dict(minibatches=1, micro_batch_size=64),
    dict(minibatches=2, update_epochs=2, micro_batch_size=5, shared_prefix=True),
    dict(minibatches=2, micro_batch_size=8, skip_zero_advantage=True, exact=False),
]


@pytest.mark.parametrize("fields", CASES, ids=["on-policy", "off-policy-mb5-shared-prefix", "mb8-skip-inexact"])
def test_micro_batches_hold_whole_groups_no_row_is_skipped_and_the_loss_is_the_formula(rollout, monkeypatch,  # noqa: F811
                                                                                       fields):
    model, _, base = rollout
    groups = copy.deepcopy(base)
    u = population_standardized(torch.stack([g.rewards for g in groups]).double())
    assert (u[0] == 0).all() and (u[1:] != 0).any()  # group 0 all equal: u = 0 (its rows must still be trained)
    for g, row in zip(groups, u):
        g.advantages = row.float()
    old, mask = old_rows(model, groups)
    losses = []
    batches, _, out = run(rollout, "tpo", {}, monkeypatch, groups=groups, losses=losses, **fields)
    per_micro = max(1, fields["micro_batch_size"] // G) * G
    n_minibatch = P * G // fields["minibatches"]
    epochs = fields.get("update_epochs", 1)
    seen = []
    for batch, loss in zip(batches, losses):
        B = batch.mask.shape[0]
        assert batch.group_size == G and B % G == 0 and B == min(per_micro, n_minibatch)
        assert batch.logprobs.requires_grad  # every part trained: no row skipped
        for k in range(0, B, G):  # each G rows: one rollout group, in its order
            n = [int(batch.mask[k + r].sum()) for r in range(G)]
            match = [j for j in range(P) if all(
                int(mask[j * G + r].sum()) == n[r]
                and float((old[j * G + r, :n[r]] - batch.old_logprobs[k + r, :n[r]].double()).abs().max()) < 1e-4
                for r in range(G))]
            assert match, "a micro-batch's rows are not one whole group in order"
            j = match[0]
            torch.testing.assert_close(batch.advantages[k:k + G].double(), u[j])
            seen.append(j)
        torch.testing.assert_close(float(loss), formula(batch), atol=1e-5, rtol=1e-5)
    # every group in every epoch, each once, in ascending order within a minibatch
    assert sorted(seen) == sorted(list(range(P)) * epochs)
    assert len(batches) * per_micro >= P * G * epochs
    assert all(torch.isfinite(torch.tensor(v)) for v in out.values())


@pytest.mark.parametrize(("engine", "why"), [("trl", "--engine trl does not support objective 'tpo'.*group"),
                                             ("verl", "couples the completions of a group")])
def test_trl_and_verl_refuse_tpo_before_any_work(tmp_path, engine, why):
    cfg = TrainConfig(algo="tpo", engine=engine, output_dir=str(tmp_path), tracking_uri=f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(ValueError, match=why):
        check(cfg)
    assert not any(tmp_path.iterdir())


def test_a_short_native_run_trains_tpo(tmp_path):
    """Two steps of the native loop end to end, with a micro-batch size that is not a multiple of G."""
    from bench.engines.entry import train
    from tests.conftest import fresh_store

    cfg = TrainConfig(algo="tpo", steps=2, prompts_per_step=4, group_size=4, max_new_tokens=16, eval_every=0,
                      checkpoint_every=0, samples_every=1, micro_batch_size=6, minibatches=2,
                      output_dir=str(tmp_path / "run"), tracking_uri=fresh_store(tmp_path / "mlflow"),
                      experiment="test-tpo", run_name="tpo")
    assert train(cfg).steps_done == 2
