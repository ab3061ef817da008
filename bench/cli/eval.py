"""`bench eval`: evaluate a model on benchmarks with the shared rollout engine; table, JSON/CSV files, MLflow run.

    bench eval --model PATH_OR_ID --benchmarks gsm8k,math500,aime24 --k 8 [--limit N] [--data ../shared/data]
    bench eval --benchmarks arith    # without --model: the built-in model (as `bench train` / `bench run`)
    bench eval ... --harness lm-eval     # also run lm-evaluation-harness on the same rows and prompts (greedy)
    bench eval --comparison ID --benchmarks math500,aime24,gsm8k   # every final model of a comparison (reused
                                                                    # where stored); `bench report` tabulates them
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import faults, preflight
from bench.cli import eval_comparison
from bench.cli.flags import add_plugin_flag
from bench.cli.interrupt import Stopped, rerun
from bench.config import BUILTIN_MODEL, TRACKING_URI_DEFAULT
from bench.eval_inputs import (
    DEFAULT_MAX_NEW_TOKENS,
    check_settings,
    drop_prompts_past_context,
    max_new_tokens,
    resolve_data,
)
from bench.evaluate import evaluate, format_table, log_to_mlflow, write_outputs
from bench.inputs import check_seed, name_list
from bench.model import format_prompt, load_policy, resolve_device, resolve_model_path, warn_unknown_characters
from bench.rollout import make_sampler
from bench.runs.store_check import check_reachable
from bench.runs.tracking import answering
from evaluators import get_benchmark, list_benchmarks
from reports.paths import check_out_is_ours, claim_output_folder, hold_out_folder, make_owned

if TYPE_CHECKING:
    from evaluators import Task


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a model on math benchmarks (greedy, pass@k, maj@k, with 95%% CIs)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help=f"builtin:tiny-arith, a local model folder or a hub id (default: {BUILTIN_MODEL})")
    p.add_argument("--comparison", metavar="ID", help="evaluate every final model of this comparison of --experiment "
                   "(from the folder `bench run` ran in); evaluations already stored with the same settings are "
                   "reused; each is an MLflow run nested under its training run, and `bench report` adds a table of "
                   "benchmark accuracy per objective")
    add_plugin_flag(p)
    p.add_argument("--benchmarks", required=True,
                   help=f"comma-separated benchmark names; valid: {', '.join(list_benchmarks())}")
    p.add_argument("--data", action="append", default=[], metavar="[NAME=]PATH",
                   help="local data: NAME=PATH for one benchmark (repeatable), a PATH (file / folder / hub id) when "
                        "evaluating one benchmark, or a folder holding one sub-folder per benchmark "
                        "(e.g. ../shared/data). Default: each benchmark's hub id")
    p.add_argument("--split", default="test", help="split to evaluate (default: test)")
    p.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark (N >= 1; default: all)")
    p.add_argument("--k", type=int, default=1, help="k of pass@k and maj@k (default 1)")
    p.add_argument("--samples", type=int, default=None, help="sampled completions per problem (default: k)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of the k samples; 0 = greedy only (no sampled metrics)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy pass")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"completion length limit (N >= 1; default {DEFAULT_MAX_NEW_TOKENS}, capped by the model's "
                        "context)")
    p.add_argument("--prompt-template", default=None, help="auto | chat | plain | a format string with {question} "
                   "(default: auto; with --comparison: the template the runs trained with)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--backend", default="hf", help="rollout engine: hf | vllm")
    p.add_argument("--batch-size", type=int, default=None,
                   help="completions per forward pass (hf engine; N >= 1; default: the engine's)")
    p.add_argument("--skip-bad-rows", action="store_true", help="skip (and count) malformed rows instead of failing")
    p.add_argument("--out", default=None, help="output folder (default a new .pobench/eval/<time>[-N])")
    p.add_argument("--harness", choices=["lm-eval"], default=None,
                   help="also run lm-evaluation-harness on the same rows with our prompts and extraction (greedy)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--tracking-uri", default=None, help=f"MLflow tracking URI (default: {TRACKING_URI_DEFAULT})")
    p.add_argument("--experiment", default="pobench", help="MLflow experiment (default: pobench)")
    p.add_argument("--run-name", default=None)
    p.add_argument("--parent-run-id", default=None,
                   help="log as a run nested under this MLflow run (e.g. a training run)")
    p.set_defaults(func=run)


def check_sampling(args) -> None:
    """``--temperature`` finite and >= 0 (0: greedy only), ``--top-p`` in (0, 1]: refused in one line before any
    work (a NaN or negative temperature skipped the sampled metrics silently and wrote NaN into results.json)."""
    t, p = args.temperature, args.top_p
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"--temperature {t}: must be a finite number >= 0 (0 = greedy only, no sampled metrics)")
    if not (math.isfinite(p) and 0 < p <= 1):
        raise ValueError(f"--top-p {p}: must be in (0, 1]")
    if t == 0 and (args.k > 1 or args.samples):
        raise ValueError(f"--temperature 0 samples nothing, so --k {args.k} / --samples give no pass@k: set a "
                         "temperature > 0, or drop them")


def run(args) -> int:
    check_seed(args.seed, "--seed")
    check_sampling(args)
    check_settings(limit=args.limit, k=args.k, samples=args.samples, max_new_tokens=args.max_new_tokens,
                   batch_size=args.batch_size, prompt_template=args.prompt_template)
    if args.comparison is not None:
        return eval_comparison.run(args)
    if args.no_mlflow:  # (they were ignored silently: held-out round 10, H18)
        given = [f for f, v in (("--parent-run-id", args.parent_run_id), ("--run-name", args.run_name),
                                ("--tracking-uri", args.tracking_uri)) if v is not None]
        if given:
            raise ValueError(f"--no-mlflow records no MLflow run, so {' / '.join(given)} would be ignored: drop "
                             f"{'them' if len(given) > 1 else 'it'}, or drop --no-mlflow")
    args.model = args.model or BUILTIN_MODEL
    args.prompt_template = args.prompt_template or "auto"
    store_file = None  # (the local store as it is now: faults.watch_file)
    if not args.no_mlflow:  # an unreachable server: one line now, before transformers and the model load
        check_reachable(args.tracking_uri, experiment=args.experiment)
        from reports.record import tracking_uri

        store_file = faults.watch_file(tracking_uri(args.tracking_uri))
        if args.parent_run_id:  # (an unknown id was a traceback once the evaluation was done)
            _check_parent_run(args.tracking_uri, args.parent_run_id)

    if args.out:  # a file in its place, a read-only one, a folder of the user's files: refused now, not after
        faults.check_output_folder(args.out, "--out")
        check_out_is_ours(args.out, "--out")
    names, loaded = _inputs(args)
    # another bench eval writing into --out now: refused in one line before any work (held-out round 11, H17)
    lock = hold_out_folder(Path(args.out), "eval") if args.out else None
    try:
        return _evaluate(args, store_file, names, loaded)
    finally:
        if lock is not None:
            lock.release()


def _inputs(args) -> tuple[list[str], list]:
    """The benchmarks' names and (task, problems, source) of each, every row checked, before any model loads."""
    names = name_list(args.benchmarks, "--benchmarks")
    benchmarks = [get_benchmark(n) for n in names]  # unknown names fail here, before any model is loaded
    if args.harness and args.no_greedy:
        raise ValueError("--harness lm-eval compares greedy decoding: drop --no-greedy")
    data = resolve_data(benchmarks, args.data)
    files = [d for d in data.values() if d is not None and Path(d).is_file()]
    if args.split != "test" and files:  # (a file is read whole: the split was ignored, and recorded)
        raise ValueError(f"--split {args.split}: --data {files[0]} is one file, read whole; a split is chosen in a "
                         "folder (<split>.jsonl, ...) or a hub dataset: drop --split, or give the folder")
    loaded: list[tuple[Task, list, str]] = []
    for b in benchmarks:  # source: a path or hub id, or "generated"
        problems, source = b.load_rows(args.split, data=data[b.name], limit=args.limit,
                                       skip_bad_rows=args.skip_bad_rows)
        if source.skipped:
            print(f"bench eval: {b.name}: skipped {len(source.skipped)} bad row(s) of {source.source}",
                  file=sys.stderr)
        warning = preflight.answer_check(b, problems, f"{b.name} ({source.source})")  # none parses: refused
        if warning:
            print(f"bench eval: warning: {warning}", file=sys.stderr)
        loaded.append((b, problems, source))
    # a prompt longer than the model's context: its row named, before the model loads (held-out round 11, H03)
    loaded = [(b, ps, s.source) for b, ps, s in drop_prompts_past_context(args.model, loaded, args.prompt_template,
                                                                          args.skip_bad_rows)]
    return names, loaded


def _evaluate(args, store_file, names: list[str], loaded: list) -> int:
    """`bench eval` without --comparison once its inputs are read and checked (and --out held)."""
    model, tokenizer = load_policy(args.model, args.device, args.dtype)
    options = {"max_batch_size": args.batch_size} if args.batch_size is not None and args.backend == "hf" else {}
    engine = make_sampler(args.backend, model, tokenizer, **options)
    all_prompts = [format_prompt(tokenizer, p.question, args.prompt_template) for _, ps, _ in loaded for p in ps]
    warn_unknown_characters(tokenizer, [p.question for _, ps, _ in loaded for p in ps], "prompts")
    max_new = max_new_tokens(args.max_new_tokens, model, [len(tokenizer(x)["input_ids"]) for x in all_prompts])
    n_samples = args.samples or args.k
    meta: dict[str, Any] = {"model": args.model, "split": args.split, "limit": args.limit, "k": args.k,
                            "n_samples": n_samples, "temperature": args.temperature, "top_p": args.top_p,
                            "max_new_tokens": max_new, "prompt_template": args.prompt_template, "seed": args.seed,
                            "backend": args.backend}
    out_dir = claim_output_folder(args.out, "--out") if args.out else None  # (the default one: made when written)

    results = []
    try:
        for b, problems, source in loaded:
            r = evaluate(engine, tokenizer, b, problems, k=args.k, temperature=args.temperature, seed=args.seed,
                         n_samples=n_samples if args.temperature > 0 else 0, greedy=not args.no_greedy,
                         max_new_tokens=max_new, top_p=args.top_p, prompt_template=args.prompt_template)
            r.source = source
            results.append(r)
            print(f"bench eval: {b.name}: {len(problems)} problems in {r.seconds:.1f}s", file=sys.stderr)
    except KeyboardInterrupt:  # SIGINT / SIGTERM: the benchmarks evaluated so far are written, marked partial
        raise stopped(results, names, out_dir, meta) from None
    out_dir = out_dir or default_out_dir()

    extra: dict[str, dict[str, float]] = {}
    if args.harness == "lm-eval":
        from evaluators.lm_eval_bridge import compare_with_ours, run_lm_eval

        harness = run_lm_eval(resolve_model_path(args.model), [(b, ps) for b, ps, _ in loaded], out_dir / "lm_eval",
                              max_new_tokens=max_new, prompt=lambda tok, q: format_prompt(tok, q, args.prompt_template),
                              device=str(resolve_device(args.device)), dtype=args.dtype)
        for r in results:
            if r.benchmark in harness.scores:
                comparison = compare_with_ours(harness, r)
                extra[r.benchmark] = {"lm_eval_acc": harness.scores[r.benchmark]}
                r.extra["lm_eval"] = comparison
                if comparison["disagreements"]:
                    cut = sum(d["truncated_by_lm_eval"] for d in comparison["disagreements"])
                    print(f"bench eval: lm-eval and ours disagree on {len(comparison['disagreements'])} "
                          f"{r.benchmark} problem(s) ({cut} of them with a prompt lm-eval truncated to fit the "
                          "model's context); see results.json", file=sys.stderr)
        meta["lm_eval_version"] = harness.version
    print(format_table(results, extra))
    paths = write_outputs(results, out_dir, meta)
    print(f"bench eval: wrote {', '.join(str(p) for p in paths)}")
    if not args.no_mlflow:
        if store_file is not None and store_file[1] is not None and (how := faults.changed(store_file)):
            # (MLflow would make a new one there, silently)
            print(f"bench eval: warning: the MLflow store {store_file[0]} was {how} while the evaluation ran, with the "
                  "runs it held; this evaluation is logged into a new store there (restore the old one from a backup "
                  "to keep them)", file=sys.stderr)
        from reports.record import tracking_uri

        try:  # (a server lost now: one `stopped:` line within $POBENCH_MLFLOW_TIMEOUT, not minutes of retries)
            with answering(tracking_uri(args.tracking_uri)):
                run_id = log_to_mlflow(results, params={**meta, "benchmarks": ",".join(names)}, artifacts=paths,
                                       run_name=args.run_name or f"eval-{Path(args.model).name}",
                                       experiment=args.experiment, tracking_uri=args.tracking_uri,
                                       parent_run_id=args.parent_run_id)
        except faults.StoreUnreachable as e:
            raise faults.StoreUnreachable(f"{e}; kept: {', '.join(str(p) for p in paths)} (the evaluation's results, "
                                          "not logged to MLflow)") from None
        print(f"bench eval: MLflow run {run_id}")
    return 0


def default_out_dir(root: Path = Path(".pobench") / "eval") -> Path:
    """A new folder ``<root>/<time>`` (``<time>-2``, ``-3``... when it exists), made exclusively and marked as
    pobench's: two evaluations started in the same second each get their own (held-out round 8: both wrote into
    one and the first's results were lost)."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        folder = root / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return make_owned(folder, "out")
    raise AssertionError("unreachable")


def stopped(results: list, names: list[str], out_dir: Path | None, meta: dict[str, Any]) -> Stopped:
    """What a stopped `bench eval` kept: the results of the benchmarks it finished, written to ``out_dir`` with
    ``"partial": true`` and the benchmarks not evaluated in results.json (not logged to MLflow); or nothing."""
    if not results:
        return Stopped("nothing: no benchmark was evaluated to its end", rerun())
    done = [r.benchmark for r in results]
    out_dir = out_dir or default_out_dir()
    write_outputs(results, out_dir, {**meta, "partial": True, "not_evaluated": [n for n in names if n not in done]})
    return Stopped(f"the results of {', '.join(done)} ({len(done)} of {len(names)} benchmarks) in {out_dir}, marked "
                   "partial in results.json, not logged to MLflow", rerun())


def _check_parent_run(uri: str | None, run_id: str) -> None:
    """``--parent-run-id``: the run exists in the store the evaluation logs to; else one line, before any work (a
    local store that does not exist is not created for the question)."""
    from mlflow.exceptions import MlflowException

    from reports.record import open_client, tracking_uri

    resolved = tracking_uri(uri)
    if resolved.startswith("sqlite:///") and not Path(resolved[len("sqlite:///"):]).is_file():
        raise ValueError(f"--parent-run-id {run_id}: there is no MLflow store at {resolved[len('sqlite:///'):]}, so "
                         "no such run; give --tracking-uri of the store that holds it (or leave --parent-run-id out)")
    try:
        open_client(resolved).get_run(run_id)
    except MlflowException as e:
        if getattr(e, "error_code", "") not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        raise ValueError(f"--parent-run-id {run_id}: no such run in {resolved}; give the id of a run of that store "
                         "(`bench report` and the MLflow UI show them), or leave --parent-run-id out") from None

