"""Where runs and experiments live on disk, and which run folders pobench may write into or delete (inside
``bench/runs`` only: other modules reach it through ``bench.runs.run``).

Every user-given name becomes ONE safe path component under its root through ``reports.paths`` (the one helper):
an experiment under ``output_dir`` (:func:`experiment_dir`), a run under its output folder
(``TrainConfig.run_dir``). A command's ``--out`` folder (`bench eval`, `bench tune`, `bench warmstart`) is claimed
by ``reports.paths.claim_output_folder``, a study's by ``bench.tune.outputs.study_dir``.

A run folder is pobench's when it holds the marker ``reports.paths.MARKER``, written when pobench creates it
(:func:`claim_run_folder`). pobench writes into, marks and deletes only such folders (and an empty one, which holds
nothing to lose: pobench makes a folder before it writes the marker). Any other folder in the way, whatever it holds
(a ``config.yaml`` whose keys are TrainConfig fields included: a user writes those too), is refused in one line
naming it: pobench neither writes into it, marks it nor deletes it. Run folders of an earlier pobench without the
marker (before the marker existed) are not adopted: the line says to move them away or delete them by hand.

Inside a marked folder, ``--force`` deletes only what pobench wrote (:data:`RUN_LAYOUT`, the one definition of a run
folder's layout): a file a user put there (an analysis, notes) stays, and so do the folder and its marker; inside a
checkpoint only the files its ``state.json`` lists go, inside ``final`` only those its listing
(``reports.paths.LISTING``) holds. The engines' own folders (``trl``, ``verl``, ``verl-data``: TRL / verl write them,
pobench hands them the folder) go whole. What is pobench's is decided by what it recorded, not by a name alone
(:func:`_owner`): a checkpoint is pobench's only as a folder holding its ``state.json``, or as the temporary folder of
one being written holding its marker (:func:`own_temp`); a link or another folder named like a checkpoint is a user's,
kept and named (held-out round 16, H06). The run folder's own listing records the digests of :data:`RECORDED`
(:func:`write_recorded`, ``reports.edits``): a user's edit of one is refused in one line before ``--force`` deletes it
or a new training replaces it (:func:`check_removable`, :func:`check_claimable`; H05).
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

from reports.edits import check_unedited, forget, record_written
from reports.paths import LISTING, MARKER, RUN_CONFIG, UnsafePath, is_owned, make_owned, remove_owned, under

RUN_KIND = "run"
#: the run folder's record of its MLflow run ({"run_id", "tracking_uri", "experiment"[, "unsent_end"]}:
#: bench/runs/tracking.py ``read_run_record``) and the digests of its inputs a resume compares (bench/runs/resume.py)
RUN_RECORD, INPUTS_FILE = "run.json", "inputs.json"

#: what pobench writes at the top of a run folder (names or patterns): the one definition of the run folder's layout.
#: ``ckpt-*``: checkpoints (``ckpt-0000040``; ``.tmp`` while written); ``final`` (``.final.tmp`` / ``.final.old``
#: while swapped); ``trl`` / ``verl`` / ``verl-data``: the engines' own folders.
RUN_LAYOUT = (MARKER, LISTING, RUN_CONFIG, RUN_RECORD, f"{RUN_RECORD}.tmp", INPUTS_FILE, "final", ".final.tmp",
              ".final.old", "ckpt-[0-9]*", "trl", "verl", "verl-data")
#: pobench's files of a run folder whose digests its listing records (:func:`write_recorded`): a user's edit of one is
#: refused before pobench would delete or replace it (:func:`check_removable`, :func:`check_claimable`)
RECORDED = (RUN_CONFIG, INPUTS_FILE)
#: the checkpoints' names: such an entry is pobench's only as a folder (never a link) holding its state.json, or as
#: the temporary folder of one being written holding its marker (:func:`own_temp`)
CHECKPOINTS = "ckpt-[0-9]*"
#: the files pobench writes into a checkpoint (a temporary one of a pobench before its marker holds only these)
CHECKPOINT_FILES = ("model.pt", "optim.pt", "critic.pt", "state.json")
#: the folders of RUN_LAYOUT whose files pobench lists as it writes them (state.json, final's listing)
LISTED = ("ckpt-[0-9]*", "final", ".final.old")
#: the names of RUN_LAYOUT pobench writes as folders (the others it writes as files): a name of the layout holding
#: the other kind (a user's plain file ``final``) is not pobench's (:func:`in_the_way`)
FOLDERS = ("final", ".final.tmp", ".final.old", "ckpt-[0-9]*", "trl", "verl", "verl-data")


def experiment_dir(output_dir: str | Path, experiment: str) -> Path:
    """``output_dir / experiment`` (`bench run`: the pairs' run folders and ``.locks``), the name made safe."""
    return under(output_dir, experiment, "--experiment")


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


def in_the_way(run_dir: str | Path) -> list[Path]:
    """The entries of the run folder ``run_dir`` named as pobench names its own (:data:`RUN_LAYOUT`) but of the other
    kind: a plain file where pobench writes a folder (a user's file ``final``), a folder where it writes a file.
    pobench did not write them: neither deleted (``--force``) nor replaced (a final model saved over them)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or run_dir.is_symlink():
        return []
    return [e for e in sorted(run_dir.iterdir()) if _matches(e.name, RUN_LAYOUT) and not e.is_symlink()
            and e.is_dir() != _matches(e.name, FOLDERS)]


def _what(name: str) -> str:
    """What pobench writes at ``name`` in a run folder (for the line refusing what is there instead)."""
    for pattern, what in (("final", "the run's final model folder"), (".final.*", "a temporary final model folder"),
                          ("ckpt-[0-9]*", "a checkpoint folder"), ("trl", "the engine's folder"),
                          ("verl*", "the engine's folder")):
        if fnmatch.fnmatchcase(name, pattern):
            return what
    return "a file of its own"


def _check_in_the_way(run_dir: Path, action: str) -> None:
    for e in in_the_way(run_dir):
        kind = "a folder" if e.is_dir() else "a file"
        raise UnsafePath(f"{e} is {kind} pobench did not write (pobench writes {_what(e.name)} there): not {action} "
                         "it; move it away, then run the same command again")


def check_removable(run_dir: str | Path) -> None:
    """UnsafePath (one line) when ``run_dir`` exists and is not a run folder pobench may delete, or holds a user's
    entry under a name pobench writes (:func:`in_the_way`: `--force` would retrain over it)."""
    run_dir = Path(run_dir)
    if (run_dir.exists() or run_dir.is_symlink()) and not is_run_folder(run_dir):
        raise _refuse(run_dir, "deleting")
    _check_in_the_way(run_dir, "deleting")
    _check_unedited(run_dir)


def check_claimable(run_dir: str | Path) -> None:
    """UnsafePath (one line) when ``run_dir`` exists and pobench may not write into it (:func:`claim_run_folder`
    would refuse it, or it holds a user's entry under a name pobench writes): asked before a comparison opens its
    record."""
    run_dir = Path(run_dir)
    if (run_dir.exists() or run_dir.is_symlink()) and not is_run_folder(run_dir):
        raise _refuse(run_dir, "writing into")
    _check_in_the_way(run_dir, "replacing")
    if not _resumable(run_dir):  # (a resume keeps them; a longer --steps replaces config.yaml: check_config_unedited)
        _check_unedited(run_dir)


def _resumable(run_dir: Path) -> bool:
    """Whether the run folder ``run_dir`` holds a checkpoint of pobench's (a training resumes it)."""
    return run_dir.is_dir() and any(_owner(e) == "listed" for e in run_dir.glob(CHECKPOINTS))


def _check_unedited(run_dir: Path, only=None) -> None:
    """EditedOutputs (``reports.edits``, one line, exit 2) when a file pobench wrote into its run folder ``run_dir``
    and recorded (:data:`RECORDED`) was edited since (held-out round 16, H05: ``--force`` replaced a commented
    ``config.yaml``). A run folder written before the digests holds none: its files are replaced as before."""
    if run_dir.is_dir() and not run_dir.is_symlink() and is_owned(run_dir):
        check_unedited(run_dir, "the run folder", only)


def check_config_unedited(run_dir: str | Path) -> None:
    """Before a resume with a larger ``--steps`` rewrites the run's ``config.yaml``: the user's edit of it refused."""
    _check_unedited(Path(run_dir), (RUN_CONFIG,))


def write_recorded(path: str | Path, write) -> Path:
    """Write pobench's file ``path`` of a run folder (:data:`RECORDED`) with ``write(path)`` and record its digest in
    the folder's listing (``reports.edits``): a later edit of it is refused, never replaced. Its entry is made unknown
    first: killed between the write and the record, pobench's own file is never taken for a user's edit."""
    path = Path(path)
    forget(path.parent, [path.name])
    write(path)
    record_written(path.parent, [path])
    return path


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def _listed(folder: Path) -> set[str] | None:
    """The files (relative paths) pobench wrote into the listed folder ``folder``; None when all of it is pobench's
    (a checkpoint being written, ``.tmp``; a ``final`` of a pobench before listings). A checkpoint without its
    ``state.json`` holds nothing of pobench's (pobench renames a checkpoint into place with it, and removes it
    first)."""
    if folder.name.endswith(".tmp"):
        return None
    final = folder.name == "final" or folder.name.startswith(".final")
    try:
        if final:
            return {LISTING, *json.loads((folder / LISTING).read_text())}
        state = json.loads((folder / "state.json").read_text())
        return {"state.json", MARKER, *(state.get("files") or {})}
    except FileNotFoundError:
        return None if final else set()
    except (OSError, ValueError, TypeError, AttributeError):
        return set()  # a listing pobench cannot read: nothing in the folder is known to be its


def _files(folder: Path) -> list[Path]:
    return [f for f in sorted(folder.rglob("*")) if f.is_symlink() or not f.is_dir()]


def _not_listed(folder: Path) -> list[Path]:
    """The files in the listed folder ``folder`` that its listing does not hold (a user's); none when it has no
    listing (all of it pobench's)."""
    listed = _listed(folder)
    return [] if listed is None else [f for f in _files(folder) if str(f.relative_to(folder)) not in listed]


def remove_written(folder: str | Path) -> list[Path]:
    """Delete the files pobench wrote in the listed folder ``folder`` (a checkpoint, ``final``); what it did not
    write stays (returned), with the folders that hold it and, for ``final``, its listing (so that what is left is
    known to be a user's). A folder that holds nothing else goes whole."""
    folder = Path(folder)
    if folder.is_symlink():  # (put there by someone else: what it points to is not pobench's to delete)
        return [folder]
    kept = _not_listed(folder)
    if not kept:
        shutil.rmtree(folder)
        return []
    for f in _files(folder):
        if f not in kept and f.name != LISTING:
            f.unlink()
    for d in sorted((d for d in folder.rglob("*") if d.is_dir() and not d.is_symlink()), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    return kept


def carry_over(old: str | Path, new: str | Path) -> None:
    """Before pobench replaces its listed folder ``old`` (a checkpoint of the same step written again, ``final``) by
    ``new``: the files in ``old`` it did not write move into ``new`` at the same place (unless ``new`` holds that
    name), then its own files of ``old`` go (:func:`remove_written`); a user's file never goes with them."""
    old, new = Path(old), Path(new)
    if not old.is_dir() or old.is_symlink():
        return
    for f in _not_listed(old):
        rel = f.relative_to(old)
        if not (new / rel).exists():
            (new / rel).parent.mkdir(parents=True, exist_ok=True)
            f.rename(new / rel)
    if old.exists():
        remove_written(old)


def _owner(entry: Path) -> str:
    """What pobench wrote at ``entry``, a top-level entry of its run folder: ``"user"`` (nothing: kept whole),
    ``"listed"`` (its folder holding the files it listed: those go, a user's stay: :func:`remove_written`) or
    ``"whole"`` (its own file or folder; a link at a name it writes in every run, replaced as it writes it, goes: its
    target is never touched). Decided by what pobench recorded, not by the name alone: a checkpoint is pobench's only
    as a folder holding its ``state.json`` (written into it before it is renamed into place) or as the temporary
    folder of one being written; a link or a folder without it named like a checkpoint (``ckpt-0000009 ->
    /elsewhere``) is a user's (held-out round 16, H06: the link was deleted)."""
    name = entry.name
    if not _matches(name, RUN_LAYOUT) or entry in in_the_way(entry.parent):
        return "user"
    if _matches(name, (CHECKPOINTS,)):
        if entry.is_symlink():
            return "user"
        if name.endswith(".tmp"):
            return "whole" if own_temp(entry) else "user"
        state = entry / "state.json"
        return "listed" if state.is_file() and not state.is_symlink() else "user"
    return "listed" if _matches(name, LISTED) and entry.is_dir() and not entry.is_symlink() else "whole"


def own_temp(folder: str | Path) -> bool:
    """Whether the temporary checkpoint folder ``folder`` (``ckpt-N.tmp``, left by a write that was interrupted) is
    pobench's: a folder (not a link) holding its marker (written into it first), or nothing, or only the files a
    pobench before that marker wrote there (:data:`CHECKPOINT_FILES`). Anything else there is a user's."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return False
    return is_owned(folder) or all(f.parent == folder and f.name in CHECKPOINT_FILES and not f.is_symlink()
                                   for f in _files(folder))


def _named(entry: Path) -> list[Path]:
    """How a user's entry is named in the line that keeps it: the files of a folder named like pobench's (a checkpoint
    without its state), else the entry."""
    if _matches(entry.name, RUN_LAYOUT) and entry.is_dir() and not entry.is_symlink():
        return _files(entry) or [entry]
    return [entry]


def not_written(run_dir: str | Path) -> list[Path]:
    """The files and folders in the run folder ``run_dir`` that pobench did not write (:data:`RUN_LAYOUT`, the
    listings of checkpoints and ``final``): what ``--force`` keeps."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or run_dir.is_symlink():
        return []
    out = []
    for entry in sorted(run_dir.iterdir()):
        owner = _owner(entry)
        if owner == "user":
            out += _named(entry)
        elif owner == "listed":
            out += _not_listed(entry)
    return out


def remove_run_folder(run_dir: str | Path, root: str | Path) -> list[Path]:
    """Delete what pobench wrote in the run folder ``run_dir`` (``--force``) when it is pobench's (marked, or empty:
    :func:`is_run_folder`) and under ``root``; UnsafePath otherwise. What pobench did not write stays
    (:func:`not_written`), and with it the folder and its marker. Returns the files and folders kept."""
    run_dir = Path(run_dir)
    check_removable(run_dir)
    if run_dir.is_dir() and not is_owned(run_dir):  # an empty folder: nothing to delete
        run_dir.rmdir()
        return []
    kept = not_written(run_dir)
    if not kept:
        remove_owned(run_dir, root)
        return []
    for entry in sorted(run_dir.iterdir()):
        owner = _owner(entry)
        if entry.name == MARKER or owner == "user":
            continue
        if owner == "listed":
            remove_written(entry)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return kept
