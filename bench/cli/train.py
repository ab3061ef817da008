"""`bench train --algo NAME ...`: one training run of one objective (flags generated from TrainConfig)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import faults, preflight
from bench.cli.flags import add_config_flags, config_from_args
from bench.cli.interrupt import Stopped, command_args, rerun, rerun_command
from bench.cli.progress import TrainProgress
from bench.config import OUTPUT_DIR
from bench.engines import RunStopped, TrainingDiverged
from bench.engines import entry as engines
from bench.runs import resume
from bench.runs.run import RUN_RECORD, end_runs_of_killed, last_checkpoint
from bench.runs.store_check import check_comparison, check_outside_artifacts, check_reachable
from reports import metric_keys as K


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one objective", description=__doc__)
    p.add_argument("--config", help="YAML file of TrainConfig fields (flags override it)")
    add_config_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress display (on stderr: a bar on a terminal, "
                   "else a line per evaluation and every POBENCH_PROGRESS_EVERY seconds)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    root = cfg.output_dir
    cfg = resume.train_folder(cfg)  # <output_dir>/<experiment>/<algo>-s<seed>-<configuration key>
    resume.check_resume(cfg, root)  # --resume: the run's own configuration, or one line naming what differs
    # an unreachable server, its experiment's files unwritable: one line now, not minutes later after the model loads
    check_reachable(cfg.tracking_uri, experiment=cfg.experiment)
    check_comparison(cfg)  # --comparison ID of runs trained under another configuration: its report would break
    faults.check_output_folder(root, "--output-dir", OUTPUT_DIR)  # a file in its place, read-only: one line
    check_outside_artifacts(cfg.tracking_uri, cfg.experiment, root, "--output-dir")
    engines.check(cfg)
    for warning in preflight.check_inputs(cfg):  # every source read, answers and prompt lengths counted
        print(f"bench train: warning: {warning}", file=sys.stderr)
    # the runs a killed process left RUNNING in the experiment's folder (a `bench train` or a `bench run` pair, of
    # any flags); this run's own folder is left to its training, which ends or resumes what it holds
    ended = end_runs_of_killed(cfg, Path(cfg.output_dir), skip=frozenset({cfg.run_dir()}))
    if ended:
        print(f"pobench: note: {len(ended)} MLflow run(s) left RUNNING by a killed process in {cfg.output_dir} were "
              f"ended: {', '.join(ended)}", file=sys.stderr)
    try:
        with TrainProgress(cfg.run_label(), cfg.steps, enabled=not args.no_progress) as progress:
            result = engines.train(cfg, on_step=progress.step, on_eval=progress.evaluated)
    except TrainingDiverged as e:
        print(f"bench train: training diverged: {e}", file=sys.stderr)
        return 3
    except RunStopped as e:  # the MLflow server gone, a full disk: what was kept, and how to go on
        then = damaged_store(e, cfg) if e.damaged_store else f"resume with: {rerun_command(resume_flag=True)}"
        text = str(e).replace(f"; {faults.DAMAGED_ADVICE}", "", 1) if e.damaged_store else str(e)
        print(f"bench train: stopped: {text}; {then}", file=sys.stderr)
        return 1
    except faults.RunNotInStore as e:  # (the store moved away: the command that trains the run again)
        raise ValueError(f"{e}: {fresh_command()}") from None
    except KeyboardInterrupt:  # SIGINT / SIGTERM: the last finished step is checkpointed, the run ended KILLED
        raise stopped(cfg) from None
    print(f"run {result.run_id}: {result.steps_done} steps; checkpoints and final model in {result.output_dir}")
    for k in (K.EVAL_ACCURACY, K.EVAL_ACCURACY_SAMPLED):
        if k in result.final_eval:
            print(f"  {k} = {result.final_eval[k]:.4f}")
    return 0


def fresh_command() -> str:
    """This command without ``--resume``: what trains the run again from step 0 once its folder is moved away."""
    return rerun_command(argv=[a for a in command_args() if a != "--resume"])


def damaged_store(e: RunStopped, cfg) -> str:
    """How a run stopped by its damaged MLflow store goes on (held-out round 14, H10: "move it away and rerun", and
    the rerun then refused the run folder's checkpoints, its advice naming a `--force` `bench train` does not have):
    the resume once the store is restored (the run's record is in it), or the run again in a new store."""
    return (f"restore the store from a backup, then resume with: {rerun_command(resume_flag=True)}; or train the run "
            f"again from step 0 in a new store: move {e.damaged_store} and {cfg.run_dir()} away, then run: "
            f"{fresh_command()}")


def stopped(cfg) -> Stopped:
    """What a stopped `bench train` kept: its newest checkpoint (resume with ``--resume``), or nothing (rerun)."""
    last = last_checkpoint(cfg.run_dir())
    if last is None and not (cfg.run_dir() / RUN_RECORD).exists():  # (stopped while the data or model loaded)
        return Stopped("nothing: stopped before the run started (no MLflow run, no checkpoint)", rerun())
    if last is None:
        return Stopped("nothing: no checkpoint yet; the run restarts from step 0", rerun())
    return Stopped(f"{last[0]} (step {last[1]})", rerun(resume_flag=True))
