"""Warm start of the built-in policy: supervised fine-tuning of the tiny model on worked `arith` solutions.

The recipe (docs/MODEL.md) is deterministic for a seed: the initial weights come from ``torch.manual_seed(seed)``
inside a forked RNG (global state is left alone), the data from the task's seeded train stream, and the learning rate
is constant after a linear warm-up, so the state after k steps does not depend on the total number of steps. Each
example is the plain prompt ``"Q: {question}\\nA:"`` followed by ``" " + solution + eos``; the loss is the mean
cross-entropy over completion tokens only.

The output folder is an ordinary Hugging Face model folder plus ``warmstart.json``: the recipe, the loss of every step
and parameter fingerprints (per-tensor sums and norms) at chosen steps, which the reproducibility test compares.
A folder whose ``warmstart.json`` already holds the same recipe is reused (the cache).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from bench.model import build_char_tokenizer, format_prompt, tiny_config
from bench.rollout import SamplingParams, make_sampler
from evaluators.arith import ArithTask
from reports.edits import record_written, recorded
from reports.paths import LISTING, MARKER, check_out_is_ours, claim_output_folder, hold_out_folder

FINGERPRINT_STEPS = (50, 100)  # besides the last step: the reproducibility test replays this prefix


@dataclass(frozen=True)
class Recipe:
    """Every knob of the warm start (all of them go into warmstart.json)."""

    steps: int = 500
    seed: int = 0
    difficulty: int = 2
    batch_size: int = 32          # examples per optimizer step
    lr: float = 1e-3              # constant after warm-up (annealing to 0 leaves RL no room, see docs/MODEL.md)
    warmup_steps: int = 50        # linear warm-up from 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    threads: int = 1              # torch CPU threads while training: fixed so the result is bitwise reproducible

    def validate(self) -> None:
        for name in ("steps", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"warm start: {name}={getattr(self, name)!r} must be >= 1")
        if self.lr <= 0 or self.warmup_steps < 0 or self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ValueError(f"warm start: invalid recipe {self}")
        ArithTask(self.difficulty)  # (an undefined difficulty: one line before --out is made, held-out round 14 H18)


def fingerprint(model) -> dict[str, list[float]]:
    """Per-tensor (sum, L2 norm) of the parameters: a compact, comparable summary of the weights."""
    return {name: [float(p.detach().double().sum()), float(p.detach().double().norm())]
            for name, p in model.named_parameters()}


def _batch(tokenizer, problems, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids (B, L), attention_mask (B, L), labels (B, L)); labels -100 outside completions."""
    seqs, labels = [], []
    for p in problems:
        prompt = tokenizer(format_prompt(tokenizer, p.question, "plain"))["input_ids"]
        target = tokenizer(" " + p.solution)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, y) in enumerate(zip(seqs, labels)):
        ids[i, :len(s)] = torch.tensor(s)
        lab[i, :len(y)] = torch.tensor(y)
        attn[i, :len(s)] = 1
    return ids.to(device), attn.to(device), lab.to(device)


def warmstart(out: str | Path, recipe: Recipe = Recipe(), *, force: bool = False, progress: bool = True,
              snapshots: tuple[int, ...] = ()) -> Path:
    """Train the tiny model with `recipe` and save it to `out` (reused if `out` already holds this recipe).

    `snapshots`: extra steps at which a copy is saved to ``out/step-<k>`` (for choosing the number of steps).
    The folder is held (``reports.paths.hold_out_folder``, as `bench eval`'s and `bench report`'s) from the look at
    what it holds until the model is saved: another warm start
    into it at the same time is refused in one line (held-out round 10: two of different recipes both ended 0, one
    model silently replaced by the other).
    """
    recipe.validate()
    check_out_is_ours(out, "--out")  # (a name over 255 bytes, a user's folder, a link: one line, nothing made)
    lock = hold_out_folder(Path(out), "warmstart", instead="wait for it to end (the same recipe is then reused), "
                           "or give another --out")
    try:
        return _warmstart(Path(out), recipe, force, progress, snapshots)
    finally:
        lock.release()


def _warmstart(out: Path, recipe: Recipe, force: bool, progress: bool, snapshots: tuple[int, ...]) -> Path:
    from transformers import AutoModelForCausalLM, GenerationConfig

    meta_path = out / "warmstart.json"
    whole = all((out / rel).is_file() for rel in recorded(out))  # (a file of the model deleted: written again)
    if not force and whole and meta_path.exists() and (out / "model.safetensors").exists():
        held = json.loads(meta_path.read_text()).get("recipe")
        if held == asdict(recipe):
            return out
        if isinstance(held, dict):  # (a second recipe into the same --out replaced the first's model silently)
            differ = ", ".join(f"{k}: {held.get(k)!r} there, {v!r} here" for k, v in asdict(recipe).items()
                               if held.get(k) != v) or "its recipe differs"
            raise ValueError(f"--out {out}: holds the warm-started model of another recipe ({differ}); give another "
                             "--out, or pass --force to replace it")
    claim_output_folder(out, "--out")  # a user's folder or a link: one line, before training
    task = ArithTask(recipe.difficulty)
    tokenizer = build_char_tokenizer()
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(recipe.seed)
            model = AutoModelForCausalLM.from_config(tiny_config(tokenizer))
        model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                                   pad_token_id=tokenizer.pad_token_id, max_new_tokens=48,
                                                   do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / recipe.warmup_steps) if recipe.warmup_steps else 1.0)
        stream = task.train_stream(recipe.seed)
        losses: list[float] = []
        prints: dict[str, dict] = {}
        t0 = time.perf_counter()
        with _progress(progress, recipe.steps) as advance:
            for step in range(1, recipe.steps + 1):
                ids, attn, labels = _batch(tokenizer, [next(stream) for _ in range(recipe.batch_size)], "cpu")
                loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if recipe.max_grad_norm:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
                opt.step()
                sched.step()
                losses.append(loss.item())
                if step in FINGERPRINT_STEPS or step == recipe.steps or step in snapshots:
                    prints[str(step)] = fingerprint(model)
                if step in snapshots:  # exactly what a run of `step` steps produces (the schedule is constant)
                    _save(model, tokenizer, out / f"step-{step}", replace(recipe, steps=step), losses,
                          {k: v for k, v in prints.items() if k in {str(s) for s in FINGERPRINT_STEPS} | {str(step)}},
                          time.perf_counter() - t0)
                advance(losses[-1])
        _save(model, tokenizer, out, recipe, losses, prints, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return out


def _save(model, tokenizer, out: Path, recipe: Recipe, losses, prints, seconds: float) -> None:
    claim_output_folder(out, "--out")  # (a snapshot's step-<k> inside the claimed folder, new)
    before = _files(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta = {"recipe": asdict(recipe), "steps_done": len(losses), "seconds": round(seconds, 1),
            "torch": torch.__version__, "losses": losses, "fingerprints": prints}
    (out / "warmstart.json").write_text(json.dumps(meta, indent=1))
    # the files written now, with their digests (reports.edits): an edited one is neither taken for the finished model
    # nor replaced by --force (held-out round 16, H26: an edited config.json was both)
    record_written(out, [p for p, state in _files(out).items() if before.get(p) != state])


def _files(folder: Path) -> dict[Path, tuple[int, int]]:
    """The regular files directly in ``folder`` with their (inode, mtime in ns): what a save changed."""
    out = {}
    for p in folder.iterdir():
        if p.name not in (LISTING, MARKER) and p.is_file() and not p.is_symlink():
            st = p.stat()
            out[p] = (st.st_ino, st.st_mtime_ns)
    return out


class _progress:
    """A rich progress bar with the running loss (or nothing when disabled)."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total

    def __enter__(self):
        if not self.enabled:
            return lambda loss: None

        self.bar = Progress(TextColumn("warm start"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                            TextColumn("loss {task.fields[loss]:.4f}"))
        self.bar.__enter__()
        task = self.bar.add_task("warm start", total=self.total, loss=float("nan"))
        return lambda loss: self.bar.update(task, advance=1, loss=loss)

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)
        return False


def held_out_accuracy(model, tokenizer, *, difficulty: int = 2, problems: int = 400, temperature: float = 1.0,
                      samples: int = 1, seed: int = 0, max_new_tokens: int = 48) -> float:
    """Mean verifier reward on the first `problems` held-out arith problems (temperature 0 = greedy)."""
    task = ArithTask(difficulty)
    test = task.test_set(problems)
    prompts = [format_prompt(tokenizer, p.question) for p in test]
    engine = make_sampler("hf", model, tokenizer)
    r = engine.generate(prompts, samples, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
                        seed=seed)
    rewards = [task.reward(text, test[i // samples]) for i, text in enumerate(r.texts)]
    return sum(rewards) / len(rewards)
