"""`bench eval --comparison ID --benchmarks math500,aime24,gsm8k`: every final model of a comparison on benchmarks.

Each training run's final weights (``<output_dir>/<run name>/final``, where `bench run` left them) are evaluated on
each benchmark with the shared rollout sampler, unless a FINISHED evaluation with the same settings is already stored
under that run (``reports.evals``: tags ``pobench.benchmark`` / ``pobench.eval_key``): stored results are reused,
never recomputed. Each evaluation is one MLflow run nested under its training run; `bench report` then adds the
``benchmarks`` table (accuracy per objective, mean ± 95% CI over seeds). The prompt template defaults to the one the
runs trained with.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.cli.eval_inputs import max_new_tokens, resolve_data
from bench.cli.interrupt import Stopped, rerun_to_resume
from bench.evaluate import evaluate, log_to_mlflow, write_outputs
from bench.model import format_prompt, load_policy
from bench.rollout import make_sampler
from bench.tracking import check_reachable
from evaluators import get_benchmark
from reports.evals import benchmark_table, find_stored, load_evals, settings_key
from reports.load import load_comparison
from reports.paths import contained, safe_component
from reports.record import BENCHMARK, COMPARISON, EVAL_KEY, open_client
from reports.tables import Units


def final_model(run) -> Path:
    """The run's final weights: ``<output_dir>/<run name>/final`` (the run name as one safe path component)."""
    out = run.params.get("output_dir")
    if not out:
        raise ValueError(f"run {run.name} ({run.run_id}) did not record output_dir: cannot find its final model")
    return contained(out, safe_component(run.name, "run name"), "final")


def settings_of(args, bench, source: str, n_problems: int, template: str) -> dict[str, Any]:
    """What makes two evaluations of one model on one benchmark the same (hashed into ``pobench.eval_key``)."""
    return {"benchmark": bench.name, "version": str(bench.version), "split": args.split, "limit": args.limit,
            "source": source, "problems": n_problems, "skip_bad_rows": args.skip_bad_rows, "k": args.k,
            "n_samples": args.samples or args.k, "temperature": args.temperature, "top_p": args.top_p,
            "greedy": not args.no_greedy, "max_new_tokens": args.max_new_tokens, "prompt_template": template,
            "seed": args.seed, "backend": args.backend}


def run(args) -> int:
    for flag, given in (("--model", args.model), ("--run-name", args.run_name), ("--parent-run-id",
                                                                                  args.parent_run_id),
                        ("--harness", args.harness)):
        if given:
            raise ValueError(f"--comparison evaluates the comparison's final models: drop {flag}")
    if args.no_mlflow:
        raise ValueError("--comparison stores each evaluation in MLflow (that is how results are reused and "
                         "reported): drop --no-mlflow")
    if args.k < 1 or (args.samples is not None and args.samples < args.k):
        raise ValueError(f"--k {args.k} / --samples {args.samples}: need k >= 1 and samples >= k")
    names = [n.strip() for n in args.benchmarks.split(",") if n.strip()]
    if not names:
        raise ValueError("--benchmarks: give at least one benchmark name")
    benchmarks = [get_benchmark(n) for n in names]
    uri = check_reachable(args.tracking_uri, reads_only=True)
    client = open_client(uri)
    cmp = load_comparison(args.experiment, args.comparison, uri, client=client, with_series=False)
    data = resolve_data(benchmarks, args.data)
    loaded = []
    for b in benchmarks:
        problems, source = b.load_rows(args.split, data=data[b.name], limit=args.limit,
                                       skip_bad_rows=args.skip_bad_rows)
        loaded.append((b, problems, source.source))

    # what is stored, what is missing, and every final model that is needed before any work starts
    todo: list[tuple[Any, Path, str, list]] = []
    reused = 0
    for r in cmp.runs:
        template = args.prompt_template or r.params.get("prompt_template") or "auto"
        missing = []
        for b, problems, source in loaded:
            key = settings_key(settings_of(args, b, source, len(problems), template))
            if find_stored(client, cmp.experiment_id, r.run_id, key):
                reused += 1
            else:
                missing.append((b, problems, source, key))
        if missing:
            todo.append((r, final_model(r), template, missing))
    absent = [f"{r.name}: {path}" for r, path, _, _ in todo if not (path / "config.json").is_file()]
    if absent:
        raise ValueError(f"{len(absent)} final model(s) not found (run bench eval from the folder bench run ran in): "
                         + "; ".join(absent[:3]) + ("; ..." if len(absent) > 3 else ""))
    print(f"bench eval: comparison {cmp.comparison_id}: {len(cmp.runs)} runs x {len(loaded)} benchmarks; "
          f"{reused} stored, {sum(len(m) for _, _, _, m in todo)} to evaluate", file=sys.stderr)

    out_root = Path(args.out or Path(".pobench") / "eval")
    stored = reused  # evaluations stored so far (what a stop keeps: the same command reuses them)
    try:
        for _ in _evaluate_missing(args, cmp, todo, uri, out_root):
            stored += 1
    except KeyboardInterrupt:  # SIGINT / SIGTERM: each evaluation is stored as it ends
        raise Stopped(f"{stored} of {len(cmp.runs) * len(loaded)} evaluations of comparison "
                      f"{cmp.comparison_id} stored", rerun_to_resume()) from None
    table, notes = benchmark_table(cmp, load_evals(client, cmp), Units())
    if table is not None:
        print(table.markdown(), end="")
        print(table.caption)
    for n in notes:
        print(f"note: {n}")
    print(f"bench eval: stored under each training run in MLflow ({uri}); bench report --experiment "
          f"{args.experiment} --comparison {cmp.comparison_id} adds the benchmarks table")
    return 0


def _evaluate_missing(args, cmp, todo, uri: str, out_root: Path) -> Iterator[str]:
    """Evaluate and store each missing (run, benchmark); yields the MLflow run id of each once it is stored."""
    max_new_of: dict[tuple[str, str], int] = {}  # (benchmark, template) -> max new tokens (warned about once)
    for r, path, template, missing in todo:
        model, tokenizer = load_policy(str(path), args.device, args.dtype)
        options = {"max_batch_size": args.batch_size} if args.batch_size and args.backend == "hf" else {}
        sampler = make_sampler(args.backend, model, tokenizer, **options)
        for b, problems, source, key in missing:
            if (b.name, template) not in max_new_of:  # the runs of a comparison share their model's architecture
                prompts = [format_prompt(tokenizer, p.question, template) for p in problems]
                max_new_of[(b.name, template)] = max_new_tokens(args.max_new_tokens, model,
                                                                [len(tokenizer(x)["input_ids"]) for x in prompts])
            max_new = max_new_of[(b.name, template)]
            n_samples = args.samples or args.k
            res = evaluate(sampler, tokenizer, b, problems, k=args.k, temperature=args.temperature, seed=args.seed,
                           n_samples=n_samples if args.temperature > 0 else 0, greedy=not args.no_greedy,
                           max_new_tokens=max_new, top_p=args.top_p, prompt_template=template)
            res.source = source
            meta = {"model": str(path), "split": args.split, "limit": args.limit, "k": args.k,
                    "n_samples": n_samples, "temperature": args.temperature, "top_p": args.top_p,
                    "max_new_tokens": max_new, "prompt_template": template, "seed": args.seed,
                    "backend": args.backend}
            out_dir = contained(out_root, safe_component(cmp.comparison_id, "--comparison"),
                                safe_component(r.name, "run name"), safe_component(b.name, "benchmark"))
            paths = write_outputs([res], out_dir, meta)
            run_id = log_to_mlflow([res], params={**meta, "benchmarks": b.name}, artifacts=paths,
                          run_name=f"eval-{b.name}-{r.name}", experiment=args.experiment, tracking_uri=uri,
                          parent_run_id=r.run_id, tags={BENCHMARK: b.name, EVAL_KEY: key,
                                                         COMPARISON: cmp.comparison_id})
            acc = res.metrics.get("greedy_acc") or res.metrics.get("pass@1")
            print(f"bench eval: {r.name} on {b.name}: {100 * acc.value:.1f}% in {res.seconds:.1f}s", file=sys.stderr)
            yield run_id
