"""Length-grouped micro-batches: a partition of the minibatch with less padding, and the same gradient through the
training loop's update as the random split (split-invariant objectives)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from algorithms import get_objective
from bench.config import TrainConfig
from bench.engines.native.batching import (
    length_grouped,
    padded_tokens,
    whole_group_micro_batches,
    whole_group_minibatches,
)
from bench.engines.native.scale import Reference
from bench.engines.native.step import Group, update
from bench.model import build_char_tokenizer, tiny_config
from bench.rollout import make_sampler
from tests.bench.record_grads import RecordGrads


def _lengths(n: int, seed: int) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 49, (n,), generator=g).tolist(), torch.randint(8, 20, (n,), generator=g).tolist()


def test_length_grouped_is_a_partition_with_less_padding():
    c_len, p_len = _lengths(128, 0)
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(1))
    plain, grouped = torch.split(perm, 32), length_grouped(perm, c_len, p_len, 32)
    assert len(grouped) == len(plain) and [len(m) for m in grouped] == [len(m) for m in plain]
    assert sorted(torch.cat(grouped).tolist()) == list(range(128))
    flat = [c_len[i] for i in torch.cat(grouped).tolist()]
    assert flat == sorted(flat)
    assert padded_tokens(grouped, c_len, p_len) < 0.8 * padded_tokens(plain, c_len, p_len)


@pytest.mark.parametrize("algo", ["grpo", "tepo"])
def test_update_with_length_grouped_micro_batches_gives_the_same_gradient(algo):
    tok = build_char_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(tok)).eval()
    g = torch.Generator().manual_seed(2)
    groups = []
    for k in range(4):
        comps = [torch.randint(3, 90, (int(n),), generator=g).tolist() for n in torch.randint(1, 30, (4,), generator=g)]
        rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
        groups.append(Group(f"q{k}", torch.randint(3, 90, (5 + 3 * k,), generator=g).tolist(), comps, [""] * 4,
                            rewards, rewards, advantages=torch.randn(4, generator=g)))
    objective = get_objective(algo)
    grads, padding = {}, {}
    for grouped in (False, True):
        cfg = TrainConfig(algo=algo, micro_batch_size=4, length_grouped_micro_batches=grouped, max_new_tokens=32)
        opt = RecordGrads(model.parameters())
        ref = Reference(model)
        out = update(cfg, objective, model, ref, opt, make_sampler("hf", model, tok), copy.deepcopy(groups), 1)
        assert torch.isfinite(torch.tensor(out["train/loss"]))
        grads[grouped] = opt.grads[0]
        model.zero_grad(set_to_none=True)
    for a, b in zip(grads[False], grads[True]):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
    c_len = [len(c) for grp in groups for c in grp.completion_ids]
    p_len = [len(grp.prompt_ids) for grp in groups for _ in grp.completion_ids]
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(7))
    padding = (padded_tokens(torch.split(perm, 4), c_len, p_len), padded_tokens(length_grouped(perm, c_len, p_len, 4),
                                                                                 c_len, p_len))
    assert padding[1] < padding[0]  # the grouped split really differs from the random one


def test_scoring_rows_in_length_order_returns_them_in_input_order():
    from bench.engines.native.step import _score_rows
    from bench.rollout.scoring import score

    tok = build_char_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(tok)).eval()
    g = torch.Generator().manual_seed(3)
    comps = [torch.randint(3, 90, (int(n),), generator=g).tolist() for n in (9, 2, 7, 1, 5, 3)]
    prompts = [torch.randint(3, 90, (int(n),), generator=g).tolist() for n in (4, 6, 3, 5, 2, 7)]
    lps, ents = _score_rows(model, prompts, comps, 1.0, 2)
    for i in range(len(comps)):  # each row alone: no padding at all
        lp, ent, _ = score(model, prompts[i:i + 1], comps[i:i + 1])
        torch.testing.assert_close(lps[i], lp[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ents[i], ent[0], atol=1e-5, rtol=1e-5)


def test_whole_group_minibatches_and_micro_batches():
    """An objective that needs whole groups (TPO): minibatches of whole groups in the permutation's group order, each
    minibatch's groups ascending and each group's rows contiguous in order; micro-batches of max(1, ⌊size/G⌋) groups."""
    G, N = 3, 12  # 4 groups
    order = torch.tensor([7, 9, 0, 4, 3, 11, 6, 1, 2, 10, 5, 8])  # group firsts in order: 9 (3), 0 (0), 3 (1), 6 (2)
    mbs = whole_group_minibatches(order, N, G, 2)
    assert [m.tolist() for m in mbs] == [[0, 1, 2, 9, 10, 11], [3, 4, 5, 6, 7, 8]]
    assert sorted(torch.cat(whole_group_minibatches(order, N, G, 9)).tolist()) == list(range(N))  # at most 4
    rows = mbs[0]
    assert [m.tolist() for m in whole_group_micro_batches(rows, G, 5)] == [[0, 1, 2], [9, 10, 11]]  # 5 -> 1 group
    assert [m.tolist() for m in whole_group_micro_batches(rows, G, 2)] == [[0, 1, 2], [9, 10, 11]]  # < G -> 1 group
    assert [m.tolist() for m in whole_group_micro_batches(rows, G, 6)] == [[0, 1, 2, 9, 10, 11]]
    assert whole_group_micro_batches(rows[:0], G, 6) == ()
