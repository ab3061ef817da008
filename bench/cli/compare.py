"""`bench compare A B [C ...]`: stored comparisons side by side, from MLflow only (reports/compare.py).

    bench compare c1a2b3c4d5 c6f7a8b9c0                 # two comparisons of experiment pobench
    bench compare pobench:c1a2b3c4d5 trl:c6f7a8b9c0     # EXPERIMENT:ID when they live in different experiments

The report's per-objective tables with one column group per comparison, and what differs in their configurations;
written into ``<out-root>/<experiment>/compare-<A>-<B>/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

from algorithms.registry import default_config
from bench.cli.flags import add_units_flag
from bench.cli.interrupt import Stopped, rerun
from bench.config import TRACKING_URI_DEFAULT, TrainConfig
from bench.runs.store_check import check_reachable
from bench.runs.tracking import answering, flatten
from reports.compare import compare_comparisons, parse_spec
from reports.paths import user_files
from reports.record import mlflow_error
from reports.report import ReportOptions, missing_note


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="stored comparisons side by side (tables, what differs in their configs)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("comparisons", nargs="+", metavar="ID", help="comparison ids (ID or EXPERIMENT:ID), at least two")
    p.add_argument("--experiment", default="pobench", help="MLflow experiment of an ID without EXPERIMENT: "
                   "(default: pobench)")
    p.add_argument("--tracking-uri", help=f"MLflow tracking URI (default: {TRACKING_URI_DEFAULT})")
    p.add_argument("--baseline", help="objective each comparison is compared against, where it has it (default: "
                   "each comparison's own, as in its report)")
    p.add_argument("--target-acc", type=float, help="one convergence target for every comparison (default: each "
                   "comparison's own)")
    p.add_argument("--out-root", default="reports/out", help="folder root: the tables go to "
                   "<out-root>/<experiment>/compare-<A>-<B>/ (default: reports/out)")
    add_units_flag(p)
    p.set_defaults(func=run)


@functools.cache
def default_params(objective: str) -> dict[str, str]:
    """The params a run of ``objective`` records with every default, spelled as bench/runs/lifecycle.py's
    ``run_tags_and_params`` writes them: TrainConfig's fields and the objective's config (``objective.*``; none for an
    objective not registered in this process). What `bench compare` counts a setting a run did not record as."""
    try:
        config = dataclasses.asdict(default_config(objective))
    except ValueError:
        config = {}
    return {**flatten(TrainConfig().to_dict()), **flatten({"objective": config})}


def run(args: argparse.Namespace) -> int:
    specs = [parse_spec(s, args.experiment) for s in args.comparisons]
    uri = check_reachable(args.tracking_uri, reads_only=True)
    options = ReportOptions(percent=not args.fractions)
    try:
        with answering(uri):  # a server lost during the work: one `stopped:` line within the bound
            res = compare_comparisons(specs, uri, out_root=args.out_root, baseline=args.baseline,
                                      target_acc=args.target_acc, options=options, defaults=default_params)
    except mlflow_error() as e:
        raise ValueError(f"MLflow at {uri}: {e.message}") from None
    except KeyboardInterrupt:  # (it reads MLflow and writes its tables at the end)
        raise Stopped("nothing: no tables written", rerun()) from None
    for name in ("compare_config", "compare_accuracy"):
        t = res.tables.get(name)
        if t is not None:
            print(f"{t.title}\n\n{t.markdown()}")
    print(f"tables in {res.out_dir / 'compare.md'}")
    for label, a in zip(res.labels, res.analyses):  # what a comparison lacks is said, never silently left out
        if a.comparison.missing:
            print(f"note: {label}: {missing_note(a.comparison)}")
        for n in a.comparison.odd:  # runs whose record does not add up (held-out round 11, H11)
            print(f"note: {label}: {n}")
    kept = user_files(res.out_dir)
    if kept:
        print(f"kept your files in {res.out_dir} (not pobench's): {', '.join(kept)}")
    return 0
