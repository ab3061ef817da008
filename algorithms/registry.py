"""The objective registry: registered name -> (objective class, default overrides, description, paper).

Duplicate names raise; unknown names and unknown config fields raise with the valid ones and the closest match.
Ablations are registered as a base objective plus field overrides.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

from evaluators.hints import check_registered_name, did_you_mean

from .base import Objective, ObjectiveConfig


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    objective_class: type[Objective]
    description: str
    paper: str
    defaults: dict[str, Any] = field(default_factory=dict)  # overrides of the config class defaults
    base: str | None = None  # for ablations: the registered objective this one modifies
    module: str = ""  # the module that registered it (``algorithms`` for the built-in ones; ``__main__``: a notebook)
    #: a positive control: the registered objective it is worse than by construction (its description says why);
    #: ``bench run --controls`` adds every control, and each report says whether the comparison detected it
    control_of: str | None = None

    @property
    def config_class(self) -> type[ObjectiveConfig]:
        return self.objective_class.config_class


_REGISTRY: dict[str, ObjectiveSpec] = {}


def _did_you_mean(word: str, options: list[str]) -> str:
    return did_you_mean(word, options, cutoff=0.5)


def _check_fields(config_class: type[ObjectiveConfig], keys: list[str], who: str) -> None:
    valid = [f.name for f in dataclasses.fields(config_class)]
    for key in keys:
        if key not in valid:
            raise ValueError(f"objective {who!r} has no config field {key!r}{_did_you_mean(key, valid)}; "
                             f"valid fields: {', '.join(valid)}")


def _check_search(config_class: type[ObjectiveConfig], who: str) -> None:
    """Each field's declared search range (``param(..., search=(low, high, log))``) is one `bench tune` can search:
    two finite numbers, low < high, low > 0 for a log range. Held-out round 11 (H13): an inverted range was accepted
    here; `bench tune` then made the store, the study and a study run before Optuna refused it in its own words."""
    import math

    for f in dataclasses.fields(config_class):
        search = f.metadata.get("search")
        if not search:
            continue
        where = f"objective {who!r}: field {f.name}: search range {search!r}"
        if not isinstance(search, tuple | list) or len(search) != 3:
            raise ValueError(f"{where}: expected (low, high, log)")
        low, high, log = search
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)):
            raise ValueError(f"{where}: low and high must be finite numbers")
        if low > high:
            raise ValueError(f"{where} is inverted (low > high); declare it as ({high!r}, {low!r}, {log!r})")
        if low == high:
            raise ValueError(f"{where} is empty (low == high); declare no search range for a fixed value")
        if log and low <= 0:
            raise ValueError(f"{where}: a log range needs low > 0")


def register(name: str, objective_class: type[Objective] | None = None, *, description: str, paper: str = "",
             base: str | None = None, module: str | None = None, control_of: str | None = None,
             **defaults: Any) -> ObjectiveSpec:
    """Register an objective (``objective_class``) or an ablation (``base`` + field overrides). ``module``: where it
    was registered (default: the caller's module, as ``collections.namedtuple`` records it), which tells a process
    that starts workers what they must import to know the name (bench/plugins.py). ``control_of``: this objective is a
    positive control, worse than that registered objective by construction (the description states the mechanism)."""
    if module is None:
        module = sys._getframe(1).f_globals.get("__name__", "")
    check_registered_name(name, "objective")  # it becomes folders, lock files and MLflow keys
    if name in _REGISTRY:
        raise ValueError(f"objective {name!r} is already registered")
    if base is not None:
        parent = get_spec(base)
        if objective_class is not None and objective_class is not parent.objective_class:
            raise ValueError(f"ablation {name!r} must use its base's objective class")
        objective_class = parent.objective_class
        defaults = {**parent.defaults, **defaults}
        paper = paper or parent.paper
    if objective_class is None:
        raise ValueError(f"objective {name!r}: give an objective class or a base")
    if control_of is not None:
        get_spec(control_of)  # the objective a control is worse than must be registered first
    _check_fields(objective_class.config_class, list(defaults), name)
    _check_search(objective_class.config_class, name)
    spec = ObjectiveSpec(name, objective_class, description, paper, dict(defaults), base, module, control_of)
    spec.config_class(**spec.defaults)  # invalid defaults fail at registration, not at first use
    _REGISTRY[name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a registration (for plugins and tests)."""
    _REGISTRY.pop(name, None)


def get_spec(name: str) -> ObjectiveSpec:
    if name not in _REGISTRY:
        names = list(_REGISTRY)
        raise ValueError(f"unknown objective {name!r}{_did_you_mean(name, names)}; registered: {', '.join(names)}")
    return _REGISTRY[name]


def default_config(name: str, **overrides: Any) -> ObjectiveConfig:
    """The resolved config of a registered name, with overrides applied and validated."""
    spec = get_spec(name)
    _check_fields(spec.config_class, list(overrides), name)
    return spec.config_class(**{**spec.defaults, **overrides})


def get_objective(name: str, **overrides: Any) -> Objective:
    """Registered name (+ config field overrides) -> objective instance."""
    spec = get_spec(name)
    return spec.objective_class(default_config(name, **overrides), name=name)


def search_space(name: str) -> dict[str, tuple]:
    """Default search space of a registered objective: {field: (low, high, log)} (see ``param``)."""
    return default_config(name).search_space()


def list_objectives() -> list[str]:
    """Every registered name, in registration order."""
    return list(_REGISTRY)


def list_controls() -> list[str]:
    """The registered positive controls (``control_of`` set), in registration order."""
    return [n for n, s in _REGISTRY.items() if s.control_of is not None]


def objective_groups() -> dict[str, list[str]]:
    """Ablation groups: a base name -> the base and every ablation registered on it (directly or transitively)."""
    groups: dict[str, list[str]] = {}
    for name in _REGISTRY:
        root = name
        while _REGISTRY[root].base is not None:
            root = _REGISTRY[root].base
        if root != name:
            groups.setdefault(root, [root]).append(name)
    return groups


def resolve_names(names: list[str] | str) -> list[str]:
    """Expand a comma-separated string or list of objective names and groups (``@tepo``: the registered objective
    ``tepo`` and its ablations, see :func:`objective_groups`) into objectives, in order, without repeats."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out: list[str] = []
    groups = objective_groups()
    for n in names:
        if n.startswith("@"):
            if n[1:] not in groups:
                raise ValueError(f"unknown objective group {n!r}; groups: {', '.join('@' + g for g in groups)}")
            members = groups[n[1:]]
        else:
            get_spec(n)
            members = [n]
        out.extend(m for m in members if m not in out)
    if not out:
        raise ValueError("no objective given")
    return out
