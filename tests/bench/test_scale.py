"""Real-model features on the tiny model: activation checkpointing (equal gradients), bf16, LoRA with the reference
as the adapter-disabled base model; each trains, resumes exactly and logs the same metrics as full fine-tuning."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from transformers import AutoModelForCausalLM

from bench.config import TrainConfig
from bench.engines.entry import train
from bench.engines.native.scale import Reference, enable_activation_checkpointing, prepare_policy
from bench.model import build_char_tokenizer, load_policy, tiny_config
from bench.rollout.scoring import score
from reports import metric_keys as K
from tests.conftest import fresh_store

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
COMPS = [[20, 21, 22, 23], [24], [25, 26, 27, 28, 29, 1]]
TIME_KEYS = K.TIMING_PREFIXES


def _random_tiny(seed: int = 0):
    tok = build_char_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(tiny_config(tok)).eval()


def _grads(model) -> dict[str, torch.Tensor]:
    lp, ent, mask = score(model, PROMPTS, COMPS, temperature=0.9, grad=True)
    (lp.sum() + 0.1 * ent.sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_activation_checkpointing_recomputes_layers_and_gives_equal_gradients():
    plain = _random_tiny()
    ckpt = copy.deepcopy(plain)
    enable_activation_checkpointing(ckpt)
    calls = {"plain": 0, "ckpt": 0}
    for name, m in (("plain", plain), ("ckpt", ckpt)):  # count the first layer's MLP runs (hooks miss recomputes)
        mlp = m.model.layers[0].mlp
        mlp.forward = (lambda f, k: lambda *a, **kw: (calls.__setitem__(k, calls[k] + 1), f(*a, **kw))[1])(
            mlp.forward, name)
    g_plain, g_ckpt = _grads(plain), _grads(ckpt)
    assert calls == {"plain": 1, "ckpt": 2}  # the checkpointed layer ran again in the backward pass
    assert set(g_plain) == set(g_ckpt) and len(g_plain) == len(list(plain.parameters()))
    for n, g in g_plain.items():
        torch.testing.assert_close(g_ckpt[n], g, atol=1e-6, rtol=1e-5, msg=n)
    # passes without gradient (reference / old policy) do not checkpoint
    with torch.no_grad():
        score(ckpt, PROMPTS, COMPS)
    assert calls["ckpt"] == 3


def test_lora_reference_is_the_base_model_and_training_leaves_it_alone():
    base = _random_tiny()
    cfg = TrainConfig(lora_rank=4, lora_alpha=8.0)
    policy = prepare_policy(copy.deepcopy(base), cfg)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ref = Reference(policy)
    assert ref._copy is None  # no second copy of the weights
    opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1.0)
    for _ in range(2):  # LoRA's B starts at zero: after two steps the adapter changes the outputs
        lp, _, _ = score(policy, PROMPTS, COMPS, grad=True)
        opt.zero_grad()
        (-lp.sum()).backward()
        opt.step()
    lp_base, ent_base, _ = score(base, PROMPTS, COMPS)
    with ref.policy() as m:
        lp_ref, ent_ref, _ = score(m, PROMPTS, COMPS)
    lp_pol, _, _ = score(policy, PROMPTS, COMPS)  # the adapter is back on after the context
    torch.testing.assert_close(lp_ref, lp_base, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent_ref, ent_base, atol=1e-6, rtol=1e-6)
    assert (lp_pol - lp_base).abs().max() > 1e-3


# --- end to end: train, interrupt, resume == uninterrupted; same metric keys as full fine-tuning -------------------
def _cfg(tmp_path: Path, uri: str, name: str, **kw) -> TrainConfig:
    base = dict(algo="tepo", steps=3, prompts_per_step=4, group_size=4, max_new_tokens=24, eval_every=3,
                eval_problems=8, checkpoint_every=1, samples_every=0, lr=1e-3, output_dir=str(tmp_path / name),
                tracking_uri=uri, experiment="test-scale", run_name=name)
    base.update(kw)
    return TrainConfig(**base)


def _history(run_id: str, uri: str) -> dict[str, list[tuple[int, float]]]:
    c = MlflowClient(uri)
    return {k: sorted((m.step, m.value) for m in c.get_metric_history(run_id, k))
            for k in c.get_run(run_id).data.metrics if not k.startswith(TIME_KEYS)}


def _interrupted_then_resumed(tmp_path: Path, uri: str, name: str, **kw):
    def stop_at_2(step, _metrics):
        if step == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(tmp_path, uri, name, **kw), on_step=stop_at_2)
    return train(_cfg(tmp_path, uri, name, resume=True, **kw))


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return fresh_store(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture(scope="module")
def full_keys(tmp_path_factory, uri):
    res = train(_cfg(tmp_path_factory.mktemp("full"), uri, "full"))
    return set(_history(res.run_id, uri))


@pytest.mark.slow
@pytest.mark.parametrize("variant", [
    {"activation_checkpointing": True, "dtype": "bfloat16"},
    {"lora_rank": 4, "lora_alpha": 8.0},
    {"lora_rank": 4, "lora_alpha": 8.0, "activation_checkpointing": True},
], ids=["ckpt-bf16", "lora", "lora-ckpt"])
def test_variant_trains_resumes_exactly_and_logs_the_full_metrics(tmp_path, uri, full_keys, variant):
    name = "-".join(f"{k}{v}" for k, v in variant.items()).replace("_", "")[:60]
    resumed = _interrupted_then_resumed(tmp_path, uri, "r-" + name, **variant)
    straight = train(_cfg(tmp_path, uri, "s-" + name, **variant))
    assert resumed.steps_done == straight.steps_done == 3
    h_res, h_str = _history(resumed.run_id, uri), _history(straight.run_id, uri)
    assert set(h_res) == full_keys  # the same metrics as full fine-tuning in float32
    assert [s for s, _ in h_res["train/grad_norm"]] == [1, 2, 3]
    for k, values in h_res.items():
        assert all(math.isfinite(v) for _, v in values), k
        assert values == h_str[k], k  # the resumed run equals the uninterrupted one
    final = Path(resumed.output_dir) / "final"
    model, _ = load_policy(str(final), dtype=variant.get("dtype", "float32"))  # merged weights: a plain model
    assert not hasattr(model, "peft_config")
    if variant.get("lora_rank"):
        ckpt = torch.load(sorted(Path(resumed.output_dir).glob("ckpt-*"))[-1] / "model.pt")
        assert ckpt and all("lora_" in k for k in ckpt)  # checkpoints hold the adapter only
        assert (final / "adapter" / "adapter_config.json").exists()
