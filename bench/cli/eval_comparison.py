"""`bench eval --comparison ID --benchmarks math500,aime24,gsm8k`: every final model of a comparison on benchmarks,
each evaluation stored once and reused after (the library: ``bench/comparison/evals.py``; here the flags, the
stop and the output)."""

from __future__ import annotations

import sys
from pathlib import Path

from bench import faults
from bench.cli.interrupt import Stopped, rerun_to_resume
from bench.comparison.evals import EvalSettings, evaluate_missing, plan_evaluations
from bench.inputs import name_list
from bench.runs.store_check import check_reachable
from bench.runs.tracking import answering
from reports.evals import benchmark_table, load_evals
from reports.record import open_client
from reports.tables import Units


def settings_from(args) -> EvalSettings:
    """The evaluation settings `bench eval`'s flags give."""
    return EvalSettings(split=args.split, limit=args.limit, skip_bad_rows=args.skip_bad_rows, k=args.k,
                        samples=args.samples, temperature=args.temperature, top_p=args.top_p,
                        greedy=not args.no_greedy, max_new_tokens=args.max_new_tokens,
                        prompt_template=args.prompt_template, seed=args.seed, backend=args.backend,
                        data=tuple(args.data or ()), device=args.device, dtype=args.dtype, batch_size=args.batch_size)


def run(args) -> int:
    for flag, given in (("--model", args.model), ("--run-name", args.run_name), ("--parent-run-id",
                                                                                  args.parent_run_id),
                        ("--harness", args.harness)):
        if given:
            raise ValueError(f"--comparison evaluates the comparison's final models: drop {flag}")
    if args.no_mlflow:
        raise ValueError("--comparison stores each evaluation in MLflow (that is how results are reused and "
                         "reported): drop --no-mlflow")
    settings = settings_from(args)
    names = name_list(args.benchmarks, "--benchmarks")
    # (reads the comparison's runs, writes evaluation runs into the experiment: its files' folder checked too)
    uri = check_reachable(args.tracking_uri, reads_only=True, experiment=args.experiment)
    state: dict = {}  # (the plan and the evaluations stored so far: what a server lost during the work keeps)
    try:
        # every request bounded as `bench report`'s and `bench run`'s are: a server lost during the work is one
        # `stopped:` line within $POBENCH_MLFLOW_TIMEOUT (held-out round 14, H21: MLflow's retries, minutes, silent)
        with answering(uri):
            client = open_client(uri)
            cmp = _evaluate(args, settings, names, uri, client, state)
            table, notes = benchmark_table(cmp, load_evals(client, cmp), Units())
    except (faults.StoreUnreachable, faults.StoreRefused) as e:
        if "plan" not in state:
            raise
        raise type(e)(f"{e}; kept: {_kept(state)}") from None
    if table is not None:
        print(table.markdown(), end="")
        print(table.caption)
    for n in notes:
        print(f"note: {n}")
    print(f"bench eval: stored under each training run in MLflow ({uri}); bench report --experiment "
          f"{args.experiment} --comparison {cmp.comparison_id} adds the benchmarks table")
    return 0


def _evaluate(args, settings: EvalSettings, names: list[str], uri: str, client, state: dict):
    """Plan the comparison's evaluations and run the missing ones (``state``: the plan, the count stored)."""
    plan = plan_evaluations(args.experiment, args.comparison, names, settings, uri, client)
    cmp = plan.comparison
    print(f"bench eval: comparison {cmp.comparison_id}: {len(cmp.runs)} runs x {len(plan.benchmarks)} benchmarks; "
          f"{plan.reused} stored, {plan.missing} to evaluate", file=sys.stderr)
    if plan.stale:
        print(f"bench eval: {len(plan.stale)} stored evaluation(s) were of other final weights than the runs' final "
              f"folders hold now (replaced since, or stored before pobench recorded their digest): evaluated again: "
              + ", ".join(plan.stale[:4]) + (", ..." if len(plan.stale) > 4 else ""), file=sys.stderr)
    state.update(plan=plan, stored=plan.reused)  # (what a stop keeps: the same command reuses them)
    try:
        for _ in evaluate_missing(plan, settings, args.experiment, uri, Path(args.out or Path(".pobench") / "eval")):
            state["stored"] += 1
    except KeyboardInterrupt:  # SIGINT / SIGTERM: each evaluation is stored as it ends
        raise Stopped(f"{state['stored']} of {plan.total} evaluations of comparison {cmp.comparison_id} stored",
                      rerun_to_resume()) from None
    return cmp


def _kept(state: dict) -> str:
    """What a command whose server was lost keeps: the evaluations stored (the rerun reuses them) and the files of
    the one being logged then (the rerun evaluates it again)."""
    plan = state["plan"]
    kept = (f"{state['stored']} of {plan.total} evaluations of comparison {plan.comparison.comparison_id} stored "
            "(the rerun reuses them, and ends an eval run left RUNNING)")
    if plan.unlogged:
        kept += (f"; the results of the evaluation being stored in {', '.join(str(p) for p in plan.unlogged)} (not "
                 "logged to MLflow: the rerun evaluates it again)")
    return kept
