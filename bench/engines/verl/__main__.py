"""``python -m bench.engines.verl --algo NAME --seed N [--config run.yaml] --print-config|--launch|--table``."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

import yaml

from bench.config import TrainConfig
from bench.engines.verl.config import VerlOptions, main_ppo_command, make_verl_config
from bench.engines.verl.launch import launch
from bench.engines.verl.losses import (
    table_markdown,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engines.verl", description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", help="objective (bench list)")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--config", help="pobench run config (YAML of TrainConfig fields)")
    for f in dataclasses.fields(VerlOptions):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default) if f.default is not None else str,
                        default=f.default)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--print-config", action="store_true", help="print the verl overrides (YAML) and the command")
    what.add_argument("--launch", action="store_true", help="write the data, run verl, translate the metrics")
    what.add_argument("--table", action="store_true", help="print how every objective runs on verl (Markdown)")
    args = ap.parse_args(argv)
    if args.table:
        print(table_markdown())
        return 0
    if args.algo is None or args.seed is None:
        ap.error("--algo and --seed are required with --print-config / --launch")
    over = {"algo": args.algo, "seed": args.seed}
    if args.config and not Path(args.config).is_file():
        ap.error(f"--config {args.config}: no such file")
    try:
        cfg = TrainConfig.load(args.config, **over) if args.config else TrainConfig(**over)
    except ValueError as e:  # an invalid field or value, named by the config's own check
        ap.error(str(e))
    options = VerlOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(VerlOptions)})
    try:
        if args.print_config:
            print(yaml.safe_dump(make_verl_config(cfg, options), sort_keys=False), end="")
            print("# command:\n# " + shlex.join(main_ppo_command(make_verl_config(cfg, options))))
            return 0
        return launch(cfg, options)
    except ValueError as e:
        print(f"bench.engines.verl: error: {e}", file=sys.stderr)
        return 2



if __name__ == "__main__":
    sys.exit(main())
