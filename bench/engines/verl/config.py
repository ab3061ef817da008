"""The verl config of one pobench run, its data in verl's parquet layout and the reward function verl calls
(part 2 of the package docstring). verl imports ``compute_score`` from this module by name (``pkg://``): loaded
by file path, its dataclasses would not build (the module is not in ``sys.modules`` while it runs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from algorithms import get_objective
from bench.data import eval_problems
from bench.engines.base import VerlOptions
from bench.engines.verl.losses import (
    EXTERNAL_LIB,
    OVERRIDES_ENV,
    ROLLOUT_ENGINES,
    TRAINER_MODULE,
    mapping,
)
from bench.model import format_string
from bench.plugins import PLUGINS_ENV, normalized
from evaluators import get_benchmark, list_benchmarks, task_module
from evaluators.tasks import Problem, checked_reward
from evaluators.verify import is_correct

#: verl imports the modules named here on ``import verl`` (verl/__init__.py), in every process of the run
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"


# ------------------------------------------------------------------------------------------------ data and reward
def _chat_template(template: str) -> str | None:
    """A Jinja chat template that renders pobench's prompt ``template`` around the user message (None: the tokenizer's
    own chat template, what pobench's ``chat`` / ``auto`` use)."""
    if template in ("auto", "chat"):
        return None
    before, after = format_string(template).split("{question}", 1)
    # string literals in expression tags: no block tag, so trim_blocks / lstrip_blocks (Hugging Face's chat-template
    # environment) cannot eat a newline or an indent of the literal text
    literal = [f"{{{{ {json.dumps(t, ensure_ascii=False)} }}}}" if t else "" for t in (before, after)]
    return literal[0] + "{{ messages[-1]['content'] }}" + literal[1]


def problem_rows(benchmark_name: str, problems, answer_kind: str, split: str) -> list[dict]:
    """verl's RLHF dataset rows (data_source, prompt messages, reward_model.ground_truth, extra_info)."""
    return [{"data_source": benchmark_name, "prompt": [{"role": "user", "content": p.question}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": p.answer},
             "extra_info": {"split": split, "index": i, "id": p.id, "answer_kind": answer_kind}}
            for i, p in enumerate(problems)]


def write_data(cfg, out_dir: str | Path) -> tuple[Path, Path]:
    """Write the training split of ``cfg.task`` and ``cfg.eval_problems`` held-out problems of ``cfg.eval_task`` as
    verl parquet files (``train.parquet``, ``val.parquet``) under ``out_dir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    train_task = get_benchmark(cfg.task)
    if train_task.generated:
        raise ValueError(f"task {cfg.task} is pobench's built-in toy task: verl runs need a benchmark with files")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = train_task.load(split="train", data=cfg.data, skip_bad_rows=cfg.skip_bad_rows)
    held_out_task, held_out = eval_problems(cfg.eval_task or cfg.task, limit=cfg.eval_problems, data=cfg.eval_data,
                                            skip_bad_rows=cfg.skip_bad_rows)
    paths = out / "train.parquet", out / "val.parquet"
    for path, name, kind, problems, split in ((paths[0], cfg.task, train_task.answer_kind, train, "train"),
                                              (paths[1], cfg.eval_task or cfg.task, held_out_task.answer_kind, held_out,
                                               "test")):
        pq.write_table(pa.Table.from_pylist(problem_rows(name, problems, kind, split)), path)
    return paths


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **_: Any) -> dict[str, float]:
    """verl's custom reward function: pobench's verifier (1 / 0), as ``score`` and as ``acc`` (the metric DAPO's
    group filter and verl's validation read); a plugin's task: its own ``reward``."""
    if data_source in list_benchmarks() and task_module(data_source) != "evaluators":
        r = checked_reward(get_benchmark(data_source), solution_str, Problem("", "", str(ground_truth)))
        return {"score": r, "acc": r}
    kind = (extra_info or {}).get("answer_kind") or get_benchmark(data_source).answer_kind
    r = 1.0 if is_correct(solution_str, str(ground_truth), kind) else 0.0
    return {"score": r, "acc": r}


# ------------------------------------------------------------------------------------------------ config
def run_name(cfg) -> str:
    return cfg.run_label()


def make_verl_config(cfg, options: VerlOptions | None = None) -> dict[str, Any]:
    """The overrides of verl's ``ppo_trainer`` config for the run (``cfg.algo``, ``cfg.seed``) of a pobench
    ``TrainConfig`` (nested dict; ``hydra_overrides`` flattens it for ``python -m verl.trainer.main_ppo``).

    An objective whose plan is "worker-loss" runs on pobench's trainer (``trainer.v1.trainer_mode=pobench_sync``,
    registered in every process through ``$VERL_USE_EXTERNAL_MODULES``), which installs pobench's worker loss and
    computes the entropies it needs (``actor.calculate_entropy``, ``actor.use_kl_loss`` for the reference worker).

    Raises ValueError for what verl cannot run as pobench defines it (objective plan, built-in model / task, the
    random-reward control, a linear LR schedule, prompts_per_step not divisible by minibatches)."""
    o = options or VerlOptions()
    cfg.validate()
    p = mapping(cfg.algo, cfg.objective_overrides, max_length=cfg.max_new_tokens)
    if not p.runs:
        raise ValueError(f"objective {cfg.algo!r} does not run on verl ({p.mode}): {p.reason}")
    if cfg.model.startswith("builtin:"):
        raise ValueError(f"model {cfg.model!r} is pobench's built-in toy model: verl needs a Hugging Face model")
    if cfg.control is not None:
        raise ValueError(f"control {cfg.control!r} is not implemented on verl")
    if cfg.revision is not None:
        raise ValueError(f"--revision {cfg.revision}: verl loads --model as a path; pass a local snapshot folder of "
                         "that revision as --model instead")

    if get_benchmark(cfg.task).generated:
        raise ValueError(f"task {cfg.task} is pobench's built-in toy task: verl runs need a benchmark with files")
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"lr_schedule {cfg.lr_schedule!r}: verl offers constant and cosine")
    if cfg.prompts_per_step % cfg.minibatches:
        raise ValueError(f"prompts_per_step={cfg.prompts_per_step} must be a multiple of minibatches="
                         f"{cfg.minibatches}: verl's mini-batches are whole prompts with their group")
    if o.rollout_engine not in ROLLOUT_ENGINES:
        raise ValueError(f"rollout engine {o.rollout_engine!r}: valid: {', '.join(ROLLOUT_ENGINES)}")
    name = run_name(cfg)
    run_dir = cfg.run_dir().resolve()
    data_dir = Path(o.data_dir).resolve() if o.data_dir else run_dir / "verl-data"
    micro = min(cfg.micro_batch_size, cfg.prompts_per_step // cfg.minibatches * cfg.group_size)
    env = {OVERRIDES_ENV: json.dumps({cfg.algo: dict(cfg.objective_overrides)}, sort_keys=True),
           "PYTHONPATH": str(Path(__file__).resolve().parents[3])}  # pobench's source tree, for external_lib
    if cfg.plugins:  # every verl worker loads them before it registers the losses (the package's __init__)
        env[PLUGINS_ENV] = json.dumps(normalized(cfg.plugins))
    if p.mode == "worker-loss":
        env[EXTERNAL_MODULES_ENV] = TRAINER_MODULE  # the trainer must be registered where verl's task runner runs
    out: dict[str, Any] = {
        "data": {"train_files": str(data_dir / "train.parquet"), "val_files": str(data_dir / "val.parquet"),
                 "train_batch_size": cfg.prompts_per_step, "max_prompt_length": o.max_prompt_length,
                 "max_response_length": cfg.max_new_tokens, "shuffle": True, "seed": cfg.seed,
                 "filter_overlong_prompts": True, "truncation": "error"},
        "actor_rollout_ref": {
            "model": {"path": cfg.model, "external_lib": EXTERNAL_LIB,
                      "enable_gradient_checkpointing": cfg.activation_checkpointing,
                      "lora_rank": cfg.lora_rank, "lora_alpha": cfg.lora_alpha,
                      **({"target_modules": list(cfg.lora_target_modules)} if cfg.lora_rank else {}),
                      **({"custom_chat_template": _chat_template(cfg.prompt_template)}
                         if _chat_template(cfg.prompt_template) else {})},
            "actor": {
                "optim": {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "betas": list(cfg.adam_betas),
                          "clip_grad": cfg.max_grad_norm if cfg.max_grad_norm > 0 else 1.0e9,
                          "lr_warmup_steps": cfg.warmup_steps, "lr_scheduler_type": cfg.lr_schedule},
                "ppo_mini_batch_size": cfg.prompts_per_step // cfg.minibatches,
                "ppo_micro_batch_size_per_gpu": micro, "ppo_epochs": cfg.update_epochs, "shuffle": False,
                "data_loader_seed": cfg.seed,
                "policy_loss": {"loss_mode": p.loss_mode},
                "fsdp_config": {"seed": cfg.seed},
            },
            "rollout": {"name": o.rollout_engine, "n": cfg.group_size, "temperature": cfg.temperature,
                        "top_p": cfg.top_p, "seed": cfg.seed, "tensor_model_parallel_size": o.tensor_parallel,
                        "gpu_memory_utilization": o.gpu_memory_utilization,
                        "log_prob_micro_batch_size_per_gpu": micro,
                        "val_kwargs": {"temperature": cfg.eval_temperature, "n": cfg.eval_samples,
                                       "do_sample": cfg.eval_temperature > 0}},
            "ref": {"log_prob_micro_batch_size_per_gpu": micro},
        },
        "algorithm": {"use_kl_in_reward": False},
        "reward": {"custom_reward_function": {"path": f"pkg://{__name__}", "name": "compute_score"}},
        "trainer": {"total_training_steps": cfg.steps, "total_epochs": 1000, "project_name": cfg.experiment,
                    "experiment_name": name, "logger": ["console", "mlflow"], "nnodes": o.nnodes,
                    "n_gpus_per_node": o.n_gpus_per_node, "val_before_train": cfg.eval_every > 0,
                    "test_freq": cfg.eval_every if cfg.eval_every > 0 else -1,
                    "save_freq": cfg.checkpoint_every if cfg.checkpoint_every > 0 else cfg.steps,
                    "max_actor_ckpt_to_keep": cfg.keep_checkpoints, "default_local_dir": str(run_dir / "verl"),
                    "resume_mode": "auto" if cfg.resume else "disable"},
        "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": env}}},
    }
    native = dict(p.native)
    if native.get("actor_rollout_ref.actor.loss_scale_factor") is not None:
        native["actor_rollout_ref.actor.loss_scale_factor"] = cfg.max_new_tokens
    for key, value in native.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    c = get_objective(cfg.algo, **cfg.objective_overrides).config
    # shown in the config verl logs; the pobench loss reads its own clip range
    if hasattr(c, "clip_low") and hasattr(c, "clip_high"):
        out["actor_rollout_ref"]["actor"].update({"clip_ratio_low": c.clip_low, "clip_ratio_high": c.clip_high})
    return out


#: keys under these prefixes are not in verl's ppo_trainer config: Hydra adds them (``+key=value``)
ADDED_PREFIXES = ("ray_kwargs.ray_init.runtime_env.env_vars", "reward.reward_kwargs")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _hydra_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(x)}" for k, x in v.items()) + "}"
    s = str(v)
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_overrides(config: dict[str, Any]) -> list[str]:
    """``key=value`` command-line overrides of verl's ppo_trainer config (``+key=value`` for keys it lacks)."""
    env = ADDED_PREFIXES[0]
    return [("+" if k.startswith(ADDED_PREFIXES) else "") + f"{k}=" + _hydra_value(str(v) if k.startswith(env) else v)
            for k, v in _flatten(config).items()]


def main_ppo_command(config: dict[str, Any], python: str = sys.executable) -> list[str]:
    return [python, "-m", "verl.trainer.main_ppo", *hydra_overrides(config)]

