"""The life of one training run, the same for every engine: its folder, seed and threads, its MLflow run (created with
the tags, params and config artifact every engine writes, or reopened on resume), SIGTERM turned into an interrupt,
and its end: FINISHED (``pobench.stopped=early`` when an ``on_eval`` hook stopped it), KILLED (Ctrl-C / SIGTERM) or
FAILED with the cause in ``pobench.failure``.

    run_name, run_dir, last = run_folder(cfg)    # refuses a folder with checkpoints unless cfg.resume
    seed_and_threads(cfg)
    logger = open_run(cfg, objective, run_dir, resume_state=state_of_last_checkpoint_or_None, tags=engine_tags)
    with recorded(logger, on_error=keep_what_is_computed):   # SIGTERM = Ctrl-C; an error ends the run KILLED / FAILED
        ... train ...
        checkpoint.save_final(run_dir, write_final)  # complete weights first: FINISHED means they are there
        finish_run(logger, stopped_early)

The run folder's ``run.json`` (bench/runs/tracking.py) names the MLflow run as soon as it is opened, so a resume
continues that run even before the first checkpoint (a run whose first checkpoint failed resumes from step 0 in the same
run). An end that could not be sent (the MLflow server gone) is recorded there and applied at the next contact, when the
run is opened again (``open_run``). A fault outside the run (the server gone, a full disk) ends it as
:class:`RunStopped`: one line with the cause, the checkpoint kept and how the MLflow run was ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

from algorithms import get_spec
from algorithms.advantages import PluginResultError
from bench import faults
from bench.config import TrainConfig
from bench.engines.base import RunStopped, TrainingDiverged
from bench.fault_causes import first_line
from bench.plugins import plugin_failure, plugins_tag
from bench.runs import checkpoint, identity, resume, stop
from bench.runs.folders import RUN_CONFIG, check_claimable, claim_run_folder, write_recorded
from bench.runs.locks import RunFolderBusy, _hold_folder, folder_held, folder_in_use
from bench.runs.server_answers import ServerError
from bench.runs.tracking import (
    RUN_RECORD,
    RunLogger,
    StoreUnreachable,
    flatten,
    read_run_record,
    version_tags,
    write_run_record,
)
from reports.record import (
    COMPARISON,
    CONFIG_HASH,
    CONTROL,
    CONTROL_OF,
    FAILURE,
    KIND,
    MODEL,
    OBJECTIVE,
    PLUGINS,
    SEED,
    STOPPED,
    TASK,
    mlflow_error,
    retry_locked,
)


def run_folder(cfg: TrainConfig) -> tuple[str, Path, Path | None]:
    """The run's name, its folder and newest checkpoint (every engine): the folder is one safe component under
    ``output_dir`` (``cfg.run_dir()``), created and marked as pobench's (a folder in the way that is not pobench's is
    refused: bench/runs/folders.py); a checkpoint there without ``cfg.resume`` is refused, so a run is never
    overwritten."""
    run_dir = cfg.run_dir()
    check_claimable(run_dir)  # a folder pobench did not mark: one line first, whatever it holds (no dead end)
    last = checkpoint.latest(run_dir)
    if last is not None and not cfg.resume:
        raise ValueError(f"{run_dir} already holds checkpoints of a run; pass --resume to continue it, or choose "
                         f"another --output-dir / --run-name{end_left_running(cfg, run_dir)}")
    if last is not None or (cfg.resume and read_run_record(run_dir) is not None):
        resume.check(cfg, run_dir)  # only the run's own configuration continues it (a larger --steps may)
    claim_run_folder(run_dir)
    faults.check_writable(run_dir, "--run-name / --output-dir")  # before its MLflow run exists
    return cfg.run_label(), run_dir, last


def has_checkpoint(run_dir: str | Path) -> bool:
    """True when ``run_dir`` holds a complete checkpoint of any engine (`bench run` then resumes the pair)."""
    return checkpoint.latest(run_dir) is not None


def seed_and_threads(cfg: TrainConfig) -> None:
    """torch's seed and intra-op threads for ``cfg`` (1 for a built-in model: its matrices are too small to gain)."""
    torch.manual_seed(cfg.seed)
    threads = cfg.threads or (1 if cfg.model.startswith("builtin:") else 0)
    if threads:
        torch.set_num_threads(threads)


def run_tags_and_params(cfg: TrainConfig, objective, tags: dict[str, str] | None = None
                        ) -> tuple[dict[str, str], dict[str, str]]:
    """The tags and params of a new training run's MLflow record (every engine writes the same ones; ``tags``: what
    the engine adds, e.g. ``pobench.engine``)."""
    written_by = version_tags()  # pobench.version, pobench.git_commit (+ mlflow.source.git.commit, git_dirty)
    out = {KIND: "train", OBJECTIVE: cfg.algo, SEED: str(cfg.seed), CONFIG_HASH: cfg.comparison_hash(), **written_by,
           MODEL: cfg.model, TASK: cfg.task, CONTROL: cfg.control or "none",
           **({CONTROL_OF: base} if (base := get_spec(cfg.algo).control_of) else {}),
           **({COMPARISON: cfg.comparison} if cfg.comparison else {}), **(tags or {}),
           **({PLUGINS: plugins} if (plugins := plugins_tag(cfg.plugins)) else {}),
           **{k: str(v) for k, v in cfg.tags.items()}}
    params = {**flatten(cfg.to_dict()), **flatten({"objective": dataclasses.asdict(objective.config)}),
              **{k: v for k, v in written_by.items() if not k.startswith("mlflow.")},
              **flatten({"inputs": identity.input_digests(cfg)})}  # data / model digests, the hub revision
    return out, params


ABANDONED = ("its process ended before the run's first checkpoint without ending the run (killed: SIGKILL, out of "
             "memory, the machine lost); the run folder was trained again in a new run")


def open_run(cfg: TrainConfig, objective, run_dir: Path, *, resume_state: dict[str, Any] | None = None,
             tags: dict[str, str] | None = None) -> RunLogger:
    """The MLflow run of a training run. First, an end ``run.json`` holds unsent is applied. ``resume_state`` (a
    checkpoint's state: ``run_id``, ``pending``): that run, reopened, with the metrics the checkpoint had not yet
    written. ``cfg.resume`` without a checkpoint: the run ``run.json`` names, from step 0 (when it logged no metric
    yet). Otherwise a new run with ``run_tags_and_params`` (plus ``tags``) and the config, saved as
    ``<run_dir>/config.yaml``, as its artifact. ``run.json`` names the run from then on."""
    folder = _hold_folder(run_dir)  # (released when the run ends: ``end_run``; or by the kernel when the process dies)
    try:
        return _open_run(cfg, objective, run_dir, folder, resume_state, tags)
    except BaseException:
        if folder.is_locked:  # (not ended: refused, or the store failed before the run existed)
            folder.release()
        raise


def _open_run(cfg: TrainConfig, objective, run_dir: Path, folder: FileLock, resume_state: dict[str, Any] | None,
              tags: dict[str, str] | None) -> RunLogger:
    logger = RunLogger(cfg.tracking_uri, cfg.experiment)
    logger.run_dir, logger.folder_lock = run_dir, folder
    found = settle(logger, run_dir)
    if resume_state is None and not cfg.resume and found is not None and end_abandoned(logger, found["run_id"]):
        print(f"bench: {run_dir}: its MLflow run {found['run_id']} was left RUNNING by a process that ended before "
              "its first checkpoint; ended FAILED, a new run starts", file=sys.stderr)
    if resume_state is None and cfg.resume and found is not None:
        run = logger.call(logger.client.get_run, found["run_id"])
        if run.data.metrics:
            raise ValueError(f"--resume: {run_dir} holds no checkpoint, and its MLflow run {found['run_id']} has "
                             "metrics already (resuming from step 0 would log steps twice); drop --resume to start a "
                             "new run")
        resume_state = {"run_id": found["run_id"], "pending": []}
    if resume_state is not None:
        logger.reopen(resume_state["run_id"], [tuple(p) for p in resume_state["pending"]])
    else:
        logger.start(cfg.run_label(), *run_tags_and_params(cfg, objective, tags))
    try:  # from here the run is RUNNING: an interrupt or error before the training ends it (not left RUNNING)
        _write_record(logger, run_dir)  # at once: a resume continues this run even if no checkpoint is ever written
        if resume_state is not None:
            logger.call(resume.record_extension, logger, cfg, run_dir)  # a larger --steps: tagged, config updated
            return logger
        logger.call(identity.log_datasets, logger.client, logger.run_id, cfg)  # mlflow.log_input: name, digest, rows
        resume.record_inputs(run_dir, cfg)  # the digests a resume compares
        write_recorded(run_dir / RUN_CONFIG, cfg.save)  # (its digest recorded: a user's edit is refused, kept)
        logger.log_artifact(run_dir / RUN_CONFIG)
    except BaseException as e:
        try:
            end_run(logger, e)
        except (StoreUnreachable, ServerError):
            pass  # (the run's record names it; the resume settles it)
        raise
    return logger


def failure_text(e: BaseException | str) -> str:
    """What ``pobench.failure`` says about ``e``: a divergence as it words itself, else the exception's type too."""
    if isinstance(e, str):
        return e
    return str(e) if isinstance(e, TrainingDiverged) else f"{type(e).__name__}: {e}"


def _write_record(logger: RunLogger, run_dir: Path, unsent_end: dict[str, str] | None = None) -> None:
    write_run_record(run_dir, {"run_id": logger.run_id, "tracking_uri": logger.uri, "experiment_id":
                               logger.experiment_id, **({"unsent_end": unsent_end} if unsent_end else {})})


def settle(logger: RunLogger, run_dir: Path) -> dict[str, Any] | None:
    """Apply the end ``<run_dir>/run.json`` holds unsent (the MLflow server was gone when the run stopped) to its
    run, if that is still RUNNING; returns the record (None when there is none, or it names a run of another
    store, or one the store no longer has)."""
    found = read_run_record(run_dir)
    if found is None or found.get("tracking_uri") != logger.uri:
        return None
    try:
        run = logger.call(logger.client.get_run, found["run_id"])
    except mlflow_error():  # (the server answered: no such run, it was deleted from the store)
        return None
    end = found.pop("unsent_end", None)
    if isinstance(end, dict):
        if run.info.status == "RUNNING":
            if end.get("failure"):
                logger.call(logger.client.set_tag, found["run_id"], FAILURE, str(end["failure"])[:5000])
            logger.call(logger.client.set_terminated, found["run_id"], status=str(end.get("status", "FAILED")))
        write_run_record(run_dir, found)
    return found


def end_abandoned(logger: RunLogger, run_id: str) -> bool:
    """A new run starts in a folder whose ``run.json`` names ``run_id`` (``settle`` found it in this store): if that
    run is still RUNNING, its process is gone (``open_run`` holds the folder's lock, which every training process
    holds while its run is open and the kernel releases when it dies; verl's trainer inherits it), so it is ended
    FAILED with :data:`ABANDONED` as the cause: a run SIGKILLed before its first checkpoint does not stay RUNNING
    beside the folder's new run. Returns whether it was ended."""
    if logger.call(logger.client.get_run, run_id).info.status != "RUNNING":
        return False
    logger.call(retry_locked, logger.client.set_tag, run_id, FAILURE, ABANDONED)
    logger.call(retry_locked, logger.client.set_terminated, run_id, status="FAILED")
    return True


def end_run(logger: RunLogger, error: BaseException | str | None = None) -> bool:
    """End the MLflow run: FINISHED without ``error``; KILLED for Ctrl-C / SIGTERM (KeyboardInterrupt);
    else FAILED with the cause in ``pobench.failure``. When the MLflow server does not answer, the end is recorded in
    the run folder's ``run.json`` (applied at the next contact: ``settle``) and False returned."""
    status = "FINISHED" if error is None else "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
    cause = failure_text(error)[:5000] if status == "FAILED" else None
    release = True  # (the folder is let go however the end went)
    try:
        if cause:
            logger.set_tags({FAILURE: cause})
        logger.end(status)
    except Exception as e:  # (no answer, an error status: held-out round 11, H09; the store damaged: round 14, H10)
        if not isinstance(e, (StoreUnreachable, ServerError)) and faults.describe(e) is None:
            raise
        if logger.run_dir is None or logger.run_id is None:
            raise
        if status == "FINISHED":  # (a FINISHED end that did not arrive fails the run: ``recorded`` ends it FAILED,
            release = False      # still holding the folder)
            raise
        _write_record(logger, logger.run_dir, {"status": status, **({"failure": cause} if cause else {})})
        return False
    finally:
        if release:
            _release_folder(logger)
    return True


def folder_lock_fds(logger: RunLogger) -> tuple[int, ...]:
    """The descriptor of the run folder's lock, for a process that trains in the folder on the run's behalf (verl's
    trainer): inherited, it keeps the folder locked while that process lives, even if this one is killed."""
    fd = getattr(getattr(logger.folder_lock, "_context", None), "lock_file_fd", None)  # (filelock's open descriptor)
    return (fd,) if isinstance(fd, int) else ()


def _release_folder(logger: RunLogger) -> None:
    """Let the run folder go (its run has ended, or its end is recorded in ``run.json``)."""
    if logger.folder_lock is not None:
        logger.folder_lock.release()
        logger.folder_lock = None


def finish_run(logger: RunLogger, stopped_early: bool = False) -> None:
    """End a run that trained to its end, or that an ``on_eval`` hook stopped (``pobench.stopped=early``); metrics
    still buffered are written first."""
    if stopped_early:
        logger.set_tags({STOPPED: "early"})
    logger.flush()
    try:
        logger.log_samples_table()
    except (mlflow_error(), OSError, ValueError) as e:  # (not worth failing a trained run for; a lost server is)
        print(f"bench: warning: the samples table was not logged ({str(e).strip()[:200]}); the per-step files "
              "samples/step_*.json are", file=sys.stderr)
    warn_lost_files(logger)
    end_run(logger)


def warn_lost_files(logger: RunLogger) -> None:
    """A warning naming the run's files that are gone from its local folder of files (deleted while it trained:
    held-out round 10, H15, the run FINISHED without its config.yaml, nothing said)."""
    try:
        lost = logger.lost_files()
    except (mlflow_error(), OSError):  # (the end met the store's fault itself)
        return
    if lost is not None:
        root, gone = lost
        names = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
        print(f"bench: warning: the folder of MLflow run {logger.run_id}'s files ({root}) was deleted while it "
              f"trained: {names} lost (MLflow made the folder again for later files)"
              + (f"; the run's config.yaml is still in {logger.run_dir}" if logger.run_dir else ""), file=sys.stderr)


def is_fault(e: BaseException) -> bool:
    """A fault outside the run that a resume gets past: the MLflow server gone, a full disk or file-size limit, a
    fault of the file system or the store (read-only, something in the way: ``bench.faults.describe``)."""
    return isinstance(e, (StoreUnreachable, ServerError, checkpoint.DiskFull)) or checkpoint.is_full(e) \
        or (isinstance(e, Exception) and faults.describe(e) is not None)


def stopped(e: BaseException, logger: RunLogger | None, run_dir: Path | None, ended: bool) -> RunStopped:
    """The one line of a run a fault stopped: the cause, the checkpoint kept, how its MLflow run was ended."""
    cause = (None if isinstance(e, (StoreUnreachable, ServerError, checkpoint.DiskFull)) else faults.describe(e)) \
        or (str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    parts = [cause.removesuffix(", then rerun")]  # (a server's error status: the resume command ends the line)
    last = checkpoint.latest(run_dir) if run_dir is not None else None
    if last is not None:
        parts.append(f"kept: the checkpoint of step {checkpoint.step_of(last)} in {last} (with the "
                     "metrics not yet in MLflow)")
    elif run_dir is not None:
        parts.append("no checkpoint was written yet (the resume starts at step 0, in the same MLflow run)")
    if logger is not None and logger.run_id is not None:
        parts.append(f"MLflow run {logger.run_id} ended FAILED" if ended else
                     f"MLflow run {logger.run_id} is ended FAILED at the next contact (recorded in "
                     f"{Path(run_dir or '.') / RUN_RECORD})")
    out = RunStopped("; ".join(parts))
    out.cause, out.run_end = parts[0], (parts[-1] if len(parts) > 1 and parts[-1].startswith("MLflow run ") else None)
    if cause.endswith(faults.DAMAGED_ADVICE) and cause.startswith("the MLflow store"):  # (its run lost with it)
        uri = cause.removeprefix("the MLflow store ").split(" is damaged (")[0]
        out.damaged_store = str(faults.sqlite_file(uri) or uri)
    return out


@contextlib.contextmanager
def recorded(logger: RunLogger | None, on_error: Callable[[], None] | None = None) -> Iterator[None]:
    """The training of a run: SIGTERM as Ctrl-C; any exception first calls ``on_error`` (keep what is computed,
    e.g. checkpoint the last finished step; its own failure is a warning), then ends the run (``end_run``) and is
    raised again; a fault outside the run (``is_fault``) as :class:`RunStopped`. ``logger`` None: a process that
    writes no record (a non-main process of a distributed run)."""
    with stop.sigterm_as_interrupt():
        try:
            yield
        except BaseException as e:
            if isinstance(e, SystemExit):  # a plugin's sys.exit: a failure (FAILED, one line), not a stop
                e = faults.exit_called(e)
            elif stop.raised_by_code(e):  # a KeyboardInterrupt no signal caused: a fault too (FAILED)
                e = faults.interrupt_raised(e)
            if on_error is not None:
                try:
                    on_error()
                except Exception as why:  # noqa: BLE001  (the run is still ended; what was kept before stays)
                    if str(why) != str(e):  # (the same cause again is the line the command ends with)
                        said = faults.describe(why) or first_line(str(why))  # (one line: round 15, H07,
                        print(f"bench: warning: the last step could not be kept: {said}", file=sys.stderr)  # SQL)
            ended = end_run(logger, e) if logger is not None else True
            if is_fault(e):
                raise stopped(e, logger, logger.run_dir if logger is not None else None, ended) from None
            if isinstance(e, faults.ExitCalled):
                raise e from None
            if isinstance(e, faults.InterruptRaised):
                raise e from e.__cause__
            if isinstance(e, (PluginResultError, checkpoint.FolderLost)) or \
                    isinstance(e, (ValueError, FileNotFoundError)) and plugin_failure(e, causes=False) is not None:
                # (a plugin's error or wrong result, round 15 H11; the run folder deleted, round 16 H17: met during
                # the work, exit 1 whatever its class)
                raise faults.RaisedInWork(str(e)) from e
            raise


def _left_run(cfg: TrainConfig, run_dir: Path) -> tuple[RunLogger, str] | None:
    """The MLflow run of the folder ``run_dir`` (named by ``run.json``, else by a readable checkpoint state) when it
    is still RUNNING in ``cfg``'s store; None otherwise (none, ended, or the store gone since it was checked)."""
    found = read_run_record(run_dir)
    run_id = found["run_id"] if found is not None else None
    for ckpt in reversed(checkpoint._complete(run_dir)) if run_id is None else ():
        try:
            run_id = str(json.loads((ckpt / "state.json").read_text())["run_id"])
            break
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if run_id is None:
        return None
    try:
        logger = RunLogger(cfg.tracking_uri, cfg.experiment)
        logger.run_dir, logger.run_id = run_dir, run_id
        if logger.call(logger.client.get_run, run_id).info.status != "RUNNING":
            return None
    except (StoreUnreachable, ServerError, mlflow_error()):
        return None  # (checked reachable just before: the store went away since; the run stays as it is)
    return logger, run_id


def _end_left(cfg: TrainConfig, run_dir: Path, error: BaseException, tags: dict[str, str] | None = None
              ) -> tuple[str, bool | None] | None:
    """End the MLflow run of ``run_dir`` its process left RUNNING (``_left_run``) with ``error`` (``end_run``):
    (its id, whether it was ended; None when another process trains in the folder now, and it is left as it is);
    None when there is no such run."""
    left = _left_run(cfg, run_dir)
    if left is None:
        return None
    logger, run_id = left
    try:
        with folder_held(run_dir):  # (RUNNING because its process is gone, not because one trains there now)
            if tags:
                logger.set_tags(tags)
            return run_id, end_run(logger, error)
    except RunFolderBusy:
        return run_id, None


def end_left_running(cfg: TrainConfig, run_dir: Path) -> str:
    """A command refused a run folder with checkpoints (no ``--resume``): when its MLflow run is still RUNNING and no
    process trains there (its own was SIGKILLed after a checkpoint), that run is ended KILLED, as a stopped run is,
    so `--resume` continues it and nothing shows as running meanwhile. Returns what to add to the refusal's line."""
    found = read_run_record(run_dir)
    if found is not None and isinstance(found.get("unsent_end"), dict):  # (its end recorded when the server failed:
        return _settle_left(cfg, run_dir, found)  # that end, not "killed": held-out round 11, H09)
    try:
        done = _end_left(cfg, run_dir, KeyboardInterrupt(), {STOPPED: "early"})
    except StoreUnreachable:
        return ""
    if done is None or done[1] is False:
        return ""
    run_id, ended = done
    if ended is None:
        return f" (another process is training in {run_dir} now)"
    return f" (its MLflow run {run_id}, left RUNNING by a process that was killed, was ended KILLED)"


def _settle_left(cfg: TrainConfig, run_dir: Path, found: dict[str, Any]) -> str:
    """The end ``run.json`` of ``run_dir`` holds unsent, applied (``settle``) when no process trains there; what to
    add to the refusal's line."""
    try:
        logger = RunLogger(cfg.tracking_uri, cfg.experiment)
        with folder_held(run_dir):
            if settle(logger, run_dir) is None:
                return ""
    except (StoreUnreachable, ServerError, RunFolderBusy, mlflow_error()):
        return ""
    end = found["unsent_end"]
    return (f" (its MLflow run {found['run_id']}, whose end could not be sent when it stopped, was ended "
            f"{end.get('status', 'FAILED')}" + (f": {str(end['failure'])[:200]}" if end.get("failure") else "") + ")")


def end_runs_of_killed(cfg: TrainConfig, folder: Path, skip: frozenset[Path] = frozenset()) -> list[str]:
    """The run folders directly under ``folder`` (a `bench run` experiment's folder) whose MLflow run, in ``cfg``'s
    store, a killed process left RUNNING: each ended as ``end_left_running`` / ``end_abandoned`` end it (KILLED when
    it has a checkpoint, to resume; else FAILED with :data:`ABANDONED`), whatever command trains there next
    (held-out round 8: only the same command, whose pairs use the same folders, ended them; one flag changed and
    they stayed RUNNING for good). A folder whose run lock a live process holds is left alone (``_end_left`` decides
    under that lock), and so are those in ``skip`` (the command's own pairs: their training ends or resumes them,
    and says so). Returns the ids of the runs ended."""
    try:
        folders = sorted(d for d in Path(folder).iterdir() if (d / RUN_RECORD).is_file() and not d.is_symlink())
    except OSError:
        return []
    ended = []
    for d in folders:
        if d in skip or folder_in_use(d):  # (a live process trains there: not even asked)
            continue
        checkpointed = bool(checkpoint._complete(d))
        try:
            done = _end_left(cfg, d, KeyboardInterrupt() if checkpointed else ABANDONED,  # type: ignore[arg-type]
                             {STOPPED: "early"} if checkpointed else None)
        except StoreUnreachable:
            break
        if done is not None and done[1]:
            ended.append(done[0])
    return ended


def end_killed_worker_run(run_dir: Path) -> str | None:
    """The MLflow run of ``run_dir`` whose pool worker the command SIGKILLed (it did not stop within the grace after
    SIGTERM: ``bench.executors.POOL_STOP_GRACE_S``; held-out round 13, H32 / H33): ended KILLED, as a stopped run
    is (its last checkpoint kept, for the rerun to resume), once no process holds the folder. Returns its id when it
    was ended (None: no record, not RUNNING, the folder held, the store not answering)."""
    found = read_run_record(run_dir)
    if found is None or not isinstance(found.get("tracking_uri"), str):
        return None
    from reports.record import open_client

    try:
        with folder_held(run_dir):
            client = open_client(found["tracking_uri"])
            if client.get_run(found["run_id"]).info.status != "RUNNING":
                return None
            retry_locked(client.set_terminated, found["run_id"], status="KILLED")
            parent = client.get_run(found["run_id"]).data.tags.get("mlflow.parentRunId")
            trial = client.get_run(parent) if parent else None  # (a `bench tune` trial's run, which the worker
            if trial is not None and trial.data.tags.get(KIND) == "tune-trial" and trial.info.status == "RUNNING":
                retry_locked(client.set_terminated, parent, status="KILLED")  # would have ended: ended with it)
            return found["run_id"]
    except (RunFolderBusy, StoreUnreachable, ServerError, OSError, mlflow_error()):
        return None


def end_unresumable(cfg: TrainConfig, run_dir: Path, error: BaseException) -> str:
    """No checkpoint of ``run_dir`` can be resumed: end its MLflow run FAILED with ``error`` as the cause, if it is
    still RUNNING (``_left_run``). Returns what to add to the error's line ("" when there is no run to end)."""
    done = _end_left(cfg, run_dir, error)
    if done is None:
        return ""
    run_id, ended = done
    if ended is None:
        return f"; its MLflow run {run_id} is left as it is: another process is training in {run_dir} now"
    return f"; its MLflow run {run_id} was ended FAILED" if ended else \
        f"; its MLflow run {run_id} is ended FAILED at the next contact ({run_dir / RUN_RECORD})"

