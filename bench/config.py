"""Training configuration: one dataclass, loaded from YAML and/or flags, validated before any work starts.

Every field carries its documentation in ``metadata["doc"]``; the CLI flags of ``bench train`` / ``bench run`` are
generated from these fields, so defaults live here and only here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from algorithms import get_objective
from bench.engines.base import CAPABILITIES, DEFAULT_ENGINE, ENGINES, check_engine_args
from bench.inputs import (
    EVAL_PROBLEMS_MAX,
    SEED_MAX,
    prompt_template_refusal,
    read_yaml,
    sequence_bytes,
    step_size,
    tag_values,
    typed_fields,
    typed_overrides,
    user_tags,
)
from bench.model import model_shape
from bench.plugins import identity, load_plugins
from evaluators.hints import did_you_mean
from reports.paths import check_length, contained, replace_file, safe_component
from reports.record import DEFAULT_TRACKING_URI, check_experiment_name


def _f(default: Any, doc: str, **kw: Any) -> Any:
    """A dataclass field with its documentation attached (shown by ``--help`` and docs)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": doc, **kw})
    return field(default=default, metadata={"doc": doc, **kw})


BUILTIN_MODEL = "builtin:tiny-arith"
OUTPUT_DIR = ".pobench/runs"  # (the runs' folders when no --output-dir is given)
# what every `--tracking-uri` help states as the default (reports.record.tracking_uri resolves it)
TRACKING_URI_DEFAULT = f"$MLFLOW_TRACKING_URI, else {DEFAULT_TRACKING_URI} in the working folder"

# Fields that distinguish runs of one comparison: everything else must be identical across its runs.
# (``threads``, ``shared_prefix`` and ``skip_zero_advantage`` change the speed, not the computation: runs that differ in
# them still compare)
PER_RUN_FIELDS = ("algo", "objective_overrides", "seed", "run_name", "output_dir", "resume",
                  "tracking_uri", "experiment", "comparison", "tags", "threads", "keep_checkpoints", "shared_prefix",
                  "skip_zero_advantage")


def config_file(path: str | Path, what: str = "--config") -> dict[str, Any]:
    """The mapping of TrainConfig fields a YAML file holds (an empty file: none); anything else raises ValueError."""
    data = read_yaml(path, what)
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config file must be a YAML mapping of field: value")
    return data


@dataclass
class TrainConfig:
    """Everything one training run needs. See ``docs/METRICS.md`` for what is logged."""

    # --- what is trained
    algo: str = _f("grpo", "Registered objective name (`bench list`).")
    objective_overrides: dict = _f({}, "Objective config fields to override, e.g. {kl_coef: 0.1}.")
    plugins: list = _f([], "Plugins to load first: module names or .py files that register objectives and tasks "
                           "(docs/PLUGINS.md); loaded in every process that trains, their source digests in the "
                           "comparison hash.")
    control: str | None = _f(None, "Objective-independent control: `random-reward` replaces the verifier reward by a "
                                   "coin flip with the same mean (checks that gains are reward-driven); default: none.")
    model: str = _f(BUILTIN_MODEL, "Policy: `builtin:tiny-arith` (shipped warm-started tiny model), a local folder "
                                   "or a Hugging Face hub id.")
    revision: str | None = _f(None, "Hub revision of --model (branch, tag or commit; default: main), resolved to its "
                                    "commit, which is part of the run's identity (bench/runs/identity.py).")
    prompt_template: str = _f("auto", "`auto` (chat template if the tokenizer has one, else plain), `chat`, `plain`, "
                                      "or a format string with {question}.")
    dtype: str = _f("float32", "Parameter dtype: float32 | bfloat16 | float16.")
    device: str = _f("auto", "cpu | cuda | auto.")
    backend: str = _f("hf", "Rollout engine backend: hf | vllm.")
    engine: str = _f(DEFAULT_ENGINE, "Training engine: native (pobench's loop: bench/engines/native/), trl (a TRL "
                               "GRPOTrainer subclass that trains the same objective: bench/engines/trl/) or verl "
                               "(verl's trainer on a Ray cluster with GPUs: bench/engines/verl/); docs/SCALE.md.",
                     choices=ENGINES)
    engine_args: dict = _f({}, "Options of the engine: with engine=trl, GRPOConfig fields TRL honours as they are "
                               "(e.g. {use_vllm: true, vllm_mode: colocate}); fields the engine sets from this config "
                               "are refused. With engine=verl, the cluster and rollout options of VerlOptions "
                               "(rollout_engine, nnodes, n_gpus_per_node, tensor_parallel, gpu_memory_utilization, "
                               "max_prompt_length, data_dir, python: the interpreter of verl's own environment).")
    threads: int = _f(0, "torch intra-op CPU threads; 0 = auto: 1 for a built-in model (its matrices are too small "
                         "to gain from more, and more oversubscribe a busy CPU), torch's default otherwise.")
    # --- data
    task: str = _f("arith", "Training task: a benchmark name (arith, gsm8k, math, ...).")
    data: str | None = _f(None, "Local file/folder or hub id for the training task (default: the benchmark's own).")
    eval_task: str | None = _f(None, "Held-out benchmark (default: same as task).")
    eval_data: str | None = _f(None, "Local file/folder or hub id for the held-out benchmark (default: its own).")
    difficulty: int = _f(2, "Difficulty of the built-in arith task (1 = easiest).")
    skip_bad_rows: bool = _f(False, "Skip (and count) malformed rows of the data / eval_data files instead of failing.")
    # --- rollouts
    steps: int = _f(40, "Number of training steps (one rollout batch each).")
    prompts_per_step: int = _f(16, "Prompts sampled per step.")
    group_size: int = _f(8, "Completions per prompt (G).")
    max_new_tokens: int = _f(48, "Maximum completion length L_max (tokens).")
    temperature: float = _f(1.0, "Sampling temperature for training rollouts.")
    top_p: float = _f(1.0, "Nucleus sampling for training rollouts.")
    # --- optimisation
    lr: float = _f(3e-5, "AdamW learning rate (peak); 3e-5 suits the default 4 mini-batch updates per rollout.")
    lr_schedule: str = _f("constant", "constant | cosine | linear (after warm-up).")
    warmup_steps: int = _f(0, "Linear warm-up steps.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    adam_betas: list = _f([0.9, 0.999], "AdamW betas.", item=float)
    max_grad_norm: float = _f(1.0, "Gradient clipping (global norm); 0 disables.")
    update_epochs: int = _f(1, "μ: passes over each rollout batch.")
    minibatches: int = _f(4, "Optimizer steps per epoch (the rollout batch is split into this many minibatches). The "
                             "default 4 makes every rollout batch feed 4 updates, so all but the first are off-policy "
                             "(importance ratios leave 1 and clips can bind), as in DAPO's / verl's recipes; "
                             "update_epochs=1 with minibatches=1 is the on-policy regime.")
    micro_batch_size: int = _f(64, "Completions per forward/backward (gradient accumulation within a minibatch).")
    # --- memory (real models on one GPU; docs/SCALE.md)
    activation_checkpointing: bool = _f(False, "Recompute each decoder layer's activations in the backward pass "
                                               "instead of keeping them (less memory, ~1/3 more compute).")
    scoring_chunk_mb: float = _f(256.0, "Float32 logits held at once when scoring (MiB): chosen-token log-probs "
                                        "and entropies are computed in chunks of tokens; 0 = the (B, T, V) logits "
                                        "in one piece.")
    lora_rank: int = _f(0, "LoRA rank r (peft); 0 = full fine-tuning. The reference policy is then the base model "
                           "with the adapter disabled.")
    lora_alpha: float = _f(16.0, "LoRA scaling alpha (the update is alpha / r * B A).")
    lora_target_modules: list = _f(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                   "Module names that get a LoRA adapter (all linear layers of a Llama / Qwen2 "
                                   "block by default).", item=str)
    length_grouped_micro_batches: bool = _f(True, "Split each minibatch into micro-batches of similar lengths (less "
                                                  "padding work; the same gradient for split-invariant objectives, "
                                                  "which are the only ones it applies to).")
    shared_prefix: bool = _f(True, "Forward each prompt once per micro-batch, its keys / values shared by its "
                                   "completions, in the update and the scoring passes (the same log-probs and "
                                   "gradients: bench/rollout/prefix.py; native engine; docs/SCALE.md for its limits).")
    skip_zero_advantage: bool = _f(True, "Skip the forward / backward of completions with advantage 0 when the "
                                         "objective declares they carry no gradient (`bench list --details`); their "
                                         "weight stays in every normaliser, so the gradient is the same (native "
                                         "engine).")
    track_ref_kl: bool = _f(True, "Log KL to the reference policy every step even when the objective does not use it "
                                  "(one extra forward pass).")
    # --- evaluation
    eval_every: int = _f(10, "Held-out evaluation every N steps (and at step 0 and the last step); 0 disables.")
    eval_problems: int = _f(400, "Held-out problems per evaluation (at most 1,000,000).")
    eval_samples: int = _f(1, "Sampled completions per held-out problem (sampled accuracy = mean over them).")
    eval_temperature: float = _f(1.0, "Temperature of the sampled held-out evaluation.")
    samples_every: int = _f(10, "Log a table of sample completions every N steps.")
    # --- bookkeeping
    seed: int = _f(0, "Seed for data order, sampling and initialisation.")
    checkpoint_every: int = _f(10, "Checkpoint every N steps (and at the end); 0 = only at the end. (TRL engine: "
                                   "every N steps, none at the end; verl: its own save_freq.)")
    keep_checkpoints: int = _f(1, "Checkpoints kept per run: the newest N (older ones are deleted; the newest two "
                                  "keep their optimizer state, so with N >= 2 a damaged newest checkpoint leaves one "
                                  "to resume from). The final weights are saved apart in <run>/final.")
    output_dir: str = _f(OUTPUT_DIR, "Where checkpoints and resolved configs are written.")
    run_name: str | None = _f(None, "MLflow run name (default: <algo>-s<seed>).")
    experiment: str = _f("pobench", "MLflow experiment name.")
    tracking_uri: str | None = _f(None, f"MLflow tracking URI (default: {TRACKING_URI_DEFAULT}).")
    comparison: str | None = _f(None, "Comparison id tag (set by `bench run`); `bench train` joins an existing "
                                      "comparison only with its configuration.")
    tags: dict = _f({}, "Extra MLflow tags (not under pobench. or mlflow.: those are pobench's and MLflow's own).")
    resume: bool = _f(False, "Resume from the last checkpoint in output_dir (same MLflow run).")

    def validate(self) -> None:
        """Raise ValueError naming the field for any value of the wrong type (numbers written as text are converted
        in place) or out of range (before any work starts)."""
        def bad(name: str, why: str) -> None:
            raise ValueError(f"config field `{name}`={getattr(self, name)!r}: {why}")

        # (a shallow view: to_dict copies every nested value, which for a YAML alias bomb under `tags` (10^7 shared
        # leaves) took minutes and gigabytes before tag_values refused it in one line)
        for name, value in typed_fields(TrainConfig, {f.name: getattr(self, f.name) for f in fields(self)}).items():
            setattr(self, name, value)
        tag_values(self.tags)
        if not isinstance(self.plugins, list):
            bad("plugins", "must be a list of module names or .py files")
        load_plugins(self.plugins)  # before the objective is looked up (its overrides typed): it may be a plugin's
        self.objective_overrides = typed_overrides(self.algo, self.objective_overrides)
        check_experiment_name(self.experiment, "config field `experiment` (--experiment)")
        check_length(self.output_dir, "config field `output_dir` (--output-dir)")  # (a name over 255 bytes)
        if not 0 <= self.seed <= SEED_MAX:
            bad("seed", f"a seed must be an integer in [0, {SEED_MAX}] (--seed)")

        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "update_epochs", "minibatches",
                     "micro_batch_size", "eval_problems", "eval_samples", "keep_checkpoints"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                bad(name, "must be an integer >= 1")
        if self.eval_problems > EVAL_PROBLEMS_MAX:
            bad("eval_problems", f"at most {EVAL_PROBLEMS_MAX:,} held-out problems per evaluation (--eval-problems; "
                                 "more than any benchmark's test split, and hours per evaluation); give fewer")
        if too_big := step_size(self.prompts_per_step, self.group_size, self.max_new_tokens, self.step_memory()):
            bad("group_size" if self.group_size > self.prompts_per_step else "prompts_per_step", too_big)
        for name in ("eval_every", "checkpoint_every", "samples_every", "warmup_steps", "difficulty", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                bad(name, "must be an integer >= 0")
        for f in fields(self):  # nan / inf pass comparisons like `lr > 0` and diverge at step 2
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                bad(f.name, "must be a finite number")
        if self.group_size < 2:
            bad("group_size", "must be >= 2: advantages are relative to the other completions of the same prompt, "
                              "so with one completion per prompt every advantage is 0 and nothing is learned")
        if not (self.lr > 0):
            bad("lr", "must be > 0")
        if self.temperature <= 0:
            bad("temperature", "must be > 0 for training rollouts")
        if not (0 < self.top_p <= 1):
            bad("top_p", "must be in (0, 1]")
        if self.eval_temperature < 0:
            bad("eval_temperature", "must be >= 0")
        if self.max_grad_norm < 0:
            bad("max_grad_norm", "must be >= 0")
        if self.weight_decay < 0:
            bad("weight_decay", "must be >= 0")
        if self.lr_schedule not in ("constant", "cosine", "linear"):
            bad("lr_schedule", "valid: constant, cosine, linear")
        if self.engine not in ENGINES:
            bad("engine", f"valid: {', '.join(ENGINES)}")
        try:  # the engine_args its engine declares (bench/engines/base.py)
            check_engine_args(self.engine, self.engine_args)
        except ValueError as e:
            bad("engine_args", str(e))
        if self.backend not in ("hf", "vllm"):
            bad("backend", "valid: hf, vllm")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            bad("dtype", "valid: float32, bfloat16, float16")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            bad("device", "valid: auto, cpu, cuda, cuda:N")
        if why := prompt_template_refusal(self.prompt_template):
            bad("prompt_template", f"{why} (--prompt-template)")
        if self.control not in (None, "random-reward"):
            bad("control", "valid: None, random-reward")
        if self.prompts_per_step * self.group_size < self.minibatches:
            bad("minibatches", "more minibatches than completions per step")
        if not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            bad("lora_rank", "must be an integer >= 0 (0 = full fine-tuning)")
        if self.lora_rank and not self.lora_alpha > 0:
            bad("lora_alpha", "must be > 0")
        if self.lora_rank and (not self.lora_target_modules
                               or not all(isinstance(m, str) for m in self.lora_target_modules)):
            bad("lora_target_modules", "must be a non-empty list of module names")
        if self.lora_rank and self.backend == "vllm":
            bad("backend", "LoRA training with the vllm backend is not supported yet; use --backend hf")
        if not self.scoring_chunk_mb >= 0:
            bad("scoring_chunk_mb", "must be >= 0 (0 = no chunking)")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            bad("adam_betas", "must be two numbers in [0, 1)")

        get_objective(self.algo, **dict(self.objective_overrides))

    def step_memory(self) -> tuple[int, str]:
        """(bytes, what) one completion of a rollout batch holds on this machine (``bench.inputs.sequence_bytes``):
        the model's tensors with the native engine's HF sampler on the CPU; the host part only where they live on a
        GPU or vLLM bounds its cache; the token ids alone for another engine or a model whose config is not local."""
        import torch

        shape = model_shape(self.model) if self.engine == "native" else None
        on_gpu = str(self.device).startswith("cuda") or (self.device == "auto" and torch.cuda.is_available())
        return sequence_bytes(shape, self.max_new_tokens, self.dtype, tensors=self.backend == "hf" and not on_gpu)

    # --- (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        """Write the config to ``path`` whole, replacing what is there (a link the user put in its place, or a hard
        link a backup shares with it, is replaced, never written through: ``reports.paths.replace_file``)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            hints = [u + did_you_mean(u, known, quote=False) for u in unknown]
            raise ValueError(f"unknown config field(s): {', '.join(hints)}; valid: {', '.join(sorted(known))}")
        cfg = cls(**typed_fields(cls, d))
        user_tags(cfg.tags)  # (a user's config; pobench's own tags are added to its copies, never read back here)
        return cfg

    @classmethod
    def load(cls, path: str | Path | None, **overrides: Any) -> TrainConfig:
        """The fields of a YAML file (``path`` None: none) < ``overrides`` (None values are ignored)."""
        data = config_file(path) if path else {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(data)

    def run_label(self) -> str:
        """The run's name (``run_name``, else ``<algo>-s<seed>``): its MLflow run name."""
        return self.run_name or f"{self.algo}-s{self.seed}"

    def run_dir(self) -> Path:
        """The run's folder: ``output_dir / run_label()`` as ONE safe path component (a name with ``/``, ``..`` or an
        absolute path becomes a slug plus a hash: reports/paths.py), never outside ``output_dir``; relative when
        ``output_dir`` is. (bench/runs/folders.py's ``under`` for the run folder; spelled out here because
        bench.runs.folders imports this module.)"""
        component = safe_component(self.run_label(), "--run-name")
        contained(self.output_dir, component)
        return Path(self.output_dir) / component

    def comparison_hash(self) -> str:
        """Hash of every field that must be identical across the runs of one comparison, and of the content of its
        inputs (data files, model files or hub revision, task versions: ``bench.runs.identity.input_digests``)."""
        from bench.runs.identity import input_digests  # (imports bench.model, hence torch, when asked)

        d = {k: v for k, v in self.to_dict().items() if k not in PER_RUN_FIELDS}
        d["inputs"] = input_digests(self)
        if d["engine"] == DEFAULT_ENGINE and not d["engine_args"]:  # the hashes of runs from before engines existed
            del d["engine"], d["engine_args"]
        elif d["engine"] in CAPABILITIES:  # engine_args that change no result (e.g. where verl is installed)
            free = CAPABILITIES[d["engine"]].hash_free_args
            d["engine_args"] = {k: v for k, v in d["engine_args"].items() if k not in free}
        if d["control"] is None:  # a control (random-reward) is its own comparison: never a real-reward run reused
            del d["control"]
        if d["plugins"]:  # by content: each plugin's file name and source digest, not its path
            d["plugins"] = identity(d["plugins"])
        else:  # the hashes of runs from before plugins existed
            del d["plugins"]
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]
