"""`bench run`: train every (objective, seed) pair under identical conditions, then write the comparison's report.

Identity of a run: (experiment, ``TrainConfig.comparison_hash()``, objective, objective overrides, seed). A FINISHED
run with the same identity is reused (also across comparisons of the same conditions), a run whose checkpoint exists
is resumed (``TrainConfig.resume``), anything else is trained; ``force`` redoes every pair.

The comparison id is a pure function of the config hash, the objectives (with their overrides) and the seeds, so
rerunning the same command finds the same comparison. Its runs carry ``pobench.comparison=<id>`` (the comparison
that trained them) and ``pobench.in.<id>=1`` (membership, also set on reused runs) and are nested under the
comparison's own MLflow run (``pobench.kind=comparison``), which receives the report as artifacts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bench.config import TrainConfig
from reports.record import (
    COMPARISON,
    CONFIG_HASH,
    KIND,
    OBJECTIVES,
    OVERRIDES,
    SEEDS,
    VARIANT,
    member_tag,
    retry_locked,
)


@dataclass(frozen=True)
class RunDefaults:
    """The ONE place the defaults of `bench run` live (tuned so that a flagless `bench run` finishes in <= 10 min on
    a 2-core CPU). ``train`` overrides TrainConfig defaults; a ``--config`` file and flags override these."""

    algos: tuple[str, ...] = ("grpo", "dapo", "tepo")
    seeds: tuple[int, ...] = (0, 1, 2)
    # pairs trained at once, each in its own process with one torch thread (bench/parallel.py); 0 = one per CPU core
    # this process may use (one on a GPU), never more than the pairs to train; 1 = one after another, in-process
    workers: int = 0
    # where the pairs are trained (bench/executors.py): local (this machine) | ray (one Ray task per pair)
    executor: str = "local"
    train: dict[str, Any] = field(default_factory=lambda: {
        # 16 prompts x 8 completions, 4 mini-batch updates per rollout (TrainConfig.minibatches) at lr 3e-5 is the
        # recipe that measurably improves the built-in model off-policy; greedy held-out accuracy on 400 problems
        # (std of one estimate ~2.4 points) at steps 0, 2, 4, 6, 8 and 10: six evaluations, so time to convergence
        # is interpolated over 2-step intervals (one greedy evaluation costs about 3 s on one core)
        "steps": 10, "prompts_per_step": 16, "group_size": 8, "lr": 3e-5, "eval_every": 2,
        "eval_problems": 400,
        "eval_temperature": 0.0, "checkpoint_every": 5, "samples_every": 5,
    })


DEFAULTS = RunDefaults()


# ------------------------------------------------------------------ resolving what to run
def resolve_algos(algos: str | list[str] | None, ablation: str | list[str] | None = None) -> list[str]:
    """Registered names and groups (``@tepo``, or a group root via ``ablation``) -> objective names, in order.

    Unknown names raise ValueError with the registered names (from the registry)."""
    from algorithms import objective_groups, resolve_names

    names: list[str] = []
    if algos is not None:  # given but empty (`--algos ''`) is an error, never the defaults
        if not [a for a in (algos.split(",") if isinstance(algos, str) else algos) if a.strip()]:
            raise ValueError(f"--algos {algos!r} names no objective; give registered names (`bench list`) or leave "
                             f"the flag out for the defaults ({','.join(DEFAULTS.algos)})")
        names += resolve_names(algos)
    for root in ([ablation] if isinstance(ablation, str) else ablation or []):
        for r in [x.strip() for x in root.split(",") if x.strip()]:
            groups = objective_groups()
            if r not in groups:
                raise ValueError(f"no ablation group {r!r}; groups: {', '.join(groups) or 'none'}")
            names += [n for n in groups[r] if n not in names]
    if not names:
        names = list(DEFAULTS.algos)
    return names


def parse_seeds(seeds: str | list[int] | None) -> list[int]:
    """The seeds of ``--seeds`` (``bench run`` and ``bench tune``): comma-separated integers, in the order given; a
    repeated seed is dropped (it would train or evaluate the same run twice), an empty list is an error; None gives
    ``RunDefaults.seeds``."""
    if seeds is None:
        return list(DEFAULTS.seeds)
    if isinstance(seeds, str):
        try:
            seeds = [int(s) for s in seeds.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    out = []
    for s in seeds:
        if int(s) not in out:
            out.append(int(s))
    if not out:
        raise ValueError("--seeds is empty")
    return out


def load_params(path: str | Path | None, algos: list[str]) -> dict[str, dict[str, Any]]:
    """Objective-config overrides from a YAML file -> {algo: overrides}.

    Accepted forms: ``{field: value}`` (applied to every listed objective that has the field; a field none of them
    has is an error), optionally under ``objective_overrides:``, or ``{objective: {field: value}}``."""
    out: dict[str, dict[str, Any]] = {a: {} for a in algos}
    if path is None:
        return out
    data = yaml.safe_load(Path(path).read_text()) or {}
    if isinstance(data, dict) and "objective_overrides" in data:
        data = data["objective_overrides"] or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: --params must be a YAML mapping of objective field: value")
    from algorithms import list_objectives
    from algorithms.registry import default_config

    registered = set(list_objectives())
    if data and all(k in registered for k in data):  # per-objective form
        for name, fields in data.items():
            if name not in out:
                raise ValueError(f"{path}: overrides for {name!r}, which is not among the objectives run "
                                 f"({', '.join(algos)})")
            default_config(name, **(fields or {}))  # unknown field / bad value -> clear error
            out[name] = dict(fields or {})
        return out
    for key, value in data.items():
        takers = [a for a in algos if key in {f.name for f in dataclasses.fields(default_config(a))}]
        if not takers:
            raise ValueError(f"{path}: field {key!r} is not a config field of any objective run "
                             f"({', '.join(algos)})")
        for a in takers:
            out[a][key] = value
    for a, ov in out.items():
        default_config(a, **ov)
    return out


def _canon(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True, default=str)


def variant_label(algo: str, overrides: dict[str, Any]) -> str:
    """The objective name, or ``name+<hash>`` when it runs with config overrides."""
    if not overrides:
        return algo
    return f"{algo}+{hashlib.sha256(_canon(overrides).encode()).hexdigest()[:6]}"


def comparison_id(config_hash: str, variants: dict[str, dict[str, Any]], seeds: list[int]) -> str:
    payload = _canon({"config": config_hash, "objectives": {k: variants[k] for k in sorted(variants)},
                      "seeds": sorted(seeds)})
    return "c" + hashlib.sha256(payload.encode()).hexdigest()[:10]


# ------------------------------------------------------------------ the plan
@dataclass
class Pair:
    objective: str                   # the registered objective (a variant adds overrides to it)
    seed: int
    overrides: dict[str, Any]
    variant: str
    run_name: str
    action: str = "train"            # reuse | resume | train
    run_id: str | None = None
    outcome: str = ""                # reused | finished | failed: ... | stopped early


@dataclass
class HarnessResult:
    comparison: str
    experiment: str
    tracking_uri: str
    pairs: list[Pair]
    report: Any = None               # reports.report.Report when written
    seconds: float = 0.0
    workers: int = 1                 # pairs trained at once: processes (local) or Ray task slots (ray)
    executor: str = "local"          # bench/executors.py

    @property
    def failed(self) -> list[Pair]:
        return [p for p in self.pairs if p.outcome.startswith("failed")]


def base_config(config: str | Path | None = None, **flags: Any) -> TrainConfig:
    """RunDefaults.train < ``config`` YAML < ``flags`` (None values are ignored); not validated here."""
    d: dict[str, Any] = dict(DEFAULTS.train)
    if config:
        data = yaml.safe_load(Path(config).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{config}: a config file must be a YAML mapping of field: value")
        d.update(data)
    d.update({k: v for k, v in flags.items() if v is not None})
    return TrainConfig.from_dict(d)


def plan(cfg: TrainConfig, algos: list[str], seeds: list[int], params: dict[str, dict[str, Any]], *,
         force: bool = False, client=None) -> tuple[str, list[Pair]]:
    """Decide for each (objective, seed) whether it is reused, resumed or trained."""
    from bench import checkpoint

    h = cfg.comparison_hash()
    variants = {variant_label(a, params.get(a, {})): params.get(a, {}) for a in algos}
    cid = comparison_id(h, variants, seeds)
    exp = client.get_experiment_by_name(cfg.experiment) if client else None
    pairs = []
    for a in algos:
        ov = params.get(a, {})
        v = variant_label(a, ov)
        for s in seeds:
            p = Pair(a, s, ov, v, run_name=f"{v}-s{s}-{h[:6]}")
            if exp is not None and not force:
                done = finished_run(client, exp.experiment_id, cfg, p)
                if done is not None:
                    p.action, p.run_id = "reuse", done
            if p.action != "reuse" and not force and checkpoint.latest(run_dir(cfg, p)) is not None:
                p.action = "resume"
            pairs.append(p)
    return cid, pairs


def finished_run(client, experiment_id: str, cfg: TrainConfig, p: Pair) -> str | None:
    """The id of the newest FINISHED run with the pair's identity, or None."""
    done = client.search_runs([experiment_id], filter_string=(
        f"tags.`pobench.kind` = 'train' and tags.`pobench.config_hash` = '{cfg.comparison_hash()}' and "
        f"tags.`pobench.objective` = '{p.objective}' and tags.`pobench.seed` = '{p.seed}' and "
        f"tags.`pobench.overrides` = '{_canon(p.overrides)}' and attributes.status = 'FINISHED'"),
        order_by=["attributes.start_time DESC"], max_results=1)
    return done[0].info.run_id if done else None


def resolve_workers(workers: int | None, n_todo: int, cfg: TrainConfig) -> int:
    """Processes to train ``n_todo`` pairs with (RunDefaults.workers when None): 0 = one per usable CPU core (one
    when the model runs on a GPU, one with the verl engine), capped by ``n_todo``."""
    n = DEFAULTS.workers if workers is None else int(workers)
    if n < 0:
        raise ValueError(f"--workers must be >= 0 (0 = one per CPU core), got {n}")
    if n == 0 and cfg.engine == "verl":  # each verl job takes the whole Ray cluster it is given
        n = 1
    elif n == 0:
        from bench.model import resolve_device

        if resolve_device(cfg.device).type != "cpu":
            n = 1
        else:
            n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(n, n_todo))


def run_dir(cfg: TrainConfig, p: Pair) -> Path:
    return Path(cfg.output_dir) / cfg.experiment / p.run_name


def pair_config(cfg: TrainConfig, p: Pair, cid: str, parent_id: str | None) -> TrainConfig:
    tags = {**cfg.tags, member_tag(cid): "1", OVERRIDES: _canon(p.overrides)}
    if p.variant != p.objective:
        tags[VARIANT] = p.variant
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    return replace(cfg, algo=p.objective, seed=p.seed, objective_overrides=dict(p.overrides), run_name=p.run_name,
                   output_dir=str(Path(cfg.output_dir) / cfg.experiment), comparison=cid, tags=tags,
                   resume=p.action == "resume")


# ------------------------------------------------------------------ running
def _comparison_run(client, exp_id: str, cid: str, cfg: TrainConfig, algos, seeds) -> str:
    from bench.store import locks_dir, pair_lock

    # one parent run per comparison, also when two `bench run` of it start at once
    with pair_lock(locks_dir(cfg.output_dir, cfg.experiment) / f"comparison-{cid}.lock", f"comparison {cid}"):
        found = client.search_runs([exp_id], filter_string=(
            f"tags.`pobench.kind` = 'comparison' and tags.`pobench.comparison` = '{cid}'"), max_results=1)
        if found:
            client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id
        run = client.create_run(exp_id, run_name=f"comparison-{cid}", tags={
            KIND: "comparison", COMPARISON: cid, CONFIG_HASH: cfg.comparison_hash(),
            OBJECTIVES: ",".join(algos), SEEDS: ",".join(map(str, seeds))})
    client.log_text(run.info.run_id, yaml.safe_dump(cfg.to_dict(), sort_keys=False), "config.yaml")
    return run.info.run_id


def run_comparison(cfg: TrainConfig, algos: list[str], seeds: list[int],
                   params: dict[str, dict[str, Any]] | None = None, *, force: bool = False, progress: bool = True,
                   report: bool = True, baseline: str | None = None, target_acc: float | None = None,
                   out_root: str | Path = "reports/out", workers: int | None = None,
                   on_eval: Callable[[Pair, int, dict[str, float]], None] | None = None,
                   executor: str | None = None, ray_address: str | None = None,
                   report_options: Any = None) -> HarnessResult:
    """Train the missing pairs of the comparison, then (``report``) write its report. ``on_eval(pair, step,
    metrics)`` is called after each held-out evaluation (it may raise ``bench.train.StopTraining``); with more than
    one worker it runs in the worker processes, so it must be picklable (with ``executor="ray"`` it runs in the Ray
    tasks). ``workers``: see ``RunDefaults.workers`` (with ``ray``: the CPUs of the local Ray instance).
    ``executor``: ``local`` | ``ray`` (``RunDefaults.executor``); ``ray_address``: the Ray cluster to connect to
    (default: start a local instance); see bench/executors.py. ``report_options``: how the report is drawn
    (``reports.report.ReportOptions``)."""
    from bench.executors import make_executor
    from bench.parallel import PairJob, PairResult
    from bench.tracking import tracking_uri
    from reports.record import get_or_create_experiment, open_client

    t_start = time.perf_counter()
    ex = make_executor(executor or DEFAULTS.executor, workers=workers, ray_address=ray_address)
    params = params or {a: {} for a in algos}
    for a in algos:  # every objective validates with its overrides before any run starts
        replace(cfg, algo=a, objective_overrides=dict(params.get(a, {}))).validate()
    uri = tracking_uri(cfg.tracking_uri)
    cfg = ex.prepare(replace(cfg, tracking_uri=uri))
    uri = cfg.tracking_uri
    client = open_client(uri)  # a fresh local store is created under a lock (reports/record.py)
    cid, pairs = plan(cfg, algos, seeds, params, force=force, client=client)
    exp_id = get_or_create_experiment(client, uri, cfg.experiment)
    parent = _comparison_run(client, exp_id, cid, cfg, algos, seeds)
    from bench.distinguish import warn_before_run  # names coinciding objectives and inert terms before training

    warn_before_run(cfg, algos, params, client=client, run_id=parent)
    result = HarnessResult(cid, cfg.experiment, uri, pairs)

    for p in pairs:
        if p.action == "reuse":
            client.set_tag(p.run_id, member_tag(cid), "1")
            p.outcome = "reused"
    if force:  # runs this comparison redoes stop counting as its members
        for p in pairs:
            for r in client.search_runs([exp_id], filter_string=(
                    f"tags.`pobench.kind` = 'train' and tags.`{member_tag(cid)}` = '1' and "
                    f"tags.`pobench.objective` = '{p.objective}' and tags.`pobench.seed` = '{p.seed}'")):
                client.set_tag(r.info.run_id, member_tag(cid), "0")
            shutil.rmtree(run_dir(cfg, p), ignore_errors=True)

    todo = [p for p in pairs if p.action != "reuse"]
    jobs = [PairJob(i, cfg, p, cid, parent, exp_id, force) for i, p in enumerate(todo)]
    # the starting policy's held-out evaluation, once for the comparison (pairs that start from scratch need it)
    fresh = sorted({p.seed for p in todo if p.action == "train"})
    # (verl evaluates the starting policy itself, in its own job: val_before_train)
    step0_cfg = cfg if fresh and cfg.eval_every > 0 and cfg.backend == "hf" and cfg.engine != "verl" else None
    status = "FINISHED"

    def finished(r: PairResult) -> None:
        nonlocal status
        p = todo[r.index]
        p.outcome = r.outcome
        if r.action:
            p.action = r.action
        p.run_id = r.run_id or p.run_id
        if r.outcome.startswith("failed"):
            status = "FAILED"
        display.done(r.index, p, r.error)

    try:
        n_workers = ex.start(len(todo), cfg, on_eval)  # the pool's size, or the Ray connection and task resources
        display = _Display(cid, pairs, cfg.steps, enabled=progress, workers=n_workers)
        with display:
            ex.execute(jobs, notify=display.event, on_eval=on_eval, step0_cfg=step0_cfg, step0_seeds=fresh,
                       on_result=finished)
    except BaseException:
        retry_locked(client.set_terminated, parent, status="KILLED")
        raise
    finally:
        ex.close()
    retry_locked(client.set_terminated, parent, status=status)
    if report and any(p.outcome.startswith(("reused", "finished", "stopped early")) for p in pairs):
        from reports.report import build_report

        result.report = build_report(cfg.experiment, cid, uri, out_root=out_root, baseline=baseline,
                                     target_acc=target_acc, objectives=[p.variant for p in pairs], seeds=seeds,
                                     client=client, options=report_options)
    result.seconds = time.perf_counter() - t_start
    result.workers = n_workers
    result.executor = ex.name
    return result


class _Display:
    """Rich live progress: an overall bar with ETA, and one line per pair being trained (step, reward, held-out
    accuracy); messages (a pair waiting for another process, a failure) are printed above it."""

    def __init__(self, cid: str, pairs: list[Pair], steps: int, enabled: bool, workers: int = 1) -> None:
        import sys

        self.enabled = enabled
        self.todo = [p for p in pairs if p.action != "reuse"]
        self.steps = steps
        self.at = [0] * len(self.todo)
        self.info = [[float("nan"), float("nan")] for _ in self.todo]  # reward, held-out accuracy
        self.tasks: dict[int, Any] = {}
        self.err = sys.stderr
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                                 TextColumn("steps"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[info]}"))
        reused = len(pairs) - len(self.todo)
        self.overall = self.progress.add_task(
            f"comparison {cid}", total=max(1, len(self.todo) * steps),
            info=f"{len(self.todo)} runs to do on {workers} worker{'s' if workers > 1 else ''}, {reused} reused")

    def __enter__(self):
        if self.enabled:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)

    def _info(self, i: int) -> str:
        r, a = self.info[i]
        return f"reward {'-' if r != r else f'{r:.3f}'}  held-out acc {'-' if a != a else f'{a:.3f}'}"

    def print(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.err)

    def event(self, kind: str, i: int, *payload: Any) -> None:
        """``notify`` of bench.parallel: start / step / eval / msg events of pair ``i`` (-1: the comparison)."""
        if kind == "msg":
            self.print(f"  {payload[0]}")  # messages name their pair
            return
        if kind == "start":
            p = self.todo[i]
            if self.enabled:
                what = "resume" if payload[0] == "resume" else "train"
                self.tasks[i] = self.progress.add_task(f"[{i + 1}/{len(self.todo)}] {what} {p.variant} seed "
                                                       f"{p.seed}", total=self.steps, info=self._info(i))
            return
        step, value = payload
        self.info[i][0 if kind == "step" else 1] = value
        self._at(i, step)

    def _at(self, i: int, step: int) -> None:
        self.at[i] = step
        if self.enabled:
            if i in self.tasks:
                self.progress.update(self.tasks[i], completed=step, info=self._info(i))
            self.progress.update(self.overall, completed=sum(self.at))

    def done(self, i: int, p: Pair, error: str = "") -> None:
        self.print(f"  {p.variant} seed {p.seed}: {p.outcome} (run {p.run_id})")
        if error and not p.outcome.startswith("failed: step"):  # a divergence needs no traceback
            self.print(error.rstrip())
        self._at(i, self.steps)
        if self.enabled and i in self.tasks:
            self.progress.remove_task(self.tasks.pop(i))
