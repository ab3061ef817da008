"""`bench train --algo NAME ...`: one training run of one objective (flags generated from TrainConfig)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing

from bench.config import TrainConfig


def add_config_flags(p: argparse.ArgumentParser, skip: tuple[str, ...] = (), defaults: dict | None = None,
                     default_label: str = "default") -> None:
    """One flag per TrainConfig field (``--prompts-per-step``), help text from the field's doc and its default, stated
    once: ``defaults`` (e.g. `bench run`'s) replace the field's own default where given. The parser default is None
    so that only flags the user gives override the YAML file / defaults."""
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        doc = f.metadata.get("doc", "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        label = "default"
        if defaults and f.name in defaults:
            default, label = defaults[f.name], default_label
        # None = unset: the field's doc says what happens then (and states that default itself, once)
        help_text = (doc if default is None else f"{doc} ({label}: {default!r})").replace("%", "%%")
        hint = hints[f.name]
        if hint is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif hint in (dict, list) or typing.get_origin(hint) in (dict, list):
            p.add_argument(flag, type=json.loads, default=None, metavar="JSON", help=help_text)
        else:
            base = int if hint is int else float if hint is float else str
            p.add_argument(flag, type=base, default=None, help=help_text, choices=f.metadata.get("choices"))


def config_from_args(args: argparse.Namespace, **fixed) -> TrainConfig:
    """YAML file (``--config``) < flags < `fixed`; validated."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
             if getattr(args, f.name, None) is not None}
    given.update(fixed)
    cfg = TrainConfig.load(args.config, **given) if getattr(args, "config", None) else TrainConfig.from_dict(given)
    cfg.validate()
    return cfg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one objective", description=__doc__)
    p.add_argument("--config", help="YAML file of TrainConfig fields (flags override it)")
    add_config_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bench.tracking import check_reachable
    from bench.train import TrainingDiverged, train

    cfg = config_from_args(args)
    check_reachable(cfg.tracking_uri)  # an unreachable server: one line now, not minutes later after the model loads
    try:
        result = train(cfg)
    except TrainingDiverged as e:
        print(f"bench train: training diverged: {e}", file=sys.stderr)
        return 3
    print(f"run {result.run_id}: {result.steps_done} steps; checkpoints and final model in {result.output_dir}")
    for k in ("eval/accuracy", "eval/accuracy_sampled"):
        if k in result.final_eval:
            print(f"  {k} = {result.final_eval[k]:.4f}")
    return 0
