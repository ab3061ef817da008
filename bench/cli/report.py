"""`bench report [--experiment NAME] [--comparison ID]`: figures, tables and report.md of a comparison, read from
MLflow only, written into ``reports/out/<experiment>/<comparison>/`` and logged as artifacts of the comparison's
MLflow run."""

from __future__ import annotations

import argparse
import sys

from bench import faults
from bench.cli.flags import add_plugin_flag, add_report_flags, report_options
from bench.cli.interrupt import Stopped, finished, rerun
from bench.config import TRACKING_URI_DEFAULT
from bench.runs.store_check import check_reachable
from bench.runs.tracking import answering
from reports.load import _client, get_experiment, list_comparisons, resolve_tracking_uri
from reports.record import mlflow_error
from reports.report import build_report


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write the report of a comparison (from MLflow)", description=__doc__)
    p.add_argument("--experiment", default="pobench", help="MLflow experiment (default: pobench)")
    p.add_argument("--comparison", help="comparison id (default: the experiment's most recent comparison)")
    p.add_argument("--tracking-uri", help=f"MLflow tracking URI (default: {TRACKING_URI_DEFAULT})")
    add_report_flags(p, baseline_default="the one recorded on the comparison run (bench run's), else grpo when "
                     "present, else the comparison's first objective")
    add_plugin_flag(p)
    p.add_argument("--no-store", action="store_true", help="do not write derived metrics back into the runs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except mlflow_error() as e:  # an error MLflow answered with (a bad URI, say): one line naming the cause
        if faults.describe(e) is not None:
            raise  # a fault of the store: its line (bench/cli/main.py)
        raise ValueError(f"MLflow at {args.tracking_uri or 'the default tracking URI'}: {e.message}") from None


def _run(args: argparse.Namespace) -> int:
    uri = check_reachable(resolve_tracking_uri(args.tracking_uri), reads_only=True)
    faults.check_output_folder(args.out_root, "--out-root")  # a file in its place, read-only: one line now
    try:
        with answering(uri):  # a server lost during the work: one `stopped:` line within the bound, not its retries
            return _report(args, uri)
    except (faults.StoreUnreachable, faults.StoreRefused) as e:  # (what answering made of the request's error)
        written = getattr(e.__context__, "report_folder", None)  # (set once the folder is written: round 13, H06)
        if written is None:
            raise
        print(f"bench report: stopped: {faults.describe(e) or e}; kept: the report in {written} (written before the "
              "store failed; not yet stored in MLflow: the rerun stores it)", file=sys.stderr)
        return 1


def _report(args: argparse.Namespace, uri: str) -> int:
    if args.comparison is None:  # say which one is reported when there is a choice
        client = _client(uri)
        comps = list_comparisons(client, get_experiment(client, args.experiment).experiment_id)
        if len(comps) > 1:
            latest = max(comps, key=comps.get)
            others = ", ".join(sorted(c for c in comps if c != latest))
            print(f"experiment {args.experiment!r} holds {len(comps)} comparisons; reporting the most recent, "
                  f"{latest} (others: {others}; choose with --comparison)")
    from bench.runs.run import left_running

    try:
        rep = build_report(args.experiment, args.comparison, uri, out_root=args.out_root, baseline=args.baseline,
                           target_acc=args.target_acc, store_derived=not args.no_store, options=report_options(args),
                           on_busy=None,  # another report of it being written now: one line, exit 2 (H21)
                           left_running=left_running)  # a RUNNING run's process gone: said, and the rerun (H02)
    except KeyboardInterrupt:  # (the report folder is swapped in whole: nothing half-written is left)
        raise Stopped("nothing: no report written", rerun()) from None
    except Exception as e:  # a fault of the store once the report was written: the line says it is kept
        line = faults.describe(e)
        written = getattr(e, "report_folder", None) if line is not None else None  # (set once the folder is written)
        if written is None:
            raise
        print(f"bench report: stopped: {line}; kept: the report in {written} (written before the store failed; not "
              "yet stored in MLflow: the rerun stores it)", file=sys.stderr)
        return 1
    finished()  # the report is written: an interrupt from now on changes nothing (exit 0)
    try:
        _summary(rep)
    except KeyboardInterrupt:
        pass
    return 0


def _summary(rep) -> None:
    print(f"comparison {rep.comparison.comparison_id}: {len(rep.comparison.runs)} runs of "
          f"{', '.join(rep.comparison.objectives)}; report in {rep.out_dir / 'report.md'} "
          f"(and MLflow run {rep.artifact_run_id}, artifacts report/)")
    for n in rep.notes:
        print(f"note: {n}")
    for key, why in rep.figures.items():  # a --metrics figure not drawn (a typo, a key no run logged): said here too
        if key.startswith("metric:") and isinstance(why, str):
            print(f"note: --metrics {key[len('metric:'):]}: not drawn: {why}")
    if rep.kept:
        shown = ", ".join(rep.kept[:5]) + (f" and {len(rep.kept) - 5} more" if len(rep.kept) > 5 else "")
        print(f"kept your files in {rep.out_dir} (not pobench's; not sent to MLflow): {shown}")
