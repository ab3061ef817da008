"""Where our training step's time goes: a per-part breakdown of the loop of perf/step_vs_trl.py.

    python perf/step_profile.py [--minibatches 1] [--prompt-tokens 0] [--steps 4] [--threads 1]

Runs our loop (GRPO without KL, 32 prompts x 8 completions, 48 new tokens, as step_vs_trl.py) in configurations that
add one saving at a time:

    before        one micro-batch per minibatch (what step_vs_trl.py ran before these savings), no shared prefix,
                  no skip, the sampler decoding every row to the end
    micro-batch   micro-batches of --prompts completions (TRL's size in step_vs_trl.py)
    +prefix       and the shared-prefix forward (docs/SCALE.md)
    +skip         and the zero-advantage skip (left out with --no-skip-zero-advantage)
    +drop         and the sampler dropping stopped rows = the defaults (this is step_vs_trl.py's "ours")

and prints for each, per step (median over the steps after the first): wall seconds and the CPU seconds of this
process (``time.process_time``; on a busy machine CPU seconds are the steadier measure) split into the rollout
(sampling and verification), the forward passes with gradient, their backward passes (the output head's recomputation
included), the passes without gradient (reference / sampling policy, skipped rows' metrics), the optimizer steps, and
the rest of the step (objective, metrics, logging). Timers wrap the loop's own functions in this process only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # step_vs_trl's prompt template
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree

PARTS = ("rollout", "forward", "backward", "no_grad", "optimizer", "other")


class Clock:
    """CPU and wall seconds per part, accumulated between ``reset`` calls (parts do not nest)."""

    def __init__(self):
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)

    def timed(self, part, fn):
        def run(*args, **kwargs):
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[part] += time.process_time() - c0
                self.wall[part] += time.perf_counter() - w0
        return run

    def reset(self) -> tuple[dict[str, float], dict[str, float]]:
        out = dict(self.cpu), dict(self.wall)
        self.cpu.clear()
        self.wall.clear()
        return out


SAMPLER = {"drop_finished": True}  # the HF sampler option of the configuration being run


def install(clock: Clock) -> None:
    """Wrap the loop's rollout, scoring passes, backward and optimizer step with ``clock``; the loop's sampler takes
    ``SAMPLER``'s options."""
    from bench.engines.native import loop
    from bench.engines.native import step as native_step
    from bench.rollout.hf import HFSampler

    loop.make_sampler = lambda backend, model, tok: HFSampler(model, tok, **SAMPLER)

    loop.collect_rollouts = clock.timed("rollout", loop.collect_rollouts)
    for name in ("score", "score_shared"):
        fn = getattr(native_step, name)

        def scorer(*args, _fn=fn, **kwargs):
            part = "forward" if kwargs.get("grad") else "no_grad"
            return clock.timed(part, _fn)(*args, **kwargs)

        setattr(native_step, name, scorer)
    torch.Tensor.backward = clock.timed("backward", torch.Tensor.backward)
    step = torch.optim.AdamW.step
    torch.optim.AdamW.step = clock.timed("optimizer", step)


def run(name: str, a, clock: Clock, template: str, drop_finished: bool = True, **fields) -> dict[str, float]:
    from bench.config import TrainConfig
    from bench.engines import train

    SAMPLER["drop_finished"] = drop_finished
    work = tempfile.mkdtemp(prefix="pobench-profile-")
    rows: list[dict[str, float]] = []
    mark = {"cpu": time.process_time()}

    def on_step(step, metrics):
        cpu, wall = clock.reset()
        now = time.process_time()
        row = {f"cpu_{p}": cpu.get(p, 0.0) for p in PARTS[:-1]}
        row["cpu_step"] = now - mark["cpu"]
        row["cpu_other"] = row["cpu_step"] - sum(row[f"cpu_{p}"] for p in PARTS[:-1])
        row["wall_step"] = metrics["time/step_s"]
        row.update({f"wall_{p}": wall.get(p, 0.0) for p in PARTS[:-1]})
        row["zero_adv_frac"] = metrics["rollout/zero_adv_frac"]
        rows.append(row)
        mark["cpu"] = now

    cfg = TrainConfig(algo="grpo", objective_overrides={"kl_coef": 0.0}, steps=a.steps, prompts_per_step=a.prompts,
                      group_size=a.group, max_new_tokens=a.max_new_tokens, minibatches=a.minibatches,
                      prompt_template=template, eval_every=0, checkpoint_every=10_000, samples_every=0,
                      track_ref_kl=False, output_dir=f"{work}/runs", tracking_uri=f"sqlite:///{work}/mlflow.db",
                      experiment="profile", threads=a.threads, **fields)
    clock.reset()
    mark["cpu"] = time.process_time()
    train(cfg, on_step=on_step)
    later = rows[1:] or rows  # the first step is a warm-up
    return {k: statistics.median(r[k] for r in later) for k in later[0]}


def main() -> None:
    from step_vs_trl import prompt_template, workload_flags

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_flags(ap, 1, "torch threads")
    ap.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    template = prompt_template(a.prompt_tokens, a.prompts)
    n = a.prompts * a.group
    off = {"shared_prefix": False, "skip_zero_advantage": False, "drop_finished": False}
    configs = {
        "before": {**off, "micro_batch_size": n // a.minibatches},
        "micro-batch": {**off, "micro_batch_size": a.prompts},
        "+prefix": {**off, "shared_prefix": True, "micro_batch_size": a.prompts},
        "+skip": {**off, "shared_prefix": True, "skip_zero_advantage": True, "micro_batch_size": a.prompts},
        "+drop": {"micro_batch_size": a.prompts, "skip_zero_advantage": a.skip_zero_advantage},
    }
    if not a.skip_zero_advantage:
        del configs["+skip"]
    only = [c for c in a.only.split(",") if c]
    clock = Clock()
    install(clock)
    results = {}
    for name, fields in configs.items():
        if only and name not in only:
            continue
        results[name] = run(name, a, clock, template, **fields)
        r = results[name]
        print(f"{name:<12} wall {r['wall_step']:.2f} s, cpu {r['cpu_step']:.2f} s: "
              + ", ".join(f"{p} {r[f'cpu_{p}']:.2f}" for p in PARTS)
              + f" (zero-adv. groups {r['zero_adv_frac']:.2f})", flush=True)
    print(f"\nper step, CPU seconds (share of the step) -- {a.minibatches} minibatch(es), threads {a.threads}, prompt "
          f"template {'few-shot' if a.prompt_tokens else 'plain'}")
    print(f"{'part':<10}" + "".join(f"{name:>20}" for name in results))
    for p in (*PARTS, "step"):
        cells = []
        for r in results.values():
            v = r[f"cpu_{p}"]
            cells.append(f"{v:8.2f} ({100 * v / r['cpu_step']:3.0f}%)" if p != "step" else f"{v:8.2f}       ")
        print(f"{p:<10}" + "".join(f"{c:>20}" for c in cells))
    print(f"{'wall step':<10}" + "".join(f"{r['wall_step']:>13.2f}       " for r in results.values()))


if __name__ == "__main__":
    main()
