"""The life of one training run, the same for every engine: its folder, seed and threads, its MLflow run (created with
the tags, params and config artifact every engine writes, or reopened on resume), SIGTERM turned into an interrupt,
and its end: FINISHED (``pobench.stopped=early`` when an ``on_eval`` hook stopped it), KILLED (Ctrl-C / SIGTERM) or
FAILED with the cause in ``pobench.failure``.

    run_name, run_dir, last = run_folder(cfg)    # refuses a folder with checkpoints unless cfg.resume
    seed_and_threads(cfg)
    logger = open_run(cfg, objective, run_dir, resume_state=state_of_last_checkpoint_or_None, tags=engine_tags)
    with recorded(logger, on_error=keep_what_is_computed):   # SIGTERM = Ctrl-C; an error ends the run KILLED / FAILED
        ... train ...
    finish_run(logger, stopped_early)
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from bench import identity, resume, stop
from bench.config import TrainConfig
from bench.engines.base import TrainingDiverged
from bench.engines.native import checkpoint
from bench.folders import claim_run_folder
from bench.plugins import record
from bench.tracking import RunLogger, flatten, version_tags
from reports.record import (
    COMPARISON,
    CONFIG_HASH,
    CONTROL,
    FAILURE,
    KIND,
    MODEL,
    OBJECTIVE,
    PLUGINS,
    SEED,
    STOPPED,
    TASK,
)


def run_folder(cfg: TrainConfig) -> tuple[str, Path, Path | None]:
    """The run's name, its folder and newest checkpoint (every engine): the folder is one safe component under
    ``output_dir`` (``cfg.run_dir()``), created and marked as pobench's (a folder in the way that is not pobench's is
    refused: bench/folders.py); a checkpoint there without ``cfg.resume`` is refused, so a run is never overwritten."""
    run_dir = cfg.run_dir()
    last = checkpoint.latest(run_dir)
    if last is not None and not cfg.resume:
        raise ValueError(f"{run_dir} already holds checkpoints of a run; pass --resume to continue it, or choose "
                         "another --output-dir / --run-name")
    if last is not None:
        resume.check(cfg, run_dir)  # only the run's own configuration continues it (a larger --steps may)
    claim_run_folder(run_dir)
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
    written_by = version_tags()  # pobench.version, pobench.git_commit
    out = {KIND: "train", OBJECTIVE: cfg.algo, SEED: str(cfg.seed), CONFIG_HASH: cfg.comparison_hash(), **written_by,
           MODEL: cfg.model, TASK: cfg.task, CONTROL: cfg.control or "none",
           **({COMPARISON: cfg.comparison} if cfg.comparison else {}), **(tags or {}),
           **({PLUGINS: plugins} if (plugins := record(cfg.plugins)) else {}),
           **{k: str(v) for k, v in cfg.tags.items()}}
    params = {**flatten(cfg.to_dict()), **flatten({"objective": dataclasses.asdict(objective.config)}), **written_by,
              **flatten({"inputs": identity.input_digests(cfg)})}  # data / model digests, the hub revision
    return out, params


def open_run(cfg: TrainConfig, objective, run_dir: Path, *, resume_state: dict[str, Any] | None = None,
             tags: dict[str, str] | None = None) -> RunLogger:
    """The MLflow run of a training run. ``resume_state`` (a checkpoint's state: ``run_id``, ``pending``): that run,
    reopened, with the metrics the checkpoint had not yet written. Otherwise a new run with ``run_tags_and_params``
    (plus ``tags``) and the config, saved as ``<run_dir>/config.yaml``, as its artifact."""
    logger = RunLogger(cfg.tracking_uri, cfg.experiment)
    if resume_state is not None:
        logger.reopen(resume_state["run_id"], [tuple(p) for p in resume_state["pending"]])
        resume.record_extension(logger, cfg, run_dir)  # a larger --steps: tagged, config.yaml updated
        return logger
    logger.start(cfg.run_label(), *run_tags_and_params(cfg, objective, tags))
    identity.log_datasets(logger.client, logger.run_id, cfg)  # mlflow.log_input: name, digest, source, rows
    resume.record_inputs(run_dir, cfg)  # the digests a resume compares
    cfg.save(run_dir / "config.yaml")
    logger.log_artifact(run_dir / "config.yaml")
    return logger


def failure_text(e: BaseException | str) -> str:
    """What ``pobench.failure`` says about ``e``: a divergence as it words itself, else the exception's type too."""
    if isinstance(e, str):
        return e
    return str(e) if isinstance(e, TrainingDiverged) else f"{type(e).__name__}: {e}"


def end_run(logger: RunLogger, error: BaseException | str | None = None) -> None:
    """End the MLflow run: FINISHED without ``error``; KILLED for Ctrl-C / SIGTERM (KeyboardInterrupt, SystemExit);
    else FAILED with the cause in ``pobench.failure``."""
    if error is None:
        logger.end("FINISHED")
    elif isinstance(error, (KeyboardInterrupt, SystemExit)):
        logger.end("KILLED")
    else:
        logger.set_tags({FAILURE: failure_text(error)[:5000]})
        logger.end("FAILED")


def finish_run(logger: RunLogger, stopped_early: bool = False) -> None:
    """End a run that trained to its end, or that an ``on_eval`` hook stopped (``pobench.stopped=early``); metrics
    still buffered are written first."""
    if stopped_early:
        logger.set_tags({STOPPED: "early"})
    logger.flush()
    end_run(logger)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside: SIGTERM raises KeyboardInterrupt (``bench.stop.interrupt``: once; a second SIGTERM while stopping is
    ignored, so it cannot break the checkpoint the first one writes), so a terminated run (or a `bench run` whose
    workers must stop) takes the Ctrl-C path (main thread only; elsewhere nothing changes)."""
    try:
        previous = signal.signal(signal.SIGTERM, stop.interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def recorded(logger: RunLogger | None, on_error: Callable[[], None] | None = None) -> Iterator[None]:
    """The training of a run: SIGTERM as Ctrl-C; any exception first calls ``on_error`` (keep what is computed,
    e.g. checkpoint the last finished step), then ends the run (``end_run``) and is raised again. ``logger`` None:
    a process that writes no record (a non-main process of a distributed run)."""
    with sigterm_as_interrupt():
        try:
            yield
        except BaseException as e:
            if on_error is not None:
                on_error()
            if logger is not None:
                end_run(logger, e)
            raise

