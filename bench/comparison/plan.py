"""The plan of a comparison (`bench run`): which (objective, seed) pairs, with which config, and for each whether it
is reused, resumed or trained.

Identity of a run: (experiment, ``TrainConfig.comparison_hash()``, objective, objective overrides, seed). A FINISHED
run with the same identity is reused (also across comparisons of the same conditions), a run whose checkpoint exists
is resumed (``TrainConfig.resume``), anything else is trained; ``force`` redoes every pair.

The comparison id is a pure function of the config hash, the objectives (with their overrides) and the seeds, so
rerunning the same command finds the same comparison. Its runs carry ``pobench.comparison=<id>`` (the comparison
that trained them) and ``pobench.in.<id>=1`` (membership, also set on reused runs) and are nested under the
comparison's own MLflow run (``pobench.kind=comparison``), which receives the report as artifacts
(runner.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from algorithms import list_objectives, objective_groups, resolve_names
from algorithms.registry import default_config
from bench import plugin_imports
from bench.config import TrainConfig, config_file
from bench.inputs import read_yaml, typed_overrides
from bench.runs import resume
from bench.runs.run import experiment_dir, has_checkpoint
from reports.paths import under
from reports.record import OVERRIDES, VARIANT, member_tag


@dataclass(frozen=True)
class RunDefaults:
    """The ONE place the defaults of `bench run` live (tuned so that a flagless `bench run` finishes in <= 10 min on
    a 2-core CPU). ``train`` overrides TrainConfig defaults; a ``--config`` file and flags override these."""

    algos: tuple[str, ...] = ("grpo", "dapo", "tepo")
    seeds: tuple[int, ...] = (0, 1, 2)
    # the registered positive controls (algorithms: ctrl-reversed, ctrl-shuffled) join the default objectives (and a
    # preset's) unless --no-controls, and any objectives with --controls: the report then says whether the comparison
    # could detect a difference of their size (reports/controls.py)
    controls: bool = True
    # pairs trained at once, each in its own process with one torch thread (executors.py); 0 = one per CPU core
    # this process may use (one on a GPU), never more than the pairs to train; 1 = one after another, in-process
    workers: int = 0
    # where the pairs are trained (executors.py): local (this machine) | ray (one Ray task per pair)
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
def resolve_algos(algos: str | list[str] | None, ablation: str | list[str] | None = None,
                  default: tuple[str, ...] | None = None) -> list[str]:
    """Registered names and groups (``@tepo``, or a group root via ``ablation``) -> objective names, in order; neither
    given: ``default`` (a preset's), else ``RunDefaults.algos``.

    Unknown names raise ValueError with the registered names (from the registry)."""
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
        names = resolve_names(list(default or DEFAULTS.algos))
    return names


def load_params(path: str | Path | None, algos: list[str]) -> dict[str, dict[str, Any]]:
    """Objective-config overrides from a YAML file -> {algo: overrides}.

    Accepted forms: ``{field: value}`` (applied to every listed objective that has the field; a field none of them
    has is an error), optionally under ``objective_overrides:``, or ``{objective: {field: value}}``."""
    out: dict[str, dict[str, Any]] = {a: {} for a in algos}
    if path is None:
        return out
    data = read_yaml(path, "--params") or {}
    if isinstance(data, dict) and "algo" in data:  # written for one objective (`bench tune`'s best.yaml): only that one
        data = {data["algo"]: data.get("objective_overrides") or {}}
        if next(iter(data)) not in algos:
            raise ValueError(f"{path} holds overrides for objective {next(iter(data))!r} (its `algo:` line), which "
                             f"is not among the objectives run ({', '.join(algos)}); add it to --algos, or write the "
                             "overrides as {objective: {field: value}}")
    if isinstance(data, dict) and "objective_overrides" in data:
        data = data["objective_overrides"] or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: --params must be a YAML mapping of objective field: value")
    registered = set(list_objectives())
    if data and all(k in registered for k in data):  # per-objective form
        for name, fields in data.items():
            if name not in out:
                raise ValueError(f"{path}: overrides for {name!r}, which is not among the objectives run "
                                 f"({', '.join(algos)})")
            out[name] = typed_overrides(name, fields or {}, f"--params {path}")
            default_config(name, **out[name])  # unknown field / bad value -> clear error
        return out
    for key, value in data.items():
        takers = [a for a in algos if key in {f.name for f in dataclasses.fields(default_config(a))}]
        if not takers:
            raise ValueError(f"{path}: field {key!r} is not a config field of any objective run "
                             f"({', '.join(algos)})")
        for a in takers:
            out[a].update(typed_overrides(a, {key: value}, f"--params {path}"))
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


def new_pair(algo: str, seed: int, overrides: dict[str, Any], config_hash: str) -> Pair:
    """The pair of ``algo`` with ``overrides`` on ``seed`` under a config of hash ``config_hash``: its variant label
    and its run name (also the name of its run folder and of its claim)."""
    v = variant_label(algo, overrides)
    return Pair(algo, seed, overrides, v, run_name=f"{v}-s{seed}-{config_hash[:6]}")


def base_config(config: str | Path | None = None, *, preset: str | Path | None = None, **flags: Any) -> TrainConfig:
    """RunDefaults.train < ``preset`` YAML (bench/presets.py) < ``config`` YAML < ``flags`` (None values are ignored);
    not validated here."""
    d: dict[str, Any] = dict(DEFAULTS.train)
    for path, what in ((preset, "--preset"), (config, "--config")):
        if path:
            d.update(config_file(path, what))
    d.update({k: v for k, v in flags.items() if v is not None})
    return TrainConfig.from_dict(d)


def plan(cfg: TrainConfig, algos: list[str], seeds: list[int], params: dict[str, dict[str, Any]], *,
         force: bool = False, client=None) -> tuple[str, list[Pair]]:
    """Decide for each (objective, seed) whether it is reused, resumed or trained."""
    h = cfg.comparison_hash()
    variants = {variant_label(a, params.get(a, {})): params.get(a, {}) for a in algos}
    cid = comparison_id(h, variants, seeds)
    exp = client.get_experiment_by_name(cfg.experiment) if client else None
    pairs = []
    for a in algos:
        ov = params.get(a, {})
        for s in seeds:
            p = new_pair(a, s, ov, h)
            if exp is not None and not force:
                done, stale, gone = reusable(client, exp.experiment_id, cfg, p)
                if stale is not None:
                    raise ValueError(stale)
                if done is not None and gone is None:
                    p.action, p.run_id = "reuse", done.info.run_id
            if p.action != "reuse" and not force and has_checkpoint(run_dir(cfg, p)) \
                    and (client is None or deleted_run(client, cfg, run_dir(cfg, p)) is None):
                p.action = "resume"  # (a folder whose run was deleted in the store is trained again: run_pair)
            pairs.append(p)
    return cid, pairs


def deleted_run(client, cfg: TrainConfig, folder: Path) -> str | None:
    """The id of the MLflow run the run folder ``folder`` names (its ``run.json``, else its newest checkpoint's state)
    when ``cfg``'s store holds it deleted (the MLflow UI's delete, ``mlflow runs delete``) or no longer at all
    (``mlflow gc``); None otherwise. Such a pair is absent: held-out round 8, resuming it ended in MLflow's "must be in
    the 'active' state" traceback and a failed pair."""
    from mlflow.exceptions import MlflowException

    from bench.runs.run import last_checkpoint
    from bench.runs.tracking import read_run_record

    record = read_run_record(folder)
    run_id = record["run_id"] if record is not None and record.get("tracking_uri") == cfg.tracking_uri else None
    if run_id is None and record is None and (last := last_checkpoint(folder)) is not None:
        try:
            run_id = str(json.loads((last[0] / "state.json").read_text())["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    if run_id is None:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        return run_id if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST" else None
    return run_id if run.info.lifecycle_stage == "deleted" else None


def finished_record(client, experiment_id: str, cfg: TrainConfig, p: Pair):
    """The newest FINISHED MLflow run with the pair's identity, or None."""
    done = client.search_runs([experiment_id], filter_string=(
        f"tags.`pobench.kind` = 'train' and tags.`pobench.config_hash` = '{cfg.comparison_hash()}' and "
        f"tags.`pobench.objective` = '{p.objective}' and tags.`pobench.seed` = '{p.seed}' and "
        f"tags.`pobench.overrides` = '{_canon(p.overrides)}' and attributes.status = 'FINISHED'"),
        order_by=["attributes.start_time DESC"], max_results=1)
    return done[0] if done else None


def reusable(client, experiment_id: str, cfg: TrainConfig, p: Pair) -> tuple[Any, str | None, Path | None]:
    """The one reuse decision of a pair (the plan's, and ``run_pair``'s again under the pair's claim): (its newest
    FINISHED run or None, the line refusing its reuse (:func:`stale_reuse`) or None, its final model's folder when its
    run folder is gone (:func:`final_gone`: trained again) or None)."""
    done = finished_record(client, experiment_id, cfg, p)
    if done is None:
        return None, None, None
    return done, stale_reuse(done, p), final_gone(done, cfg, p)


def final_gone(run, cfg: TrainConfig, p: Pair) -> Path | None:
    """The final model folder of the pair's finished MLflow run ``run`` when it was trained into this command's
    folder (its ``output_dir``) and its run folder is gone from there (moved, renamed or deleted): such a pair is
    trained again, as a new run (held-out round 17, H09: it was "reused", and `bench eval --comparison` found no final
    model). None otherwise: its folder is there, or it was trained into another folder."""
    out = run.data.params.get("output_dir")
    folder = run_dir(cfg, p)
    if not out or Path(out).resolve() != folder.parent.resolve() or folder.exists() or folder.is_symlink():
        return None
    return folder.resolve() / "final"


def finished_run(client, experiment_id: str, cfg: TrainConfig, p: Pair) -> str | None:
    """The id of the newest FINISHED run with the pair's identity, or None."""
    done = finished_record(client, experiment_id, cfg, p)
    return done.info.run_id if done is not None else None


def stale_reuse(run, p: Pair) -> str | None:
    """The one line refusing to reuse the pair's finished MLflow run ``run`` when a module of the user's that its
    plugins' code imported while it trained (not in the comparison's identity) has changed since
    (bench/plugin_imports.py; held-out round 16, H09); None when it may be reused."""
    found = plugin_imports.changed(run.data.tags)
    return plugin_imports.refusal(f"{p.variant} seed {p.seed}", run.info.run_id, found) if found else None


def run_dir(cfg: TrainConfig, p: Pair) -> Path:
    return under(experiment_dir(cfg.output_dir, cfg.experiment), p.run_name, "run name")


def pair_config(cfg: TrainConfig, p: Pair, cid: str, parent_id: str | None) -> TrainConfig:
    tags = {**cfg.tags, member_tag(cid): "1", OVERRIDES: _canon(p.overrides)}
    if p.variant != p.objective:
        tags[VARIANT] = p.variant
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    return replace(cfg, algo=p.objective, seed=p.seed, objective_overrides=dict(p.overrides), run_name=p.run_name,
                   output_dir=str(experiment_dir(cfg.output_dir, cfg.experiment)), comparison=cid, tags=tags,
                   resume=p.action == "resume")


def check_resumed_pairs(cfg: TrainConfig, cid: str, pairs: list[Pair]) -> None:
    """Before the comparison's run is made: the pairs it resumes hold runs of the command's own settings (the same
    store, ...); one ValueError line otherwise, naming the first such folder and how many more (held-out round 16,
    H21: each pair failed after the comparison run was made, its line telling of flags `bench run` has not)."""
    found = []
    for p in pairs:
        try:
            saved = resume.saved(run_dir(cfg, p)) if p.action == "resume" else None
        except ValueError:  # (its config.yaml / inputs.json damaged: the pair's own line says so, as before)
            continue
        diff = resume.differences(pair_config(cfg, p, cid, None), *saved) if saved is not None else []
        if diff:
            found.append((run_dir(cfg, p), saved[0], diff))
    if found:
        raise ValueError(resume.pair_mismatch(cfg, *found[0], more=len(found) - 1))
