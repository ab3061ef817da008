"""``python -m bench.engines.trl --config run.yaml [--flag value ...]``: one run with the TRL engine (any TrainConfig
flag of `bench train`); launch it with ``torchrun`` / ``accelerate launch`` for several processes."""

import argparse
import dataclasses
import sys

from bench.cli.flags import add_config_flags, config_from_args
from bench.engines.trl.run import train


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engines.trl", description=__doc__)
    p.add_argument("--config", help="YAML file of TrainConfig fields (flags override it)")
    add_config_flags(p)
    args = p.parse_args(argv)
    cfg = dataclasses.replace(config_from_args(args), engine="trl")
    res = train(cfg)
    if res.run_id:
        print(f"run {res.run_id}: {res.steps_done} steps; final model in {res.output_dir / 'final'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
