"""Where runs, experiments and studies live on disk, and which of those folders pobench may write into or delete.

Every user-given name becomes ONE safe path component under its root through ``reports.paths`` (the one helper):
an experiment under ``output_dir`` (:func:`experiment_dir`), a run under its output folder
(``TrainConfig.run_dir``), a study under ``.pobench/tune`` (:func:`study_dir`).

A run folder is pobench's when it holds the marker ``reports.paths.MARKER`` (written when pobench creates or first
uses it: :func:`claim_run_folder`). A run folder of an earlier pobench has no marker; it counts as pobench's (and
gets the marker) when everything in it is something pobench writes there (``ckpt-*``, ``config.yaml``, ``final``,
``trl``, ``verl``, ``verl-data`` and their temporary folders) and it holds a pobench checkpoint (``ckpt-*/state.json``)
or a ``config.yaml`` whose keys are all TrainConfig fields; an empty folder counts too. Anything else (a file of
the user's, a folder of another program) is refused in one line: pobench neither writes into it nor deletes it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from bench.config import TrainConfig
from bench.engines.native.checkpoint import PREFIX
from reports.paths import MARKER, UnsafePath, contained, is_owned, make_owned, remove_owned, safe_component

#: what pobench writes into a run folder (besides ``ckpt-*`` checkpoints and hidden temporary folders)
RUN_ENTRIES = ("config.yaml", "inputs.json", "final", "trl", "verl", "verl-data", MARKER)
RUN_KIND = "run"


def under(root: str | Path, name: object, what: str) -> Path:
    """``root / name`` with ``name`` made ONE safe component (``what`` names the flag in errors), checked to stay
    under ``root``; relative when ``root`` is (as the user wrote it: it is recorded in config.yaml and MLflow)."""
    component = safe_component(name, what)
    contained(root, component)
    return Path(root) / component


def experiment_dir(output_dir: str | Path, experiment: str) -> Path:
    """``output_dir / experiment`` (`bench run`: the pairs' run folders and ``.locks``), the name made safe."""
    return under(output_dir, experiment, "--experiment")


def study_dir(root: str | Path, study: str) -> Path:
    """A study's output folder under ``root`` (``.pobench/tune``), the name made safe."""
    return under(root, study, "--study")


def _looks_like_run(folder: Path) -> bool:
    """An unmarked folder that an earlier pobench wrote as a run folder (module docstring), or an empty one."""
    entries = list(folder.iterdir())
    for e in entries:
        name = e.name
        if e.is_symlink() or not (name in RUN_ENTRIES or name.startswith(PREFIX) or name.startswith(".final.")):
            return False
    if not entries or any((e / "state.json").is_file() for e in entries if e.name.startswith(PREFIX)):
        return True
    config = folder / "config.yaml"
    if not config.is_file():
        return False
    try:
        data = yaml.safe_load(config.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    return isinstance(data, dict) and bool(data) and set(data) <= fields


def is_run_folder(folder: str | Path) -> bool:
    """Whether ``folder`` is a run folder pobench may write into or delete (marked, or an earlier version's)."""
    folder = Path(folder)
    return folder.is_dir() and not folder.is_symlink() and (is_owned(folder) or _looks_like_run(folder))


def _refuse(folder: Path, action: str) -> UnsafePath:
    return UnsafePath(f"{folder} exists and is not a pobench run folder (no {MARKER} file, and it holds files "
                      f"pobench does not write): not {action} it; move it away, or choose another name or "
                      "--output-dir")


def claim_run_folder(run_dir: str | Path) -> Path:
    """Create the run folder ``run_dir`` (``TrainConfig.run_dir()``: already checked to be under its root) and mark
    it as pobench's; an earlier version's run folder gets the marker; anything else is refused (UnsafePath)."""
    run_dir = Path(run_dir)
    if run_dir.exists() or run_dir.is_symlink():
        if not is_run_folder(run_dir):
            raise _refuse(run_dir, "writing into")
    return make_owned(run_dir, RUN_KIND)


def check_removable(run_dir: str | Path) -> None:
    """UnsafePath (one line) when ``run_dir`` exists and is not a run folder pobench may delete."""
    run_dir = Path(run_dir)
    if (run_dir.exists() or run_dir.is_symlink()) and not is_run_folder(run_dir):
        raise _refuse(run_dir, "deleting")


def remove_run_folder(run_dir: str | Path, root: str | Path) -> bool:
    """Delete the run folder ``run_dir`` (``--force``) when it is pobench's (:func:`is_run_folder`) and under
    ``root``; UnsafePath otherwise. Returns whether something was deleted."""
    run_dir = Path(run_dir)
    check_removable(run_dir)
    if run_dir.is_dir() and not is_owned(run_dir):
        make_owned(run_dir, RUN_KIND)  # an earlier version's run folder: recognised above
    return remove_owned(run_dir, root)
