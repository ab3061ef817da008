"""`bench tune`: the command line of an Optuna search over an objective's tunable fields, and `bench tune --show`.

Flags and their checks only; the library is the package ``bench.tune`` (search space, metric, storage, the study
loop, MLflow runs, outputs). See docs/TUNING.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import faults, preflight, tune
from bench.cli import interrupt
from bench.cli.flags import add_config_flags, add_preset_flag, config_from_args
from bench.cli.interrupt import Stopped, rerun_to_resume
from bench.config import OUTPUT_DIR, TrainConfig
from bench.engines import RunStopped
from bench.inputs import check_seed
from bench.runs.server_answers import ServerError
from bench.runs.store_check import check_outside_artifacts, check_reachable
from bench.runs.tracking import answering, bounded_http, timeout_s
from bench.tune.confirm import summary_of
from bench.tune.outputs import print_leaderboard, study_dir, write_outputs
from bench.tune.outputs import show as show_study
from bench.workers import parse_seeds, stop_grace_s
from reports.edits import check_unedited
from reports.paths import check_out_is_ours, claim_output_folder
from reports.record import open_client, sqlite_file, tracking_uri

# TrainConfig fields a study sets itself per trial (the rest come from --config and the flags)
SKIP = ("algo", "seed", "run_name", "comparison", "resume")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="Optuna search over an objective's hyper-parameters",
                       description="Search an objective's tunable fields with Optuna (see docs/TUNING.md). Outputs in "
                                   "--out: best.yaml, summary.csv / .md, importance.csv / .md (fANOVA: how much each "
                                   "parameter's variation explains the spread of the trial values; not whether the "
                                   "best setting beats the default), plots; with --confirm-seeds, confirm.md / .csv "
                                   "(the best trial against the default on fresh seeds).")
    p.add_argument("--algo", help="objective to tune (`bench list`)")
    p.add_argument("--trials", type=int, default=30, help="finished (complete or pruned) trials the study needs, "
                                                          "counted over every worker (default 30)")
    p.add_argument("--space", help="narrow or add ranges: name=low:high[:log] or name=a|b, comma-separated "
                                   "(default: the ranges the objective declares, minus the fields "
                                   "--objective-overrides fixes)")
    p.add_argument("--metric", default="eval/accuracy",
                   help="eval/KEY (value at the end, maximised) or steps_to:eval/KEY>=X / seconds_to:eval/KEY>=X "
                        "(time to reach X, minimised); default eval/accuracy")
    p.add_argument("--direction", choices=["maximize", "minimize"], help="override the metric's direction")
    p.add_argument("--seeds", default="0", help="comma-separated seeds; a trial's value is the mean (default 0)")
    p.add_argument("--study", help="study name (default tune-<algo>); an existing study is resumed / joined")
    p.add_argument("--storage", help="SQLAlchemy URL of the Optuna storage, e.g. postgresql://user@host/db "
                                     f"(default {tune.default_storage_url()})")
    p.add_argument("--config", help="base TrainConfig YAML every trial starts from (the flags below override it)")
    add_preset_flag(p)
    p.add_argument("--pruner", default="median", help="median | percentile:P | hyperband | none (default median)")
    p.add_argument("--pruner-warmup", type=int, default=1, help="reports of a trial before it may be pruned")
    p.add_argument("--pruner-startup", type=int, default=2, help="finished trials before pruning starts")
    p.add_argument("--heartbeat", type=int, default=30, help="seconds between worker heartbeats (default 30)")
    p.add_argument("--grace", type=int, help="seconds without heartbeat before a trial counts as dead and is "
                                             "re-queued (default 4 x heartbeat)")
    p.add_argument("--max-retry", type=int, default=3, help="re-queues per trial whose worker died (default 3)")
    p.add_argument("--sampler-seed", type=int, help="seed of the TPE sampler (default random: workers differ)")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="workers that run the study's trials at once, each in its own process with one torch thread "
                        "(or Ray task with --executor ray); 0 = one per CPU core (one on a GPU), at most the trials "
                        "still needed; 1 = in this process (default 0)")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="where the workers run: local = this machine's processes; ray = Ray tasks on a local Ray "
                        "instance or the cluster at --ray-address (the storage and MLflow store must be reachable "
                        "from every node) (default local)")
    p.add_argument("--ray-address", metavar="ADDR", help="with --executor ray: the cluster to join (auto, HOST:PORT, "
                                                          "ray://HOST:10001) (default: a local Ray instance)")
    p.add_argument("--confirm-seeds", metavar="SEEDS",
                   help="after the study: train the objective's default and the best trial's setting once per seed "
                        "of SEEDS (comma-separated, none of --seeds) under the same base configuration, with the "
                        "same --workers / --executor, and write confirm.md / confirm.csv: the paired difference best "
                        "- default with its 95%% t interval, the paired t-test and a verdict that follows the "
                        "interval; finished runs are reused, so a rerun trains only what is missing")
    p.add_argument("--out", help="output folder (default .pobench/tune/<study>)")
    p.add_argument("--show", action="store_true", help="print the leaderboard of --study and write its outputs "
                                                       "(importances, and the confirm's result when it has one)")

    add_config_flags(p, skip=SKIP)  # --steps, --prompts-per-step, --tracking-uri, ... as in `bench train`
    p.set_defaults(func=main)


def _base_config(args: argparse.Namespace) -> TrainConfig:
    """``--preset`` < ``--config`` file < TrainConfig flags; validated with the objective's default config."""
    return config_from_args(args, algo=args.algo)


def spec_from_args(args: argparse.Namespace) -> tune.TuneSpec:
    """Validate every input (objective, space, metric, storage flags) before any trial starts."""
    if not args.algo:
        raise ValueError("--algo is required (e.g. --algo tepo)")
    if args.sampler_seed is not None:
        check_seed(args.sampler_seed, "--sampler-seed")
    if args.trials < 1:
        raise ValueError(f"--trials {args.trials}: must be >= 1")
    for flag, value in (("--pruner-warmup", args.pruner_warmup), ("--pruner-startup", args.pruner_startup),
                        ("--max-retry", args.max_retry)):
        if value < 0:  # (Optuna's own words named no flag; a negative --max-retry was taken)
            raise ValueError(f"{flag} {value}: must be >= 0")
    if args.heartbeat < 1 or (args.grace is not None and args.grace <= args.heartbeat):
        raise ValueError("--heartbeat must be >= 1 and --grace longer than --heartbeat")
    base = _base_config(args)
    if base.eval_every == 0:
        raise ValueError("config field `eval_every`=0: a trial is scored on held-out evaluations; set eval_every >= 1")
    spec = tune.TuneSpec(
        algo=args.algo, base=base, space=tune.resolve_space(args.algo, args.space, base.objective_overrides),
        metric=tune.parse_metric(args.metric, args.direction), study=study_name(args),
        trials=args.trials, seeds=parse_seeds(args.seeds, default=(0,)), storage=args.storage, pruner=args.pruner,
        pruner_warmup=args.pruner_warmup, pruner_startup=args.pruner_startup, heartbeat=args.heartbeat,
        grace=args.grace, max_retry=args.max_retry, sampler_seed=args.sampler_seed)
    tune.check_kept(spec.storage)  # an in-memory storage: lost with the process
    tune.make_pruner(spec.pruner)  # bad pruner spec -> error now
    tune.check_reported(spec.metric, base)  # a key the evaluation does not report -> error now
    return spec


def study_name(args: argparse.Namespace) -> str:
    """``--study`` (default ``tune-<algo>``), refused now when it cannot name the study's storage entry and its
    output folder (blank, longer than Optuna stores): it was refused only after the study had run."""
    study = f"tune-{args.algo}" if args.study is None else args.study
    study_dir(tune.DEFAULT_DIR, study)  # blank / not a string: one line (UnsafePath)
    if len(study) > 512:  # (Optuna's storage column)
        raise ValueError(f"--study: {len(study)} characters; the Optuna storage holds at most 512")
    return study


def confirm_seeds_from_args(args: argparse.Namespace, spec: tune.TuneSpec) -> list[int]:
    """``--confirm-seeds``: none of the study's ``--seeds`` (refused with one line, before anything is created)."""
    if args.confirm_seeds is None:
        return []
    seeds = parse_seeds(args.confirm_seeds, default=(), flag="--confirm-seeds")
    tune.check_seeds(spec.seeds, seeds)
    return seeds


def check_joined_settings(spec: tune.TuneSpec) -> None:
    """A study the storage holds already, created with other settings: refused (one line, exit 2) before anything is
    made, the MLflow store included (held-out round 15, H24: the refusal came after the store was created, and left an
    empty `mlflow.db`). A storage file not there yet holds no study: nothing is opened."""
    import optuna

    from bench.tune.study import _check_fingerprint

    url = spec.storage or tune.default_storage_url()
    db = sqlite_file(url)
    if db is not None and not db.exists():
        return
    try:
        study = optuna.load_study(study_name=spec.study, storage=tune.open_storage(url))
    except KeyError:  # (no study of that name: created by the work)
        return
    if study.user_attrs.get("algo"):  # (one another worker creates just now: checked when joined, as before)
        _check_fingerprint(study, spec)


def main(args: argparse.Namespace) -> int:
    if args.show:
        if args.confirm_seeds is not None:
            raise ValueError("--show only writes what a study holds; --confirm-seeds trains runs: drop one of them")
        return show(args)

    spec = spec_from_args(args)
    confirm_seeds = confirm_seeds_from_args(args, spec)
    check_joined_settings(spec)  # (before the MLflow store is made: round 15, H24, an empty mlflow.db was left)
    stop_grace_s()  # (a malformed $POBENCH_POOL_STOP_GRACE: one line now, not ignored at the stop: round 16, H28)
    check_reachable(spec.base.tracking_uri, experiment=spec.base.experiment)
    faults.check_output_folder(spec.base.output_dir, "--output-dir", OUTPUT_DIR)  # a file there, read-only: one line
    tune.check_default_dir(spec.storage, args.out)  # a file at .pobench/tune, where the defaults go: one line now
    check_outside_artifacts(spec.base.tracking_uri, spec.base.experiment, spec.base.output_dir, "--output-dir")
    if args.out:  # a folder of the user's holding other files: refused now, not after the study
        faults.check_output_folder(args.out, "--out")
        check_out_is_ours(args.out, "--out")  # (and a file of it pobench wrote, edited since: one line, H14)
    else:
        check_unedited(study_dir(tune.DEFAULT_DIR, spec.study), "the study's outputs folder")
    faults.note(storage=tune.redact(spec.storage or tune.default_storage_url()))
    for warning in preflight.check_inputs(spec.base):  # every source read, answers and prompt lengths counted
        print(f"bench tune: warning: {warning}", file=sys.stderr)
    tune.check_worker_settings(spec, args.workers, args.executor, args.ray_address)  # (before any file is made)
    tune.check_new_study(spec)  # an earlier study of its name in another storage: its trials' folders and runs
    local = _local_files(spec)  # (identity of the SQLite files the study writes to, as they are now)
    uri = tracking_uri(spec.base.tracking_uri)
    try:
        # every request of the study (its run, its trials' runs, in this process and its workers') bounded as a run's
        # are: a server lost or answering an error status is one `stopped:` line within $POBENCH_MLFLOW_TIMEOUT, not
        # minutes of MLflow's retries, silent, deaf to SIGTERM (held-out round 11, H10)
        with answering(uri):
            study = tune.run_workers(spec, args.workers, args.executor, args.ray_address)
    except (faults.StoreUnreachable, ServerError) as e:
        print(f"bench tune: stopped: {_store_failed(spec, uri, e)}", file=sys.stderr)
        return 1
    except tune.StudyStopped as e:  # SIGINT / SIGTERM: each running trial ends FAIL and is queued again
        if e.finished is None:  # (the storage did not answer the stop: held-out round 11, H15)
            raise Stopped(f"the finished trials of study {e.study!r} in {e.storage} (it did not answer just now: the "
                          "rerun queues the running trials again once it answers)", rerun_to_resume()) from None
        raise Stopped(f"{e.finished} of {e.trials} trials finished of study {e.study!r} in {e.storage} (the running "
                      "trials are queued again)", rerun_to_resume()) from None
    except RunStopped as e:  # a trial's run stopped by the MLflow server gone or a full disk: one line
        print(f"bench tune: stopped: {_gone(local) or _trial_stopped(spec, e)}", file=sys.stderr)  # (a deleted
        # file: said as such)
        return 1
    gone = _gone(local)
    if gone:
        print(f"bench tune: stopped: {gone}", file=sys.stderr)
        return 1
    try:  # the study is complete from here: a stop while its outputs are written keeps it (the rerun finds it done)
        out = claim_output_folder(args.out, "--out") if args.out else study_dir(tune.DEFAULT_DIR, spec.study)
        paths = write_outputs(study, out)  # (before the confirm: a stopped confirm leaves the study's outputs written)
        print_leaderboard(study)
    except KeyboardInterrupt:
        raise Stopped(f"the study {spec.study!r} with its {len(study.trials)} trials, complete, in "
                      f"{tune.redact(spec.storage or tune.default_storage_url())} (its outputs may be incomplete)",
                      rerun_to_resume()) from None
    failed = 0
    if confirm_seeds:
        try:
            record = tune.run_confirm(spec, study, confirm_seeds, args.workers, args.executor, args.ray_address)
        except tune.ConfirmStopped as e:  # finished runs are reused by the rerun, checkpointed ones resumed
            raise Stopped(f"{e.finished} of {e.total} confirm runs of study {e.study!r} finished (the study's "
                          f"outputs are in {out})", rerun_to_resume()) from None
        paths.update(tune.write_confirm(study, out))
        failed = _print_confirm(record)
    try:
        with answering(uri):
            tune.log_outputs(spec, study, out)
    except (faults.StoreUnreachable, ServerError) as e:
        print(f"bench tune: stopped: {e}; kept: the study {spec.study!r}, complete, and its outputs in {out} (not all "
              "logged to MLflow yet): once the server answers again, rerun the same command", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise Stopped(f"the study {spec.study!r}, complete, and its outputs in {out} (not all logged to MLflow yet)",
                      rerun_to_resume()) from None
    interrupt.finished()  # the study and its outputs are complete: a signal from now on changes nothing
    print(f"outputs in {out}: {', '.join(sorted(p.name for p in paths.values()))}")
    if failed:
        print(f"bench tune: {failed} confirm run(s) failed (confirm.md names them); rerun the command to train them",
              file=sys.stderr)
        return 1
    return 0


def _print_confirm(record: dict | None) -> int:
    """The confirm's verdict in one line; returns the number of its runs without a value."""
    if not record or record.get("same"):
        return 0
    s = summary_of(record)
    interval = "n/a" if s.low is None else f"[{s.low:+.4g}, {s.high:+.4g}]"
    diff = "n/a" if s.diff is None else f"{s.diff:+.4g}"
    print(f"confirm of trial {record['trial']} on seeds {','.join(map(str, record['seeds']))}: best - default = "
          f"{diff}, 95% interval {interval}. {s.sentence}")
    return sum(r["value"] is None for r in record["runs"])


def show(args: argparse.Namespace) -> int:
    if args.study is not None:
        study_name(args)
    if not args.out and args.study:  # (a file pobench wrote there, edited since: one line, not replaced)
        check_unedited(study_dir(tune.DEFAULT_DIR, args.study), "the study's outputs folder")
    out = show_study(args.study, args.storage, claim_output_folder(args.out, "--out") if args.out else None)
    print(f"outputs in {out}")
    return 0


def _store_failed(spec: tune.TuneSpec, uri: str, error: BaseException) -> str:
    """The line of a study stopped by its MLflow server (gone, or answering an error status): the cause, the
    finished trials kept in the storage, what became of the study's MLflow run (ended FAILED, or left for the rerun,
    which continues it), and what to do."""
    import contextlib

    import optuna

    url = spec.storage or tune.default_storage_url()
    finished, parent, status = "?", None, None
    with contextlib.suppress(Exception):  # (what cannot be read is said as unknown)
        study = optuna.load_study(study_name=spec.study, storage=tune.open_storage(url))
        finished = str(tune.count(study, *tune.FINISHED))
        parent = study.user_attrs.get("mlflow_parent_run_id")
    if parent:
        with contextlib.suppress(Exception), bounded_http(timeout_s()):
            status = open_client(uri).get_run(parent).info.status
    run = "no MLflow run of the study was made" if not parent else \
        f"the study's MLflow run {parent} was ended {status}" if status not in (None, "RUNNING") else \
        f"the study's MLflow run {parent} could not be ended (the server did not take it): the rerun continues it"
    cause = str(error).removesuffix(", then rerun")
    return (f"{cause}; kept: {finished} of {spec.trials} trials finished of study {spec.study!r} in {tune.redact(url)}"
            f"; {run}; once the server answers again, rerun the same command to resume the study")


def _trial_stopped(spec: tune.TuneSpec, e: RunStopped) -> str:
    """The line of a study whose trial's run a fault stopped (a full disk, a fault of the store or the file system):
    the cause, how the run was ended, the finished trials kept, and what `bench tune`'s rerun does (held-out round 16,
    H19: it said `bench train`'s "then resume ... the resume starts at step 0, in the same MLflow run"; the stopped
    trial is FAIL, not resumed: the rerun goes on with the study in a new trial)."""
    if e.cause is None:  # (a line of the study's own: its storage lost, a worker process died)
        return str(e)
    import contextlib

    import optuna

    url, finished = spec.storage or tune.default_storage_url(), "?"
    with contextlib.suppress(Exception):  # (what cannot be read is said as unknown)
        finished = str(tune.count(optuna.load_study(study_name=spec.study, storage=tune.open_storage(url)),
                                  *tune.FINISHED))
    cause = e.cause.removesuffix(", then resume")  # (bench train's way on: a trial is not resumed)
    then = ", then rerun the same command: the study" if cause.startswith("no space left on device") else \
        "; a rerun: the study"  # (the cause says what to fix, e.g. another --experiment)
    end = f"; {e.run_end} (its trial ended FAIL)" if e.run_end else ""
    return (f"{cause}{then} goes on with a new trial (the stopped one is not trained again){end}; kept: {finished} "
            f"of {spec.trials} trials finished of study {spec.study!r} in {tune.redact(url)}")


def _local_files(spec) -> dict[str, tuple[Path, tuple[int, int] | None]]:
    """The local SQLite files of the Optuna storage and the MLflow store as they are now (``faults.watch_file``).
    Each is created now if it is not there yet (the study would create it moments later), so that a file deleted and
    created again while the study runs is told from the one it started with."""
    store, storage = tracking_uri(spec.base.tracking_uri), spec.storage or tune.default_storage_url()
    tune.open_storage(storage)  # (first: an unreachable storage is its one line before any file is created)
    out = {}
    for what, uri in (("the Optuna storage", storage), ("the MLflow store", store)):
        watched = faults.watch_file(uri)
        if watched is not None and watched[1] is None and uri == store:
            open_client(store)
            watched = faults.watch_file(uri)
        if watched is not None:
            out[what] = watched
    return out


def _gone(before: dict[str, tuple[Path, tuple[int, int] | None]]) -> str | None:
    """The line for a local store / storage deleted or replaced while the study ran (SQLite goes on writing to a
    deleted file through an open connection, so the study ended as if nothing happened, its record lost)."""
    for what, watched in before.items():
        how = faults.changed(watched)
        if how:
            return (f"{what} {watched[0]} was {how} while the study ran: what the study wrote there since is lost "
                    "with it (the trials finished on it, their runs); restore it from a backup, or rerun the same "
                    "command (it starts a new file)")
    return None
