"""Optuna hyper-parameter searches over one objective's tunable fields (the engine behind `bench tune`).

A study searches the fields of an objective config (``algorithms/``) whose dataclass field carries
``metadata["search"] = (low, high, log)``; ``--space`` narrows those ranges or adds fields. One trial trains the same
base ``TrainConfig`` once per seed with the sampled ``objective_overrides`` through ``bench.train.train`` and scores
it by a held-out metric:

- ``eval/accuracy`` (any eval key): the value at the end of training, mean over seeds, maximised;
- ``steps_to:eval/accuracy>=0.5`` / ``seconds_to:eval/accuracy>=0.5``: training steps (or wall-clock seconds of
  training) until the held-out metric first reaches the threshold, mean over seeds, minimised; a seed that never gets
  there counts as twice the budget.

Pruning: each held-out evaluation reports the eval metric to Optuna (sign-flipped for the ``*_to`` metrics, so that
"lower is better" holds for both the study and its curves) at step ``seed_index * (steps + 1) + train_step``: all
trials use the same seed list, so the pruner compares like with like.

Storage: any SQLAlchemy URL (default a local SQLite file). Heartbeats detect workers that died mid-trial; their
trials are marked FAIL and re-queued with the same parameters. MLflow: one parent run per study (kind
``tune-study``), one nested run per trial (kind ``tune-trial``) holding its parameters, reported curve and state, and
each seed's training run nested under its trial run.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from bench.config import TrainConfig

DEFAULT_DIR = Path(".pobench/tune")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


# --------------------------------------------------------------------------------------------------- search space
@dataclass(frozen=True)
class Range:
    """One searched dimension: a numeric interval or a list of choices."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    kind: str = "float"            # float | int | categorical
    choices: tuple = ()

    def describe(self) -> str:
        if self.kind == "categorical":
            return "|".join(map(str, self.choices))
        return f"{self.low:g}:{self.high:g}" + (":log" if self.log else "") + (" (int)" if self.kind == "int" else "")

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        if self.kind == "categorical":
            return trial.suggest_categorical(name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(name, float(self.low), float(self.high), log=self.log)


def objective_config(algo: str, **overrides: Any) -> Any:
    """The resolved config dataclass of objective ``algo`` (ValueError naming valid names / fields when wrong)."""
    from algorithms import default_config

    return default_config(algo, **overrides)


def declared_space(algo: str, overrides: dict[str, Any] | None = None) -> dict[str, Range]:
    """The ranges objective ``algo`` declares (``metadata["search"]``) for the terms active under ``overrides``."""
    cfg = objective_config(algo, **(overrides or {}))
    kinds = {f.name: _field_kind(f) for f in dataclasses.fields(cfg)}
    return {name: Range(float(low), float(high), bool(log), kinds[name])
            for name, (low, high, log) in cfg.search_space().items()}


def _field_kind(f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return "int" if t == "int" else "float"


_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ITEM = re.compile(rf"^\s*(?P<name>[A-Za-z_]\w*)\s*=\s*(?:(?P<low>{_NUM})\s*:\s*(?P<high>{_NUM})(?::(?P<log>log))?"
                   rf"|(?P<choices>[^,:]+\|[^,]+))\s*$")


def parse_space(spec: str | None) -> dict[str, Range]:
    """Parse ``name=low:high[:log],name=a|b`` (numbers as in Python; ``|`` separates categorical choices)."""
    space: dict[str, Range] = {}
    if not spec or not spec.strip():
        return space
    for item in spec.split(","):
        m = _ITEM.match(item)
        if not m:
            raise ValueError(f"--space item {item.strip()!r}: expected name=low:high, name=low:high:log or "
                             f"name=a|b|c")
        name = m["name"]
        if name in space:
            raise ValueError(f"--space: parameter {name!r} given twice")
        if m["choices"]:
            choices = tuple(_scalar(c.strip()) for c in m["choices"].split("|"))
            if len(set(choices)) < 2:
                raise ValueError(f"--space {name}: a categorical range needs at least two distinct choices")
            space[name] = Range(kind="categorical", choices=choices)
            continue
        low, high, log = float(m["low"]), float(m["high"]), bool(m["log"])
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"--space {name}: bounds must be finite numbers")
        if low > high:
            raise ValueError(f"--space {name}={low:g}:{high:g}: inverted range (low > high)")
        if low == high:
            raise ValueError(f"--space {name}={low:g}:{high:g}: empty range (low == high); fix the value with "
                             f"--set objective_overrides instead of searching it")
        if log and low <= 0:
            raise ValueError(f"--space {name}={low:g}:{high:g}:log: a log range needs low > 0")
        space[name] = Range(low, high, log)
    return space


def _scalar(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def resolve_space(algo: str, spec: str | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Range]:
    """Declared ranges of ``algo``, narrowed / extended by ``spec``; every name checked against the objective.

    ``overrides``: the base config's fixed ``objective_overrides`` (a term switched off there is not searched unless
    ``spec`` names it).
    """
    overrides = dict(overrides or {})
    cfg = objective_config(algo, **overrides)
    fields_by_name = {f.name: f for f in dataclasses.fields(cfg)}
    space = declared_space(algo, overrides)
    for name, rng in parse_space(spec).items():
        if name not in fields_by_name:
            from evaluators.hints import did_you_mean

            hint = did_you_mean(name, fields_by_name)
            raise ValueError(f"--space: objective {algo!r} has no parameter {name!r}{hint}; its fields: "
                             f"{', '.join(fields_by_name)}")
        if rng.kind == "float" and _field_kind(fields_by_name[name]) == "int":
            if int(rng.low) != rng.low or int(rng.high) != rng.high:
                raise ValueError(f"--space {name}: integer field, bounds must be integers")
            rng = dataclasses.replace(rng, kind="int")
        space[name] = rng
    if not space:
        raise ValueError(f"objective {algo!r} declares no searchable field and --space adds none: nothing to tune")
    # the corners of the box (and every categorical choice) must be valid configs: a bad range fails before any trial
    corners = [{n: _pick(r, end) for n, r in space.items()} for end in ("low", "high")]
    for n, r in space.items():
        corners += [{**corners[0], n: c} for c in r.choices[1:]]
    for corner in corners:
        try:
            objective_config(algo, **{**overrides, **corner})
        except (ValueError, TypeError) as e:
            raise ValueError(f"search space of {algo!r}: {corner} is not a valid config: {e}") from e
    return space


def _pick(r: Range, end: str) -> Any:
    if r.kind == "categorical":
        return r.choices[0]
    return int(getattr(r, end)) if r.kind == "int" else getattr(r, end)


# --------------------------------------------------------------------------------------------------- metric
@dataclass(frozen=True)
class Metric:
    """What a trial is scored by: ``eval/KEY`` at the end, or steps/seconds until ``eval/KEY >= threshold``."""

    key: str
    kind: str = "final"            # final | steps_to | seconds_to
    threshold: float | None = None
    direction: str = "maximize"

    @property
    def spec(self) -> str:
        return self.key if self.kind == "final" else f"{self.kind}:{self.key}>={self.threshold:g}"

    def intermediate(self, value: float) -> float:
        """The value reported to the pruner for an eval metric value (better = the study's direction)."""
        return -value if self.kind != "final" and self.direction == "minimize" else value


def parse_metric(text: str, direction: str | None = None) -> Metric:
    m = re.fullmatch(rf"\s*(?:(?P<kind>steps_to|seconds_to):)?(?P<key>[\w/.\-]+)\s*(?:>=\s*(?P<thr>{_NUM}))?\s*",
                     text or "")
    if not m or not m["key"].startswith("eval/"):
        raise ValueError(f"--metric {text!r}: expected an eval key (eval/accuracy), steps_to:eval/KEY>=X or "
                         f"seconds_to:eval/KEY>=X")
    kind = m["kind"] or "final"
    if (kind == "final") != (m["thr"] is None):
        raise ValueError(f"--metric {text!r}: a threshold (>=X) goes with steps_to:/seconds_to: and only with them")
    if direction not in (None, "maximize", "minimize"):
        raise ValueError(f"--direction {direction!r}: valid: maximize, minimize")
    default = "maximize" if kind == "final" else "minimize"
    return Metric(m["key"], kind, float(m["thr"]) if m["thr"] else None, direction or default)


# --------------------------------------------------------------------------------------------------- storage, pruner
def default_storage_url(root: Path = DEFAULT_DIR) -> str:
    return f"sqlite:///{(root / 'optuna.db').resolve()}"


def redact(url: str) -> str:
    """A storage URL with its password hidden (for logs and MLflow params)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy understands: shown as given minus anything that looks like user:pass@
        return re.sub(r"//[^/@]*@", "//***@", url)


def open_storage(url: str, heartbeat: int = 30, grace: int | None = None, max_retry: int = 3,
                 on_stale: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None
                 ) -> optuna.storages.RDBStorage:
    """Connect to (and create the tables of) an Optuna RDB storage; ValueError naming the cause if unreachable.

    Trials whose worker stops sending heartbeats for ``grace`` seconds are failed and re-queued (up to ``max_retry``
    times per original trial); ``on_stale`` runs after the re-queueing (used to close the trial's MLflow run).
    """
    import warnings

    from sqlalchemy.engine import make_url

    from bench.dburl import INSTALL_HINT, with_driver

    try:
        url = with_driver(url)  # postgresql:// -> the installed driver (SQLAlchemy versions differ in the default)
        backend = make_url(url).get_backend_name()
    except ValueError as e:  # no driver installed
        raise ValueError(f"--storage {e}") from None
    except Exception as e:
        raise ValueError(f"--storage {url!r}: not a SQLAlchemy URL ({e})") from e
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if backend == "sqlite":
        db = make_url(url).database
        if db and db != ":memory:":
            Path(db).parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs["connect_args"] = {"timeout": 60}
    elif backend == "postgresql":
        engine_kwargs["connect_args"] = {"connect_timeout": 10}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)

    def stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        retry(study, trial)
        if on_stale is not None:
            on_stale(study, trial)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat,
                                              grace_period=grace or 4 * heartbeat,
                                              heartbeat_stale_trial_callback=stale)
    except ModuleNotFoundError as e:
        raise ValueError(f"--storage {redact(url)}: database driver missing ({e.name}); for PostgreSQL "
                         f"{INSTALL_HINT}") from e
    except Exception as e:  # sqlalchemy OperationalError / ArgumentError and friends: one line naming the cause
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"--storage {redact(url)}: cannot be reached: {first}") from e


def make_pruner(spec: str = "median", warmup: int = 1, startup: int = 2) -> optuna.pruners.BasePruner:
    """``median`` | ``percentile:P`` | ``hyperband`` | ``none``; warmup = reports before pruning may start."""
    name, _, arg = (spec or "median").partition(":")
    if name == "median" and not arg:
        return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
    if name == "percentile":
        try:
            p = float(arg)
        except ValueError:
            p = -1.0
        if not 0 < p < 100:
            raise ValueError(f"--pruner {spec!r}: percentile needs a number in (0, 100), e.g. percentile:25")
        return optuna.pruners.PercentilePruner(p, n_startup_trials=startup, n_warmup_steps=warmup)
    if name == "hyperband" and not arg:
        return optuna.pruners.HyperbandPruner()
    if name == "none" and not arg:
        return optuna.pruners.NopPruner()
    raise ValueError(f"--pruner {spec!r}: valid: median, percentile:P, hyperband, none")


# --------------------------------------------------------------------------------------------------- study
@dataclass
class TuneSpec:
    """Everything one `bench tune` worker needs."""

    algo: str
    base: TrainConfig
    space: dict[str, Range]
    metric: Metric
    study: str
    trials: int = 30
    seeds: list[int] = field(default_factory=lambda: [0])
    storage: str | None = None              # None: default_storage_url()
    pruner: str = "median"
    pruner_warmup: int = 1
    pruner_startup: int = 2
    heartbeat: int = 30
    grace: int | None = None
    max_retry: int = 3
    sampler_seed: int | None = None

    def fingerprint(self) -> dict[str, str]:
        """What must match when a worker joins or resumes an existing study."""
        return {"algo": self.algo, "metric": self.metric.spec, "direction": self.metric.direction,
                "seeds": ",".join(map(str, self.seeds)), "steps": str(self.base.steps),
                "space": ",".join(f"{n}={r.describe()}" for n, r in sorted(self.space.items())),
                "config_hash": self.base.comparison_hash()}


def tracking_uri(cfg: TrainConfig) -> str:
    """The MLflow URI the training loop will use for ``cfg`` (resolved once, passed to every trial explicitly)."""
    from bench.tracking import tracking_uri as resolve

    return resolve(cfg.tracking_uri)


def open_study(spec: TuneSpec) -> tuple[optuna.Study, StudyRuns]:
    """Create or join the study (checking its settings match) and its MLflow parent run."""
    holder: list[StudyRuns] = []  # the storage is checked first: an unreachable URL fails before MLflow is touched
    storage = open_storage(spec.storage or default_storage_url(), spec.heartbeat, spec.grace, spec.max_retry,
                           on_stale=lambda study, trial: holder[0].close_stale_trial(study, trial))
    runs = StudyRuns(tracking_uri(spec.base), spec.base.experiment, spec.study)
    holder.append(runs)
    sampler = optuna.samplers.TPESampler(seed=spec.sampler_seed)
    pruner = make_pruner(spec.pruner, spec.pruner_warmup, spec.pruner_startup)
    try:
        study = optuna.create_study(storage=storage, study_name=spec.study, direction=spec.metric.direction,
                                    sampler=sampler, pruner=pruner)
        for k, v in spec.fingerprint().items():
            study.set_user_attr(k, v)
        runs.create_parent(study, spec)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.study, storage=storage, sampler=sampler, pruner=pruner)
        _check_fingerprint(study, spec)
        runs.join_parent(study, spec)
    return study, runs


def _check_fingerprint(study: optuna.Study, spec: TuneSpec) -> None:
    deadline = time.monotonic() + 30  # the creating worker writes its attributes right after creating the study
    while not study.user_attrs.get("algo") and time.monotonic() < deadline:
        time.sleep(0.5)
    mine = spec.fingerprint()
    diff = [f"{k}: study has {study.user_attrs.get(k)!r}, this command {v!r}" for k, v in mine.items()
            if k in study.user_attrs and study.user_attrs[k] != v]
    if diff:
        raise ValueError(f"study {spec.study!r} exists with different settings ({'; '.join(diff)}); rerun with the "
                         f"same settings to resume it, or pick another --study name")


def count(study: optuna.Study, *states: TrialState) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def run_study(spec: TuneSpec, train_fn: Callable[..., Any] | None = None,
              log: Callable[[str], None] = print) -> optuna.Study:
    """Run trials of ``spec.study`` until it holds ``spec.trials`` finished (complete or pruned) trials.

    Safe to run from several processes / machines at once against one storage; a rerun resumes the study.
    ``train_fn`` (default ``bench.train.train``) trains one config: ``train_fn(cfg, on_eval=...) -> TrainResult``.
    """
    import warnings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study, runs = open_study(spec)  # an unreachable storage fails here, before anything heavy is imported
    if train_fn is None:
        from bench.train import train as train_fn
    from bench.train import StopTraining, TrainingDiverged

    optuna.storages.fail_stale_trials(study)  # re-queue trials of workers that died since the last run
    log(f"study {spec.study!r} at {redact(spec.storage or default_storage_url())}: "
        f"{count(study, *FINISHED)}/{spec.trials} trials finished; MLflow parent run {runs.parent_id}")

    def objective(trial: optuna.Trial) -> float:
        params = {name: rng.suggest(trial, name) for name, rng in spec.space.items()}
        run_id = runs.start_trial(trial, params, spec)
        curves: list[dict[int, dict[str, float]]] = []
        finals: list[float] = []
        try:
            for si, seed in enumerate(spec.seeds):
                curve: dict[int, dict[str, float]] = {}
                curves.append(curve)
                pruned = _train_one(spec, trial, train_fn, StopTraining, params, seed, si, run_id, curve, runs)
                if pruned:
                    runs.end_trial(run_id, "PRUNED", curves, None, spec)
                    raise optuna.TrialPruned(f"pruned at seed {seed}")
                finals.append(_score(spec, curve))
            value = float(sum(finals) / len(finals))
            runs.end_trial(run_id, "COMPLETE", curves, value, spec)
            return value
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM: the trial ends FAIL and its parameters are queued again
            runs.end_trial(run_id, "FAIL", curves, None, spec, reason="interrupted")
            study.enqueue_trial(params, user_attrs={"origin_trial": trial.user_attrs["origin_trial"]})
            raise
        except BaseException as e:
            runs.end_trial(run_id, "FAIL", curves, None, spec, reason=f"{type(e).__name__}: {e}"[:500])
            raise

    def after(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        val = "-" if trial.value is None else f"{trial.value:.4g}"
        log(f"trial {trial.number}: {trial.state.name} value={val} params={trial.params}")
        runs.log_progress(study, trial)
        if _done(study, spec):
            study.stop()

    while not _done(study, spec):
        study.optimize(objective, callbacks=[after], catch=(TrainingDiverged,), gc_after_trial=True)
        optuna.storages.fail_stale_trials(study)  # a dead worker's trial found at the end is re-queued and run
    runs.finish_parent(study, spec, complete=_done(study, spec))
    return study


def _done(study: optuna.Study, spec: TuneSpec) -> bool:
    """Enough finished trials and none re-queued; or too many genuine failures to go on."""
    if count(study, TrialState.FAIL) >= max(3, spec.trials) + spec.max_retry:
        return True
    return count(study, *FINISHED) >= spec.trials and count(study, TrialState.WAITING) == 0


def _train_one(spec: TuneSpec, trial: optuna.Trial, train_fn: Callable[..., Any], stop_exc: type[BaseException],
               params: dict[str, Any], seed: int, seed_index: int, trial_run_id: str,
               curve: dict[int, dict[str, float]], runs: StudyRuns) -> bool:
    """Train one seed of a trial, reporting every evaluation to the pruner; True if the pruner stopped it."""
    base = spec.base
    cfg = dataclasses.replace(
        base, algo=spec.algo, objective_overrides={**base.objective_overrides, **params}, seed=seed,
        run_name=f"{spec.study}-t{trial.number}-s{seed}", tracking_uri=tracking_uri(base), resume=False,
        tags={**base.tags, "mlflow.parentRunId": trial_run_id, "pobench.study": spec.study,
              "pobench.trial": str(trial.number)})
    state = {"pruned": False, "t0": None}

    def on_eval(step: int, metrics: dict[str, float]) -> None:
        now = time.monotonic()
        if state["t0"] is None:
            state["t0"] = now
        m = dict(metrics)
        m.setdefault("time/elapsed_s", now - state["t0"])
        curve[int(step)] = m
        if spec.metric.key not in m:
            raise ValueError(f"--metric {spec.metric.spec}: the evaluation reports no {spec.metric.key!r}; it "
                             f"reports {', '.join(sorted(metrics))}")
        report_step = seed_index * (base.steps + 1) + int(step)
        value = spec.metric.intermediate(float(m[spec.metric.key]))
        trial.report(value, report_step)
        runs.log_intermediate(trial_run_id, value, report_step)
        if trial.should_prune():
            state["pruned"] = True
            raise stop_exc(f"pruned by Optuna at step {step}")

    result = train_fn(cfg, on_eval=on_eval)
    final = getattr(result, "final_eval", None) or {}
    if final and not state["pruned"]:
        last = max(curve) if curve else int(getattr(result, "steps_done", base.steps))
        curve.setdefault(last, {}).update({k: v for k, v in final.items() if k not in curve.get(last, {})})
    return state["pruned"]


def _score(spec: TuneSpec, curve: dict[int, dict[str, float]]) -> float:
    """One seed's objective value from its evaluation curve {step: metrics}."""
    metric, key = spec.metric, spec.metric.key
    if not curve:
        raise ValueError("training made no held-out evaluation (eval_every=0?): nothing to score a trial by")
    if metric.kind == "final":
        return float(curve[max(curve)][key])
    for step in sorted(curve):
        if curve[step].get(key, -math.inf) >= metric.threshold:
            return float(step if metric.kind == "steps_to" else curve[step]["time/elapsed_s"])
    last = curve[max(curve)]
    return float(2 * spec.base.steps if metric.kind == "steps_to" else 2 * last["time/elapsed_s"])


# --------------------------------------------------------------------------------------------------- MLflow
class StudyRuns:
    """MLflow bookkeeping of one study: a parent run and one nested run per trial.

    Uses ``MlflowClient`` only (never the fluent API), so the training loop's own active run is never disturbed.
    """

    def __init__(self, uri: str, experiment: str, study: str) -> None:
        from reports.record import get_or_create_experiment, open_client

        self.client, self.study, self.parent_id = open_client(uri), study, ""
        self.experiment_id = get_or_create_experiment(self.client, uri, experiment)  # safe against other workers

    def create_parent(self, study: optuna.Study, spec: TuneSpec) -> None:
        run = self.client.create_run(self.experiment_id, run_name=f"tune-{spec.study}",
                                     tags={"pobench.kind": "tune-study", "pobench.study": spec.study,
                                           "pobench.objective": spec.algo, **_version_tags()})
        self.parent_id = run.info.run_id
        params = {"algo": spec.algo, "metric": spec.metric.spec, "direction": spec.metric.direction,
                  "seeds": ",".join(map(str, spec.seeds)), "trials": spec.trials, "steps": spec.base.steps,
                  "storage": redact(spec.storage or default_storage_url()), "pruner": spec.pruner,
                  "config_hash": spec.base.comparison_hash(),
                  **{f"space.{n}": r.describe() for n, r in spec.space.items()}}
        for k, v in params.items():
            self.client.log_param(self.parent_id, k, v)
        study.set_user_attr("mlflow_parent_run_id", self.parent_id)

    def join_parent(self, study: optuna.Study, spec: TuneSpec) -> None:
        deadline = time.monotonic() + 30
        while not (pid := study.user_attrs.get("mlflow_parent_run_id")) and time.monotonic() < deadline:
            time.sleep(0.5)
        try:
            run = self.client.get_run(pid) if pid else None
        except Exception:  # a different tracking server than the creating worker's
            run = None
        if run is None:
            self.create_parent(study, spec)
            return
        self.parent_id = pid
        if run.info.status != "RUNNING":
            self.client.update_run(pid, status="RUNNING")

    def start_trial(self, trial: optuna.Trial, params: dict[str, Any], spec: TuneSpec) -> str:
        tags = {"mlflow.parentRunId": self.parent_id, "pobench.kind": "tune-trial", "pobench.study": spec.study,
                "pobench.trial": str(trial.number), "pobench.objective": spec.algo, **_version_tags()}
        origin = trial.user_attrs.get("origin_trial")  # user attributes are copied into a re-queued trial
        if origin is None:
            trial.set_user_attr("origin_trial", trial.number)
        elif origin != trial.number:
            tags["pobench.retry_of"] = str(origin)
        run = self.client.create_run(self.experiment_id, run_name=f"{spec.study}-t{trial.number}", tags=tags)
        rid = run.info.run_id
        for k, v in params.items():
            self.client.log_param(rid, k, v)
        self.client.log_param(rid, "seeds", ",".join(map(str, spec.seeds)))
        trial.set_user_attr("mlflow_run_id", rid)
        return rid

    def log_intermediate(self, run_id: str, value: float, step: int) -> None:
        self.client.log_metric(run_id, "tune/intermediate", float(value), step=int(step))

    def end_trial(self, run_id: str, state: str, curves: list[dict[int, dict[str, float]]], value: float | None,
                  spec: TuneSpec, reason: str | None = None) -> None:
        """Log the seed-mean eval curve and the objective value, then close the run with the trial's state."""
        from mlflow.entities import Metric as MlMetric

        from reports.record import log_batch

        now = int(time.time() * 1000)
        batch = []
        for step in sorted({s for c in curves for s in c}):
            rows = [c[step] for c in curves if step in c]
            for key in sorted({k for r in rows for k in r if k.startswith("eval/")}):
                vals = [r[key] for r in rows if key in r]
                batch.append(MlMetric(key, float(sum(vals) / len(vals)), now, int(step)))
        if value is not None:
            batch.append(MlMetric("tune/objective", float(value), now, 0))
        log_batch(self.client, run_id, metrics=batch)
        self.client.set_tag(run_id, "pobench.trial_state", state)
        if reason:
            self.client.set_tag(run_id, "pobench.fail_reason", reason)
        self.client.set_terminated(run_id, {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}.get(state, "FAILED"))

    def close_stale_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """A trial whose worker died: mark its run, and the training run left open under it, FAILED."""
        rid = trial.user_attrs.get("mlflow_run_id")
        if not rid:
            return
        children = self.client.search_runs([self.experiment_id], f"tags.`mlflow.parentRunId` = '{rid}'")
        for run in [self.client.get_run(rid), *children]:
            if run.info.status == "RUNNING":
                self.client.set_tag(run.info.run_id, "pobench.trial_state", "FAIL")
                self.client.set_tag(run.info.run_id, "pobench.fail_reason", "worker heartbeat lost")
                self.client.set_terminated(run.info.run_id, "FAILED")

    def log_progress(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.value is not None:
            self.client.log_metric(self.parent_id, "tune/value", float(trial.value), step=trial.number)
        try:
            self.client.log_metric(self.parent_id, "tune/best_value", float(study.best_value), step=trial.number)
        except ValueError:  # no complete trial yet
            pass
        for name, state in (("complete", TrialState.COMPLETE), ("pruned", TrialState.PRUNED),
                            ("failed", TrialState.FAIL)):
            self.client.log_metric(self.parent_id, f"tune/n_{name}", count(study, state), step=trial.number)

    def finish_parent(self, study: optuna.Study, spec: TuneSpec, complete: bool) -> None:
        try:
            best = study.best_trial
        except ValueError:
            best = None
        if best is not None:
            self.client.set_tag(self.parent_id, "pobench.best_trial", str(best.number))
            self.client.set_tag(self.parent_id, "pobench.best_value", f"{best.value:.6g}")
            for k, v in best.params.items():
                self.client.set_tag(self.parent_id, f"best.{k}", str(v))
        if complete:
            self.client.set_terminated(self.parent_id, "FINISHED")

    def log_artifacts(self, folder: Path) -> None:
        self.client.log_artifacts(self.parent_id, str(folder), artifact_path="tune")


def _version_tags() -> dict[str, str]:
    from bench.tracking import version_tags

    return version_tags(commit=False)  # pobench.version (tune runs carry no commit tag)
