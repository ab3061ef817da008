"""Flags several commands share, each defined once: the TrainConfig flags (`bench train`, `bench run`, `bench tune`,
``python -m bench.engines.trl``) and the report flags (`bench run`, `bench report`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from bench.config import TrainConfig, config_file
from bench.inputs import read_yaml, yaml_flag
from bench.plugins import load_entry_points, load_plugins, normalized
from bench.presets import PRESETS, get_preset


def add_config_flags(p: argparse.ArgumentParser, skip: tuple[str, ...] = (), defaults: dict | None = None,
                     default_label: str = "default") -> None:
    """One flag per TrainConfig field (``--prompts-per-step``), help text from the field's doc and its default, stated
    once: ``defaults`` (e.g. `bench run`'s) replace the field's own default where given. The parser default is None
    so that only flags the user gives override the YAML file / defaults."""
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if f.name in skip:
            continue
        if f.name == "plugins":
            add_plugin_flag(p)
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
            p.add_argument(flag, type=yaml_flag, default=None, metavar="YAML", help=help_text)
        else:
            base = int if hint is int else float if hint is float else str
            choices = f.metadata.get("choices")  # (a callable one, which plugins extend, is checked by the config)
            p.add_argument(flag, type=base, default=None, help=help_text,
                           choices=None if callable(choices) else choices)


def add_plugin_flag(p: argparse.ArgumentParser) -> None:
    """``--plugin MODULE_OR_FILE.py``, repeatable: loaded before anything else (``plugins`` of a ``--config`` file
    too: main.py's ``load_cli_plugins``)."""
    p.add_argument("--plugin", dest="plugins", action="append", default=None, metavar="MODULE_OR_FILE.py",
                   help="a module or .py file that registers objectives / tasks, loaded first and in every worker "
                   "(repeatable; adds to the `plugins` of a --config file; docs/PLUGINS.md)")


def load_cli_plugins(args: argparse.Namespace) -> None:
    """Load the plugins a command names (its ``--config`` file's ``plugins``, then each ``--plugin``) before the
    command reads any objective or task name; ``args.plugins`` becomes that list (the TrainConfig field)."""
    specs: list[str] = []
    config = getattr(args, "config", None)
    if config:
        data = read_yaml(config) or {}  # invalid YAML, a folder, a binary file: one line (bench/inputs.py)
        listed = data.get("plugins") if isinstance(data, dict) else None
        if listed is not None and not isinstance(listed, list):
            raise ValueError(f"{config}: plugins must be a list of module names or .py files")
        specs += listed or []
    specs += getattr(args, "plugins", None) or []
    for plugin in [*load_plugins(specs), *load_entry_points()]:
        if plugin.unknown:  # what it imports by a computed name is not in its identity
            print(f"bench {args.command}: warning: plugin {plugin.spec} imports modules by a name computed at run "
                  f"time ({', '.join(plugin.unknown)}): their code is not in its identity (the comparison hash); a "
                  "run records the modules of yours imported while it trained and is not reused once one changed "
                  "(refused, exit 2): import them by name to make them part of the identity",
                  file=sys.stderr)
        for what in plugin.changed:  # (put back: bench.plugins._KeepProcessState)
            print(f"bench {args.command}: warning: plugin {plugin.spec} changed {what}", file=sys.stderr)
    if hasattr(args, "plugins"):
        args.plugins = normalized(specs) or None


def config_from_args(args: argparse.Namespace, **fixed) -> TrainConfig:
    """``--preset`` file (bench/presets.py) < ``--config`` file < flags < `fixed`; validated."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
             if getattr(args, f.name, None) is not None}
    given.update(fixed)
    preset = getattr(args, "preset", None)
    base = config_file(get_preset(preset).path, "--preset") if preset else {}
    if getattr(args, "config", None):
        base.update(config_file(args.config))
    cfg = TrainConfig.from_dict({**base, **given})
    cfg.validate()
    return cfg


def add_report_flags(p: argparse.ArgumentParser, baseline_default: str) -> None:
    """How a report compares and is drawn (`bench run`, `bench report`): ``--baseline``, ``--target-acc``,
    ``--out-root``, ``--no-titles``, ``--band``, ``--fractions``, ``--metrics``."""
    p.add_argument("--baseline", help=f"objective the report compares against (default: {baseline_default})")
    p.add_argument("--target-acc", type=float, help="convergence target accuracy (default: step-0 accuracy + half "
                   "of the improvement the baseline achieves over it; docs/REPORTS.md)")
    p.add_argument("--out-root", default="reports/out", help="report folder root: each report goes to "
                   "<out-root>/<experiment>/<comparison>/ (default: reports/out)")
    add_style_flags(p)
    p.add_argument("--metrics", metavar="KEY[,KEY]", help="more logged metrics to draw, one figure each against the "
                   "step (e.g. rollout/entropy_p90,train/lr); also in curves.csv")


def add_style_flags(p: argparse.ArgumentParser) -> None:
    """``--no-titles``, ``--band``, ``--fractions``, ``--formats``."""
    p.add_argument("--no-titles", action="store_true", help="figures without titles (a paper's caption says it)")
    p.add_argument("--band", choices=("ci", "minmax"), default="ci", help="band around each seed-mean line: ci = 95%% "
                   "Student-t confidence interval of the mean over seeds, minmax = min to max over seeds (default: ci)")
    add_units_flag(p)
    p.add_argument("--formats", metavar="FMT[,FMT]", help="the files of each figure, among png, pdf, svg, with png "
                   "(default: $POBENCH_FIGURE_FORMATS, else png,pdf,svg; png alone draws a report in about a third of "
                   "the time)")


def add_units_flag(p: argparse.ArgumentParser) -> None:
    """``--fractions`` (also `bench compare`)."""
    p.add_argument("--fractions", action="store_true", help="accuracies as fractions (0.697) instead of percent "
                   "(69.7), in tables, notes, figures and curves.csv")


def report_options(args: argparse.Namespace):
    """The ``reports.report.ReportOptions`` of the flags above."""
    from reports.report import ReportOptions

    metrics = tuple(k.strip() for k in (getattr(args, "metrics", None) or "").split(",") if k.strip())
    from reports.figures import figure_formats

    formats = figure_formats(getattr(args, "formats", None))  # (a wrong one: one line before any work)
    return ReportOptions(titles=not args.no_titles, band=args.band, percent=not args.fractions, metrics=metrics,
                         formats=formats)


def add_preset_flag(p: argparse.ArgumentParser) -> None:
    """``--preset NAME`` (`bench run`, `bench tune`): a named configuration under ``--config`` and the flags."""
    p.add_argument("--preset", metavar="NAME", help="a named configuration the --config file and flags build on: "
                   + "; ".join(f"{n} = {pr.description}" for n, pr in PRESETS.items()).replace("%", "%%")
                   + " (bench/presets.py)")
