"""bench/engines/verl.py against verl 0.9.1 itself (CPU tensors, no GPU, no Ray): the registered policy losses through
verl's own loss path equal our objectives, the generated config composes and validates with verl's Hydra config and
config dataclasses, and the module registers every objective when verl imports it as external_lib.

Runs in `tox -e verl`; skipped where verl is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (tox -e verl)")

from tensordict import TensorDict  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from algorithms import PolicyBatch, get_objective, list_objectives  # noqa: E402
from bench.config import TrainConfig  # noqa: E402
from bench.engines import verl as engine  # noqa: E402

pytestmark = pytest.mark.verl
ROOT = Path(__file__).resolve().parents[2]
B, T = 8, 7
PLANS = {p.objective: p for p in engine.objective_table()}
REGISTERED = [n for n, p in PLANS.items() if p.mode == "registered"]
TOL = {"rtol": 1e-6, "atol": 1e-7}


def tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 7, 1, 6, 4, 2])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    old = lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    entropy = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return lp, old, ref, entropy, adv, mask


def actor_config(p: engine.VerlMapping, **kw) -> ActorConfig:
    """verl's ActorConfig as make_verl_config sets it for the objective's plan."""
    fields = {k.rpartition(".")[2]: v for k, v in p.native.items() if k.startswith("actor_rollout_ref.actor.")}
    if fields.get("loss_scale_factor") == "L_max":
        fields["loss_scale_factor"] = T
    fields["policy_loss"] = {"loss_mode": p.loss_mode}
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **{**fields, **kw})


def ours(name, lp, old, adv, mask, *, ref=None, entropy=None, seed=0, **overrides):
    lp = lp.clone().requires_grad_(True)
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, max_length=T, ref_logprobs=ref,
                        entropy=entropy)
    torch.manual_seed(seed)  # Clip-Cov's random choice: the same stream on both sides
    loss, _ = get_objective(name, **overrides).loss(batch)
    (g,) = torch.autograd.grad(loss, lp)
    return loss.detach(), g


# --- (a) the registered losses, called as verl calls them
@pytest.mark.parametrize("name", REGISTERED)
def test_registered_policy_loss_equals_objective(name):
    """get_policy_loss_fn('pobench_<name>') called with verl's arguments = our objective without the KL / entropy
    terms verl adds itself (values and gradients)."""
    p = PLANS[name]
    lp, old, _, _, adv, mask = tensors()
    fn = core_algos.get_policy_loss_fn(p.loss_mode)
    x = lp.clone().requires_grad_(True)
    torch.manual_seed(0)
    loss, metrics = fn(old_log_prob=old, log_prob=x, advantages=adv[:, None] * mask, response_mask=mask.bool(),
                       loss_agg_mode=p.native["actor_rollout_ref.actor.loss_agg_mode"], config=actor_config(p),
                       rollout_is_weights=None)
    (g,) = torch.autograd.grad(loss, x)
    want_loss, want_grad = ours(name, lp, old, adv, mask, **p.loss_overrides)
    torch.testing.assert_close(loss.detach(), want_loss, **TOL)
    torch.testing.assert_close(g, want_grad, **TOL)
    assert "objective/policy_loss" in metrics and all(isinstance(v, float) for v in metrics.values())


def verl_batch(lp, old, ref, entropy, adv, mask, rows, *, batch_num_tokens, global_batch_size):
    """verl's actor-update inputs for the rows ``rows``: the model output (flat, unpadded log-probs / entropies of
    prompt + response tokens, one prompt token each) and the TensorDict ppo_loss reads."""
    lengths = mask[rows].sum(-1).long()
    flat_lp, flat_h = [], []
    for i, n in zip(rows, lengths.tolist()):
        # verl's unpadded output is shifted by one: position t of the sequence holds log p(token t+1)
        flat_lp += [lp[i, :n], lp.new_zeros(1)]
        flat_h += [entropy[i, :n], entropy.new_zeros(1)]
    Tm = int(lengths.max())
    resp_mask = (torch.arange(Tm)[None, :] < lengths[:, None]).long()
    data = TensorDict({
        "prompts": torch.ones(len(rows), 1, dtype=torch.long),
        "responses": torch.ones(len(rows), Tm, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(len(rows), 1, dtype=torch.long), resp_mask], dim=1),
        "response_mask": resp_mask, "old_log_probs": old[rows, :Tm], "advantages": (adv[:, None] * mask)[rows, :Tm],
        "ref_log_prob": ref[rows, :Tm],
    }, batch_size=[len(rows)])
    data.set_non_tensor("dp_size", 1)
    data.set_non_tensor("batch_num_tokens", batch_num_tokens)
    data.set_non_tensor("global_batch_size", global_batch_size)
    return {"log_probs": torch.cat(flat_lp), "entropy": torch.cat(flat_h)}, data


@pytest.mark.parametrize("name", REGISTERED)
def test_verl_ppo_loss_path_equals_objective(name):
    """verl's own worker loss (verl/workers/utils/losses.py ppo_loss: registered policy loss + verl's KL loss + entropy
    bonus, global-batch normalisation) over two micro-batches sums to our objective's loss on the whole batch, KL and
    entropy terms included (one micro-batch for objectives that select tokens per micro-batch)."""
    p = PLANS[name]
    lp, old, ref, entropy, adv, mask = tensors(seed=1)
    splits = [list(range(B))] if not get_objective(name).split_invariant else [[0, 2, 4, 6], [1, 3, 5, 7]]
    x = lp.clone().requires_grad_(True)
    total = torch.zeros((), dtype=lp.dtype)
    torch.manual_seed(0)
    for rows in splits:
        out, data = verl_batch(x, old, ref, entropy, adv, mask, rows, batch_num_tokens=int(mask.sum()),
                               global_batch_size=B)
        loss, _ = ppo_loss(actor_config(p), out, data)
        total = total + loss
    (g,) = torch.autograd.grad(total, x)
    want_loss, want_grad = ours(name, lp, old, adv, mask, ref=ref, entropy=entropy)
    torch.testing.assert_close(total.detach(), want_loss, **TOL)
    torch.testing.assert_close(g, want_grad, **TOL)


def test_mismatched_verl_config_is_refused():
    lp, old, _, _, adv, mask = tensors()
    p = PLANS["grpo"]
    fn = core_algos.get_policy_loss_fn(p.loss_mode)
    args = {"old_log_prob": old, "log_prob": lp, "advantages": adv[:, None] * mask, "response_mask": mask.bool()}
    with pytest.raises(ValueError, match="loss_agg_mode='token-mean'.*seq-mean-token-mean"):
        fn(**args, loss_agg_mode="token-mean", config=actor_config(p, loss_agg_mode="token-mean"))
    with pytest.raises(ValueError, match="use_kl_loss=True"):
        fn(**args, loss_agg_mode="seq-mean-token-mean", config=actor_config(p, use_kl_loss=False))
    with pytest.raises(ValueError, match="kl_loss_coef"):
        fn(**args, loss_agg_mode="seq-mean-token-mean", config=actor_config(p, kl_loss_coef=0.001))
    with pytest.raises(ValueError, match="rollout-correction"):
        fn(**args, loss_agg_mode="seq-mean-token-mean", config=actor_config(p), rollout_is_weights=torch.ones_like(lp))


def test_worker_loss_objectives_are_stubs_as_policy_losses():
    """Objectives that run as pobench's worker loss (tests/verl/test_verl_worker_loss.py) are registered as stubs that
    raise: verl's stock ppo_loss would call them only when pobench's trainer did not replace the actor's loss."""
    assert {n for n, p in PLANS.items() if p.mode == "worker-loss"} >= {"tepo", "forking_tokens"}
    lp, old, _, _, adv, mask = tensors()
    with pytest.raises(ValueError, match="pobench objective 'tepo' does not run.*ref_entropy.*pobench_sync"):
        core_algos.get_policy_loss_fn("pobench_tepo")(old, lp, adv[:, None] * mask, mask.bool(), "token-mean", None)


# --- (b) the generated config against verl's own config
def train_config(algo: str, **kw) -> TrainConfig:
    base = {"algo": algo, "seed": 3, "model": "Qwen/Qwen2.5-Math-1.5B", "task": "math", "eval_task": "math500",
            "prompts_per_step": 64, "group_size": 8, "minibatches": 4, "micro_batch_size": 16, "max_new_tokens": 3072,
            "lr": 1e-6, "warmup_steps": 10, "weight_decay": 0.1, "steps": 300, "eval_temperature": 0.0,
            "prompt_template": "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",
            "experiment": "pobench-verl", "comparison": "c1", "tags": {"team": "x"}}
    return TrainConfig(**{**base, **kw})


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from verl.trainer import main_ppo

    config_dir = str(Path(main_ppo.__file__).parent / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


@pytest.mark.parametrize("algo", ["grpo", "dapo", "dr_grpo", "entropy_reg", "gspo", "rloo", "tepo-mask-all"])
def test_generated_config_validates_with_verl(algo, tmp_path):
    from omegaconf import OmegaConf
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig

    cfg = train_config(algo, output_dir=str(tmp_path), objective_overrides={"clip_high": 0.3} if algo == "dapo" else {})
    generated = engine.make_verl_config(cfg, engine.VerlOptions(n_gpus_per_node=8))
    config = compose(engine.hydra_overrides(generated))
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    OmegaConf.resolve(config)  # the workers see resolved sections (rollout.mtp interpolates model.mtp)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    algorithm = omega_conf_to_dataclass(config.algorithm, AlgoConfig)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout, RolloutConfig)
    p = engine.mapping(algo, cfg.objective_overrides, max_length=cfg.max_new_tokens)
    assert actor.policy_loss.loss_mode == f"pobench_{algo}"
    assert actor.loss_agg_mode == p.native["actor_rollout_ref.actor.loss_agg_mode"]
    assert (actor.ppo_mini_batch_size, actor.ppo_epochs, actor.optim.lr) == (16, 1, 1e-6)
    assert (actor.use_kl_loss, actor.entropy_coeff) == (algo in ("grpo", "tepo-mask-all"),
                                                        1e-3 if algo == "entropy_reg" else 0.0)
    assert (rollout.n, rollout.name, rollout.seed, rollout.response_length) == (8, "vllm", 3, 3072)
    assert algorithm.adv_estimator == p.native["algorithm.adv_estimator"]
    assert config.trainer.logger == ["console", "mlflow"] and config.trainer.experiment_name == f"{algo}-s3"
    assert config.trainer.total_training_steps == 300 and config.data.train_batch_size == 64
    assert config.actor_rollout_ref.model.external_lib == "bench.engines.verl"
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert json.loads(env[engine.OVERRIDES_ENV]) == {algo: cfg.objective_overrides}
    if algo == "dapo":
        assert algorithm.filter_groups.enable and algorithm.filter_groups.metric == "acc"
        assert config.reward.reward_manager.name == "dapo"
        assert config.reward.reward_kwargs.overlong_buffer_cfg.len == round(0.2 * 3072)
        assert actor.clip_ratio_high == 0.3
    if algo == "dr_grpo":
        assert actor.loss_scale_factor == 3072 and algorithm.norm_adv_by_std_in_grpo is False


def test_reward_function_loads_through_verl(tmp_path):
    """verl loads the configured reward function with its own loader (`get_custom_reward_fn`); a file path to a module
    holding dataclasses failed there (the module is not in sys.modules while it runs), so the config names
    the module."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    generated = engine.make_verl_config(train_config("grpo", output_dir=str(tmp_path)), engine.VerlOptions())
    fn = get_custom_reward_fn(OmegaConf.create({"reward": generated["reward"]}))
    assert fn is not None
    right = fn(data_source="gsm8k", solution_str="so the answer is \\boxed{12}", ground_truth="12")
    wrong = fn(data_source="gsm8k", solution_str="so the answer is \\boxed{13}", ground_truth="12")
    assert (right["score"], right["acc"], wrong["score"], wrong["acc"]) == (1.0, True, 0.0, False)


def test_custom_chat_template_renders_the_prompt_template():
    import jinja2

    template = "\n  Q: {% not jinja %} {{x}} \"é\\n\"\n  {question}\n  A: "
    text = engine._chat_template(template)
    for env in (jinja2.Environment(), jinja2.Environment(trim_blocks=True, lstrip_blocks=True)):  # HF's settings
        out = env.from_string(text).render(messages=[{"role": "user", "content": "1+1?"}])
        assert out == template.replace("{question}", "1+1?")
    assert engine._chat_template("auto") is None and engine._chat_template("chat") is None


def test_config_refuses_what_verl_cannot_run(tmp_path):
    with pytest.raises(ValueError, match="grpo.*unsupported.*rollout_correction"):
        engine.make_verl_config(train_config("grpo", output_dir=str(tmp_path),
                                             objective_overrides={"rollout_correction": "token-truncate"}))
    with pytest.raises(ValueError, match="built-in"):
        engine.make_verl_config(train_config("grpo", model="builtin:tiny-arith"))
    with pytest.raises(ValueError, match="multiple of minibatches"):
        engine.make_verl_config(train_config("grpo", prompts_per_step=10, minibatches=4))


# --- (c) external_lib in a fresh interpreter
def test_external_lib_registers_every_objective():
    code = ("import json; from verl.utils.import_utils import import_external_libs; "
            "import_external_libs('bench.engines.verl'); import_external_libs('bench.engines.verl'); "
            "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R; "
            "print(json.dumps(sorted(k for k in R if k.startswith('pobench_'))))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(engine.OVERRIDES_ENV, None)
    out = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == sorted(f"pobench_{n}" for n in list_objectives())


def test_registration_applies_overrides_from_the_environment(monkeypatch):
    monkeypatch.setenv(engine.OVERRIDES_ENV, json.dumps({"gspo": {"clip_high": 2e-3}}))
    try:
        engine.register_all()
        lp, old, _, _, adv, mask = tensors()
        x = lp.clone().requires_grad_(True)
        p = engine.mapping("gspo", {"clip_high": 2e-3})
        loss, _ = core_algos.get_policy_loss_fn("pobench_gspo")(old, x, adv[:, None] * mask, mask.bool(),
                                                                "seq-mean-token-mean", actor_config(p))
        torch.testing.assert_close(loss.detach(), ours("gspo", lp, old, adv, mask, clip_high=2e-3)[0], **TOL)
        assert not torch.allclose(loss.detach(), ours("gspo", lp, old, adv, mask)[0])
    finally:
        monkeypatch.delenv(engine.OVERRIDES_ENV)
        engine.register_all()
