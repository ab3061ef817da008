"""`bench run --algos grpo,dapo,tepo --seeds 0,1,2 ...`: a comparison of objectives under identical conditions.

Every (objective, seed) pair is one MLflow run with the same model, data order, rollout sampler and evaluation
schedule; finished pairs are reused, interrupted ones resumed (``--force`` redoes them); then the report is written
(``bench report``). Settings: `bench run` defaults (bench/comparison/plan.py RunDefaults) < ``--config`` file < flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from algorithms import list_controls
from bench.cli.flags import add_config_flags, add_preset_flag, add_report_flags, report_options
from bench.cli.interrupt import Stopped, rerun_to_resume
from bench.comparison import (
    DEFAULTS,
    ComparisonSpec,
    ComparisonStopped,
    base_config,
    load_params,
    resolve_algos,
    run_comparison,
)
from bench.config import TrainConfig
from bench.executors import EXECUTORS, make_executor
from bench.presets import get_preset
from bench.workers import LOST_WORKER, parse_seeds

SKIP = ("algo", "seed", "run_name", "comparison", "resume", "objective_overrides")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="compare objectives over seeds, then write the report", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", help="comma-separated registered objectives and groups (@tepo = tepo and its "
                   f"ablations; `bench list`) (default: {','.join(DEFAULTS.algos)})")
    p.add_argument("--ablation", action="append", metavar="NAME",
                   help="add an objective and all its registered ablations (e.g. `--ablation tepo`)")
    p.add_argument("--seeds", help=f"comma-separated seeds (default: the --preset's, else "
                   f"{','.join(map(str, DEFAULTS.seeds))})")
    p.add_argument("--controls", action=argparse.BooleanOptionalAction, default=None, help="add the registered "
                   f"positive controls (objectives worse than their base by construction: {', '.join(list_controls())})"
                   "; the report says whether the comparison detected each, which shows whether it could detect a "
                   "difference of that size at all (default: on for bench run's own or the --preset's objectives; "
                   "off when --algos / --ablation name them)")
    p.add_argument("--params", metavar="FILE", help="YAML of objective-config overrides (e.g. written by `bench "
                   "tune`): {field: value}, optionally under `objective_overrides:`, or {objective: {field: value}}")
    p.add_argument("--workers", type=int, metavar="N", help="pairs trained at once, each in its own process with one "
                   "torch thread; 0 = one per CPU core (one on a GPU), at most the number of pairs to train; 1 = one "
                   "after another in this process; results are identical either way; with --executor ray: the CPUs "
                   f"of the local Ray instance (ignored with --ray-address) (default: {DEFAULTS.workers})")
    p.add_argument("--executor", metavar="NAME", help="where the pairs are trained: " + "; ".join(
        f"{k} = {v}" for k, v in EXECUTORS.items()) + "; reuse, resume, --force and the MLflow records are the same "
        f"with each (default: {DEFAULTS.executor})")
    p.add_argument("--ray-address", metavar="ADDR", help="with --executor ray: the Ray cluster to connect to (`auto` = "
                   "the one `ray start --head` runs on this machine, HOST:PORT, or ray://HOST:10001); every node needs "
                   "pobench installed (docs/SCALE.md) (default: start a local Ray instance for this command)")
    p.add_argument("--force", action="store_true", help="redo pairs that already finished (default: reuse them)")
    p.add_argument("--config", help="YAML file of TrainConfig fields (flags override it)")
    add_preset_flag(p)
    add_report_flags(p, baseline_default="the first --ablation root; else grpo when among the objectives; else the "
                     "first objective")
    p.add_argument("--no-report", action="store_true", help="train only; `bench report` writes the report later")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    add_config_flags(p, skip=SKIP, defaults=DEFAULTS.train, default_label="default of bench run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    make_executor(args.executor, workers=args.workers, ray_address=args.ray_address)  # bad flags: one line, nothing run
    preset = get_preset(args.preset) if args.preset else None
    algos = resolve_algos(args.algos, args.ablation, default=preset.algos if preset else None)
    if args.controls or (args.controls is None and DEFAULTS.controls and not (args.algos or args.ablation)):
        algos += [c for c in list_controls() if c not in algos]
    seeds = parse_seeds(args.seeds, preset.seeds if preset else DEFAULTS.seeds)
    params = load_params(args.params, algos)
    flags = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(TrainConfig) if f.name not in SKIP}
    cfg = base_config(args.config, preset=preset.path if preset else None, **flags)
    baseline = run_baseline(args.baseline, args.ablation, algos)
    # (every check before any work is the library's, run_comparison's first step: bench.comparison.check_comparison)
    spec = ComparisonSpec(cfg, algos, seeds, params, force=args.force, workers=args.workers, executor=args.executor,
                          ray_address=args.ray_address, report=not args.no_report, baseline=baseline,
                          target_acc=args.target_acc, out_root=args.out_root, report_options=report_options(args),
                          progress=not args.no_progress, on_warning=warn)
    try:
        res = run_comparison(spec)
    except ComparisonStopped as e:  # SIGINT / SIGTERM: finished pairs are reused, checkpointed ones resumed
        raise Stopped(f"{e.finished} of {e.total} pairs finished and {e.checkpointed} checkpointed of comparison "
                      f"{e.comparison}", rerun_to_resume()) from None
    print(f"comparison {res.comparison} in experiment {res.experiment!r} ({res.tracking_uri}): "
          f"{len(res.pairs)} runs in {res.seconds:.0f} s on {res.workers} worker(s)"
          + (" (Ray tasks)" if res.executor == "ray" else ""))
    for p in res.pairs:
        print(f"  {p.variant:<24} seed {p.seed}: {p.outcome}")
    lost = sum(LOST_WORKER in p.outcome for p in res.pairs)
    if lost:  # (a worker process killed: the out-of-memory killer, kill -9)
        print(f"{lost} pair(s) lost their worker process: {rerun_to_resume()} (checkpointed pairs resume, finished "
              "ones are reused)")
    if res.report is not None:
        print(f"report: {res.report.out_dir / 'report.md'}")
        t = res.report.tables["accuracy"]
        print(t.markdown(), end="")
    return 1 if res.failed else 0


def warn(warning: str) -> None:
    """A warning of the checks before any work, as the command says it."""
    print(f"bench run: warning: {warning}", file=sys.stderr)


def run_baseline(baseline: str | None, ablation: list[str] | None, algos: list[str]) -> str | None:
    """The report's baseline: ``--baseline`` (it must be run), else the first ``--ablation`` root (what its ablations
    are measured against), else None: the report's own rule (``reports.report.resolve_baseline``: grpo when run, else
    the first objective)."""
    if baseline is not None:
        if baseline not in algos:
            raise ValueError(f"--baseline {baseline!r} is not among the objectives run ({', '.join(algos)})")
        return baseline
    roots = [r.strip() for a in ablation or [] for r in a.split(",") if r.strip()]
    return roots[0] if roots else None
