"""Where runs, experiments and studies live on disk, and which of those folders pobench may write into or delete.

Every user-given name becomes ONE safe path component under its root through ``reports.paths`` (the one helper):
an experiment under ``output_dir`` (:func:`experiment_dir`), a run under its output folder
(``TrainConfig.run_dir``), a study under ``.pobench/tune`` (:func:`study_dir`).

A run folder is pobench's when it holds the marker ``reports.paths.MARKER``, written when pobench creates it
(:func:`claim_run_folder`). pobench writes into, marks and deletes only such folders (and an empty one, which holds
nothing to lose: pobench makes a folder before it writes the marker). Any other folder in the way, whatever it holds
(a ``config.yaml`` whose keys are TrainConfig fields included: a user writes those too), is refused in one line
naming it: pobench neither writes into it, marks it nor deletes it. Run folders of an earlier pobench without the
marker (before the marker existed) are not adopted: the line says to move them away or delete them by hand.
"""

from __future__ import annotations

from pathlib import Path

from reports.paths import MARKER, UnsafePath, contained, is_owned, make_owned, remove_owned, safe_component

RUN_KIND = "run"


def under(root: str | Path, name: object, what: str) -> Path:
    """``root / name`` with ``name`` made ONE safe component (``what`` names the flag in errors), checked to stay
    under ``root``; relative when ``root`` is (as the user wrote it: it is recorded in config.yaml and MLflow)."""
    component = safe_component(name, what)
    contained(root, component)
    return Path(root) / component


def lock_file(folder: str | Path, name: str) -> Path:
    """``<folder>/.locks/<name>.lock``, ``name`` (made of user or plugin names: a run, a study, an objective)
    through the one containment helper, so a lock file stays in ``.locks`` whatever the name."""
    return under(Path(folder) / ".locks", f"{name}.lock", "lock name")


def experiment_dir(output_dir: str | Path, experiment: str) -> Path:
    """``output_dir / experiment`` (`bench run`: the pairs' run folders and ``.locks``), the name made safe."""
    return under(output_dir, experiment, "--experiment")


def study_dir(root: str | Path, study: str) -> Path:
    """A study's output folder under ``root`` (``.pobench/tune``), the name made safe."""
    return under(root, study, "--study")


def is_run_folder(folder: str | Path) -> bool:
    """Whether ``folder`` is a run folder pobench may write into or delete: a marked folder, or an empty one."""
    folder = Path(folder)
    return folder.is_dir() and not folder.is_symlink() and (is_owned(folder) or not any(folder.iterdir()))


def _refuse(folder: Path, action: str) -> UnsafePath:
    return UnsafePath(f"{folder} exists and is not a pobench run folder (no {MARKER} file: pobench did not make it): "
                      f"not {action} it; move it away (or, if an earlier pobench wrote it, delete it yourself), or "
                      "choose another name or --output-dir")


def claim_run_folder(run_dir: str | Path) -> Path:
    """Create the run folder ``run_dir`` (``TrainConfig.run_dir()``: already checked to be under its root) and mark
    it as pobench's; a folder in the way that is neither marked nor empty is refused (UnsafePath)."""
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
    """Delete the run folder ``run_dir`` (``--force``) when it is pobench's (marked, or empty: :func:`is_run_folder`)
    and under ``root``; UnsafePath otherwise. Returns whether something was deleted."""
    run_dir = Path(run_dir)
    check_removable(run_dir)
    if run_dir.is_dir() and not is_owned(run_dir):  # an empty folder: nothing to delete
        run_dir.rmdir()
        return True
    return remove_owned(run_dir, root)
