"""Every final model of a comparison on benchmarks (`bench eval --comparison ID`, or a notebook's call), each
evaluation stored once and reused after.

Each training run's final weights (``<output_dir>/<run name>/final``, where `bench run` left them) are evaluated on
each benchmark with the shared rollout sampler, unless a FINISHED evaluation with the same settings and the same
problems (by content: a rewritten data file is evaluated again) is already stored under that run
(``reports.evals``: tags ``pobench.benchmark`` / ``pobench.eval_key``, the hash of :meth:`EvalSettings.key_fields`)
of the same final weights (``pobench.final_digest``, the run's ``final`` folder's
:func:`bench.runs.identity.model_digest`): stored results are reused, never recomputed. A stored result of other
weights (``final`` replaced since; or stored before pobench recorded the digest) is evaluated again and named
(``EvalPlan.stale``); a run whose ``final`` is gone keeps its stored results. Each evaluation is one MLflow run
nested under its training run; `bench report` then adds the ``benchmarks`` table. The prompt template defaults to
the one the runs trained with.

:func:`plan_evaluations` settles what is stored and what is missing, and checks every final model needed is there,
before any work; :func:`evaluate_missing` evaluates and stores the rest, one at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.comparison.store import pair_lock
from bench.eval_inputs import check_settings, drop_prompts_past_context, max_new_tokens, resolve_data
from bench.evaluate import evaluate, log_to_mlflow, write_outputs
from bench.model import format_prompt, load_policy
from bench.rollout import make_sampler
from bench.runs.identity import model_digest
from evaluators import get_benchmark
from reports.evals import find_stored, settings_key
from reports.load import Comparison, load_comparison
from reports.paths import contained, lock_file, safe_component
from reports.record import BENCHMARK, COMPARISON, EVAL_KEY, FAILURE, FINAL_DIGEST, KIND, open_client


@dataclass(frozen=True)
class EvalSettings:
    """How each final model is evaluated (the flags of `bench eval`); all but the last four make two evaluations of
    one model on one benchmark the same (:meth:`key_fields`)."""

    split: str = "test"
    limit: int | None = None
    skip_bad_rows: bool = False
    k: int = 1
    samples: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    greedy: bool = True
    max_new_tokens: int | None = None
    prompt_template: str | None = None  # None: the template each run trained with
    seed: int = 0
    backend: str = "hf"
    data: tuple[str, ...] = ()
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int | None = None

    @property
    def n_samples(self) -> int:
        return self.samples or self.k

    def key_fields(self, bench, source: str, problems: list, template: str) -> dict[str, Any]:
        """What makes two evaluations of one model on one benchmark the same (hashed into ``pobench.eval_key``): the
        settings, and the problems evaluated by content (:func:`problems_digest`: a rewritten data file is another
        evaluation; held-out round 16, H10)."""
        return {"benchmark": bench.name, "version": str(bench.version), "split": self.split, "limit": self.limit,
                "source": source, "problems": len(problems), "data": problems_digest(problems),
                "skip_bad_rows": self.skip_bad_rows, "k": self.k,
                "n_samples": self.n_samples, "temperature": self.temperature, "top_p": self.top_p,
                "greedy": self.greedy, "max_new_tokens": self.max_new_tokens, "prompt_template": template,
                "seed": self.seed, "backend": self.backend}


def problems_digest(problems: list) -> str:
    """A digest (16 hex) of the problems evaluated: each one's id, question, reference answer and solution, in order
    (what was read, whatever the file, folder or hub dataset it came from)."""
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps(dataclasses.astuple(p), default=str).encode() + b"\n")
    return h.hexdigest()[:16]


@dataclass
class EvalPlan:
    """What :func:`plan_evaluations` found: the comparison, each benchmark's problems, the evaluations already stored
    (``reused``) and, per run that lacks some, its final model, prompt template and the missing benchmarks."""

    comparison: Comparison
    benchmarks: list[tuple[Any, list, str]]  # (task, problems, source)
    reused: int = 0
    todo: list[tuple[Any, Path, str, list]] = field(default_factory=list)  # (run, final, template, missing)
    final_digests: dict[str, str] = field(default_factory=dict)  # training run id -> its final weights' digest
    stale: list[str] = field(default_factory=list)  # "<run> on <benchmark>": stored of other weights, evaluated again
    unlogged: list[Path] = field(default_factory=list)  # the files of the evaluation being stored (not yet in MLflow)

    @property
    def total(self) -> int:
        return len(self.comparison.runs) * len(self.benchmarks)

    @property
    def missing(self) -> int:
        return sum(len(m) for _, _, _, m in self.todo)


def final_model(run) -> Path:
    """The run's final weights: ``<output_dir>/<run name>/final`` (the run name as one safe path component)."""
    out = run.params.get("output_dir")
    if not out:
        raise ValueError(f"run {run.name} ({run.run_id}) did not record output_dir: cannot find its final model")
    return contained(out, safe_component(run.name, "run name"), "final")


def final_digest(final: Path) -> str:
    """The digest of a run's final weights (config, tokenizer and weight files): what a stored evaluation evaluated."""
    return model_digest(str(final))


def plan_evaluations(experiment: str, comparison: str | None, benchmarks: list[str], settings: EvalSettings,
                     uri: str, client) -> EvalPlan:
    """The comparison's stored and missing evaluations on ``benchmarks``; ValueError (one line) for an unknown
    benchmark, bad settings, or a final model that is needed and absent, before any work."""
    check_settings(limit=settings.limit, k=settings.k, samples=settings.samples,
                   max_new_tokens=settings.max_new_tokens, batch_size=settings.batch_size,
                   prompt_template=settings.prompt_template)
    if not benchmarks:
        raise ValueError("--benchmarks: give at least one benchmark name")
    tasks = [get_benchmark(n) for n in benchmarks]
    cmp = load_comparison(experiment, comparison, uri, client=client, with_series=False)
    data = resolve_data(tasks, list(settings.data))
    plan = EvalPlan(cmp, [])
    loaded = []
    for b in tasks:
        problems, source = b.load_rows(settings.split, data=data[b.name], limit=settings.limit,
                                       skip_bad_rows=settings.skip_bad_rows)
        loaded.append((b, problems, source))
        plan.benchmarks.append((b, problems, source.source))
    rows = _rows_within_context(cmp.runs, loaded, settings)
    for r in cmp.runs:
        template = _template(r, settings)
        missing = []
        for b, problems, source in rows.get(template, plan.benchmarks):
            key = settings_key(settings.key_fields(b, source, problems, template))
            stored = find_stored(client, cmp.experiment_id, r.run_id, key)
            final = final_model(r) if stored and r.params.get("output_dir") else None
            if final is not None and (final / "config.json").is_file():  # (final gone: its stored results are all)
                digest = plan.final_digests.setdefault(r.run_id, final_digest(final))
                if stored[1] != digest:
                    plan.stale.append(f"{r.name} on {b.name}")
                    stored = None
            if stored:
                plan.reused += 1
            else:
                missing.append((b, problems, source, key))
        if missing:
            plan.todo.append((r, final_model(r), template, missing))
    in_way = [path for _, path, _, _ in plan.todo if (path.exists() or path.is_symlink()) and not path.is_dir()]
    if in_way:  # (the command does run where bench run ran: the path is there, as a file)
        more = f" ({len(in_way) - 1} more such file(s))" if len(in_way) > 1 else ""
        raise ValueError(f"{in_way[0]} is a file, not pobench's final model folder (pobench writes a folder there): "
                         "move it away, then put the run's final model folder back there (or train the run again: the "
                         f"same `bench run` with --force){more}")
    absent = [f"{r.name}: {path}" for r, path, _, _ in plan.todo if not (path / "config.json").is_file()]
    if absent and all(path.parent.parent.is_dir() for _, path, _, _ in plan.todo
                      if not (path / "config.json").is_file()):  # (run here: the folder of run folders is here)
        raise ValueError(f"{len(absent)} final model(s) moved or deleted (the folder of the comparison's run folders "
                         "is here, without them): " + "; ".join(absent[:3]) + ("; ..." if len(absent) > 3 else "")
                         + ": move each back there, or train the pair again (the same `bench run` does when its "
                         "run folder is gone; else `bench run --force`)")
    if absent:  # (held-out round 17, H09: said also when run from that folder)
        raise ValueError(f"{len(absent)} final model(s) not found (run bench eval from the folder bench run ran in): "
                         + "; ".join(absent[:3]) + ("; ..." if len(absent) > 3 else ""))
    return plan


def _template(run, settings: EvalSettings) -> str:
    return settings.prompt_template or run.params.get("prompt_template") or "auto"


def _rows_within_context(runs, loaded: list, settings: EvalSettings) -> dict[str, list]:
    """Per prompt template, the benchmarks' (task, problems, source) without the prompts not shorter than the
    final models' context: `bench eval`'s own check (:func:`bench.eval_inputs.drop_prompts_past_context`, one line
    naming ``file:line`` unless ``--skip-bad-rows``), read from the tokenizer and config of the first final model on
    disk of that template, before any model loads (the runs of a comparison share their model's architecture).
    Held-out round 12 (H01): `--comparison` evaluated such a row with a warning and stored it."""
    out: dict[str, list] = {}
    for r in runs:
        template = _template(r, settings)
        final = final_model(r) if template not in out and r.params.get("output_dir") else None
        if final is not None and (final / "config.json").is_file():
            out[template] = [(b, ps, s.source) for b, ps, s in
                             drop_prompts_past_context(str(final), loaded, template, settings.skip_bad_rows)]
    return out


def evaluate_missing(plan: EvalPlan, settings: EvalSettings, experiment: str, uri: str, out_root: str | Path
                     ) -> Iterator[str]:
    """Evaluate and store each missing (run, benchmark) of ``plan``; yields the MLflow run id of each once it is
    stored (so a stop keeps every evaluation stored before it)."""
    cmp = plan.comparison
    max_new_of: dict[tuple[str, str], int] = {}  # (benchmark, template) -> max new tokens (warned about once)
    for r, path, template, missing in plan.todo:
        digest = plan.final_digests.get(r.run_id) or final_digest(path)
        model, tokenizer = load_policy(str(path), settings.device, settings.dtype)
        options = ({"max_batch_size": settings.batch_size}
                   if settings.batch_size is not None and settings.backend == "hf" else {})
        sampler = make_sampler(settings.backend, model, tokenizer, **options)
        for b, problems, source, key in missing:
            with _claimed(r, b, key, digest, cmp.experiment_id, uri) as done:
                run_id = done or _evaluate_one(r, path, template, b, problems, source, key, digest, model, tokenizer,
                                               sampler, max_new_of, settings, experiment, uri, out_root, plan)
            yield run_id


@contextlib.contextmanager
def _claimed(r, b, key: str, digest: str, experiment_id: str, uri: str) -> Iterator[str | None]:
    """Hold the claim on one (run, benchmark, settings) evaluation (``<output_dir>/.locks/<run>.eval-<benchmark>-<key>
    .lock``, as `bench run` claims its pairs: bench/comparison/store.py ``pair_lock``); yields None to evaluate it, or
    the id of the evaluation another process stored since this one planned (held-out round 10: two
    `bench eval --comparison` at once evaluated everything twice and stored duplicates)."""
    lock = lock_file(r.params["output_dir"], f"{r.name}.eval-{b.name}-{key}")

    def waiting(_: str) -> None:
        print(f"bench eval: {r.name} on {b.name} is being evaluated by another process (lock {lock}); waiting for "
              "it to finish, then its result is reused", file=sys.stderr)

    with pair_lock(lock, f"{r.name} on {b.name}", on_wait=waiting):
        # (asked once the claim is held, waited for or not: the other process may have stored it and let go since
        # this one planned)
        stored = find_stored(open_client(uri), experiment_id, r.run_id, key)
        stored = stored if stored is not None and stored[1] == digest else None  # (of these final weights)
        if stored is not None:
            print(f"bench eval: {r.name} on {b.name}: stored by another process since (reused)", file=sys.stderr)
        else:
            _end_left_running(r, b, key, experiment_id, uri)
        yield None if stored is None else stored[0]


def _end_left_running(r, b, key: str, experiment_id: str, uri: str) -> None:
    """End FAILED the eval runs of this (run, benchmark, settings) left RUNNING: their process's claim is free (this
    one holds it), so it is gone, stopped while it stored the evaluation (held-out round 14, H21: its MLflow server
    lost between the eval run's creation and its end left it RUNNING for good)."""
    client = open_client(uri)
    for left in client.search_runs([experiment_id], filter_string=(
            f"tags.`{KIND}` = 'eval' and tags.`mlflow.parentRunId` = '{r.run_id}' and tags.`{EVAL_KEY}` = '{key}' "
            "and attributes.status = 'RUNNING'")):
        client.set_tag(left.info.run_id, FAILURE, "its `bench eval` process stopped before the evaluation was stored "
                       "(its MLflow server lost, or the process killed): evaluated again by a later command")
        client.set_terminated(left.info.run_id, "FAILED")
        print(f"bench eval: {r.name} on {b.name}: the eval run {left.info.run_id} an earlier command left RUNNING "
              "(its process stopped before storing it) was ended FAILED; evaluating again", file=sys.stderr)


def _evaluate_one(r, path, template, b, problems, source, key, digest, model, tokenizer, sampler, max_new_of,
                  settings, experiment, uri, out_root, plan: EvalPlan) -> str:
    """Evaluate and store one (run, benchmark) of ``evaluate_missing``; returns its MLflow run id. While it is
    logged to MLflow, ``plan.unlogged`` names its files (what a server lost then keeps)."""
    cmp = plan.comparison
    if (b.name, template) not in max_new_of:  # the runs of a comparison share their model's architecture
        prompts = [format_prompt(tokenizer, p.question, template) for p in problems]
        max_new_of[(b.name, template)] = max_new_tokens(settings.max_new_tokens, model,
                                                        [len(tokenizer(x)["input_ids"]) for x in prompts])
    max_new = max_new_of[(b.name, template)]
    res = evaluate(sampler, tokenizer, b, problems, k=settings.k, temperature=settings.temperature,
                   seed=settings.seed, n_samples=settings.n_samples if settings.temperature > 0 else 0,
                   greedy=settings.greedy, max_new_tokens=max_new, top_p=settings.top_p,
                   prompt_template=template)
    res.source = source
    meta = {"model": str(path), "split": settings.split, "limit": settings.limit, "k": settings.k,
            "n_samples": settings.n_samples, "temperature": settings.temperature, "top_p": settings.top_p,
            "max_new_tokens": max_new, "prompt_template": template, "seed": settings.seed,
            "backend": settings.backend}
    out_dir = contained(out_root, safe_component(cmp.comparison_id, "--comparison"),
                        safe_component(r.name, "run name"), safe_component(b.name, "benchmark"))
    paths = write_outputs([res], out_dir, meta)
    plan.unlogged[:] = paths
    run_id = log_to_mlflow([res], params={**meta, "benchmarks": b.name}, artifacts=paths,
                           run_name=f"eval-{b.name}-{r.name}", experiment=experiment, tracking_uri=uri,
                           parent_run_id=r.run_id, tags={BENCHMARK: b.name, EVAL_KEY: key,
                                                         COMPARISON: cmp.comparison_id, FINAL_DIGEST: digest})
    plan.unlogged.clear()
    acc = res.metrics.get("greedy_acc") or res.metrics.get("pass@1")
    print(f"bench eval: {r.name} on {b.name}: {100 * acc.value:.1f}% in {res.seconds:.1f}s", file=sys.stderr)
    return run_id
