"""`bench list`: every registered objective with its description; `--details NAME` its config fields."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list registered objectives", description=__doc__)
    p.add_argument("--details", metavar="NAME", help="config fields, defaults and paper reference of one objective")
    p.add_argument("--markdown", action="store_true", help="print the defaults tables of docs/objectives.md")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from algorithms import get_spec, list_objectives, objective_groups
    from algorithms.describe import defaults_markdown, details_text

    if args.details:
        print(details_text(args.details))
        return 0
    if args.markdown:
        print(defaults_markdown(), end="")
        return 0
    names = list_objectives()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {get_spec(name).description}")
    for root, members in objective_groups().items():
        print(f"\ngroup @{root} (bench run --ablation {root}): {', '.join(members)}")
    return 0
