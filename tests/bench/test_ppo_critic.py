"""``ppo``'s critic in the native loop (bench/engines/native/critic.py): it trains on the built-in model (policy and
critic both move, the critic's metrics are logged), it is saved in every checkpoint and restored on a resume so that
a run stopped and resumed equals the uninterrupted one exactly (every metric, the policy's final weights, the critic's
weights in the last checkpoint), the warm-up steps leave the policy alone, and every other objective's checkpoint holds
no critic. TRL and verl refuse ppo before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.config import TrainConfig
from bench.engines.entry import check, train
from bench.model import load_policy
from bench.runs.checkpoint import CRITIC
from reports import metric_keys as K
from tests.bench.test_objective_state import _history  # (the metric histories, machine-dependent ones left out)
from tests.conftest import fresh_store

CRITIC_KEYS = ("critic/value_loss", "critic/value_clip_frac", "critic/explained_var", "critic/grad_norm",
               "critic/value_mean", "critic/return_mean", "critic/warmup")


def _cfg(tmp_path: Path, uri: str, name: str, **kw) -> TrainConfig:
    base = dict(algo="ppo", steps=4, prompts_per_step=4, group_size=4, max_new_tokens=24, eval_every=0,
                checkpoint_every=1, samples_every=0, lr=1e-3, output_dir=str(tmp_path / name), tracking_uri=uri,
                experiment="test-ppo", run_name=name, objective_overrides={"critic_lr": 1e-3})
    base.update(kw)
    return TrainConfig(**base)




def _critic(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / f"ckpt-{step:07d}" / CRITIC, weights_only=True)["model"]


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return fresh_store(tmp_path_factory.mktemp("mlflow"))


@pytest.mark.slow
def test_ppo_trains_and_a_resumed_run_equals_the_uninterrupted_one(tmp_path, uri):
    straight = train(_cfg(tmp_path, uri, "straight", keep_checkpoints=3))
    h_str = _history(straight.run_id, uri)
    for key in CRITIC_KEYS:
        assert [s for s, _ in h_str[key]] == [1, 2, 3, 4], key
    assert any(v > 0 for _, v in h_str["critic/value_loss"]) and any(v > 0 for _, v in h_str["critic/grad_norm"])
    assert any(v != 0 for _, v in h_str["objective/policy_loss"]) or any(v > 0 for _, v in h_str[K.GRAD_NORM])
    run_dir = _cfg(tmp_path, uri, "straight").run_dir()
    assert not (run_dir / "ckpt-0000001" / CRITIC).exists()  # (older than the newest 2: dropped with optim.pt)
    c3, c4 = _critic(run_dir, 3), _critic(run_dir, 4)
    assert any(not torch.equal(c3[k], c4[k]) for k in c3), "the critic did not train"
    assert torch.count_nonzero(c4["head.weight"]) > 0  # the value head left its zero initialisation

    def stop_at_3(step, _metrics):
        if step == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(tmp_path, uri, "resumed"), on_step=stop_at_3)
    resumed = train(_cfg(tmp_path, uri, "resumed", resume=True))  # from the checkpoint of step 2
    h_res = _history(resumed.run_id, uri)
    assert set(h_res) == set(h_str)
    for k, values in h_str.items():  # identical, not close (NaN: an explained variance of returns that do not vary)
        assert [(s, repr(v)) for s, v in h_res[k]] == [(s, repr(v)) for s, v in values], k
    a, _ = load_policy(str(Path(straight.output_dir) / "final"))
    b, _ = load_policy(str(Path(resumed.output_dir) / "final"))
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    c_res = _critic(_cfg(tmp_path, uri, "resumed").run_dir(), 4)
    for k in c4:
        assert torch.equal(c4[k], c_res[k]), k


@pytest.mark.slow
def test_critic_warmup_leaves_the_policy_alone_and_other_checkpoints_hold_no_critic(tmp_path, uri):
    res = train(_cfg(tmp_path, uri, "warm", steps=2, objective_overrides={"critic_lr": 1e-3, "critic_warmup": 2}))
    h = _history(res.run_id, uri)
    assert [v for _, v in h["critic/warmup"]] == [1.0, 1.0]
    assert "objective/policy_loss" not in h  # no policy update ran
    before, _ = load_policy("builtin:tiny-arith")
    after, _ = load_policy(str(Path(res.output_dir) / "final"))
    for (n, p), (_, q) in zip(before.named_parameters(), after.named_parameters()):
        assert torch.equal(p, q), n
    grpo = train(_cfg(tmp_path, uri, "grpo", algo="grpo", steps=1, objective_overrides={}))
    ckpt = _cfg(tmp_path, uri, "grpo", algo="grpo").run_dir() / "ckpt-0000001"
    assert not (ckpt / CRITIC).exists()
    assert set(json.loads((ckpt / "state.json").read_text())["files"]) == {"model.pt", "optim.pt"}
    assert grpo.steps_done == 1


@pytest.mark.parametrize("engine", ["trl", "verl"])
def test_trl_and_verl_refuse_ppo_before_any_work(tmp_path, engine):
    cfg = TrainConfig(algo="ppo", engine=engine, output_dir=str(tmp_path), tracking_uri=f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(ValueError, match="critic"):
        check(cfg)
    assert not any(tmp_path.iterdir())  # nothing written
