"""Real models on one GPU: activation checkpointing, LoRA adapters (peft) and the reference policy.

``prepare_policy(model, cfg)`` turns the loaded model into the trained policy as configured, and
``Reference(policy)`` is the frozen reference policy π_ref of KL terms: a deep copy of the initial weights for full
fine-tuning, or, with LoRA, the same module with its adapter disabled (no second copy of the weights).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def enable_activation_checkpointing(model) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them.

    Hugging Face models checkpoint only in training mode, so the model is put in training mode (the rollout engine
    switches to eval mode while sampling, and passes without gradient never checkpoint). Training mode also turns on
    the dropout of the model's config: none for Llama / Qwen2 (a warning names any that is set)."""
    net = model.get_base_model() if is_peft(model) else model
    if not getattr(net, "supports_gradient_checkpointing", False):
        raise ValueError(f"--activation-checkpointing: {type(net).__name__} does not support activation "
                         "checkpointing")
    kwargs = {"use_reentrant": False}  # reentrant checkpoints lose the gradient when the inputs are frozen (LoRA)
    if hasattr(net, "activation_checkpointing_enable"):  # transformers >= 5.x
        net.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    dropouts = {k: v for k, v in net.config.to_dict().items() if "dropout" in k and isinstance(v, float) and v > 0}
    if dropouts:
        warnings.warn(f"--activation-checkpointing puts the model in training mode: dropout {dropouts} applies",
                      stacklevel=2)
    model.train()


def apply_lora(model, rank: int, alpha: float, targets: list[str], dropout: float = 0.0):
    """Wrap `model` in a peft LoRA adapter on the `targets` linear layers; only the adapter is trained."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # pragma: no cover - peft is a dependency
        raise ImportError("--lora-rank needs the `peft` package: pip install peft") from e
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in targets if t not in present]
    if missing:
        raise ValueError(f"--lora-target-modules: {', '.join(missing)} not found in {type(model).__name__}")
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), bias="none",
                     task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def prepare_policy(model, cfg):
    """The trained policy of `cfg` from the loaded model: LoRA-wrapped when ``cfg.lora_rank`` > 0, with activation
    checkpointing when ``cfg.activation_checkpointing``."""
    if cfg.lora_rank > 0:
        model = apply_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules)
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(model)
    return model


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class Reference:
    """The reference policy π_ref (the initial weights): ``with ref.policy() as m: score(m, ...)``."""

    def __init__(self, policy):
        self._policy = policy
        self._copy = None if is_peft(policy) else copy.deepcopy(policy).requires_grad_(False)

    @contextmanager
    def policy(self) -> Iterator[torch.nn.Module]:
        if self._copy is not None:
            yield self._copy
        else:
            with self._policy.disable_adapter():
                yield self._policy


def merged_for_export(model):
    """The plain model to save as the run's final model: LoRA merged into the base weights."""
    return model.merge_and_unload() if is_peft(model) else model
