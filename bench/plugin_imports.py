"""The modules of the user's that plugin code imported while a run trained, recorded with the run and checked before
it is reused (held-out round 16, H09).

A plugin's identity (bench/plugin_identity.py) covers the modules its source imports by name and those imported
while it loads; a module its code imports later, by a name computed at run time (``importlib.import_module("dyn" +
"helper")`` inside an advantage estimator), is known only once that code has run: it is not in the comparison id. So
each run of a plugin's process records, when it finishes, every module that appeared in ``sys.modules`` since the
first plugin began loading (:func:`mark`) whose file is the user's (not installed, not pobench's) and not one its
plugins' identity covers already, with the SHA-256 of that file (tag ``pobench.run_imports``: JSON {path: digest},
split over ``pobench.run_imports.2``, ``.3``... past MLflow's tag length); before such a run is reused,
:func:`changed` compares those files with the files there now, and a changed (or gone) one is refused in one line
(:func:`refusal`): the result is never reused silently for code that changed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from bench.plugin_identity import users_file

RUN_IMPORTS = "pobench.run_imports"
_CHUNK = 7900  # (MLflow's tag values hold at most 8000 characters)
_before: set[str] | None = None  # the modules there when the first plugin began loading in this process


def mark() -> None:
    """Note the modules this process holds before its first plugin loads (once: a later call keeps the first)."""
    global _before
    if _before is None:
        _before = set(sys.modules)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def imported(covered: Iterable[str]) -> dict[str, str]:
    """{real path: digest} of each module of the user's imported since :func:`mark`, less the files and folders
    ``covered`` (the plugins' sources and the modules their identity holds); {} where no plugin loaded."""
    if _before is None:
        return {}
    cover = [Path(c).resolve() for c in covered]
    out: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name in _before or not isinstance(file, str) or not file or not users_file(file):
            continue
        path = Path(file).resolve()
        if any(c == path or c in path.parents for c in cover):
            continue
        digest = _digest(path)
        if digest is not None:
            out[str(path)] = digest
    return dict(sorted(out.items()))


def tags(found: dict[str, str]) -> dict[str, str]:
    """The tags recording ``found`` (:func:`imported`); {} when there is nothing to record."""
    if not found:
        return {}
    text = json.dumps(found, sort_keys=True)
    parts = [text[i:i + _CHUNK] for i in range(0, len(text), _CHUNK)]
    return {RUN_IMPORTS if i == 0 else f"{RUN_IMPORTS}.{i + 1}": part for i, part in enumerate(parts)}


def recorded(run_tags: dict[str, str]) -> dict[str, str]:
    """What a run's tags record (:func:`tags`); {} for a run that recorded none (or whose record is damaged)."""
    if RUN_IMPORTS not in run_tags:
        return {}
    text, i = run_tags[RUN_IMPORTS], 2
    while f"{RUN_IMPORTS}.{i}" in run_tags:
        text, i = text + run_tags[f"{RUN_IMPORTS}.{i}"], i + 1
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def changed(run_tags: dict[str, str]) -> list[str]:
    """``<file name> (<path>), which has changed since`` (or ``..., which is gone since``) for each module the run
    recorded (:func:`recorded`) whose file differs now."""
    out = []
    for path, digest in recorded(run_tags).items():
        now = _digest(Path(path))
        if now != digest:
            out.append(f"{Path(path).name} ({path}), which {'has changed' if now is not None else 'is gone'} since")
    return out


def refusal(what: str, run_id: str, found: list[str]) -> str:
    """The one line refusing to reuse the finished run ``run_id`` of ``what`` (a pair) whose modules ``found``
    (:func:`changed`) changed."""
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (f"{what}: its finished run {run_id} trained while plugin code imported {found[0]}{more}: a module imported "
            "while training (by a name computed at run time) is not part of the comparison's identity, so its result "
            "is not reused for the changed module; import the module at the plugin's top level (then an edit to it "
            "gives another comparison), put it back as it was, or pass --force to train the pairs again")
