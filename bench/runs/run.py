"""The door of ``bench/runs``: the :class:`Run` every engine enters, and what other commands may ask of a run folder.

An engine is its training step; everything around it is the run's, the same for every engine::

    run = Run.enter(cfg, objective)                 # folder claimed (refused: not pobench's, or checkpoints
                                                    # without --resume), seed and threads; run.last: the newest
                                                    # checkpoint a resume starts from
    state = run.load(model=..., optimizer=..., scheduler=...)   # native; TRL: run.load_state("trl")
    logger = run.open(resume_state=state, tags=engine_tags)      # the MLflow run, locked folder
    with run.recorded(on_error=keep_what_is_computed):           # SIGTERM = Ctrl-C; an error ends it KILLED / FAILED
        ... train: run.save(step, ...) / run.save_state(step, ...) ...
        run.save_final(write_final)                 # complete weights first: FINISHED means they are there
        run.finish(stopped_early)

Checkpoint, folder and lock code stays inside ``bench/runs`` (``checkpoint``, ``folders``, ``locks``): a module
outside reaches it through this module only (tests/test_layers.py checks it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.config import TrainConfig
from bench.runs import checkpoint, lifecycle
from bench.runs.checkpoint import FINAL_TMP, CheckpointError, DiskFull, NoneResumable
from bench.runs.folders import RUN_RECORD, check_claimable, check_removable, experiment_dir, remove_run_folder
from bench.runs.lifecycle import (
    end_killed_worker_run,
    end_left_running,
    end_runs_of_killed,
    has_checkpoint,
    run_tags_and_params,
    seed_and_threads,
)
from bench.runs.locks import RunFolderBusy, folder_held, folder_in_use
from bench.runs.tracking import RunLogger, read_run_record

__all__ = ["FINAL_TMP", "RUN_RECORD", "CheckpointError", "DiskFull", "NoneResumable", "Run", "RunFolderBusy",
           "check_claimable", "check_removable",
           "end_killed_worker_run", "end_left_running",
           "end_runs_of_killed", "experiment_dir", "folder_held", "folder_in_use", "has_checkpoint", "last_checkpoint",
           "left_running",
           "remove_run_folder", "run_tags_and_params", "seed_and_threads"]


def last_checkpoint(run_dir: str | Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint of ``run_dir`` and its step (what a resume starts from); None when none."""
    last = checkpoint.latest(run_dir)
    return (last, checkpoint.step_of(last)) if last is not None else None


def left_running(run) -> str | None:
    """What a report can say of the process of a training run left RUNNING (``run``: ``reports.load.RunData``), read
    from its run folder here (``<output_dir>/<run name>``, whose ``run.json`` names it): a process still trains it
    (the folder's run lock held), or its process has ended (the lock free: killed, or stopped by a lost MLflow server
    that could not take its end) and the same command run again completes it; None when the folder is not here or
    is another run's. Held-out round 12 (H02): the report said only "is RUNNING, not FINISHED"."""
    from reports.paths import contained, safe_component

    out = run.params.get("output_dir")
    try:
        folder = contained(out, safe_component(run.name, "run name")) if out else None
    except ValueError:
        return None
    found = read_run_record(folder) if folder is not None else None
    if found is None or found["run_id"] != run.run_id:
        return None
    if folder_in_use(folder):
        return f"a process is still training it (it holds its run folder {folder})"
    unsent = (" (the end its MLflow server did not take is kept in its run.json)"
              if isinstance(found.get("unsent_end"), dict) else "")
    again = ("run the same `bench run` again to complete it" if run.tags.get("mlflow.parentRunId")
             else "run the same `bench train` again with --resume to complete it")
    return f"its process has ended (no process holds its run folder {folder}){unsent}: {again}"


@dataclasses.dataclass
class Run:
    """One training run of ``cfg`` (any engine): its folder, its newest checkpoint, its MLflow run once opened."""

    cfg: TrainConfig
    objective: Any
    name: str
    folder: Path
    last: Path | None  # the newest complete checkpoint (a resume starts from it; refused without cfg.resume)
    logger: RunLogger | None = None  # the MLflow run, once opened (None in a process that writes no record)

    @classmethod
    def enter(cls, cfg: TrainConfig, objective, *, seed: bool = True) -> Run:
        """Claim ``cfg``'s run folder (``lifecycle.run_folder``) and, with ``seed``, set torch's seed and threads
        (an engine that seeds in its own processes, verl, passes False)."""
        name, folder, last = lifecycle.run_folder(cfg)
        if seed:
            seed_and_threads(cfg)
        return cls(cfg, objective, name, folder, last)

    def _unresumable(self, e: NoneResumable) -> NoneResumable:
        """No checkpoint can be resumed: the run's MLflow run is not left RUNNING (ended FAILED, said in the line)."""
        return NoneResumable(f"{e}{lifecycle.end_unresumable(self.cfg, self.folder, e)}")

    def load(self, **parts: Any) -> dict[str, Any] | None:
        """The state of the newest checkpoint (verified; an older one if it cannot be read), loaded into ``parts``
        (``model``, ``optimizer``, ``scheduler``, ``critic``: ``checkpoint.load``); None when there is none."""
        if self.last is None:
            return None
        try:
            return checkpoint.load(self.last, **parts)
        except NoneResumable as e:
            raise self._unresumable(e) from None

    def load_state(self, engine: str) -> dict[str, Any] | None:
        """The state of the newest checkpoint written by ``engine`` (its own files are its to load); None: none."""
        if self.last is None:
            return None
        try:
            return checkpoint.load_state(self.last, engine)
        except NoneResumable as e:
            raise self._unresumable(e) from None

    def open(self, *, resume_state: dict[str, Any] | None = None, tags: dict[str, str] | None = None) -> RunLogger:
        """The MLflow run, new or reopened (``lifecycle.open_run``); the folder's lock is held until it ends."""
        self.logger = lifecycle.open_run(self.cfg, self.objective, self.folder, resume_state=resume_state, tags=tags)
        return self.logger

    def recorded(self, on_error: Callable[[], None] | None = None) -> Iterator[None]:
        """The training, guarded (``lifecycle.recorded``): SIGTERM as Ctrl-C, any error ends the MLflow run."""
        return lifecycle.recorded(self.logger, on_error=on_error)

    def save(self, step: int, **parts: Any) -> Path:
        """Checkpoint ``step`` (``checkpoint.save``: model, optimizer, scheduler, state, keep, critic)."""
        return checkpoint.save(self.folder, step, **parts)

    def save_state(self, step: int, state: dict[str, Any], keep: int = 1) -> Path:
        """Checkpoint ``step`` of an engine that writes its own files (TRL): pobench's state beside them."""
        return checkpoint.save_state(self.folder, step, state, keep=keep)

    def save_final(self, write: Callable[[Path], None]) -> Path:
        """``<run>/final``: ``write`` fills a temporary folder, swapped in whole (complete, or absent)."""
        return checkpoint.save_final(self.folder, write)

    def finish(self, stopped_early: bool = False) -> None:
        """End a run that trained to its end (or that a hook stopped early): FINISHED. First the modules of the
        user's its plugins' code imported while it trained are recorded (``bench.plugins.run_imports_tags``: checked
        before the run is reused)."""
        from bench.plugins import run_imports_tags  # (bench.plugins imports the registries)

        self.logger.set_tags(run_imports_tags(self.cfg.plugins))
        lifecycle.finish_run(self.logger, stopped_early)

    def end(self, error: BaseException | str | None = None) -> bool:
        """End the MLflow run now (FINISHED without ``error``, else KILLED / FAILED: ``lifecycle.end_run``)."""
        return lifecycle.end_run(self.logger, error)

    def lock_fds(self) -> tuple[int, ...]:
        """The descriptor of the folder's lock, for a process that trains on the run's behalf (verl's trainer)."""
        return lifecycle.folder_lock_fds(self.logger)
