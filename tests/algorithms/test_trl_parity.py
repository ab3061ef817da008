"""Our GRPO / DAPO / Dr. GRPO losses agree with the installed TRL GRPOTrainer where the definitions coincide.

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

CASES = {  # TRL loss_type -> (our objective, TRL config kwargs)
    # TRL multiplies the KL by the ratio by default (use_bias_correction_kl); the spec (GRPO paper) does not
    "grpo": ("grpo", {"beta": 0.04, "epsilon": 0.2, "use_bias_correction_kl": False}),
    "dapo": ("dapo", {"beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28}),
    "dr_grpo": ("dr_grpo", {"beta": 0.0, "epsilon": 0.2}),
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
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=T_COMPLETION, loss_type=loss_type, report_to=[], use_cpu=True,
                      **kwargs)
    ds = Dataset.from_dict({"prompt": ["1+2=", "3+4="] * 4})
    return GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                       args=args, train_dataset=ds, processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir))


@pytest.mark.parametrize("loss_type", list(CASES))
def test_loss_and_gradients_match_trl(model_dir, tmp_path, loss_type):
    ours_name, kwargs = CASES[loss_type]
    trainer = make_trainer(model_dir, tmp_path, loss_type, kwargs)
    model = trainer.model
    model.eval()  # TRL then applies no gradient-accumulation normaliser
    g = torch.Generator().manual_seed(1)
    B, P, T = 8, 4, T_COMPLETION
    prompt_ids = torch.randint(3, 18, (B, P), generator=g)
    completion_ids = torch.randint(3, 18, (B, T), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    completion_mask = torch.ones(B, T, dtype=torch.long)
    completion_mask[0, 5:] = 0
    completion_mask[3, 2:] = 0
    completion_mask[6, 7:] = 0
    with torch.no_grad():
        lp0 = trainer._get_per_token_logps_and_entropies(model, torch.cat([prompt_ids, completion_ids], 1),
                                                         torch.cat([prompt_mask, completion_mask], 1), T)[0]
    old = lp0 + 0.15 * torch.randn(B, T, generator=g)
    ref = lp0 + 0.15 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    inputs = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                  completion_mask=completion_mask, advantages=adv, old_per_token_logps=old,
                  ref_per_token_logps=ref, num_items_in_batch=completion_mask.sum())

    model.zero_grad()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    lp = trainer._get_per_token_logps_and_entropies(model, torch.cat([prompt_ids, completion_ids], 1),
                                                    torch.cat([prompt_mask, completion_mask], 1), T)[0]
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, ref_logprobs=ref, advantages=adv,
                        mask=completion_mask.float(), max_length=T)
    our_loss, _ = get_objective(ours_name).loss(batch)
    our_loss.backward()
    torch.testing.assert_close(our_loss, trl_loss.detach(), rtol=1e-5, atol=1e-6)
    for ours, theirs in zip([p.grad for p in model.parameters()], trl_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
