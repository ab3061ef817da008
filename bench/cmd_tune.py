"""`bench tune`: Optuna search over an objective's tunable fields, its outputs, and `bench tune --show`.

Outputs (in ``--out``, default ``.pobench/tune/<study>/``, also logged to the study's MLflow parent run):
``best.yaml`` (``{algo, objective_overrides}``, accepted by ``bench run --params``), ``summary.csv`` / ``summary.md``
(one row per trial), ``history.png``, ``importance.png``, ``contour.png`` (Optuna's matplotlib plots; a plot that
cannot be drawn yet, e.g. importances with fewer than two complete trials, is listed in ``summary.md`` with the reason).
See docs/TUNING.md.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

import yaml

from bench import tune
from bench.config import TrainConfig

# TrainConfig fields a study sets itself per trial (the rest come from --config and the flags)
SKIP = ("algo", "seed", "run_name", "comparison", "resume")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="Optuna search over an objective's hyper-parameters",
                       description="Search an objective's tunable fields with Optuna (see docs/TUNING.md).")
    p.add_argument("--algo", help="objective to tune (`bench list`)")
    p.add_argument("--trials", type=int, default=30, help="finished (complete or pruned) trials the study needs, "
                                                          "counted over every worker (default 30)")
    p.add_argument("--space", help="narrow or add ranges: name=low:high[:log] or name=a|b, comma-separated "
                                   "(default: the ranges the objective declares)")
    p.add_argument("--metric", default="eval/accuracy",
                   help="eval/KEY (value at the end, maximised) or steps_to:eval/KEY>=X / seconds_to:eval/KEY>=X "
                        "(time to reach X, minimised); default eval/accuracy")
    p.add_argument("--direction", choices=["maximize", "minimize"], help="override the metric's direction")
    p.add_argument("--seeds", default="0", help="comma-separated seeds; a trial's value is the mean (default 0)")
    p.add_argument("--study", help="study name (default tune-<algo>); an existing study is resumed / joined")
    p.add_argument("--storage", help="SQLAlchemy URL of the Optuna storage, e.g. postgresql://user@host/db "
                                     f"(default {tune.default_storage_url()})")
    p.add_argument("--config", help="base TrainConfig YAML every trial starts from (the flags below override it)")
    p.add_argument("--pruner", default="median", help="median | percentile:P | hyperband | none (default median)")
    p.add_argument("--pruner-warmup", type=int, default=1, help="reports of a trial before it may be pruned")
    p.add_argument("--pruner-startup", type=int, default=2, help="finished trials before pruning starts")
    p.add_argument("--heartbeat", type=int, default=30, help="seconds between worker heartbeats (default 30)")
    p.add_argument("--grace", type=int, help="seconds without heartbeat before a trial counts as dead and is "
                                             "re-queued (default 4 x heartbeat)")
    p.add_argument("--max-retry", type=int, default=3, help="re-queues per trial whose worker died (default 3)")
    p.add_argument("--sampler-seed", type=int, help="seed of the TPE sampler (default random: workers differ)")
    p.add_argument("--out", help="output folder (default .pobench/tune/<study>)")
    p.add_argument("--show", action="store_true", help="print the leaderboard of --study and write its outputs")
    from bench.cmd_train import add_config_flags

    add_config_flags(p, skip=SKIP)  # --steps, --prompts-per-step, --tracking-uri, ... as in `bench train`
    p.set_defaults(func=main)


def _base_config(args: argparse.Namespace) -> TrainConfig:
    """``--config`` file < TrainConfig flags; validated with the objective's default config."""
    from bench.cmd_train import config_from_args

    return config_from_args(args, algo=args.algo)


def spec_from_args(args: argparse.Namespace) -> tune.TuneSpec:
    """Validate every input (objective, space, metric, storage flags) before any trial starts."""
    from bench.harness import parse_seeds  # the one --seeds rule of bench run and bench tune

    if not args.algo:
        raise ValueError("--algo is required (e.g. --algo tepo)")
    if args.trials < 1:
        raise ValueError(f"--trials {args.trials}: must be >= 1")
    if args.heartbeat < 1 or (args.grace is not None and args.grace <= args.heartbeat):
        raise ValueError("--heartbeat must be >= 1 and --grace longer than --heartbeat")
    base = _base_config(args)
    if base.eval_every == 0:
        raise ValueError("config field `eval_every`=0: a trial is scored on held-out evaluations; set eval_every >= 1")
    spec = tune.TuneSpec(
        algo=args.algo, base=base, space=tune.resolve_space(args.algo, args.space, base.objective_overrides),
        metric=tune.parse_metric(args.metric, args.direction), study=args.study or f"tune-{args.algo}",
        trials=args.trials, seeds=parse_seeds(args.seeds), storage=args.storage, pruner=args.pruner,
        pruner_warmup=args.pruner_warmup, pruner_startup=args.pruner_startup, heartbeat=args.heartbeat,
        grace=args.grace, max_retry=args.max_retry, sampler_seed=args.sampler_seed)
    tune.make_pruner(spec.pruner)  # bad pruner spec -> error now
    return spec


def main(args: argparse.Namespace) -> int:
    if args.show:
        return show(args)
    from bench.tracking import check_reachable

    spec = spec_from_args(args)
    check_reachable(spec.base.tracking_uri)
    try:
        study = tune.run_study(spec)
    except KeyboardInterrupt:
        print(f"bench tune: interrupted; the running trial is queued again: rerun the same command to resume study "
              f"{spec.study!r}", file=sys.stderr)
        return 130
    out = Path(args.out) if args.out else tune.DEFAULT_DIR / spec.study
    paths = write_outputs(study, out)
    print_leaderboard(study)
    runs = tune.StudyRuns(tune.tracking_uri(spec.base), spec.base.experiment, spec.study)
    runs.parent_id = study.user_attrs.get("mlflow_parent_run_id", "")
    if runs.parent_id:
        runs.log_artifacts(out)
    print(f"outputs in {out}: {', '.join(sorted(p.name for p in paths.values()))}")
    return 0


def show(args: argparse.Namespace) -> int:
    import optuna

    url = args.storage or tune.default_storage_url()
    storage = tune.open_storage(url)
    names = optuna.study.get_all_study_names(storage)
    if not args.study or args.study not in names:
        raise ValueError(f"--show needs --study NAME of an existing study; studies in {tune.redact(url)}: "
                         f"{', '.join(names) or '(none)'}")
    study = optuna.load_study(study_name=args.study, storage=storage)
    print_leaderboard(study)
    out = Path(args.out) if args.out else tune.DEFAULT_DIR / args.study
    write_outputs(study, out)
    print(f"outputs in {out}")
    return 0


# --------------------------------------------------------------------------------------------------- outputs
def leaderboard(study: Any) -> list[dict[str, Any]]:
    """One row per trial: finished trials best first, then the others by number."""
    from optuna.trial import TrialState

    sign = -1.0 if study.direction.name == "MAXIMIZE" else 1.0
    rows = []
    for t in study.get_trials(deepcopy=False):
        dur = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start \
            else None
        last = max(t.intermediate_values) if t.intermediate_values else None
        rows.append({"trial": t.number, "state": t.state.name, "value": t.value,
                     "last_report": None if last is None else t.intermediate_values[last],
                     "duration_s": None if dur is None else round(dur, 1),
                     "retry_of": t.system_attrs.get("failed_trial"),
                     "mlflow_run": t.user_attrs.get("mlflow_run_id"), **{f"p.{k}": v for k, v in t.params.items()}})
    complete = sorted((r for r in rows if r["state"] == TrialState.COMPLETE.name), key=lambda r: sign * r["value"])
    return complete + [r for r in rows if r["state"] != TrialState.COMPLETE.name]


def print_leaderboard(study: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = leaderboard(study)
    params = sorted({k for r in rows for k in r if k.startswith("p.")})
    metric = study.user_attrs.get("metric", "")
    table = Table(title=f"study {study.study_name} ({study.direction.name.lower()} {metric})")
    for col in ["trial", "state", "value", "last_report", "duration_s", *[p[2:] for p in params]]:
        table.add_column(col, justify="right" if col not in ("state",) else "left")
    for r in rows:
        table.add_row(*[_fmt(r.get(c)) for c in ["trial", "state", "value", "last_report", "duration_s", *params]])
    Console(width=max(120, 70 + 16 * len(params))).print(table)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def best_params_yaml(study: Any) -> str:
    """``{algo, objective_overrides}`` of the best trial, the format `bench run --params` reads."""
    best = study.best_trial  # ValueError when no trial completed
    algo = study.user_attrs.get("algo")
    if not algo:
        raise ValueError(f"study {study.study_name!r} was not created by `bench tune` (no algo attribute)")
    head = (f"# best trial {best.number} of study {study.study_name}: {study.user_attrs.get('metric', 'value')} = "
            f"{best.value:.6g} (seeds [{study.user_attrs.get('seeds', '?')}], {study.user_attrs.get('steps', '?')} "
            f"training steps)\n# use: bench run --algos {algo} --params best.yaml\n")
    return head + yaml.safe_dump({"algo": algo, "objective_overrides": dict(best.params)}, sort_keys=False)


def write_outputs(study: Any, out: Path) -> dict[str, Path]:
    """best.yaml, summary.csv, summary.md and the PNG plots; returns the paths written."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    notes: list[str] = []
    rows = leaderboard(study)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    paths["summary.csv"] = out / "summary.csv"
    try:
        (out / "best.yaml").write_text(best_params_yaml(study))
        paths["best.yaml"] = out / "best.yaml"
    except ValueError as e:
        notes.append(f"best.yaml not written: {e}")
    top = _top_params(study)
    plots = {"history.png": lambda: ovm.plot_optimization_history(study),
             "importance.png": lambda: ovm.plot_param_importances(study, evaluator=_evaluator()),
             "contour.png": lambda: ovm.plot_contour(study, params=top)}
    for name, make in plots.items():
        if name == "contour.png" and len(top) < 2:
            notes.append("contour.png not drawn: it needs two searched parameters and two complete trials")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = make()
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
            fig.set_size_inches(max(fig.get_size_inches()[0], 7), max(fig.get_size_inches()[1], 5))
            fig.savefig(out / name, dpi=110, bbox_inches="tight")
            plt.close(fig)
            paths[name] = out / name
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            notes.append(f"{name} not drawn: {e}")
        plt.close("all")
    md = [f"# Study `{study.study_name}`", "",
          f"objective `{study.user_attrs.get('algo', '?')}`, metric `{study.user_attrs.get('metric', '?')}` "
          f"({study.direction.name.lower()}); seeds [{study.user_attrs.get('seeds', '?')}]; "
          f"{study.user_attrs.get('steps', '?')} training steps per run", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    md += ["", *[f"- {n}" for n in notes]]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    paths["summary.md"] = out / "summary.md"
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    return paths


def _evaluator() -> Any:
    """fANOVA with a fixed seed: the importance plot and the contour's choice of parameters agree."""
    from optuna.importance import FanovaImportanceEvaluator

    return FanovaImportanceEvaluator(seed=0)


def _top_params(study: Any) -> list[str]:
    """The two most important parameters (fANOVA) for a readable contour; [] when a contour cannot be drawn."""
    from optuna.importance import get_param_importances
    from optuna.trial import TrialState

    names = sorted({k for t in study.get_trials(deepcopy=False) for k in t.params})
    if len(names) < 2 or len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) < 2:
        return []
    try:
        ranked = list(get_param_importances(study, evaluator=_evaluator()))
    except (ValueError, RuntimeError, ZeroDivisionError):
        ranked = []
    return list(dict.fromkeys(ranked + names))[:2]
