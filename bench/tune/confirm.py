"""The best trial against the default on fresh seeds: `bench tune --confirm-seeds`.

A study's best value is the best of many noisy trials on the seeds that scored them, so it overstates what the best
setting gains (the winner's curse), and fANOVA importance says how much a parameter explains the spread of the trial
values, not whether the best setting beats the default. After the study has its trials, the confirm trains the
objective twice per fresh seed under the study's base configuration (``TuneSpec.base``: preset, ``--config`` and
flags): with its registered defaults for the searched fields ("default") and with the best trial's overrides
("best"); scores every run by the study's metric; and tests the paired difference best − default (mean, 95%
Student-t interval ``reports.stats.mean_ci``, paired t-test ``reports.tables.paired_test``). The verdict follows the
interval: better (it lies on the better side of 0), worse (on the worse side), else unresolved.

The two settings are the variants of a two-variant comparison (bench/comparison/): each (setting, seed) is a ``Pair``
run by ``run_pair`` under its claim, through the executor of the study's ``--workers`` / ``--executor``. A FINISHED
run of the same identity (experiment, config hash, objective, overrides, seed) is reused, a checkpointed one resumed,
so a rerun of the command trains only what is missing. The runs are nested under the study's MLflow run and tagged
``pobench.confirm_of=<study>`` (the runs it trained) and ``pobench.in.<comparison id>`` (every run it used). The result
is kept in the study's storage (its user attribute ``confirm``), from which ``confirm.md`` / ``confirm.csv`` are
written, by the command and by ``bench tune --show``.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from algorithms.registry import default_config
from bench.comparison.pairs import PairContext, PairJob, PairResult, run_pair
from bench.comparison.plan import Pair, comparison_id, finished_run, new_pair
from bench.engines import entry as engines
from bench.executors import Job, make_executor
from bench.plugins import check_shippable, with_plugins
from bench.runs.tracking import store_client
from bench.tune.metric import TuneMetric, parse_metric, trial_value
from bench.tune.spec import TuneSpec
from reports import metric_keys as K
from reports.edits import record_written
from reports.paths import replace_file
from reports.record import CONFIRM_OF, get_or_create_experiment, tracking_uri
from reports.stats import mean_ci
from reports.tables import fmt_p, paired_test

ATTR = "confirm"                      # the study's user attribute holding the confirm's record
SETTINGS = ("default", "best")
KEPT = ("reused", "finished", "stopped early")  # outcomes of a run that has a result (as bench/comparison's)


class ConfirmStopped(KeyboardInterrupt):
    """A confirm stopped by Ctrl-C / SIGTERM: how many of its ``total`` runs are finished; rerunning the command
    reuses them and resumes the checkpointed ones."""

    def __init__(self, study: str, finished: int, total: int) -> None:
        super().__init__(f"confirm of study {study!r}: {finished} of {total} runs finished")
        self.study, self.finished, self.total = study, finished, total


def check_seeds(seeds: list[int], confirm_seeds: list[int]) -> None:
    """ValueError when a confirm seed is one the study scored its trials on."""
    overlap = [s for s in confirm_seeds if s in seeds]
    if overlap:
        raise ValueError(f"--confirm-seeds {','.join(map(str, confirm_seeds))} overlaps --seeds "
                         f"{','.join(map(str, seeds))} (seed {','.join(map(str, overlap))}): the confirm trains on "
                         "fresh seeds, never those the study chose its best trial on")


def setting_overrides(spec: TuneSpec, best_params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The objective overrides of each setting: "default" keeps the base config's fixed overrides of fields the study
    does not search (the searched ones take their registered defaults), "best" is what the best trial trained."""
    fixed = {k: v for k, v in spec.base.objective_overrides.items() if k not in spec.space}
    return {"default": fixed, "best": {**spec.base.objective_overrides, **best_params}}


def run_confirm(spec: TuneSpec, study: Any, seeds: list[int], workers: int | None = 1, executor: str = "local",
                ray_address: str | None = None, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Train (or reuse) the default and the best trial's setting on each of ``seeds``, score them, keep the record
    in the study (``ATTR``) and return it; None when the study has no complete trial. ConfirmStopped on Ctrl-C /
    SIGTERM, once the running trainings have stopped (each checkpointed, its run KILLED)."""
    try:
        best = study.best_trial
    except ValueError:
        log(f"confirm: study {spec.study!r} has no complete trial: nothing to confirm")
        return None
    overrides = setting_overrides(spec, best.params)
    configs = {name: default_config(spec.algo, **ov) for name, ov in overrides.items()}
    record: dict[str, Any] = {
        "trial": best.number, "trial_value": best.value, "seeds": list(seeds), "metric": spec.metric.spec,
        "direction": spec.metric.direction, "overrides": overrides,
        # the searched fields' values in each setting (for confirm.md, without the objective's registry)
        "fields": {k: [getattr(configs["default"], k), getattr(configs["best"], k)] for k in sorted(best.params)},
        "same": configs["default"] == configs["best"]}
    if record["same"]:
        log(f"confirm: the best trial {best.number} is the objective's default setting: nothing to confirm")
        study.set_user_attr(ATTR, record)
        return record

    cfg = with_plugins(spec.base, [spec.algo])
    cfg = replace(cfg, algo=spec.algo, tracking_uri=tracking_uri(cfg.tracking_uri),
                  tags={**cfg.tags, CONFIRM_OF: spec.study})
    h = cfg.comparison_hash()
    names = [name for name in SETTINGS for _ in seeds]
    pairs = [new_pair(spec.algo, s, overrides[name], h) for name, s in zip(names, seeds * len(SETTINGS))]
    cid = comparison_id(h, {p.variant: p.overrides for p in pairs}, seeds)
    client = store_client(cfg.tracking_uri)
    exp_id = get_or_create_experiment(client, cfg.tracking_uri, cfg.experiment)
    # (picks the executor only: run_pair decides reuse / resume / train, under each pair's claim; every run finished
    # already: they are reused one after another in this process, no pool or Ray started)
    todo = sum(finished_run(client, exp_id, cfg, p) is None for p in pairs)
    if todo:
        ex = make_executor(executor, workers=workers, ray_address=ray_address)
    else:
        ex = make_executor("local", workers=1)
    cfg = ex.prepare(cfg)
    train_fn = spec.train_fn or engines.train
    ctx = PairContext(cfg, cid, study.user_attrs.get("mlflow_parent_run_id", ""), exp_id, False, train_fn)
    if ex.spawns(todo, cfg):
        check_shippable(cfg, [spec.algo])  # a notebook's objective: one line before any worker starts

    def notify(kind: str, i: int, *payload: Any) -> None:
        if kind == "start":
            log(f"confirm: {_what(names[i], pairs[i])}: {payload[0]}")
        elif kind == "msg":
            log(f"confirm: {payload[0]}")

    def done(task: Job, r: PairResult) -> None:
        p = pairs[r.index]
        p.outcome, p.run_id = r.outcome, r.run_id or p.run_id
        log(f"confirm: {_what(names[r.index], p)}: {r.outcome}")
        if r.error:
            print(r.error, file=sys.stderr)

    try:
        n = ex.start(max(1, todo), cfg, {"train_fn": train_fn})  # (1 when every run is reused: in this process)
        log(f"confirm: best trial {best.number} against the default on seeds {','.join(map(str, seeds))}: "
            f"{len(pairs)} runs ({len(pairs) - todo} finished already) on {n} worker{'s' if n > 1 else ''}; "
            f"comparison {cid}")
        tasks = [Job(i, run_pair, (PairJob(i, p, ctx),), not_started=PairResult(i, "not started"),
                      interrupted=PairResult(i, "interrupted"), failed=_failed(i)) for i, p in enumerate(pairs)]
        ex.run(tasks, notify, on_result=done)
    except KeyboardInterrupt:
        raise ConfirmStopped(spec.study, sum(p.outcome.startswith(KEPT) for p in pairs), len(pairs)) from None
    finally:
        ex.close()

    record.update(comparison=cid, experiment=cfg.experiment, runs=[])
    for p, name in zip(pairs, names):
        value, outcome = None, p.outcome
        if outcome.startswith(KEPT) and p.run_id:
            try:
                value = run_score(client, p.run_id, spec.metric, cfg.steps)
            except ValueError as e:
                outcome = f"not scored: {e}"
        record["runs"].append({"setting": name, "seed": p.seed, "variant": p.variant, "run_id": p.run_id,
                               "outcome": outcome, "value": value})
    study.set_user_attr(ATTR, record)
    return record


def _what(name: str, p: Pair) -> str:
    return f"{name} ({p.variant}) seed {p.seed}"


def _failed(i: int) -> Callable[[str, str], PairResult]:
    return lambda why, detail: PairResult(i, f"failed: {why}", "train", error=detail)


def run_score(client: Any, run_id: str, metric: TuneMetric, steps: int) -> float:
    """A finished run's value of the study's metric, from its MLflow record (the eval curve, and ``time/elapsed_s``
    at each evaluation for ``seconds_to``: 0 at step 0, as a trial counts it)."""
    curve: dict[int, dict[str, float]] = {}
    for m in client.get_metric_history(run_id, metric.key):
        curve.setdefault(int(m.step), {})[metric.key] = float(m.value)
    if not curve:
        raise ValueError(f"run {run_id} logged no {metric.key!r}")
    if metric.kind == "seconds_to":
        elapsed = {int(m.step): float(m.value) for m in client.get_metric_history(run_id, K.ELAPSED_S)}
        for step, row in curve.items():
            row[K.ELAPSED_S] = elapsed.get(step, 0.0)
    return trial_value(metric, curve, steps)


# ------------------------------------------------------------------ the result
@dataclass(frozen=True)
class ConfirmSummary:
    """The paired comparison of the two settings over the seeds where both have a value."""

    seeds: list[int]
    default: dict[int, float]
    best: dict[int, float]
    diff: float | None             # mean over seeds of best − default
    low: float | None              # its 95% Student-t interval (None with fewer than two seeds)
    high: float | None
    p: float | None                # paired t-test (None: fewer than two seeds, or identical differences)
    verdict: str                   # better | worse | unresolved

    @property
    def sentence(self) -> str:
        n = len(self.seeds)
        return {"better": "The tuned setting beats the default on fresh seeds.",
                "worse": "The tuned setting is worse than the default on fresh seeds."}.get(
            self.verdict, f"No difference resolved with {n} seed{'' if n == 1 else 's'}.")


def summarize(default: dict[int, float], best: dict[int, float], direction: str) -> ConfirmSummary:
    """best − default per seed, its mean, 95% t interval and paired t-test; the verdict follows the interval (better:
    it lies entirely on the better side of 0 for ``direction``, worse: entirely on the other, else unresolved)."""
    seeds = sorted(set(default) & set(best))
    diffs = [best[s] - default[s] for s in seeds]
    mean, half = mean_ci(diffs)
    low, high = (None, None) if half is None else (mean - half, mean + half)
    test = paired_test(best, default)
    verdict = "unresolved"
    if low is not None:
        sign = 1.0 if direction == "maximize" else -1.0  # (for a minimised metric a negative difference is better)
        if sign * low > 0 and sign * high > 0:
            verdict = "better"
        elif sign * low < 0 and sign * high < 0:
            verdict = "worse"
    return ConfirmSummary(seeds, {s: default[s] for s in seeds}, {s: best[s] for s in seeds}, mean, low, high,
                          test.p, verdict)


def summary_of(record: dict[str, Any]) -> ConfirmSummary | None:
    """The summary of a confirm record; None when nothing was trained (the best trial is the default)."""
    if record.get("same"):
        return None
    values: dict[str, dict[int, float]] = {name: {} for name in SETTINGS}
    for r in record.get("runs", []):
        if r["value"] is not None:
            values[r["setting"]][int(r["seed"])] = float(r["value"])
    return summarize(values["default"], values["best"], record["direction"])


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _signed(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.4g}".replace("-", "\u2212")


def write_confirm(study: Any, out: Path) -> dict[str, Path]:
    """``confirm.md`` and ``confirm.csv`` from the study's confirm record; {} when the study has none."""
    record = study.user_attrs.get(ATTR)
    if not record:
        return {}
    metric = parse_metric(record["metric"])
    seeds = ",".join(map(str, record["seeds"]))
    md = ["# The best trial against the default on fresh seeds", "",
          f"Study `{study.study_name}`, objective `{study.user_attrs.get('algo', '?')}`, metric `{metric.spec}` "
          f"({record['direction']}). Best trial {record['trial']} ({_num(record['trial_value'])} on the study's "
          f"seeds [{study.user_attrs.get('seeds', '?')}]) against the objective's default setting, each trained once "
          f"per fresh seed [{seeds}] under the study's base configuration.", "",
          "| field | default | best trial |", "|---|---|---|"]
    md += [f"| {k} | {d} | {b} |" for k, (d, b) in record["fields"].items()]
    md.append("")
    try:
        now = study.best_trial.number
    except ValueError:
        now = record["trial"]
    if now != record["trial"]:
        md += [f"Note: the study's best trial is now {now} (trials were added after this confirm); rerun with "
               "`--confirm-seeds` to confirm it.", ""]
    rows: list[list[Any]] = []
    summary = summary_of(record)
    if summary is None:
        md += [f"The best trial {record['trial']} sets every searched field to the objective's default: nothing to "
               "confirm, no run trained.", ""]
    else:
        runs = {(r["setting"], int(r["seed"])): r for r in record["runs"]}
        md += ["| seed | default | best | best − default | default run | best run |", "|---|---|---|---|---|---|"]
        for s in record["seeds"]:
            d, b = runs.get(("default", s), {}), runs.get(("best", s), {})
            dv, bv = d.get("value"), b.get("value")
            diff = None if dv is None or bv is None else bv - dv
            md.append(f"| {s} | {_num(dv)} | {_num(bv)} | {_signed(diff)} | {d.get('run_id') or '-'} | "
                      f"{b.get('run_id') or '-'} |")
            rows.append([s, dv, bv, diff, d.get("run_id"), b.get("run_id"), "", "", "", ""])
        n = len(summary.seeds)
        md += [f"| mean | {_num(_mean(summary.default))} | {_num(_mean(summary.best))} | {_signed(summary.diff)} | "
               "| |", ""]
        rows.append(["mean", _mean(summary.default), _mean(summary.best), summary.diff, "", "", summary.low,
                     summary.high, summary.p, summary.verdict])
        interval = "n/a (one seed)" if summary.low is None else f"[{_signed(summary.low)}, {_signed(summary.high)}]"
        md += [f"best − default: {_signed(summary.diff)}, 95% Student-t interval {interval} over {n} seed"
               f"{'' if n == 1 else 's'}; paired t-test p = {fmt_p(summary.p)}.", "", f"**{summary.sentence}**", ""]
        missing = [f"{r['setting']} seed {r['seed']}: {r['outcome']}" for r in record["runs"] if r["value"] is None]
        if missing:
            md += ["Runs without a value (left out of the paired test; rerun the command to train them): "
                   + "; ".join(missing) + ".", ""]
        md += ["The verdict follows the interval, not the point estimate: a difference whose interval includes 0 is "
               "not resolved with these seeds, whatever its sign. The runs form comparison "
               f"`{record['comparison']}` of experiment `{record['experiment']}` (`bench report --comparison "
               f"{record['comparison']}` reports it in full).", ""]
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow(["seed", "default", "best", "diff", "default_run", "best_run", "diff_low", "diff_high", "p", "verdict"])
    w.writerows(["" if v is None else (repr(v) if isinstance(v, float) else v) for v in r] for r in rows)
    paths = {"confirm.md": replace_file(out / "confirm.md", "\n".join(md)),
             "confirm.csv": replace_file(out / "confirm.csv", text.getvalue())}
    record_written(out, paths.values())  # (a later edit of one is told, not replaced: reports.edits)
    return paths


def _mean(values: dict[int, float]) -> float | None:
    return sum(values.values()) / len(values) if values else None
