"""Speed measurement: our training step against TRL's GRPOTrainer, raw `model.generate`, and the floor.

Same tiny model, same 32 prompts x 8 completions (256), 48 new tokens, measured in ONE process so that the ratios
compare like with like on whatever machine runs it:

    python perf/step_vs_trl.py [--steps 4] [--prompts 32] [--group 8] [--max-new-tokens 48] [--rounds 5]
                                     [--threads 1] [--minibatches 4] [--prompt-tokens 200]
                                     [--micro-batch-size 32] [--no-shared-prefix] [--no-skip-zero-advantage]

`--minibatches M` is the several-mini-batch regime: each rollout batch is split into M mini-batches with one optimizer
step each (ours: `minibatches=M`; TRL: `gradient_accumulation_steps = group / M` with the generation batch of all
completions, i.e. `steps_per_generation` = M optimizer steps per generation). A "step" is then one rollout plus its M
optimizer steps on both sides (TRL: the sum of M consecutive optimizer steps, first generation cycle excluded).
Both sides forward / backward `--micro-batch-size` completions at a time (default: TRL's, one completion per prompt
of the batch: `per_device_train_batch_size` = `--prompts`).

`--prompt-tokens N` is the long-prompt configuration: every prompt (ours and TRL's) starts with the same few-shot
prefix of worked arith examples (``Q: ...\nA: <solution>``, drawn from a stream the training prompts never use),
whole examples (of the first 100 of that stream, in order, each taken if it fits) up to a mean prompt of N tokens
(the built-in tokenizer reads one character per token; keep the longest prompt + max-new-tokens within the model's
256 positions: `--prompt-tokens 200` gives prompts of 174-197 tokens, 183 on average, 3.5x the default's 53).

Ours and TRL's step are timed in interleaved rounds (A B, then B A, ...: slow drifts of a shared machine hit both
alike), each round a fresh run whose first step (warm-up) is excluded, with the same torch thread count pinned for
both; the ratio is reported as the median over rounds with its min and max and its interquartile range (the middle
half of the rounds). Prints seconds per step (ours, TRL) and their ratio; our rollout tokens/s against raw
`model.generate`; the floor (raw generate + one plain forward/backward over the same tokens) and our step's ratio to
it; peak RSS after each part. The same ratio in CPU seconds of the process (``time.process_time``) is printed beside
it: on a machine others are using, it moves much less than the wall-clock ratio (with T threads it sums their time).
`--no-shared-prefix` / `--no-skip-zero-advantage` turn off one of our savings
(docs/SCALE.md) to measure its share. The built-in model solves none of the few-shot prompts (it was warm-started on
the plain template only): every group then has zero advantage and the skip would remove the whole update, so the
long-prompt configuration is measured with `--no-skip-zero-advantage` (the printed zero-advantage fraction says so).
Targets: ours <= 0.7x TRL with one update per rollout, <= 0.5x with 4 mini-batches; rollout >= 90% of
raw generate.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time

import torch


def quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartile (linear interpolation between order statistics; one value: itself twice)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


FEW_SHOT_SEED = 12345  # the stream of worked examples of --prompt-tokens (the runs train on seed 0's prompts)


def prompt_template(prompt_tokens: int, n: int) -> str:
    """``auto`` (the plain ``Q: {question}\nA:``), or with ``prompt_tokens`` > 0 a few-shot prefix of whole worked
    examples before it, as many as keep the mean prompt of the benchmark's ``n`` questions within ``prompt_tokens``."""
    if prompt_tokens <= 0:
        return "auto"
    from bench.data import TrainData
    from bench.model import PLAIN_TEMPLATE, load_policy
    from evaluators import get_benchmark

    _, tok = load_policy("builtin:tiny-arith")
    count = lambda text: len(tok(text)["input_ids"])  # noqa: E731
    questions = [p.question for p in TrainData("arith", seed=0, steps=1, prompts_per_step=n).batch(1)]
    mean_question = sum(count(PLAIN_TEMPLATE.replace("{question}", q)) for q in questions) / len(questions)
    prefix = ""
    for _, p in zip(range(100), get_benchmark("arith").train_stream(seed=FEW_SHOT_SEED)):
        example = f"Q: {p.question}\nA: {p.solution}\n\n"
        if count(prefix + example) + mean_question <= prompt_tokens:  # (an example too long is passed over)
            prefix += example
    if not prefix:
        raise SystemExit(f"--prompt-tokens {prompt_tokens}: not even one example fits (prompts are already "
                         f"{mean_question:.0f} tokens)")
    return prefix + PLAIN_TEMPLATE


def prompts_for(n: int, template: str = "auto") -> list[str]:
    from bench.data import TrainData
    from bench.model import format_prompt, load_policy

    _, tok = load_policy("builtin:tiny-arith")
    data = TrainData("arith", seed=0, steps=1, prompts_per_step=n)
    return [format_prompt(tok, p.question, template) for p in data.batch(1)]


def raw_generate(prompts: list[str], group: int, max_new: int, repeats: int) -> tuple[float, float]:
    """Seconds and tokens/s of plain `model.generate` sampling the same batch."""
    from bench.model import load_policy

    model, tok = load_policy("builtin:tiny-arith")
    enc = tok([p for p in prompts for _ in range(group)], return_tensors="pt", padding=True)
    times, toks = [], 0
    for i in range(repeats):
        torch.manual_seed(i)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, max_new_tokens=max_new, temperature=1.0, top_p=1.0, top_k=0,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        times.append(time.perf_counter() - t0)
        gen = out[:, enc.input_ids.shape[1]:]
        # tokens up to and including the first eos count as generated
        is_eos = (gen == tok.eos_token_id).int()
        before = (is_eos.cumsum(-1) - is_eos) == 0
        toks = int(before.sum())
    sec = statistics.median(times)
    return sec, toks / sec


def our_rollout_and_floor(prompts, group, max_new, repeats) -> dict[str, float]:
    """Our engine's tokens/s, and one forward/backward over its completions (the floor's training half)."""
    from bench.model import load_policy
    from bench.rollout import SamplingParams, make_sampler
    from bench.rollout.scoring import score

    model, tok = load_policy("builtin:tiny-arith")
    engine = make_sampler("hf", model, tok)
    times, toks, fb = [], 0, []
    for i in range(repeats):
        t0 = time.perf_counter()
        ro = engine.generate(prompts, group, SamplingParams(max_new_tokens=max_new), seed=i)
        times.append(time.perf_counter() - t0)
        toks = sum(len(c) for c in ro.completion_ids)
        t1 = time.perf_counter()
        prompt_rows = [p for p in ro.prompt_ids for _ in range(group)]
        lp, _, mask = score(model, prompt_rows, ro.completion_ids, 1.0, grad=True)
        ((lp * mask).sum() / mask.sum()).backward()
        model.zero_grad(set_to_none=True)
        fb.append(time.perf_counter() - t1)
    sec = statistics.median(times)
    return {"rollout_s": sec, "rollout_tok_s": toks / sec, "fwd_bwd_s": statistics.median(fb)}


def our_step(steps: int, prompts: int, group: int, max_new: int, workdir: str, threads: int = 0,
             minibatches: int = 1, micro_batch_size: int = 0, template: str = "auto", **fields
             ) -> tuple[float, float, float]:
    """Median `time/step_s` of our loop (GRPO without KL; `minibatches` updates per rollout, each accumulated over
    micro-batches of `micro_batch_size` completions; `fields`: further TrainConfig fields), the median CPU seconds
    of this process per step (from one step's end to the next's), and the mean `rollout/zero_adv_frac`."""
    from mlflow.tracking import MlflowClient

    from bench.config import TrainConfig
    from bench.engines import train

    uri = f"sqlite:///{workdir}/mlflow.db"
    cfg = TrainConfig(algo="grpo", objective_overrides={"kl_coef": 0.0}, steps=steps, prompts_per_step=prompts,
                      group_size=group, max_new_tokens=max_new, minibatches=minibatches,
                      micro_batch_size=micro_batch_size or prompts, prompt_template=template, eval_every=0,
                      checkpoint_every=10_000, samples_every=0, track_ref_kl=False, output_dir=f"{workdir}/runs",
                      tracking_uri=uri, experiment="bench-step", threads=threads or torch.get_num_threads(), **fields)
    cpu, zero_adv = [time.process_time()], []
    res = train(cfg, on_step=lambda step, metrics: (cpu.append(time.process_time()),
                                                     zero_adv.append(metrics["rollout/zero_adv_frac"])))
    hist = MlflowClient(uri).get_metric_history(res.run_id, "time/step_s")
    wall = statistics.median(m.value for m in sorted(hist, key=lambda m: m.step)[1:])  # first step = warm-up
    return wall, statistics.median(b - a for a, b in list(zip(cpu, cpu[1:]))[1:]), statistics.mean(zero_adv)


def trl_step(steps: int, prompts: list[str], group: int, max_new: int, workdir: str, minibatches: int = 1,
             template: str = "auto") -> tuple[float, float]:
    """Median seconds per generation cycle (one generation + `minibatches` optimizer steps) of TRL's GRPOTrainer on
    the same model and batch (the first cycle, warm-up, excluded): wall-clock and CPU seconds of this process."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bench.model import resolve_model_path
    from evaluators.verify import is_correct

    stamps: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not stamps:
                stamps.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **kw):
            stamps.append((time.perf_counter(), time.process_time()))

    answers = {}
    from bench.data import TrainData

    for p in TrainData("arith", seed=0, steps=1, prompts_per_step=len(prompts)).batch(1):
        answers[p.question] = p.answer

    def reward(completions, answer, **kw):
        return [1.0 if is_correct(c, a, "number") else 0.0 for c, a in zip(completions, answer)]

    from bench.model import format_prompt, load_policy

    _, tok = load_policy("builtin:tiny-arith")
    qs = list(answers)
    ds = Dataset.from_dict({"prompt": [format_prompt(tok, q, template) for q in qs] * steps,
                            "answer": [answers[q] for q in qs] * steps})
    n = len(prompts) * group
    args = GRPOConfig(output_dir=f"{workdir}/trl", per_device_train_batch_size=len(prompts),
                      gradient_accumulation_steps=group // minibatches, num_generations=group,
                      max_completion_length=max_new, max_steps=steps * minibatches, beta=0.0, loss_type="grpo",
                      learning_rate=1e-4, report_to=[], use_cpu=True,
                      logging_steps=1000, save_strategy="no", temperature=1.0, top_p=1.0, seed=0,
                      generation_batch_size=n, shuffle_dataset=False,
                      # like for like with our loop: float32 and no activation checkpointing (TRL's defaults on this
                      # version are bf16 and gradient checkpointing, which also disables the KV cache in generation)
                      bf16=False, gradient_checkpointing=False)
    trainer = GRPOTrainer(model=resolve_model_path("builtin:tiny-arith"), reward_funcs=reward, args=args,
                          train_dataset=ds, processing_class=tok, callbacks=[Clock()])
    trainer.train()
    out = []
    for k in (0, 1):  # wall, CPU
        gaps = [b[k] - a[k] for a, b in zip(stamps, stamps[1:])]
        cycles = [sum(gaps[i:i + minibatches]) for i in range(0, len(gaps) - minibatches + 1, minibatches)]
        out.append(statistics.median(cycles[1:] if len(cycles) > 1 else cycles))
    return out[0], out[1]


def interleaved(a, prompts: list[str], work: str, threads: int, template: str
                ) -> list[dict[str, tuple[float, float]]]:
    """{"ours": (wall s, CPU s), "trl": (wall s, CPU s)} per round; rounds alternate which goes first; threads
    re-pinned before each."""
    rounds = []
    savings = {"shared_prefix": a.shared_prefix, "skip_zero_advantage": a.skip_zero_advantage}
    for r in range(a.rounds):
        times = {}
        for who in (("ours", "trl") if r % 2 == 0 else ("trl", "ours")):
            torch.set_num_threads(threads)
            if who == "ours":
                times[who] = our_step(a.steps, a.prompts, a.group, a.max_new_tokens, f"{work}/ours-{r}", threads,
                                      a.minibatches, a.micro_batch_size, template, **savings)
            else:
                times[who] = trl_step(a.steps, prompts, a.group, a.max_new_tokens, f"{work}/trl-{r}", a.minibatches,
                                      template)
        (ow, oc, _), (tw, tc) = times["ours"], times["trl"]
        print(f"round {r + 1}/{a.rounds}: ours {ow:.3f} s, TRL {tw:.3f} s, ratio {ow / tw:.2f} (CPU seconds: ours "
              f"{oc:.3f}, TRL {tc:.3f}, ratio {oc / tc:.2f})", flush=True)
        rounds.append(times)
    return rounds


def workload_flags(ap: argparse.ArgumentParser, threads: int, threads_help: str) -> None:
    """The flags of the measured workload, the same in this script and perf/step_profile.py."""
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=threads, help=threads_help)
    ap.add_argument("--minibatches", type=int, default=1,
                    help="optimizer steps per rollout batch (1: the one-update regime); must divide --group")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="long-prompt configuration: a few-shot prefix up to a mean prompt of about N tokens")
    ap.add_argument("--no-skip-zero-advantage", dest="skip_zero_advantage", action="store_false",
                    help="ours without skipping zero-advantage completions (the built-in model fails the few-shot "
                         "prompts of --prompt-tokens)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_flags(ap, 0, "torch threads for both (default: torch's default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of (ours, TRL); the order alternates")
    ap.add_argument("--micro-batch-size", type=int, default=0,
                    help="our completions per forward/backward (default: --prompts, TRL's micro-batch here)")
    ap.add_argument("--no-shared-prefix", dest="shared_prefix", action="store_false",
                    help="ours without the shared-prefix forward")
    a = ap.parse_args()
    if a.minibatches < 1 or a.group % a.minibatches:
        ap.error(f"--minibatches {a.minibatches} must be >= 1 and divide --group {a.group}")
    if a.rounds < 1 or a.steps < 2:
        ap.error("--rounds must be >= 1 and --steps >= 2 (the first step is a warm-up)")
    threads = a.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    template = prompt_template(a.prompt_tokens, a.prompts)
    prompts = prompts_for(a.prompts, template)
    work = tempfile.mkdtemp(prefix="pobench-bench-")
    from bench.model import load_policy

    tok = load_policy("builtin:tiny-arith")[1]
    mean_prompt = sum(len(tok(p)["input_ids"]) for p in prompts) / len(prompts)
    print(f"torch threads: {torch.get_num_threads()}; batch {a.prompts} prompts x {a.group} = "
          f"{a.prompts * a.group} completions, {a.max_new_tokens} new tokens, {a.minibatches} optimizer step(s) "
          f"per rollout; prompts of {mean_prompt:.0f} tokens on average; ours: micro-batches of "
          f"{a.micro_batch_size or a.prompts}, shared prefix {'on' if a.shared_prefix else 'off'}, zero-advantage "
          f"skip {'on' if a.skip_zero_advantage else 'off'}")
    raw_s, raw_tps = raw_generate(prompts, a.group, a.max_new_tokens, a.repeats)
    rss_raw = rss_mib()
    ours = our_rollout_and_floor(prompts, a.group, a.max_new_tokens, a.repeats)
    floor = raw_s + ours["fwd_bwd_s"]
    rounds = interleaved(a, prompts, work, threads, template)
    step = statistics.median(r["ours"][0] for r in rounds)
    trl = statistics.median(r["trl"][0] for r in rounds)
    ratios = [r["ours"][0] / r["trl"][0] for r in rounds]
    cpu_ratios = [r["ours"][1] / r["trl"][1] for r in rounds]
    q1, q3 = quartiles(ratios)
    c1, c3 = quartiles(cpu_ratios)
    zero_adv = statistics.mean(r["ours"][2] for r in rounds)
    target = 0.7 if a.minibatches == 1 else 0.5
    rss_ours = rss_trl = rss_mib()
    rows = [
        ("raw model.generate (s)", f"{raw_s:.3f}", f"{raw_tps:.0f} tok/s"),
        ("our rollout (s)", f"{ours['rollout_s']:.3f}",
         f"{ours['rollout_tok_s']:.0f} tok/s = {ours['rollout_tok_s'] / raw_tps:.2f}x raw (target >= 0.90)"),
        ("one forward/backward (s)", f"{ours['fwd_bwd_s']:.3f}", ""),
        ("floor = raw generate + fwd/bwd (s)", f"{floor:.3f}", ""),
        ("our step (s)", f"{step:.3f}", f"{step / floor:.2f}x floor (target <= 1.2)"),
        ("TRL GRPOTrainer step (s)", f"{trl:.3f}", ""),
        (f"ours / TRL over {len(rounds)} rounds", f"{statistics.median(ratios):.2f}",
         f"median [min {min(ratios):.2f}, max {max(ratios):.2f}]  IQR {q3 - q1:.2f} [{q1:.2f}, {q3:.2f}] "
         f"(target <= {target})"),
        ("ours / TRL in CPU seconds", f"{statistics.median(cpu_ratios):.2f}",
         f"median [min {min(cpu_ratios):.2f}, max {max(cpu_ratios):.2f}]  IQR {c3 - c1:.2f} [{c1:.2f}, {c3:.2f}] "
         "(this process's CPU time: steadier than wall-clock on a busy machine)"),
        ("our zero-advantage groups", f"{zero_adv:.2f}",
         "fraction of groups with all-equal rewards (the skip removes their update work"
         + ("; near 1: the model fails these prompts, use --no-skip-zero-advantage" if zero_adv > 0.9 else "") + ")"),
        ("peak RSS after raw / both loops (MiB)", f"{rss_raw:.0f} / {max(rss_ours, rss_trl):.0f}", ""),
    ]
    w = max(len(r[0]) for r in rows)
    for name, val, note in rows:
        print(f"{name:<{w}}  {val:>16}  {note}")


if __name__ == "__main__":
    main()
