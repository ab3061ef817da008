"""Our losses (every TRL loss_type and option we implement) agree with the installed TRL GRPOTrainer.

Same model, same tensors (old / ref log-probs, advantages, masks), same config: TRL's own `_compute_loss` against our
objective fed with the log-probs TRL's scoring pass returns. Values and parameter gradients must match.
"""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl", reason="trl is not installed")

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from algorithms import PolicyBatch, get_objective  # noqa: E402

CASES = {  # case -> (our objective, our overrides, TRL loss_type, TRL config kwargs, noise of old log-probs)
    # TRL multiplies the KL by the ratio by default (use_bias_correction_kl); the spec (GRPO paper) does not
    "grpo": ("grpo", {}, "grpo", {"beta": 0.04, "epsilon": 0.2, "use_bias_correction_kl": False}, 0.15),
    "dapo": ("dapo", {}, "dapo", {"beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28}, 0.15),
    "dr_grpo": ("dr_grpo", {}, "dr_grpo", {"beta": 0.0, "epsilon": 0.2}, 0.15),
    "bnpo": ("bnpo", {}, "bnpo", {"beta": 0.0, "epsilon": 0.2}, 0.15),
    "cispo": ("cispo", {"clip_high": 0.2}, "cispo", {"beta": 0.0, "epsilon_high": 1.2}, 0.3),
    "sapo": ("sapo", {}, "sapo", {"beta": 0.0}, 0.3),
    "luspo": ("luspo", {}, "luspo", {"beta": 0.0, "epsilon": 3e-4, "epsilon_high": 4e-4,
                                     "importance_sampling_level": "sequence"}, 0.15),
    "vespo": ("vespo", {}, "vespo", {"beta": 0.0}, 0.05),
    # options
    "grpo-sequence": ("grpo", {"ratio_level": "sequence"}, "grpo",
                      {"beta": 0.04, "use_bias_correction_kl": False, "importance_sampling_level": "sequence"}, 0.1),
    "sapo-sequence": ("sapo", {"ratio_level": "sequence"}, "sapo", {"beta": 0.0, "importance_sampling_level":
                                                                    "sequence"}, 0.1),
    "grpo-bias-corrected-kl": ("grpo", {"kl_is_correction": True}, "grpo", {"beta": 0.04,
                                                                          "use_bias_correction_kl": True}, 0.15),
    "grpo-sequence-bias-corrected-kl": ("grpo", {"kl_is_correction": True, "ratio_level": "sequence"}, "grpo",
                                        {"beta": 0.04, "use_bias_correction_kl": True,
                                         "importance_sampling_level": "sequence"}, 0.1),
    "dapo-delta": ("dapo", {"clip_delta": 1.5}, "dapo", {"beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28,
                                                         "delta": 1.5}, 0.6),
    "dapo-off-policy-mask": ("dapo", {"off_policy_mask_threshold": 0.02}, "dapo",
                             {"beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28, "off_policy_mask_threshold": 0.02},
                             0.3),
    "cispo-kl": ("cispo", {"clip_high": 0.2, "kl_coef": 0.05}, "cispo", {"beta": 0.05, "epsilon_high": 1.2,
                                                                         "use_bias_correction_kl": False}, 0.3),
}
T_COMPLETION = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    chars = list("0123456789+=#? ")
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    cfg = Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                      eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny")
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_trainer(model_dir, tmp_path, loss_type, kwargs):
    kwargs = dict(kwargs)
    if loss_type in ("cispo", "vespo", "dapo"):  # TRL normalises these by num_items_in_batch (here: the batch)
        kwargs.setdefault("steps_per_generation", 1)
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=T_COMPLETION, loss_type=loss_type, report_to=[], use_cpu=True,
                      **kwargs)
    ds = Dataset.from_dict({"prompt": ["1+2=", "3+4="] * 4})
    return GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                       args=args, train_dataset=ds, processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir))


def tensors(trainer, noise, seed=1):
    """Random prompts/completions (three padded rows), TRL's own log-probs, noisy old/ref log-probs, advantages."""
    g = torch.Generator().manual_seed(seed)
    B, P, T = 8, 4, T_COMPLETION
    prompt_ids = torch.randint(3, 18, (B, P), generator=g)
    completion_ids = torch.randint(3, 18, (B, T), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    completion_mask = torch.ones(B, T, dtype=torch.long)
    completion_mask[0, 5:] = 0
    completion_mask[3, 2:] = 0
    completion_mask[6, 7:] = 0
    with torch.no_grad():
        lp0 = trainer._get_per_token_logps_and_entropies(trainer.model, torch.cat([prompt_ids, completion_ids], 1),
                                                         torch.cat([prompt_mask, completion_mask], 1), T)[0]
    old = lp0 + noise * torch.randn(B, T, generator=g)
    ref = lp0 + 0.15 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    sampler = old + 0.3 * torch.randn(B, T, generator=g)
    inputs = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                  completion_mask=completion_mask, advantages=adv, old_per_token_logps=old,
                  ref_per_token_logps=ref, num_items_in_batch=completion_mask.sum())
    return inputs, sampler


def compare(trainer, inputs, objective, sampler=None):
    """TRL's `_compute_loss` vs our objective on the log-probs TRL's scoring pass returns: value and gradients."""
    model = trainer.model
    model.eval()  # TRL then applies no gradient-accumulation normaliser
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    T = inputs["completion_ids"].shape[1]
    model.zero_grad()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    lp = trainer._get_per_token_logps_and_entropies(model, ids, att, T)[0]
    batch = PolicyBatch(logprobs=lp, old_logprobs=inputs["old_per_token_logps"],
                        ref_logprobs=inputs["ref_per_token_logps"], advantages=inputs["advantages"],
                        mask=inputs["completion_mask"].float(), max_length=T, sampler_logprobs=sampler)
    our_loss, _ = objective.loss(batch)
    our_loss.backward()
    torch.testing.assert_close(our_loss, trl_loss.detach(), rtol=1e-5, atol=1e-6)
    for ours, theirs in zip([p.grad for p in model.parameters()], trl_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_gradients_match_trl(model_dir, tmp_path, case):
    ours_name, overrides, loss_type, kwargs, noise = CASES[case]
    trainer = make_trainer(model_dir, tmp_path, loss_type, kwargs)
    inputs, _ = tensors(trainer, noise)
    if "off_policy_mask_threshold" in kwargs:  # the case must drop a sequence, or it tests nothing
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        with torch.no_grad():
            lp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, T_COMPLETION)[0]
        keep = trainer.get_off_policy_mask(inputs["advantages"][:, None], lp, inputs["old_per_token_logps"],
                                           inputs["completion_mask"].float(), kwargs["off_policy_mask_threshold"])
        assert (keep == 0).any()
    compare(trainer, inputs, get_objective(ours_name, **overrides))


def trl_is_ratio(old, sampler, mask, mode, cap):
    """TRL's vLLM importance-sampling ratio (GRPOTrainer._generate_and_score_completions), C_min = 1/C for masks."""
    diff = torch.nan_to_num((old - sampler) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, max=cap)
    return ratio.masked_fill((ratio < 1.0 / cap) | (ratio > cap), 0.0)


@pytest.mark.parametrize("loss_type,ours,mode", [
    ("dapo", "dapo", "token-truncate"), ("dapo", "dapo", "token-mask"), ("grpo", "grpo", "sequence-truncate"),
    ("grpo", "grpo", "sequence-mask"), ("vespo", "vespo", "token-truncate"), ("vespo", "vespo", "token-mask"),
])
def test_rollout_correction_matches_trl(model_dir, tmp_path, loss_type, ours, mode):
    cap = 1.4
    kwargs = {"beta": 0.0, "epsilon_high": 0.28} if loss_type != "vespo" else {"beta": 0.0}
    trainer = make_trainer(model_dir, tmp_path, loss_type, kwargs)
    trainer.use_vllm = True  # _compute_loss then applies inputs["importance_sampling_ratio"]
    trainer.vllm_importance_sampling_correction = True
    inputs, sampler = tensors(trainer, 0.05)
    ratio = trl_is_ratio(inputs["old_per_token_logps"], sampler, inputs["completion_mask"].float(), mode, cap)
    assert ((ratio == 0) | (ratio == cap)).any(), "the synthetic mismatch must reach the cap"
    inputs["importance_sampling_ratio"] = ratio
    same = {"kl_coef": 0.0, "clip_high": 0.28} if ours == "grpo" else {}
    compare(trainer, inputs, get_objective(ours, rollout_correction=mode, rollout_correction_cap=cap, **same), sampler)


def test_gmpo_matches_trl_experimental_trainer(model_dir, tmp_path):
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer

    args = GMPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=T_COMPLETION, report_to=[], use_cpu=True, beta=0.02)
    trainer = GMPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["1+2=", "3+4="] * 4}),
                          processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir))
    inputs, _ = tensors(trainer, 0.5)
    compare(trainer, inputs, get_objective("gmpo", kl_coef=0.02))
