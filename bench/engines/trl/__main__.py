"""``python -m bench.engines.trl --config run.yaml [--flag value ...]``: one run with the TRL engine (any TrainConfig
flag of `bench train`); launch it with ``torchrun`` / ``accelerate launch`` for several processes."""

import argparse
import dataclasses
import os
import signal
import sys

from bench.cli.flags import add_config_flags, config_from_args
from bench.cli.interrupt import rerun_command
from bench.engines.trl.run import train
from bench.runs import stop
from bench.runs.run import last_checkpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engines.trl", description=__doc__)
    p.add_argument("--config", help="YAML file of TrainConfig fields (flags override it)")
    add_config_flags(p)
    args = p.parse_args(argv)
    for sig in stop.STOP_SIGNALS:  # (torchrun forwards a scheduler's SIGTERM to every process)
        signal.signal(sig, stop.interrupt)
    cfg = dataclasses.replace(config_from_args(args), engine="trl")
    try:
        res = train(cfg)
    except KeyboardInterrupt:  # the last finished step is checkpointed, the run ended KILLED (Run.recorded)
        if int(os.environ.get("RANK", "0")) == 0:
            print(stopped_line(cfg, sys.argv[1:] if argv is None else argv), file=sys.stderr)
        return stop.exit_code()
    if res.run_id:
        print(f"run {res.run_id}: {res.steps_done} steps; final model in {res.output_dir / 'final'}")
    return 0


def stopped_line(cfg, argv: list[str]) -> str:
    """The one line of a stopped run: its newest checkpoint and the command that resumes it, or nothing kept."""
    last = last_checkpoint(cfg.run_dir())
    head = f"python -m bench.engines.trl: stopped by {stop.name()}; kept "
    if last is None:
        return head + f"nothing: no checkpoint yet; the run restarts from step 0; rerun: {rerun_command(argv=argv)}"
    command = rerun_command(resume_flag=True, argv=argv).replace("bench ", "python -m bench.engines.trl ", 1)
    return head + f"{last[0]} (step {last[1]}); resume with (under the same launcher, " \
        f"e.g. torchrun): {command}"


if __name__ == "__main__":
    sys.exit(main())
