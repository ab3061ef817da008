"""The search space of a study (`bench tune --space`): the ranges an objective declares, narrowed or extended.

An objective config (``algorithms/``) declares a searched field with ``metadata["search"] = (low, high, log)``;
``--space name=low:high[:log],name=a|b`` narrows those ranges or adds fields. Every name is checked against the
objective, and the corners of the box must be valid configs, before any trial starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import optuna
import yaml

from algorithms import default_config
from evaluators.hints import did_you_mean

NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"  # a number as Python writes it (also read by bench.tune.metric)


@dataclass(frozen=True)
class Range:
    """One searched dimension: a numeric interval or a list of choices."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    kind: str = "float"            # float | int | categorical
    choices: tuple = ()

    def describe(self) -> str:
        if self.kind == "categorical":
            return "|".join(map(str, self.choices))
        return f"{self.low:g}:{self.high:g}" + (":log" if self.log else "") + (" (int)" if self.kind == "int" else "")

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        if self.kind == "categorical":
            return trial.suggest_categorical(name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(name, float(self.low), float(self.high), log=self.log)


def objective_config(algo: str, **overrides: Any) -> Any:
    """The resolved config dataclass of objective ``algo`` (ValueError naming valid names / fields when wrong)."""
    return default_config(algo, **overrides)


def declared_space(algo: str, overrides: dict[str, Any] | None = None) -> dict[str, Range]:
    """The ranges objective ``algo`` declares (``metadata["search"]``) for the terms active under ``overrides``."""
    cfg = objective_config(algo, **(overrides or {}))
    kinds = {f.name: _field_kind(f) for f in dataclasses.fields(cfg)}
    return {name: Range(float(low), float(high), bool(log), kinds[name])
            for name, (low, high, log) in cfg.search_space().items()}


def _field_kind(f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return "int" if t == "int" else "float"


_ITEM = re.compile(rf"^\s*(?P<name>[A-Za-z_]\w*)\s*=\s*"
                   rf"(?:(?P<low>{NUMBER})\s*:\s*(?P<high>{NUMBER})(?::(?P<log>log))?"
                   rf"|(?P<choices>[^,:]+\|[^,]+))\s*$")


def _not_a_file(item: str) -> str:
    """For an item that names a file (held-out round 14, H13: ``--space sp1.yaml`` was only "expected name=low:high",
    as if the file had been read): that --space takes the ranges themselves."""
    if "=" in item or not (os.path.exists(item) or item.lower().endswith((".yaml", ".yml", ".json", ".txt"))):
        return ""
    return ("; --space takes the ranges themselves, not a file (the file is not read): give e.g. --space "
            "lr=1e-6:1e-4:log")


def parse_space(spec: str | None) -> dict[str, Range]:
    """Parse ``name=low:high[:log],name=a|b`` (numbers as in Python; ``|`` separates categorical choices)."""
    space: dict[str, Range] = {}
    if not spec or not spec.strip():
        return space
    for item in spec.split(","):
        m = _ITEM.match(item)
        if not m:
            raise ValueError(f"--space item {item.strip()!r}: expected name=low:high, name=low:high:log or "
                             f"name=a|b|c{_not_a_file(item.strip())}")
        name = m["name"]
        if name in space:
            raise ValueError(f"--space: parameter {name!r} given twice")
        if m["choices"]:
            choices = tuple(_scalar(c.strip()) for c in m["choices"].split("|"))
            if len(set(choices)) < 2:
                raise ValueError(f"--space {name}: a categorical range needs at least two distinct choices")
            space[name] = Range(kind="categorical", choices=choices)
            continue
        low, high, log = float(m["low"]), float(m["high"]), bool(m["log"])
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"--space {name}: bounds must be finite numbers")
        if low > high:
            raise ValueError(f"--space {name}={low:g}:{high:g}: inverted range (low > high)")
        if low == high:
            raise ValueError(f"--space {name}={low:g}:{high:g}: empty range (low == high); fix the value with "
                             f"--objective-overrides '{{\"{name}\": {low:g}}}' instead of searching it")
        if log and low <= 0:
            raise ValueError(f"--space {name}={low:g}:{high:g}:log: a log range needs low > 0")
        space[name] = Range(low, high, log)
    return space


def _scalar(text: str) -> Any:
    return yaml.safe_load(text)


def resolve_space(algo: str, spec: str | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Range]:
    """Declared ranges of ``algo``, narrowed / extended by ``spec``; every name checked against the objective.

    ``overrides``: the base config's fixed ``objective_overrides``: a field they set, and a term they switch off, is
    not searched unless ``spec`` names it (a trial's sampled value would silently replace the fixed one).
    """
    overrides = dict(overrides or {})
    cfg = objective_config(algo, **overrides)
    fields_by_name = {f.name: f for f in dataclasses.fields(cfg)}
    space = {n: r for n, r in declared_space(algo, overrides).items() if n not in overrides}
    for name, rng in parse_space(spec).items():
        if name not in fields_by_name:
            hint = did_you_mean(name, fields_by_name)
            raise ValueError(f"--space: objective {algo!r} has no parameter {name!r}{hint}; its fields: "
                             f"{', '.join(fields_by_name)}")
        if rng.kind == "float" and _field_kind(fields_by_name[name]) == "int":
            if int(rng.low) != rng.low or int(rng.high) != rng.high:
                raise ValueError(f"--space {name}: integer field, bounds must be integers")
            rng = dataclasses.replace(rng, kind="int")
        space[name] = rng
    if not space:
        raise ValueError(f"objective {algo!r} declares no searchable field and --space adds none: nothing to tune")
    # the corners of the box (and every categorical choice) must be valid configs: a bad range fails before any trial
    corners = [{n: _pick(r, end) for n, r in space.items()} for end in ("low", "high")]
    for n, r in space.items():
        corners += [{**corners[0], n: c} for c in r.choices[1:]]
    for corner in corners:
        for n, v in corner.items():  # (a text choice for a number field was Python's "'<' not supported ...")
            default = getattr(cfg, n)
            if isinstance(default, (int, float)) and not isinstance(default, bool) and \
                    (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"--space {n}: {v!r} is not a number, and {n} of {algo!r} is a number field: give "
                                 f"numbers (e.g. {n}={default}|{default * 2 or 1})")
        try:
            objective_config(algo, **{**overrides, **corner})
        except (ValueError, TypeError) as e:
            raise ValueError(f"search space of {algo!r}: {corner} is not a valid config: {e}") from e
    return space


def _pick(r: Range, end: str) -> Any:
    if r.kind == "categorical":
        return r.choices[0]
    return int(getattr(r, end)) if r.kind == "int" else getattr(r, end)


