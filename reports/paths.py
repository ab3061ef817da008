"""Paths built from user-given names, and the only folders pobench deletes or replaces.

Every name a user gives that becomes part of a path (an experiment, a run name, a study, a comparison id, a label)
goes through :func:`safe_component`: one path component, never ``.`` / ``..``, never a separator or an absolute path.
A name that is already safe is kept as it is (so the folders of earlier runs keep their names); one that had to change
becomes a readable slug plus a short hash of the original, so two different names never share a folder.

:func:`contained` joins components under a root and refuses a result outside it (a symlink pointing out included),
or one the file system cannot name (:func:`check_length`: a component over its name limit, 255 bytes on most; the
whole over its path limit), which every folder flag (``--output-dir``, ``--out-root``, ``--out``) is checked by too.

pobench deletes or replaces only folders it created: each one gets a marker file (:data:`MARKER`) when it is made
(:func:`make_owned`). :func:`remove_owned` and :func:`replace_owned` refuse, with one line naming the folder, anything
in the way that has no marker. :func:`replace_owned` swaps a finished temporary folder in for the old one, so a
reader never sees a half-written folder and a failure leaves the old one in place. A folder pobench swaps in lists the
files it wrote (:data:`LISTING`); a file a user put into it later (notes, an edited figure) is not in that list and
moves into the new folder when it is replaced (:func:`user_files`), never deleted with it. The process writing a
temporary folder holds its marker locked; the next writer of the same folder removes the temporary folders whose lock
is free (a killed writer's), never one being written (:func:`remove_stale_temps`).

This module lives on the ``reports`` side because both ``bench`` and ``reports`` need it (imports point one way).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from evaluators.hints import COMPONENT_CHARS, MAX_COMPONENT, is_component

#: the marker file of a folder pobench created and may delete or replace
MARKER = ".pobench-owned"
#: the list (JSON, relative paths) of the files pobench wrote into a folder it swaps in whole (a report, a run's
#: ``final``): every other file there is a user's
LISTING = ".pobench-files"
#: the config file at the top of every run folder pobench makes (bench/runs/folders.py ``RUN_LAYOUT``): with the
#: marker, what tells a run folder from other folders pobench made (``is_run_with_config``)
RUN_CONFIG = "config.yaml"
_UNSAFE = re.compile(f"[^{COMPONENT_CHARS}]+")
MAX_LEN = MAX_COMPONENT


class UnsafePath(ValueError):
    """A user-given name or a path that pobench refuses to write to or delete (one line, exit 2 at the CLI)."""


def safe_component(name: object, what: str = "name") -> str:
    """``name`` as ONE safe path component: unchanged when it already is one (letters, digits, ``._+=@-``, not starting
    with a dot, at most 96 characters), else a slug of it plus ``-`` and 8 hex digits of its SHA-256, so different
    names stay different. ``what`` names the flag in the error for an empty or non-string name."""
    if not isinstance(name, str) or not name.strip():
        raise UnsafePath(f"{what} {name!r}: expected a non-empty name")
    if is_component(name):  # (evaluators.hints: the one rule, which the registries apply to registered names)
        return name
    slug = _UNSAFE.sub("_", name).strip("._-")[: MAX_LEN - 9] or "x"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _limits(path: str) -> tuple[int, int]:
    """(the longest file name, the longest path) in bytes that the file system of ``path``'s nearest existing folder
    takes."""
    probe = path
    while not os.path.isdir(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    try:
        return os.pathconf(probe, "PC_NAME_MAX"), os.pathconf(probe, "PC_PATH_MAX")
    except (OSError, ValueError):  # (no pathconf here: the usual limits)
        return 255, 4096


def check_length(path: str | Path, what: str) -> None:
    """UnsafePath (one line naming ``what`` and the name that is too long) when the file system cannot name ``path``:
    a component longer than its name limit (255 bytes on most), or the whole, absolute, longer than its path limit.
    (held-out round 9: ``--output-dir`` of 300 characters was an OSError traceback "File name too long".)"""
    absolute = os.path.abspath(path)
    name_max, path_max = _limits(absolute)
    for part in Path(absolute).parts:
        size = len(os.fsencode(part))
        if size > name_max:
            shown = part if len(part) <= 40 else f"{part[:24]}...{part[-8:]}"
            raise UnsafePath(f"{what}: the name {shown!r} in it is {size} bytes long, over the {name_max} the file "
                             "system takes for one file or folder name; give a shorter one")
    if len(os.fsencode(absolute)) >= path_max:
        raise UnsafePath(f"{what}: {len(os.fsencode(absolute))} bytes as an absolute path, over the {path_max - 1} the "
                         "system takes; give a shorter one")


def contained(root: str | Path, *parts: str) -> Path:
    """``root / parts`` after checking that it stays under ``root`` once resolved (``..``, absolute parts and symlinks
    that point out are refused with :class:`UnsafePath`) and that the file system can name it (:func:`check_length`).
    ``parts`` are usually :func:`safe_component` results."""
    check_length(Path(root).joinpath(*parts), str(Path(root).joinpath(*parts)))
    try:
        base = Path(root).resolve()
        path = base.joinpath(*parts)
        resolved = path.resolve()
    except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError before Python 3.13, OSError ELOOP after)
        raise UnsafePath(f"{Path(root).joinpath(*parts)}: {e} (a symlink that leads back to itself); remove it, or "
                         "choose another name or folder") from None
    if resolved != base and base not in resolved.parents:
        raise UnsafePath(f"{path} is outside {base}; pobench writes only under its own folders")
    return path


def replace_file(path: str | Path, text: str | bytes) -> Path:
    """Write ``text`` (str, or bytes written as they are) to ``path`` whole or not at all: into a temporary file
    beside it, then renamed over it. A link at ``path`` (a user's hard link or symbolic link to a file of theirs) is
    replaced, never written through, and a fault while writing (a full disk, a file-size limit) leaves the earlier
    file as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # (mkstemp's file is private: the result gets the mode a plain write would give)
    try:
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", newline="")) as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:  # (a write's error names no file: the one line names the one being written)
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def make_owned(folder: str | Path, kind: str = "") -> Path:
    """Create ``folder`` (and its parents) and mark it as pobench's: :func:`remove_owned` may delete it later."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / MARKER
    if not marker.exists():
        marker.write_text(f"{kind or 'pobench'}\n")
    return folder


def is_owned(folder: str | Path) -> bool:
    return (Path(folder) / MARKER).is_file()


def _refuse(folder: Path, action: str) -> UnsafePath:
    return UnsafePath(f"{folder} exists and was not created by pobench (no {MARKER} file): not {action} it; move "
                      "it away or choose another name")


def remove_owned(folder: str | Path, root: str | Path) -> bool:
    """Delete ``folder`` when it is under ``root`` and marked as pobench's; nothing when it does not exist. Refuses
    (UnsafePath) an unmarked folder or a path outside ``root``. Returns whether something was deleted."""
    folder = Path(folder)
    contained(root, os.path.relpath(folder.resolve(), Path(root).resolve()))
    if not folder.exists() and not folder.is_symlink():
        return False
    if folder.is_symlink() or not folder.is_dir() or not is_owned(folder):
        raise _refuse(folder, "deleting")
    _let_go(folder)
    shutil.rmtree(folder)
    return True


#: the temporary folders this process writes, each with its marker held locked (fcntl): a folder whose marker is not
#: locked was left by a process that ended (killed mid-write) and is removed by the next writer of the same folder
_WRITING: dict[str, int] = {}


def new_temp_folder(dest: str | Path) -> Path:
    """A marked temporary folder beside ``dest`` (same file system, so :func:`replace_owned` can rename it), held by
    this process until it is swapped in or removed; those a killed writer left beside ``dest`` go first
    (:func:`remove_stale_temps`)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-{os.getpid()}-", dir=dest.parent))  # (pid: see below)
    umask = os.umask(0o022)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private (0700); the folder it becomes is an ordinary one
    make_owned(tmp)
    fd = os.open(tmp / MARKER, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # (released by the kernel if this process dies: the folder is then stale)
    _WRITING[str(tmp)] = fd
    return tmp


def _let_go(tmp: Path) -> None:
    fd = _WRITING.pop(str(tmp), None)
    if fd is not None:
        os.close(fd)


def remove_stale_temps(dest: str | Path) -> list[Path]:
    """Remove the temporary folders a killed writer of ``dest`` left beside it: ``.<name>.tmp-*`` that pobench
    marked and whose marker no process holds locked, and ``.<name>.old-<pid>-*`` (an old ``dest`` moved aside while
    being replaced) of a process that no longer runs. Never one being written. Returns those removed."""
    dest = Path(dest)
    removed = []
    for p in sorted(dest.parent.glob(f".{dest.name}.tmp-*")) + sorted(dest.parent.glob(f".{dest.name}.old-*")):
        if p.is_symlink() or not p.is_dir() or str(p) in _WRITING:
            continue
        if not is_owned(p):  # (a writer killed before it marked its folder: empty, named by its process: removed)
            if _unmarked_stale(p):
                removed.append(p)
            continue
        if ".old-" in p.name:
            pid = p.name.rsplit(".old-", 1)[1].split("-")[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
            continue
        try:
            fd = os.open(p / MARKER, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its writer is alive
            os.close(fd)
            continue
        try:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
        finally:
            os.close(fd)
    return removed


def _unmarked_stale(p: Path) -> bool:
    """Remove ``p``, a ``.<name>.tmp-<pid>-*`` folder without pobench's marker, when the process that made it has
    ended and it is empty (what a writer killed between ``mkdtemp`` and marking leaves: a CI saw one left for good);
    anything in it, or a name of another form, is left alone. Whether it was removed."""
    pid = p.name.rsplit(".tmp-", 1)[1].split("-")[0]
    if not pid.isdigit() or _alive(int(pid)):
        return False
    try:
        p.rmdir()
    except OSError:  # (not empty: not what pobench's writer left)
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def files_in(folder: str | Path) -> list[str]:
    """The files under ``folder`` (relative paths, symlinks as files), without the marker and the listing."""
    folder = Path(folder)
    return [str(f.relative_to(folder)) for f in sorted(folder.rglob("*"))
            if (f.is_symlink() or not f.is_dir()) and f.name not in (MARKER, LISTING)]


def write_listing(folder: str | Path) -> list[str]:
    """Write ``folder``'s :data:`LISTING`: every file in it now is pobench's, each with its digest
    (``reports.edits.record_written``: a later edit of one is told, not replaced). Returns the list."""
    from reports.edits import record_written

    written = files_in(folder)
    record_written(folder, [Path(folder) / f for f in written])
    return written


def read_listing(folder: str | Path) -> dict[str, str | None] | None:
    """``folder``'s :data:`LISTING` as ``{relative path: digest}`` (a digest None: listed by a pobench before digests,
    a plain list of names); None when there is none; empty when it cannot be read (nothing in the folder is then known
    to be pobench's). The one reader of the listing."""
    try:
        listed = json.loads((Path(folder) / LISTING).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    if isinstance(listed, dict):
        return {str(k): v if isinstance(v, str) else None for k, v in listed.items()}
    if isinstance(listed, list):
        return {str(k): None for k in listed}
    return {}


def user_files(folder: str | Path) -> list[str]:
    """The files in ``folder`` that its :data:`LISTING` does not hold (a user's), as relative paths; none when it has
    no listing (a folder of a pobench before listings: all of it pobench's) or is not a folder."""
    listed = read_listing(folder)
    if listed is None:
        return []
    return [f for f in files_in(folder) if f not in listed]


def _carry(old: Path, new: Path, theirs: list[str]) -> None:
    for rel in theirs:
        if not (new / rel).exists() and not (new / rel).is_symlink():
            (new / rel).parent.mkdir(parents=True, exist_ok=True)
            (old / rel).rename(new / rel)


def replace_owned(tmp: str | Path, dest: str | Path, root: str | Path) -> Path:
    """Swap the finished folder ``tmp`` in as ``dest`` (under ``root``): an old ``dest`` must be pobench's (marked),
    else UnsafePath and nothing changes. ``tmp`` gets its :data:`LISTING` (all it holds is pobench's). The old folder
    is renamed aside first and deleted only once the new one is in place, so ``dest`` is never half written; the
    files a user put into it (:func:`user_files`) move into the new one first, and one at a path the new folder
    writes is refused before any change (UnsafePath). When another process swaps its own folder in between (two
    reports of one comparison at once), that one is moved aside in turn: the last writer's folder stays."""
    tmp, dest = Path(tmp), Path(dest)
    contained(root, os.path.relpath(dest.resolve(), Path(root).resolve()))
    make_owned(tmp)
    written = set(write_listing(tmp))
    if dest.is_dir() and not dest.is_symlink() and is_owned(dest):
        from reports.edits import check_unedited

        check_unedited(dest, "the folder")  # (a file pobench wrote that the user edited: never replaced, H14)
        clash = [rel for rel in user_files(dest) if rel in written]
        if clash:
            raise UnsafePath(f"{dest / clash[0]} is not pobench's (a file you put there) and the new folder writes a "
                             "file of that name: move it away, then rerun")
    olds: list[Path] = []
    try:
        for attempt in range(16):
            if dest.exists() or dest.is_symlink():
                if dest.is_symlink() or not dest.is_dir() or not is_owned(dest):
                    raise _refuse(dest, "replacing")
                old = dest.with_name(f".{dest.name}.old-{os.getpid()}-{attempt}")
                shutil.rmtree(old, ignore_errors=True)
                try:
                    dest.rename(old)
                    olds.append(old)
                except FileNotFoundError:  # another process moved it first
                    pass
            try:
                tmp.rename(dest)
                break
            except OSError:
                if not dest.exists():  # not another process's folder in the way: a real failure
                    raise
        else:
            raise OSError(f"{dest}: other processes kept replacing it; not written")
        for old in olds:
            _carry(old, dest, user_files(old))
    except BaseException:
        if olds and not dest.exists():
            olds.pop().rename(dest)
        raise
    finally:
        for old in olds:
            if not user_files(old):  # (a user's file that could not be moved keeps its folder, beside dest)
                shutil.rmtree(old, ignore_errors=True)
        _let_go(tmp)
    return dest


def under(root: str | Path, name: object, what: str) -> Path:
    """``root / name`` with ``name`` made ONE safe component (``what`` names the flag in errors), checked to stay
    under ``root``; relative when ``root`` is (as the user wrote it: it is recorded in config.yaml and MLflow)."""
    component = safe_component(name, what)
    contained(root, component)
    return Path(root) / component


def is_run_with_config(folder: Path) -> bool:
    """Whether ``folder`` is a run folder pobench made and wrote its config into: a folder with the marker and
    ``RUN_CONFIG`` (bench/runs/folders.py, where the run folder's layout is defined, imports both from here)."""
    return folder.is_dir() and (folder / MARKER).is_file() and (folder / RUN_CONFIG).exists()


def check_not_runs(folder: Path) -> None:
    """UnsafePath (one line) when ``folder``, where a report would go, holds run folders pobench marked (an
    experiment's runs: `--out-root` given as an `--output-dir`). Held-out round 17, H22, H26: it was refused as "not
    created by pobench" with the advice to move it away, which would move every run of the experiment."""
    try:
        runs = not folder.is_symlink() and any(is_run_with_config(c) for c in folder.iterdir())
    except OSError:
        runs = False
    if runs:
        raise UnsafePath(f"{folder} holds pobench's run folders (an --output-dir's runs): not writing reports "
                         "into it; choose another --out-root (the default is reports/out), and leave that folder "
                         "where it is")


def make_lock_folder(lock: str | Path) -> Path:
    """Make the folder of lock file ``lock`` (a ``.locks`` folder) and return ``lock``; one line (UnsafePath, exit 2,
    before any work) when something that is no folder is in its place (held-out round 17, H25: a user's file
    `.locks` made `bench warmstart` stop with "File exists (something not pobench's is in the way)", exit 1)."""
    folder = Path(lock).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        in_the_way = next((p for p in (folder, *folder.parents) if p.is_symlink() or p.exists() and not p.is_dir()),
                          folder)
        raise UnsafePath(f"{in_the_way}: a file that is not pobench's is where pobench keeps its lock files "
                         f"({folder}): move it away, then run the same command again") from None
    return Path(lock)


def lock_file(folder: str | Path, name: str) -> Path:
    """``<folder>/.locks/<name>.lock``, ``name`` (made of user or plugin names: a run, a study, an objective)
    through the one containment helper, so a lock file stays in ``.locks`` whatever the name."""
    return under(Path(folder) / ".locks", f"{name}.lock", "lock name")


def check_out_is_ours(folder: str | Path, flag: str) -> None:
    """UnsafePath (one line) when ``folder`` (a user-given ``--out`` of `bench tune` / `bench eval`, where pobench
    writes files of fixed names: best.yaml, summary.csv, results.json, ...) exists, holds something and is not
    pobench's (no marker): its files of those names would be overwritten. Asked before any work."""
    check_length(folder, flag)
    folder = Path(folder)
    if folder.is_symlink():  # (its target is not a folder pobench made, whatever it holds: never marked or written)
        raise UnsafePath(f"{flag} {folder} is a symbolic link (to {os.readlink(folder)}): not writing through it; give "
                         "a real folder, new or pobench's")
    if folder.is_dir() and not is_owned(folder) and any(folder.iterdir()):
        raise UnsafePath(f"{flag} {folder} exists and holds files pobench did not write (no {MARKER} file): not "
                         "writing into it (files of the names pobench writes would be overwritten); give a new or "
                         "empty folder")
    if folder.is_dir() and is_owned(folder):  # pobench's, but a file it wrote there edited since: kept (H29)
        from reports.edits import check_unedited

        check_unedited(folder, flag)


def claim_output_folder(folder: str | Path, flag: str) -> Path:
    """Create (or take, when empty or pobench's already) the output folder ``folder`` and mark it as pobench's, so
    the same command writes into it again; any other folder: UnsafePath (:func:`check_out_is_ours`)."""
    check_out_is_ours(folder, flag)
    return make_owned(folder, "out")


class OutFolderBusy(ValueError):
    """Another command writes into this output folder now (one line; exit 2, before any work)."""


def hold_out_folder(out: Path, command: str, flag: str = "--out",
                    instead: str = "wait for it to end, or give another --out", on_busy=None):
    """Hold output folder ``out`` for `bench <command>` until the returned lock (a ``filelock.FileLock``) is
    released: ``<parent>/.locks/<name>.<command>.lock``, outside the folder as a run folder's lock is, an ``fcntl``
    lock the kernel releases when its holder dies, the holder's process id beside it (``<lock>.pid``). Else
    OutFolderBusy naming the folder and the process that holds it: two commands writing one folder at once each said
    its results were there, and one's were silently lost (held-out round 11, H17, H21). Take it after the folder's
    own checks (a file in its place, a user's folder): a refused command makes nothing but the lock. With
    ``on_busy``: it is called with the line (worded as a wait) and the hold is waited for instead."""
    from filelock import FileLock, Timeout

    path = make_lock_folder(Path(out).parent / ".locks" / f"{Path(out).name}.{command}.lock")
    pid = path.with_name(path.name + ".pid")
    lock = FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            who = f"process {int(pid.read_text().split()[0])}"
        except (OSError, ValueError, IndexError):
            who = "another process"
        if on_busy is None:
            raise OutFolderBusy(f"{flag} {out}: another bench {command} ({who}) is writing there now (lock {path}); "
                                f"{instead}") from None
        on_busy(f"{flag} {out}: another bench {command} ({who}) is writing there now: waiting for it to end")
        lock.acquire()
    try:
        pid.write_text(f"{os.getpid()}\n")
    except OSError:  # (the process named is a courtesy: the lock holds without it)
        pass
    return lock
