"""Evaluation of a task with the shared rollout sampler: greedy accuracy, pass@1, pass@k, maj@k (with 95% CIs).

`evaluate` is the one evaluation routine, used by ``bench eval`` and by every engine's held-out evaluation
(``held_out_result``, ``eval_metrics``). It samples with the same sampler as training rollouts and scores with the
task's verifier (its training reward). `log_to_mlflow` records results in their own MLflow run, or in a run nested
under the active (training) run.
"""

from __future__ import annotations

import concurrent.futures
import csv
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.data import derive_seed
from bench.model import format_prompt
from bench.rollout import Sampler, SamplingParams
from bench.runs.tracking import version_tags
from evaluators.metrics import Metric, summarize
from evaluators.tasks import Problem, Task
from evaluators.verify import answer_key, judge
from reports import metric_keys as K
from reports import record
from reports.edits import record_written
from reports.paths import replace_file
from reports.record import KIND, get_or_create_experiment, log_batch, open_client

if TYPE_CHECKING:
    from bench.config import TrainConfig


@dataclass
class EvalResult:
    """Results of one benchmark: metrics with their intervals and one row per problem."""

    benchmark: str
    version: str
    answer_kind: str
    k: int
    n_samples: int
    temperature: float
    seed: int
    metrics: dict[str, Metric]
    rows: list[dict[str, Any]]
    """Per problem: id, reference, prompt, greedy completion / answer / correct, sampled answers / correct flags."""
    seconds: float
    source: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def flat_metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """``{prefix}{benchmark}/{metric}`` (+ ``_ci_low`` / ``_ci_high``) as floats, for MLflow / on_eval callbacks.

        Metric names: ``greedy_acc``, ``pass_at_1``, ``pass_at_<k>``, ``maj_at_<k>`` (MLflow keys cannot hold '@').
        """
        out: dict[str, float] = {}
        for name, m in self.metrics.items():
            key = f"{prefix}{self.benchmark}/{name.replace('@', '_at_')}"
            out[key] = m.value
            out[f"{key}_ci_low"] = m.ci_low
            out[f"{key}_ci_high"] = m.ci_high
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"benchmark": self.benchmark, "version": self.version, "answer_kind": self.answer_kind, "k": self.k,
                "n_samples": self.n_samples, "temperature": self.temperature, "seed": self.seed,
                "source": self.source, "seconds": self.seconds,
                "metrics": {name: m.as_dict() for name, m in self.metrics.items()}, **self.extra,
                "rows": self.rows}


def _judge_all(completions: list[str], references: list[str], kind: str, timeout: float,
               workers: int) -> list[tuple[str | None, bool]]:
    """The verifier over many completions; threads overlap the math-verify child processes of LaTeX answers."""
    if workers <= 1 or kind != "latex":
        return [judge(c, r, kind, timeout) for c, r in zip(completions, references)]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda cr: judge(cr[0], cr[1], kind, timeout), zip(completions, references)))


def evaluate(sampler: Sampler, tokenizer, task: Task, problems: list[Problem], k: int = 1, temperature: float = 1.0,
             seed: int = 0, *, n_samples: int | None = None, greedy: bool = True, max_new_tokens: int = 512,
             top_p: float = 1.0, prompt_template: str = "auto", verify_timeout: float = 5.0,
             verify_threads: int = 4, confidence: float = 0.95) -> EvalResult:
    """Evaluate `sampler`'s policy on `problems` of `task` (anything with ``name``, ``version``, ``answer_kind``).

    Greedy decoding gives ``greedy_acc``; ``n_samples`` (default k) completions per problem at `temperature` give
    ``pass@1`` (mean over samples), unbiased ``pass@k`` and ``maj@k``; ``k=0`` or ``n_samples=0`` skips sampling.
    Every metric carries a bootstrap interval over problems. Completions are scored by the task's verifier.
    """
    n = k if n_samples is None else n_samples
    if not problems:
        raise ValueError(f"evaluate: no problems to evaluate for {task.name}")
    if k < 0 or n < 0 or (n and k > n):
        raise ValueError(f"evaluate: need 0 <= k <= n_samples, got k={k}, n_samples={n}")
    if n and temperature <= 0:
        raise ValueError("evaluate: sampled metrics need temperature > 0 (greedy accuracy is computed separately)")
    if not greedy and not n:
        raise ValueError("evaluate: nothing to do (greedy=False and no samples)")
    kind = task.answer_kind
    t0 = time.perf_counter()
    prompts = [format_prompt(tokenizer, p.question, prompt_template) for p in problems]
    references = [p.answer for p in problems]
    rows: list[dict[str, Any]] = [{"id": p.id, "reference": p.answer, "prompt": prompt}
                                  for p, prompt in zip(problems, prompts)]
    greedy_correct = None
    if greedy:
        out = sampler.generate(prompts, 1, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0), seed)
        judged = _judge_all(out.texts, references, kind, verify_timeout, verify_threads)
        greedy_correct = [ok for _, ok in judged]
        for row, text, (pred, ok), reason in zip(rows, out.texts, judged, out.finish_reasons):
            row.update(greedy_completion=text, greedy_answer=pred, greedy_correct=ok, greedy_finish=reason)
    samples = keys = None
    if n:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        out = sampler.generate(prompts, n, params, seed)
        judged = _judge_all(out.texts, [r for r in references for _ in range(n)], kind, verify_timeout,
                            verify_threads)
        samples = [[ok for _, ok in judged[i * n:(i + 1) * n]] for i in range(len(problems))]
        keys = [[answer_key(pred, kind) for pred, _ in judged[i * n:(i + 1) * n]] for i in range(len(problems))]
        for i, row in enumerate(rows):
            row.update(sample_answers=[pred for pred, _ in judged[i * n:(i + 1) * n]], sample_correct=samples[i],
                       n_correct=sum(samples[i]), sample_completions=out.texts[i * n:(i + 1) * n])
    metrics = summarize(greedy_correct, samples, keys, k, confidence=confidence, seed=seed)
    return EvalResult(benchmark=task.name, version=str(task.version), answer_kind=kind, k=k, n_samples=n,
                      temperature=temperature, seed=seed, metrics=metrics, rows=rows,
                      seconds=time.perf_counter() - t0)


def held_out_result(cfg: TrainConfig, sampler: Sampler, tok, task: Task, problems: list[Problem]) -> EvalResult:
    """One held-out evaluation of the sampler's current policy, as a training run of ``cfg`` evaluates."""
    return evaluate(sampler, tok, task, problems, k=1 if cfg.eval_temperature > 0 else 0,
                    temperature=cfg.eval_temperature or 1.0, seed=derive_seed(cfg.seed, "eval"),
                    n_samples=cfg.eval_samples if cfg.eval_temperature > 0 else 0,
                    max_new_tokens=cfg.max_new_tokens, prompt_template=cfg.prompt_template)


def eval_metrics(res: EvalResult) -> dict[str, float]:
    """The ``eval/*`` metrics logged for one held-out evaluation (and ``time/eval_s``)."""
    m = res.flat_metrics()
    m[K.EVAL_ACCURACY] = res.metrics["greedy_acc"].value
    if "pass@1" in res.metrics:
        m[K.EVAL_ACCURACY_SAMPLED] = res.metrics["pass@1"].value
    m[K.EVAL_S] = res.seconds
    return m


# ---------------------------------------------------------------------------------------------- outputs

CSV_FIELDS = ("id", "reference", "greedy_answer", "greedy_correct", "greedy_finish", "n_correct", "sample_answers",
              "greedy_completion")


def _drop_earlier(out: Path, now: set[str]) -> None:
    """Remove the ``<benchmark>.csv`` an earlier evaluation into ``out`` wrote (its results.json lists them) for the
    benchmarks this one does not evaluate: left there, they would sit beside results that no longer list them."""
    try:
        before = json.loads((out / "results.json").read_text())["benchmarks"]
        names = {b["benchmark"] for b in before if isinstance(b, dict) and isinstance(b.get("benchmark"), str)}
    except (OSError, ValueError, KeyError, TypeError):
        return
    for name in names - now:
        path = out / f"{name}.csv"
        if path.is_file() and not path.is_symlink() and path.parent == out:
            path.unlink()


def write_outputs(results: list[EvalResult], out_dir: str | Path, meta: dict[str, Any]) -> list[Path]:
    """``results.json`` (metrics + every per-problem row) and one ``<benchmark>.csv`` per benchmark."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    _drop_earlier(out, {r.benchmark for r in results})
    for r in results:  # (each file whole or not at all, replacing a link rather than writing through it)
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in r.rows:
            writer.writerow({**row, "sample_answers": json.dumps(row.get("sample_answers"))})
        paths.append(replace_file(out / f"{r.benchmark}.csv", text.getvalue()))
    results_json = json.dumps({**meta, "benchmarks": [r.to_dict() for r in results]}, indent=2, default=str)
    paths = [replace_file(out / "results.json", results_json), *paths]  # (results.json last: it lists the others)
    record_written(out, paths)  # (their digests: a later edit of one is told, not replaced: reports.edits, H29)
    return paths


def format_table(results: list[EvalResult], extra_columns: dict[str, dict[str, float]] | None = None) -> str:
    """A plain-text table: one line per benchmark, each metric as ``value [low, high]`` in percent."""
    names: list[str] = []
    for r in results:
        names += [m for m in r.metrics if m not in names]
    extra = extra_columns or {}
    extra_names = sorted({c for cols in extra.values() for c in cols})
    header = ["benchmark", "version", "problems", *names, *extra_names]
    lines = [header]
    for r in results:
        n_problems = len(r.rows)
        cells = [r.benchmark, r.version, str(n_problems)]
        for m in names:
            metric = r.metrics.get(m)
            cells.append(f"{100 * metric.value:.1f} [{100 * metric.ci_low:.1f}, {100 * metric.ci_high:.1f}]"
                         if metric else "-")
        cells += [f"{100 * extra[r.benchmark][c]:.1f}" if c in extra.get(r.benchmark, {}) else "-"
                  for c in extra_names]
        lines.append(cells)
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines)


# ---------------------------------------------------------------------------------------------- MLflow

def log_to_mlflow(results: list[EvalResult], *, params: dict[str, Any], artifacts: list[Path] = (),
                  run_name: str | None = None, experiment: str = "pobench", tracking_uri: str | None = None,
                  tags: dict[str, str] | None = None, step: int = 0, parent_run_id: str | None = None) -> str:
    """Log metrics, params and output files to a new MLflow run; returns its run id.

    The run is nested under `parent_run_id` (e.g. a training run), else under the run active in this process if any,
    else it is a top-level run in `experiment`. Tags: ``pobench.kind=eval``, version and commit, plus `tags`.
    """
    import mlflow
    from mlflow.entities import Metric as MlflowMetric
    from mlflow.entities import Param

    active = mlflow.active_run()
    parent = parent_run_id or (active.info.run_id if active is not None else None)
    uri = record.tracking_uri(tracking_uri)
    client = open_client(uri)
    if parent is not None:
        experiment_id = client.get_run(parent).info.experiment_id
    else:
        experiment_id = get_or_create_experiment(client, uri, experiment)
    all_tags = {KIND: "eval", **version_tags(),
                **({"mlflow.parentRunId": parent} if parent else {}), **(tags or {})}
    run_id = client.create_run(experiment_id, run_name=run_name, tags=all_tags).info.run_id
    metrics: dict[str, float] = {}
    for r in results:
        metrics.update(r.flat_metrics("eval/"))
        metrics[K.EVAL_TASK_PROBLEMS.format(task=r.benchmark)] = float(len(r.rows))
        metrics[K.EVAL_TASK_SECONDS.format(task=r.benchmark)] = r.seconds
        if "lm_eval" in r.extra:  # the lm-evaluation-harness accuracy on the same rows (`--harness lm-eval`)
            metrics[K.EVAL_TASK_LM_EVAL.format(task=r.benchmark)] = r.extra["lm_eval"]["lm_eval_acc"]
    now = int(time.time() * 1000)
    try:
        log_batch(client, run_id, metrics=[MlflowMetric(k, float(v), now, step) for k, v in metrics.items()],
                  params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        for path in artifacts:
            client.log_artifact(run_id, str(path))
    except BaseException as e:  # never a run left RUNNING: KILLED by Ctrl-C / SIGTERM, else FAILED
        client.set_terminated(run_id, "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    client.set_terminated(run_id)
    return run_id
