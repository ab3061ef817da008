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
import inspect
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bench.config import TrainConfig


@dataclass(frozen=True)
class RunDefaults:
    """The ONE place the defaults of `bench run` live (tuned so that a flagless `bench run` finishes in <= 10 min on
    a 2-core CPU). ``train`` overrides TrainConfig defaults; a ``--config`` file and flags override these."""

    algos: tuple[str, ...] = ("grpo", "dapo", "tepo")
    seeds: tuple[int, ...] = (0, 1)
    baseline: str = "grpo"
    train: dict[str, Any] = field(default_factory=lambda: {
        # 16 prompts x 8 completions, 4 mini-batch updates per rollout (TrainConfig.minibatches) at lr 3e-5 is the
        # recipe that measurably improves the built-in model off-policy; greedy held-out accuracy on 400 problems
        # (std of one estimate ~2.4 points) at steps 0, 5 and 10
        "steps": 10, "prompts_per_step": 16, "group_size": 8, "lr": 3e-5, "eval_every": 5,
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
    algo: str
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
                done = client.search_runs([exp.experiment_id], filter_string=(
                    f"tags.`pobench.kind` = 'train' and tags.`pobench.config_hash` = '{h}' and "
                    f"tags.`pobench.objective` = '{a}' and tags.`pobench.seed` = '{s}' and "
                    f"tags.`pobench.overrides` = '{_canon(ov)}' and attributes.status = 'FINISHED'"),
                    order_by=["attributes.start_time DESC"], max_results=1)
                if done:
                    p.action, p.run_id = "reuse", done[0].info.run_id
            if p.action != "reuse" and not force and checkpoint.latest(run_dir(cfg, p)) is not None:
                p.action = "resume"
            pairs.append(p)
    return cid, pairs


def run_dir(cfg: TrainConfig, p: Pair) -> Path:
    return Path(cfg.output_dir) / cfg.experiment / p.run_name


def pair_config(cfg: TrainConfig, p: Pair, cid: str, parent_id: str | None) -> TrainConfig:
    tags = {**cfg.tags, f"pobench.in.{cid}": "1", "pobench.overrides": _canon(p.overrides)}
    if p.variant != p.algo:
        tags["pobench.variant"] = p.variant
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    return replace(cfg, algo=p.algo, seed=p.seed, objective_overrides=dict(p.overrides), run_name=p.run_name,
                   output_dir=str(Path(cfg.output_dir) / cfg.experiment), comparison=cid, tags=tags,
                   resume=p.action == "resume")


# ------------------------------------------------------------------ running
def _comparison_run(client, exp_id: str, cid: str, cfg: TrainConfig, algos, seeds) -> str:
    found = client.search_runs([exp_id], filter_string=(
        f"tags.`pobench.kind` = 'comparison' and tags.`pobench.comparison` = '{cid}'"), max_results=1)
    if found:
        client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    run = client.create_run(exp_id, run_name=f"comparison-{cid}", tags={
        "pobench.kind": "comparison", "pobench.comparison": cid, "pobench.config_hash": cfg.comparison_hash(),
        "pobench.objectives": ",".join(algos), "pobench.seeds": ",".join(map(str, seeds))})
    client.log_text(run.info.run_id, yaml.safe_dump(cfg.to_dict(), sort_keys=False), "config.yaml")
    return run.info.run_id


def run_comparison(cfg: TrainConfig, algos: list[str], seeds: list[int],
                   params: dict[str, dict[str, Any]] | None = None, *, force: bool = False, progress: bool = True,
                   report: bool = True, baseline: str | None = None, target_acc: float | None = None,
                   out_root: str | Path = "reports/out",
                   on_eval: Callable[[Pair, int, dict[str, float]], None] | None = None) -> HarnessResult:
    """Train the missing pairs of the comparison, then (``report``) write its report. ``on_eval(pair, step,
    metrics)`` is called after each held-out evaluation (it may raise ``bench.train.StopTraining``)."""
    from mlflow import MlflowClient

    from bench.tracking import tracking_uri
    from bench.train import TrainingDiverged, train

    t_start = time.perf_counter()
    params = params or {a: {} for a in algos}
    for a in algos:  # every objective validates with its overrides before any run starts
        replace(cfg, algo=a, objective_overrides=dict(params.get(a, {}))).validate()
    uri = tracking_uri(cfg.tracking_uri)
    cfg = replace(cfg, tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    cid, pairs = plan(cfg, algos, seeds, params, force=force, client=client)
    exp = client.get_experiment_by_name(cfg.experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(cfg.experiment)
    parent = _comparison_run(client, exp_id, cid, cfg, algos, seeds)
    from bench.distinguish import warn_before_run  # names coinciding objectives and inert terms before training

    warn_before_run(cfg, algos, params, client=client, run_id=parent)
    result = HarnessResult(cid, cfg.experiment, uri, pairs)

    for p in pairs:
        if p.action == "reuse":
            client.set_tag(p.run_id, f"pobench.in.{cid}", "1")
            p.outcome = "reused"
    if force:  # runs this comparison redoes stop counting as its members
        for p in pairs:
            for r in client.search_runs([exp_id], filter_string=(
                    f"tags.`pobench.kind` = 'train' and tags.`pobench.in.{cid}` = '1' and "
                    f"tags.`pobench.objective` = '{p.algo}' and tags.`pobench.seed` = '{p.seed}'")):
                client.set_tag(r.info.run_id, f"pobench.in.{cid}", "0")
            shutil.rmtree(run_dir(cfg, p), ignore_errors=True)

    todo = [p for p in pairs if p.action != "reuse"]
    display = _Display(cid, pairs, cfg.steps, enabled=progress)
    train_kw = {}
    status = "FINISHED"
    try:
        with display:
            for i, p in enumerate(todo):
                display.start(i, p)

                def cb(step: int, metrics: dict[str, float], p=p) -> None:
                    display.eval(step, metrics)
                    if on_eval is not None:
                        on_eval(p, step, metrics)

                if "on_step" in inspect.signature(train).parameters:
                    train_kw["on_step"] = display.step
                try:
                    res = train(pair_config(cfg, p, cid, parent), on_eval=cb, **train_kw)
                    p.run_id = res.run_id
                    client.set_tag(res.run_id, f"pobench.in.{cid}", "1")  # a resumed run may predate this id
                    p.outcome = "stopped early" if res.stopped_early else "finished"
                except TrainingDiverged as e:
                    p.outcome = f"failed: {e}"
                    status = "FAILED"
                display.done(p)
    except BaseException:
        client.set_terminated(parent, status="KILLED")
        raise
    client.set_terminated(parent, status=status)
    if report and any(p.outcome in ("reused", "finished", "stopped early") for p in pairs):
        from reports.report import build_report

        result.report = build_report(cfg.experiment, cid, uri, out_root=out_root, baseline=baseline,
                                     target_acc=target_acc, objectives=[p.variant for p in pairs], seeds=seeds,
                                     client=client)
    result.seconds = time.perf_counter() - t_start
    return result


class _Display:
    """Rich live progress: overall bar with ETA, and the current run's step, reward and held-out accuracy."""

    def __init__(self, cid: str, pairs: list[Pair], steps: int, enabled: bool) -> None:
        self.enabled = enabled
        self.todo = [p for p in pairs if p.action != "reuse"]
        self.steps = steps
        self.reward = self.acc = float("nan")
        self.n_done = 0
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
        self.overall = self.progress.add_task(f"comparison {cid}", total=max(1, len(self.todo) * steps),
                                              info=f"{len(self.todo)} runs to do, {reused} reused")
        self.current = self.progress.add_task("", total=steps, info="", visible=False)

    def __enter__(self):
        if self.enabled:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)

    def _info(self) -> str:
        r = "-" if self.reward != self.reward else f"{self.reward:.3f}"
        a = "-" if self.acc != self.acc else f"{self.acc:.3f}"
        return f"reward {r}  held-out acc {a}"

    def start(self, i: int, p: Pair) -> None:
        self.reward = self.acc = float("nan")
        self.n_done = i
        if self.enabled:
            what = "resume" if p.action == "resume" else "train"
            self.progress.update(self.current, description=f"[{i + 1}/{len(self.todo)}] {what} {p.variant} "
                                 f"seed {p.seed}", completed=0, visible=True, info=self._info())

    def _at(self, step: int) -> None:
        if self.enabled:
            self.progress.update(self.current, completed=step, info=self._info())
            self.progress.update(self.overall, completed=self.n_done * self.steps + step)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.reward = metrics.get("rollout/reward_mean", self.reward)
        self._at(step)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.acc = metrics.get("eval/accuracy", self.acc)
        self._at(step)

    def done(self, p: Pair) -> None:
        if self.enabled:
            self.progress.console.print(f"  {p.variant} seed {p.seed}: {p.outcome} (run {p.run_id})")
            self._at(self.steps)
