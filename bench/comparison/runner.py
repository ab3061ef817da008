"""`bench run` as one call: ``run_comparison(ComparisonSpec(cfg, algos, seeds, ...))`` trains the missing pairs of the
comparison (plan.py decides which; an executor runs them: executors.py, pairs.py), then writes its report.

The training function is part of the spec (``train_fn``, default ``bench.engines.entry.train``), as ``bench tune``'s
``run_study(spec, train_fn=...)``: the orchestration (reuse, resume, ``--force``, failures, Ctrl-C, executors) is the
same whatever trains, so its tests run on a fake trainer and only a few train for real.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock, Timeout

from bench import faults, preflight
from bench.comparison.display import LiveDisplay
from bench.comparison.distinguish import warn_before_run
from bench.comparison.pairs import PairContext, PairJob, PairResult, TrainFn, initial_evals, run_pair, step0_task
from bench.comparison.plan import DEFAULTS, Pair, check_resumed_pairs, plan, run_dir
from bench.comparison.store import lock_file, pair_lock
from bench.config import OUTPUT_DIR, TrainConfig
from bench.engines import entry as engines
from bench.executors import Job, WorkerDied, make_executor
from bench.faults import StoreUnreachable
from bench.plugins import PLUGINS_CHANGED, check_shippable, with_plugins
from bench.runs.identity import written_by_note
from bench.runs.run import (
    RunFolderBusy,
    check_claimable,
    check_removable,
    end_runs_of_killed,
    experiment_dir,
    folder_held,
    folder_in_use,
    has_checkpoint,
    left_running,
    remove_run_folder,
)
from bench.runs.store_check import check_outside_artifacts, check_reachable
from bench.runs.tracking import answering, store_client, version_tags
from bench.workers import LOST_WORKER, stop_grace_s
from reports.record import (
    COMPARISON,
    CONFIG_HASH,
    FAILURE,
    KIND,
    OBJECTIVES,
    SEEDS,
    get_or_create_experiment,
    member_tag,
    retry_locked,
    tracking_uri,
)
from reports.report import build_report, report_folder

NOT_LOADED = " failed to load in a worker process: "  # (bench.workers.pool_worker_setup's words)


@dataclass
class ComparisonSpec:
    """Everything one `bench run` needs (the command line builds it from its flags: bench/cli/run.py)."""

    cfg: TrainConfig                          # the comparison's config (every pair's, but objective and seed)
    algos: list[str]
    seeds: list[int]
    params: dict[str, dict[str, Any]] = field(default_factory=dict)   # objective -> config overrides (--params)
    force: bool = False                       # redo pairs that already finished
    workers: int | None = None                # RunDefaults.workers when None (with ray: a local instance's CPUs)
    executor: str | None = None               # local | ray (RunDefaults.executor when None)
    ray_address: str | None = None            # the Ray cluster to connect to (default: start a local instance)
    # on_eval(pair, step, metrics) after each held-out evaluation of a pair (it may raise bench.engines.StopTraining);
    # with more than one worker it runs in the worker processes (Ray tasks), so it must be picklable
    on_eval: Callable[[Pair, int, dict[str, float]], None] | None = None
    train_fn: TrainFn = engines.train         # trains one pair's config: train_fn(cfg, on_eval=, on_step=, step0_eval=)
    step0_fn: Callable[[TrainConfig, list[int]], dict[int, dict[str, float]]] = initial_evals  # shared step 0
    report: bool = True                       # write the report afterwards
    baseline: str | None = None
    target_acc: float | None = None
    out_root: str | Path = "reports/out"
    report_options: Any = None                # how the report is drawn (reports.report.ReportOptions)
    progress: bool = True                     # the live display (LiveDisplay)
    # what to do with each warning of the checks before any work (check_comparison); None: print it to stderr.
    # A module-level function (the spec reaches worker processes)
    on_warning: Callable[[str], None] | None = None


# the outcomes of a pair whose run is complete (the report reads them; a rerun reuses them)
KEPT = ("reused", "finished", "stopped early")


class ComparisonStopped(KeyboardInterrupt):
    """A comparison stopped by Ctrl-C / SIGTERM (its MLflow run ended KILLED): its id, how many of its ``total`` pairs
    are complete (reused or trained: ``finished``) and how many others hold a checkpoint (``checkpointed``); the same
    call resumes it."""

    def __init__(self, comparison: str, finished: int, checkpointed: int, total: int) -> None:
        super().__init__(f"comparison {comparison}: {finished} of {total} pairs finished, {checkpointed} checkpointed")
        self.comparison, self.finished, self.checkpointed, self.total = comparison, finished, checkpointed, total


@dataclass
class ComparisonResult:
    comparison: str
    experiment: str
    tracking_uri: str
    pairs: list[Pair]
    report: Any = None               # reports.report.Report when written
    seconds: float = 0.0
    workers: int = 1                 # pairs trained at once: processes (local) or Ray task slots (ray)
    executor: str = "local"          # executors.py

    @property
    def failed(self) -> list[Pair]:
        return [p for p in self.pairs if p.outcome.startswith("failed")]


def comparison_run(client, exp_id: str, cid: str, cfg: TrainConfig, algos: list[str], seeds: list[int]) -> str:
    """The comparison's own MLflow run (``pobench.kind=comparison``): found, or created with its config; one per
    comparison, also when two `bench run` of it start at once."""
    with pair_lock(lock_file(cfg.output_dir, cfg.experiment, f"comparison-{cid}"), f"comparison {cid}"):
        found = client.search_runs([exp_id], filter_string=(
            f"tags.`pobench.kind` = 'comparison' and tags.`pobench.comparison` = '{cid}'"), max_results=1)
        if found:  # (a later bench run of it may add objectives or seeds: the run records every pair asked for)
            run_id, tags = found[0].info.run_id, found[0].data.tags
            for key, values in ((OBJECTIVES, algos), (SEEDS, list(map(str, seeds)))):
                had = [v for v in tags.get(key, "").split(",") if v]
                if set(values) - set(had):
                    client.set_tag(run_id, key, ",".join([*had, *[v for v in values if v not in had]]))
            client.update_run(run_id, status="RUNNING")
            return run_id
        run = client.create_run(exp_id, run_name=f"comparison-{cid}", tags={
            KIND: "comparison", COMPARISON: cid, CONFIG_HASH: cfg.comparison_hash(),
            OBJECTIVES: ",".join(algos), SEEDS: ",".join(map(str, seeds))})
    try:
        client.log_text(run.info.run_id, yaml.safe_dump(cfg.to_dict(), sort_keys=False), "config.yaml")
    except BaseException:  # (its artifact store refused it: the run is not left RUNNING behind the one line)
        with contextlib.suppress(Exception):
            client.set_terminated(run.info.run_id, status="FAILED")
        raise
    return run.info.run_id


def check_comparison(spec: ComparisonSpec) -> list[str]:
    """Every check `bench run` makes before any work, for every caller (the command line, a notebook): the store
    reachable, the output folder and (``spec.report``) the report's folder usable, each objective trainable by the
    engine with its params, the engine able to train pairs side by side when more than one worker is asked for; one
    ValueError line otherwise. Returns the warnings (params outside their declared ranges, what reading the inputs
    found)."""
    cfg = spec.cfg
    stop_grace_s()  # (a malformed $POBENCH_POOL_STOP_GRACE: one line now, not ignored at the stop)
    check_reachable(cfg.tracking_uri, experiment=cfg.experiment)
    faults.check_output_folder(cfg.output_dir, "--output-dir", OUTPUT_DIR)  # a file there, read-only: one line
    check_outside_artifacts(cfg.tracking_uri, cfg.experiment, cfg.output_dir, "--output-dir")
    if spec.report:  # a foreign folder where the report would go: one line now, not after training
        faults.check_output_folder(spec.out_root, "--out-root")
        reports_in = experiment_dir(spec.out_root, cfg.experiment)  # (the clash first: round 17, H22)
        runs_in = experiment_dir(cfg.output_dir, cfg.experiment)
        a, b = reports_in.resolve(), runs_in.resolve()
        if a == b or a in b.parents or b in a.parents:  # (the report would replace, or be made inside, the runs)
            raise ValueError(f"--output-dir {cfg.output_dir} and --out-root {spec.out_root} put the runs and the "
                             f"report of experiment {cfg.experiment!r} in one folder ({runs_in}): give them "
                             "different folders (the defaults are .pobench/runs and reports/out)")
        report_folder(spec.out_root, cfg.experiment)  # (a user's folder there: its own line)
    for a in spec.algos:  # what the engine cannot train: one line now, not one failed pair after another
        engines.check(replace(cfg, algo=a, objective_overrides=dict(spec.params.get(a, {}))))
    engine = engines.engine_for(cfg)
    if not engine.capabilities.parallel_pairs and (spec.executor == "ray" or (spec.workers or 0) > 1):
        raise ValueError(f"--engine {engine.name} runs one pair at a time from this process (each job takes the "
                         "cluster it is given): drop --executor ray / --workers above 1")
    ranges = [preflight.range_warning(a, spec.params.get(a, {})) for a in spec.algos]  # outside declared ranges
    return list(dict.fromkeys([*filter(None, ranges), *preflight.check_inputs(cfg)]))  # every source read, ...


def _print_warning(warning: str) -> None:
    print(f"pobench: warning: {warning}", file=sys.stderr)


def run_comparison(spec: ComparisonSpec) -> ComparisonResult:
    """Train the missing pairs of the comparison, then (``spec.report``) write its report. First every check `bench
    run` makes (``check_comparison``), so a notebook's call is refused as the command is."""
    t_start = time.perf_counter()
    ex = make_executor(spec.executor or DEFAULTS.executor, workers=spec.workers, ray_address=spec.ray_address)
    for warning in check_comparison(spec):
        (spec.on_warning or _print_warning)(warning)
    algos, seeds = spec.algos, spec.seeds
    params = {a: dict(spec.params.get(a, {})) for a in algos}
    cfg = with_plugins(spec.cfg, algos)  # the plugins the objectives and tasks come from, named in the config
    for a in algos:  # every objective validates with its overrides before any run starts
        replace(cfg, algo=a, objective_overrides=params[a]).validate()
    if spec.report and cfg.eval_every == 0:  # (the report would fail only after every pair had trained)
        raise ValueError("config field `eval_every`=0: the report compares held-out accuracy, which eval_every 0 "
                         "never measures; set --eval-every >= 1, or pass --no-report")
    cfg = ex.prepare(replace(cfg, tracking_uri=tracking_uri(cfg.tracking_uri)))
    uri = cfg.tracking_uri
    known: dict[str, Any] = {}  # (the comparison and its pairs, once planned: what a lost server's line says is kept)
    try:
        # every request of the comparison itself (its run, the reuse marks, the report) bounded as a run's are: a
        # server lost mid-comparison is one `stopped:` line within $POBENCH_MLFLOW_TIMEOUT, not minutes of MLflow's
        # retries and its traceback (found by the lead after held-out round 10)
        with answering(uri):
            return _open_and_run(spec, ex, cfg, uri, algos, seeds, params, t_start, known)
    except StoreUnreachable as e:
        if "pairs" not in known:
            raise
        s = _stopped(cfg, known["cid"], known["pairs"])
        raise StoreUnreachable(f"{e}; kept: {s.finished} of {s.total} pairs of comparison {s.comparison} finished, "
                               f"{s.checkpointed} checkpointed (the rerun reuses and resumes them, and ends the runs "
                               "left RUNNING)") from None
    except Exception as e:  # the store's disk full: as a lost server, what is kept and the rerun (round 15, H07)
        line = faults.describe(e, store=uri) if "pairs" in known else None
        if line is None or not line.startswith("no space left on device"):
            raise
        s = _stopped(cfg, known["cid"], known["pairs"])
        raise faults.StoreRefused(f"{line}, then rerun the same command; kept: {s.finished} of {s.total} pairs of "
                                  f"comparison {s.comparison} finished, {s.checkpointed} checkpointed (the rerun "
                                  "reuses and resumes them, and ends the runs left RUNNING)") from None


def _open_and_run(spec: ComparisonSpec, ex, cfg: TrainConfig, uri: str, algos: list[str], seeds: list[int],
                  params: dict[str, dict[str, Any]], t_start: float, known: dict[str, Any]) -> ComparisonResult:
    """``run_comparison`` once every check passed: plan, open the comparison's run, train, report."""
    client = store_client(uri)  # (a fresh local store is created under a lock: reports/record.py open_client)
    cid, pairs = plan(cfg, algos, seeds, params, force=spec.force, client=client)
    known.update(cid=cid, pairs=pairs)
    if spec.report:  # a file of its earlier report the user edited: refused now, not after training (H14)
        report_folder(spec.out_root, cfg.experiment, cid)
    for p in pairs:  # a folder pobench may not write into or delete: refused now, before any record
        if spec.force:  # (--force deletes only what pobench wrote in its own run folders)
            check_removable(run_dir(cfg, p))
        elif p.action != "reuse":
            check_claimable(run_dir(cfg, p))
    for p in pairs if spec.force else []:
        if folder_in_use(run_dir(cfg, p)):  # (at once, before any record; the deletion itself holds the folder)
            raise RunFolderBusy(f"--force: {run_dir(cfg, p)} is being trained by another process now; wait for it "
                                "to end, then redo the comparison with --force")
    check_resumed_pairs(cfg, cid, pairs)  # (a pair folder of another store: one line now, no comparison run made)
    if ex.spawns(sum(p.action != "reuse" for p in pairs), cfg):  # a notebook's objective: one line, no worker
        check_shippable(cfg, algos)
    exp_id = get_or_create_experiment(client, uri, cfg.experiment)
    live = _live_lock(cfg, cid)  # held while this process runs the comparison (the kernel lets it go if killed)
    try:
        # the runs a killed `bench run` left RUNNING here, whatever its flags were
        _end_killed(cfg, client, exp_id, frozenset(run_dir(cfg, p) for p in pairs))
        parent = comparison_run(client, exp_id, cid, cfg, algos, seeds)
        return _run(spec, ex, cfg, cid, pairs, client, exp_id, parent, uri, seeds, t_start)
    finally:
        live.release()
        Path(live.lock_file).unlink(missing_ok=True)


def _live_lock(cfg: TrainConfig, cid: str) -> FileLock:
    """``.locks/comparison-<cid>-<pid>.live.lock``, held by this process while it runs comparison ``cid``: a later
    command knows from it being free that the process whose comparison run is RUNNING is gone (``_end_killed``)."""
    path = lock_file(cfg.output_dir, cfg.experiment, f"comparison-{cid}-{os.getpid()}.live")
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), thread_local=False)
    lock.acquire()
    return lock


def _end_killed(cfg: TrainConfig, client, exp_id: str, own: frozenset[Path]) -> None:
    """End the runs a killed `bench run` (SIGKILL, the OOM killer) left RUNNING in this experiment's folder,
    whatever flags it had (held-out round 8: only the same command, whose pair folders and comparison id are the
    same, ended them): its pairs' runs (``end_runs_of_killed``: by their folder's run lock) and its comparison runs
    RUNNING whose every ``.live`` lock in this folder is free (KILLED). Its own pairs' folders (``own``) are left to
    their training, which ends or resumes what they hold. A run a live process holds is left alone; a
    comparison run with no live lock here (another output folder's) too."""
    folder = experiment_dir(cfg.output_dir, cfg.experiment)
    ended = end_runs_of_killed(cfg, folder, skip=own)  # (its own pairs' folders: their training ends them)
    found = client.search_runs([exp_id], filter_string=(
        "tags.`pobench.kind` = 'comparison' and attributes.status = 'RUNNING'"))
    for run in found:
        cid = run.data.tags.get(COMPARISON, "")
        if not cid.isalnum():
            continue
        with pair_lock(lock_file(cfg.output_dir, cfg.experiment, f"comparison-{cid}"), f"comparison {cid}"):
            files = sorted((folder / ".locks").glob(f"comparison-{cid}-*.live.lock"))
            held: list[FileLock] = []
            try:
                for f in files:
                    lock = FileLock(str(f), thread_local=False)
                    try:
                        lock.acquire(timeout=0)
                    except Timeout:  # its process is alive
                        break
                    held.append(lock)
                else:
                    if held and client.get_run(run.info.run_id).info.status == "RUNNING":
                        client.set_tag(run.info.run_id, FAILURE, "its `bench run` process was killed (SIGKILL, out "
                                       "of memory) before the comparison ended; ended KILLED by the next command")
                        retry_locked(client.set_terminated, run.info.run_id, status="KILLED")
                        ended.append(run.info.run_id)
                        for f in files:
                            f.unlink(missing_ok=True)
            finally:
                for lock in held:
                    lock.release()
    if ended:
        print(f"pobench: note: {len(ended)} MLflow run(s) left RUNNING by a killed process in {folder} were ended: "
              f"{', '.join(ended)}", file=sys.stderr)


def _run(spec: ComparisonSpec, ex, cfg: TrainConfig, cid: str, pairs: list[Pair], client, exp_id: str, parent: str,
         uri: str, seeds: list[int], t_start: float) -> ComparisonResult:
    """``run_comparison`` once its MLflow run is open."""
    # from here on the comparison's run ends KILLED on Ctrl-C / SIGTERM (with what is kept said) or on any fault,
    # and FINISHED / FAILED only once its report is written: a run marked ended has its report
    try:
        try:
            status, n_workers = _train(spec, ex, cfg, cid, pairs, client, exp_id, parent)
        finally:
            ex.close()
        result = ComparisonResult(cid, cfg.experiment, uri, pairs, workers=n_workers, executor=ex.name)
        earlier = report_folder(spec.out_root, cfg.experiment, cid) if spec.report else None
        if earlier is not None and result.failed and (earlier / "report.md").is_file():
            # a pair failed: the earlier report of this comparison is kept, not replaced by one that lacks the pair
            # (held-out round 8: a complete report was silently replaced by one holding the other objective alone)
            print(f"pobench: the earlier report {earlier / 'report.md'} is kept: {len(result.failed)} pair(s) failed "
                  f"this time; rerun the command to train them, or `bench report --comparison {cid}` to report the "
                  "pairs that finished", file=sys.stderr)
        elif spec.report and any(p.outcome.startswith(KEPT) for p in pairs):  # (swapped in whole, or not at all)
            result.report = build_report(cfg.experiment, cid, uri, out_root=spec.out_root, baseline=spec.baseline,
                                         target_acc=spec.target_acc, objectives=[p.variant for p in pairs],
                                         seeds=seeds, client=client, options=spec.report_options,
                                         on_busy=lambda line: print(f"pobench: {line}", file=sys.stderr),
                                         left_running=left_running)
    except KeyboardInterrupt:
        retry_locked(client.set_terminated, parent, status="KILLED")
        raise _stopped(cfg, cid, pairs) from None
    except BaseException:
        with contextlib.suppress(Exception):  # (a lost server: the next command ends it, `_end_killed`)
            retry_locked(client.set_terminated, parent, status="KILLED")
        raise
    retry_locked(client.set_terminated, parent, status=status)
    result.seconds = time.perf_counter() - t_start
    return result


def _stopped(cfg: TrainConfig, cid: str, pairs: list[Pair]) -> ComparisonStopped:
    finished = sum(p.outcome.startswith(KEPT) for p in pairs)
    ckpt = sum(not p.outcome.startswith(KEPT) and has_checkpoint(run_dir(cfg, p)) for p in pairs)
    return ComparisonStopped(cid, finished, ckpt, len(pairs))


def _train(spec: ComparisonSpec, ex, cfg: TrainConfig, cid: str, pairs: list[Pair], client, exp_id: str,
           parent: str) -> tuple[str, int]:
    """``run_comparison`` once its MLflow run exists: reuse, then train the missing pairs. Returns the run's status
    (FINISHED, or FAILED when a pair failed) and the pairs trained at once."""
    params = {a: dict(spec.params.get(a, {})) for a in spec.algos}
    warn_before_run(cfg, spec.algos, params, client=client, run_id=parent)  # coinciding objectives, inert terms

    now = version_tags()  # a run reused from another pobench version / commit is named as such
    for p in pairs:
        if p.action == "reuse":
            client.set_tag(p.run_id, member_tag(cid), "1")
            p.outcome = "reused" + written_by_note(client.get_run(p.run_id).data.tags, now)
    if spec.force:  # runs this comparison redoes stop counting as its members
        for p in pairs:
            for r in client.search_runs([exp_id], filter_string=(
                    f"tags.`pobench.kind` = 'train' and tags.`{member_tag(cid)}` = '1' and "
                    f"tags.`pobench.objective` = '{p.objective}' and tags.`pobench.seed` = '{p.seed}'")):
                client.set_tag(r.info.run_id, member_tag(cid), "0")
            with folder_held(run_dir(cfg, p)):  # (no training starts in it while it goes; one running: refused)
                kept = remove_run_folder(run_dir(cfg, p), experiment_dir(cfg.output_dir, cfg.experiment))
            if kept:  # a user's files in a pobench run folder stay (bench/runs/folders.py RUN_LAYOUT)
                names = ", ".join(str(k.relative_to(run_dir(cfg, p))) for k in kept[:5])
                more = f" and {len(kept) - 5} more" if len(kept) > 5 else ""
                print(f"--force: kept {names}{more} in {run_dir(cfg, p)}: pobench did not write them", file=sys.stderr)

    todo = [p for p in pairs if p.action != "reuse"]
    ctx = PairContext(cfg, cid, parent, exp_id, spec.force, spec.train_fn, spec.on_eval)
    # the starting policy's held-out evaluation, once for the comparison (pairs that start from scratch need it),
    # when the engine takes one computed here (verl evaluates the starting policy itself, in its own job)
    fresh = sorted({p.seed for p in todo if p.action == "train"})
    shared_step0 = (fresh and cfg.eval_every > 0 and cfg.backend == "hf"
                    and engines.engine_for(cfg).capabilities.step0_eval)
    status = "FINISHED"

    def finished(task: Job, r: PairResult) -> None:
        nonlocal status
        p = todo[r.index]
        p.outcome = r.outcome
        if r.action:
            p.action = r.action
        p.run_id = r.run_id or p.run_id
        if r.outcome.startswith("failed"):
            status = "FAILED"
        display.done(r.index, p, r.error)

    said: list[str] = []  # (the plugins changed as the pool started: the whole line once, each pair's short)

    def pair_failed(i: int) -> Callable[[str, str], PairResult]:
        def failed(why: str, detail: str) -> PairResult:
            if why.startswith(PLUGINS_CHANGED):  # (held-out round 14, H19: 3 times per pair)
                why, detail = why.split("; ")[0], "" if why in said else why
                said.append(detail)
            elif NOT_LOADED in why:  # (round 15, H09: its sentence 7 times for 2 pairs): whole once, each pair short
                short = why.split(NOT_LOADED)[0] + NOT_LOADED.rstrip(": ")
                detail = "" if why in said else (f"{why}: fix the plugin's import (it loads in this process, not in "
                                                 "a worker process), then rerun the same command")
                said.append(why)
                why = short
            return PairResult(i, f"failed: {why}", "train", error=(
                f"{todo[i].variant} seed {todo[i].seed}: {detail}" if detail else ""))  # (none: it says it all)
        return failed

    # the pool's size, or the Ray connection and task resources
    n_workers = ex.start(len(todo), cfg, {"on_eval": spec.on_eval, "train_fn": spec.train_fn})
    display = LiveDisplay(cid, pairs, cfg.steps, enabled=spec.progress, workers=n_workers)
    with display:
        step0: dict[int, dict[str, float]] = {}
        if shared_step0:
            got = ex.run([Job(-1, step0_task, (spec.step0_fn, cfg, fresh), not_started={}, interrupted={})],
                         display.event)[-1]
            if isinstance(got, WorkerDied):  # (a plugin not loaded there: said with the pairs, round 15 H09)
                why = got.why.split(NOT_LOADED)[0] + NOT_LOADED.rstrip(": ") if NOT_LOADED in got.why else got.why
                display.print(f"  the shared step-0 evaluation failed ({why}); each run evaluates its own step 0")
            else:
                step0 = got
        tasks = [Job(i, run_pair, (PairJob(i, p, ctx, step0.get(p.seed)),), not_started=PairResult(i, "not "
                      "started"), interrupted=PairResult(i, "interrupted"), failed=pair_failed(i),
                     label=f"{p.variant} seed {p.seed}") for i, p in enumerate(todo)]
        ex.run(tasks, display.event, on_result=finished)
    if any(LOST_WORKER in p.outcome for p in todo):  # a worker process killed: its run, left RUNNING, ends now
        ended = end_runs_of_killed(cfg, experiment_dir(cfg.output_dir, cfg.experiment))
        if ended:
            print(f"pobench: note: the MLflow run(s) of the lost worker were ended: {', '.join(ended)}",
                  file=sys.stderr)
    return status, n_workers
