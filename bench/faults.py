"""Faults of the MLflow store, the Optuna storage and the file system, each as ONE line: the cause, the path or URI,
and what to do (docs/RELIABILITY.md). Two halves, one wording:

- before any work, what can be known is checked and refused as bad input (ValueError: exit 2): :func:`check_store`
  (a local SQLite store that is not a file, not SQLite, truncated, of another MLflow schema revision, or read-only:
  the file or the folder SQLite writes its journal in; ``bench.runs.store_check.check_reachable`` calls it for every
  command), :func:`check_output_folder` (``--output-dir`` / ``--out-root`` naming a file, or on a read-only file
  system) and :func:`check_writable` (a run folder);
- a fault met during the work is turned into its line by :func:`describe` (``bench/cli/main.py``, every command:
  exit 1), whatever raised it: an ``OSError`` of the file system, SQLite / SQLAlchemy errors of the MLflow store
  (directly or inside an ``MlflowException``), Optuna's storage errors. What was computed stays: a training run's
  own faults are ended by its lifecycle first (``RunStopped``); this is what reaches the command line.

Nothing here writes: the store is opened read-only (``mode=ro``) to read its schema revision (one with a hot
journal left by an interrupted write excepted: its rollback, as MLflow's own first connection does it).
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path, PurePath

from bench.fault_causes import (  # noqa: F401  (re-exported: faults.answered_status, faults.damaged, ...)
    CLOUD_CLIENTS,
    FULL_ERRNOS,
    NO_ANSWER_STATUSES,
    STORAGE_DAMAGED_ADVICE,
    answered_status,
    cloud_refusal,
    damaged,
    full_errno,
    storage_damage,
    storage_refusal,
)
from bench.fault_causes import chain as _chain
from bench.fault_causes import first_line as _first
from reports.paths import check_length
from reports.record import sqlite_file

SQLITE_MAGIC = b"SQLite format 3\x00"


class ExitCalled(ValueError):
    """``sys.exit()`` called inside a command's work (a plugin's objective, estimator or reward): pobench's own work
    never exits that way, so the command would have ended with that code (0: as if it had finished), silently."""


def exit_called(e: SystemExit) -> ExitCalled:
    """The one line of ``e``: the exit code and the line of code that called ``sys.exit`` (its traceback's last
    frame: ``sys.exit`` is a builtin, so that frame is its caller's)."""
    tb, last = e.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    where = "" if last is None else \
        f" at {last.tb_frame.f_code.co_filename}:{last.tb_lineno} (in {last.tb_frame.f_code.co_name})"
    if getattr(e, "where", None):  # (os._exit called by a plugin: bench.plugin_guard.PluginExit, raised for it)
        where = f" at {e.where}"
    call = getattr(e, "call", "sys.exit")
    return ExitCalled(f"{call}({e.code!r}) was called inside the work{where}: nothing in pobench exits there, so it "
                      "is a plugin's (its objective, estimator or reward): make it raise an exception instead")


class RunNotInStore(ValueError):
    """A checkpoint to resume continues an MLflow run the store does not hold (one line, exit 2; `bench train` adds
    the command that trains the run again)."""


class RaisedInWork(RuntimeError):
    """An error met while a run trained, of a class the command line takes for bad input before any work
    (ValueError, FileNotFoundError: exit 2): a fault met during the work, exit 1 as any other class (its run ended
    FAILED); its cause is the error: one a plugin's code raised, whose traceback names the plugin
    (``bench.plugins.plugin_failure``; held-out round 10, H13: exit 2 or 1 by the class of what the plugin raised),
    or the run folder deleted while the run trained (round 16, H17)."""


class InterruptRaised(RuntimeError):
    """A KeyboardInterrupt raised by code while no stop signal came (``bench.runs.stop.raised_by_code``): a fault of
    that code (a plugin's), which ends its run FAILED, not a stop; its cause is the interrupt, whose traceback names
    the plugin (``bench.plugins.plugin_failure``)."""


def interrupt_raised(e: KeyboardInterrupt) -> InterruptRaised:
    """The one line of ``e``: where it was raised (its traceback's last frame), and that no signal came."""
    tb, last = e.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    where = "" if last is None else \
        f" at {last.tb_frame.f_code.co_filename}:{last.tb_lineno} (in {last.tb_frame.f_code.co_name})"
    text = f" ({str(e)[:200]})" if str(e) else ""
    error = InterruptRaised(f"KeyboardInterrupt{text} was raised{where} while no signal came: a fault of that code, "
                            "not a stop; make it raise an ordinary exception")
    error.__cause__ = e
    return error


class StoreFault(ValueError):
    """A store or folder that cannot be used, found before any work (one line; exit 2)."""


class StoreUnreachable(RuntimeError):
    """The MLflow server did not answer within ``$POBENCH_MLFLOW_TIMEOUT`` seconds (one line, naming the server:
    ``bench.runs.tracking``)."""


class StoreRefused(RuntimeError):
    """The MLflow server answered a request with an error status (HTTP 500: its database or its storage failed), or
    the place a run's files go (its experiment's artifact location: S3, ...) refused a file pobench stores there: one
    line naming the server or the place, its error and what to do (``bench.runs.tracking``)."""


#: the store and storage this command uses (``note``: the tracking URI its check resolved, the Optuna storage), which
#: its fault line names: the exceptions of SQLite and SQLAlchemy do not say which database they came from
_USED: dict[str, str] = {}


def note(*, store: str | None = None, storage: str | None = None) -> None:
    """Record the MLflow store / Optuna storage (password hidden) the command uses, for :func:`describe`."""
    _USED.update({k: v for k, v in (("store", store), ("storage", storage)) if v})


# ------------------------------------------------------------------ before any work
def watch_file(uri: str) -> tuple[Path, tuple[int, int] | None] | None:
    """The local SQLite file of ``uri`` and its identity now ((device, inode); None when it does not exist yet), to
    tell later (:func:`changed`) whether it was deleted or replaced meanwhile: SQLite goes on writing into a deleted
    file through an open connection, and MLflow makes a new one at the path for the next, both silently. None for a
    store that is not a local SQLite file."""
    path = sqlite_file(uri)
    if path is None:
        return None
    st = path.stat() if path.is_file() else None
    return path, None if st is None else (st.st_dev, st.st_ino)


def changed(watched: tuple[Path, tuple[int, int] | None] | None) -> str | None:
    """``"deleted"`` / ``"replaced by another file"`` when the file :func:`watch_file` saw is gone or another one is
    there now; None when it is the same (or was not there then and is now)."""
    if watched is None:
        return None
    path, ident = watched
    now = path.stat() if path.exists() else None
    if now is None:
        return "deleted"
    return "replaced by another file" if ident is not None and (now.st_dev, now.st_ino) != ident else None


def _existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _why_not_writable(path: Path) -> str | None:
    """Why ``path`` (an existing file or folder) cannot be written, or None when it can."""
    if os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
        return None
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "a read-only file system"
    except OSError:
        pass
    return "no write permission (read-only for this user)"


def check_store(uri: str) -> None:
    """Refuse (StoreFault, one line) a local SQLite store that cannot be used, before any work: see the module doc.
    A store that does not exist yet is fine (it is created); other stores are checked by their server."""
    db = sqlite_file(uri)
    if db is None:
        return
    if db.exists() and not db.is_file():
        raise StoreFault(f"the MLflow store {db} ({uri}) is not a file; give --tracking-uri sqlite:///<a file>")
    if db.is_symlink() and not db.exists():  # (SQLite would create nothing there: MLflow retries, then fails)
        raise StoreFault(f"the MLflow store {db} is a symbolic link to {os.readlink(db)}, which does not exist: "
                         "restore its target, or remove the link (a new store starts) or give another --tracking-uri")
    folder = _existing(db.parent)
    if not folder.is_dir():
        raise StoreFault(f"the MLflow store {db}: {folder} is a file, not a folder; give another --tracking-uri")
    for what, path in (("", db), (f"its folder {folder}: ", folder)):
        why = _why_not_writable(path) if path.exists() else None
        if why:
            raise StoreFault(f"the MLflow store {db} is read-only ({what}{why}; SQLite writes the file and a journal "
                             "beside it): make both writable, or give --tracking-uri sqlite:///<a writable path>")
    from reports.record import ARTIFACTS

    arts = db.parent / ARTIFACTS
    if (arts.exists() or arts.is_symlink()) and not arts.is_dir():  # (runs would fail at their first file, RUNNING)
        raise StoreFault(f"{arts} is not a folder: the MLflow store {db} keeps its runs' files there (config.yaml, "
                         "reports, study outputs); move it away, or give another --tracking-uri")
    if db.exists() and db.stat().st_size:
        _check_sqlite(db, uri)


def sqlite_damage(db: Path) -> str | None:
    """Why the existing file ``db`` is not a sound SQLite database, from its header (not one at all: its first
    bytes; truncated: fewer bytes than its header declares); None when the header is sound."""
    with open(db, "rb") as f:
        header = f.read(100)
    if not header.startswith(SQLITE_MAGIC):
        return f"not an SQLite database (its first bytes are {header[:16]!r})"
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    pages, counter, valid_for = (int.from_bytes(header[i:i + 4], "big") for i in (28, 24, 92))
    if pages and counter == valid_for and db.stat().st_size < pages * page:
        return f"damaged: truncated ({db.stat().st_size} bytes of the {pages * page} its header declares)"
    return None


def _check_sqlite(db: Path, uri: str, locked_again: bool = False) -> None:
    away = ("move it away (pobench does not write into it) to start a new store there, or give another "
            "--tracking-uri")
    why = sqlite_damage(db)
    if why is not None:
        restore = "restore it from a backup, or " if why.startswith("damaged") else ""
        raise StoreFault(f"the MLflow store {db} is {why}; {restore}" + away)
    try:
        row, tables = _schema(db)
    except sqlite3.DatabaseError as e:
        if "no such table" in str(e):
            raise StoreFault(f"the MLflow store {db} is an SQLite database but not MLflow's (no alembic_version "
                             "table); " + away) from None
        if "locked" in str(e):  # another process writes it now: MLflow waits for it, but not for ever
            if locked_again:
                raise StoreFault(f"the MLflow store {db} {LOCKED}") from None
            return _check_sqlite(db, uri, locked_again=True)
        raise StoreFault(f"the MLflow store {db} is damaged ({e}); restore it from a backup, or " + away) from None
    if row is not None:
        schema_revision(db, uri, row[0])
        missing = sorted(missing_tables(tables))
        if missing:  # (held-out round 9: a dropped latest_metrics was six tracebacks and a run left RUNNING)
            raise StoreFault(f"the MLflow store {db} is damaged (no such table: {', '.join(missing)}); restore it "
                             "from a backup, or " + away)


def _schema(db: Path) -> tuple[tuple | None, set[str]]:
    """(the alembic_version row, the table names) of the SQLite file ``db``, read read-only. A write interrupted by
    a killed process or a fault (held-out round 16, H31: the file made unwritable mid-write) leaves a hot journal
    beside it, which a read-only connection cannot roll back ("attempt to write a readonly database": the store was
    called damaged, and the advised resume refused): then read through a writable connection, which rolls it back as
    MLflow's own first connection would."""
    def read(con) -> tuple[tuple | None, set[str]]:
        try:
            return (con.execute("select version_num from alembic_version").fetchone(),
                    {t for (t,) in con.execute("select name from sqlite_master where type = 'table'")})
        finally:
            con.close()

    try:
        return read(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=20))
    except sqlite3.OperationalError as e:
        if "readonly database" not in str(e) or not db.with_name(db.name + "-journal").exists():
            raise
    return read(sqlite3.connect(db, timeout=20))


def missing_tables(tables: set[str]) -> set[str]:
    """The tables of the installed MLflow's schema that are not among ``tables`` (those of a store at its schema
    revision: ``schema_revision`` checked it). MLflow's table definitions are loaded with its store's code, which
    reading the revision imported already."""
    import mlflow.store.db.utils  # noqa: F401  (the store's code: it imports the definitions of its tables)
    from mlflow.store.db.base_sql_model import Base

    return set(Base.metadata.tables) - tables


def schema_revision(db: Path | str, uri: str, found: str) -> None:
    """Refuse a store whose schema revision is not the installed MLflow's: a newer MLflow's (unknown here: upgrade
    MLflow; MLflow's own advice, ``mlflow db upgrade``, cannot go back) or an older one's (``mlflow db upgrade``)."""
    import mlflow
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    script = ScriptDirectory.from_config(_get_alembic_config(db_url=""))
    head = script.get_current_head()
    if found == head:
        return
    try:
        known = script.get_revision(found) is not None
    except Exception:  # alembic: "No such revision"
        known = False
    if not known:
        raise StoreFault(f"the MLflow store {db} was written by a newer MLflow (its schema revision {found} is "
                         f"unknown to MLflow {mlflow.__version__} installed here): upgrade MLflow (pip install -U "
                         "mlflow) to use it, or give another --tracking-uri")
    raise StoreFault(f"the MLflow store {db} was written by an older MLflow (schema revision {found}; MLflow "
                     f"{mlflow.__version__} expects {head}): back it up, then run `mlflow db upgrade {uri}`, or give "
                     "another --tracking-uri")


def check_artifact_folder(experiment: str, location: str) -> None:
    """Refuse (StoreFault, one line) the experiment ``experiment`` when its runs' files go to a local folder
    (``location``: a path or ``file:`` URI, as MLflow stores it) that cannot be made or written: found at the run's
    first file, the run was FAILED and its folder made (held-out round 9: ``[Errno 2] No such file or directory:
    '/proc/nope'``). The folder is made as MLflow makes it at a run's first file. Another scheme (``s3://``, an MLflow
    server's ``mlflow-artifacts:``) is checked by its first use (:class:`StoreRefused`)."""
    from urllib.parse import urlparse

    if urlparse(location).scheme not in ("", "file"):
        return
    from mlflow.utils.file_utils import local_file_uri_to_path

    path = Path(local_file_uri_to_path(location))
    try:
        path.mkdir(parents=True, exist_ok=True)
        why = _why_not_writable(path)
    except OSError as e:
        why = f"{e.strerror}: {e.filename}" if e.filename else e.strerror or str(e)
    if why:
        raise StoreFault(f"experiment {experiment!r} keeps its runs' files in {location}, which cannot be written "
                         f"({why}): give another --experiment (a new one keeps them beside the store), or make that "
                         "folder writable (MLflow cannot move an experiment's files)")


def check_output_folder(path: str | Path, flag: str, default: str | None = None) -> None:
    """Refuse (StoreFault, one line naming ``flag``, or the folder as its default when it is ``default``: held-out
    round 14, H17) a folder pobench will write into when a file stands at it or above it, or it cannot be written
    (checked on its nearest existing folder), or a name in it is longer than the file system takes."""
    check_length(path, flag)
    name, fix = (f"{path} (the default {flag})", f"move that file away, or give another {flag}") if \
        str(path) == default else (f"{flag} {path}", "give a folder (it is created when missing)")
    existing = _existing(Path(path))
    if not existing.is_dir():
        where = "" if existing == Path(os.path.abspath(path)) else f" ({existing} is a file)"
        raise StoreFault(f"{name}: not a folder{where}; {fix}")
    why = _why_not_writable(existing)
    if why:
        raise StoreFault(f"{name}: cannot be written ({existing}: {why}); give a writable folder")


def check_writable(folder: str | Path, what: str) -> None:
    """Refuse (StoreFault) an existing ``folder`` that cannot be written (``what`` says what to choose instead)."""
    why = _why_not_writable(Path(folder)) if Path(folder).is_dir() else None
    if why:
        raise StoreFault(f"{folder} cannot be written ({why}); make it writable, or choose another {what}")


# ------------------------------------------------------------------ during the work
_NO_SPACE = FULL_ERRNOS
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
_IN_THE_WAY = (errno.ENOTDIR, errno.EEXIST, errno.EISDIR)


#: what a command stopped by a damaged MLflow store is told (a training run's command words its own: its checkpoints)
DAMAGED_ADVICE = "restore it from a backup, or move it away and rerun"


def check_sqlite_file(db: Path, what: str) -> None:
    """StoreFault (one line, naming ``what``) when ``db`` is a folder, cannot be read, or is not a sound SQLite file
    (:func:`sqlite_damage`); an absent or empty file is fine (SQLite creates it)."""
    if db.is_dir():
        raise StoreFault(f"{what}: {db} is a folder, not a SQLite file: give a file path")
    if db.exists() and not db.is_file():  # (a device, a pipe, a link to /dev/null: SQLite says "disk I/O error")
        link = f", a link to {os.readlink(db)}" if db.is_symlink() else ""
        raise StoreFault(f"{what}: {db} is not a regular file{link}; give the path of a SQLite file (sqlite:///<a "
                         "file>)")
    try:
        why = sqlite_damage(db) if db.stat().st_size else None
    except FileNotFoundError:
        return
    except OSError as e:
        raise StoreFault(f"{what}: {db} cannot be read ({e.strerror}): make it readable") from None
    if why is not None:
        raise StoreFault(f"{what}: {db} is {why}; restore it from a backup, or move it away and rerun (a new "
                         "study starts)")


#: the end of the line for a store another process keeps locked (SQLite's "database is locked" after every wait)
LOCKED = ("stayed locked by another process (SQLite: database is locked) through every wait: let that process finish "
          "(an open sqlite3 shell or transaction, a backup tool), then rerun the same command")


def describe(error: BaseException, store: str | None = None, storage: str | None = None) -> str | None:
    """The one line of a fault of the MLflow store (``store``: its URI; default: the one :func:`note` recorded), the
    Optuna storage (``storage``, password hidden) or the file system behind ``error``; None when ``error`` is none
    of those (a bug: its traceback is shown)."""
    store, storage = store or _USED.get("store"), storage or _USED.get("storage")
    for e in _chain(error):
        if isinstance(e, StoreRefused):
            return str(e)
        if isinstance(e, StoreUnreachable):  # (met outside a training run, which adds what it kept)
            return f"{e}; once it answers again, rerun the same command"
    if (status := answered_status(error)) is not None:  # (met outside a training run, whose logger words its own)
        return (f"the MLflow server {store or ''} answered a request with HTTP {status} (its log says why: its "
                "database or storage failed, say): fix the server, then rerun the same command").replace("  ", " ")
    if (cloud := cloud_refusal(error)) is not None:
        return (f"the place the experiment's runs' files go refused a file ({cloud}): give pobench access to that "
                "place (its credentials), or give another --experiment (a new one keeps its files beside the store, "
                "or where the server chooses), then rerun")
    optuna_error = any(type(e).__name__ == "StorageInternalError" for e in _chain(error))
    if optuna_error and (damage := storage_damage(error)) is not None:  # (Optuna's storage: the chain says which)
        return f"the Optuna storage {storage or ''} is damaged ({damage}); {STORAGE_DAMAGED_ADVICE}"
    for e in _chain(error):
        text = str(e)
        if isinstance(e, OSError) and e.errno in (*_NO_SPACE, *_READ_ONLY, *_IN_THE_WAY) and e.filename is not None:
            return _os_line(e, store)
        if isinstance(e, OSError) and e.errno in _NO_SPACE:  # (a write's error carries no file name)
            return _os_line(e, store)
        if not isinstance(e, OSError) and (code := full_errno(e)) is not None:  # (a library's own type: round 16,
            full = OSError(code, os.strerror(code))  # H18, safetensors' SafetensorError, its traceback shown)
            full.__traceback__ = e.__traceback__  # (where it wrote: :func:`_written_path`)
            return _os_line(full, store)
        db = f"the MLflow store {store}" if store else "the MLflow store"
        gone = store is not None and (path := sqlite_file(store)) is not None and not path.exists()
        if gone and ("readonly database" in text or "unable to open database file" in text or "no such table" in
                     text):  # (deleted while open: SQLite reports it as read-only)
            return (f"{db} is gone from {path} while in use (its folder moved or renamed, or the file deleted): "
                    "if the folder was moved, rerun from its new place (the store and runs are there); if the file "
                    "was deleted, with every run it held, restore it from a backup, or rerun (a new store starts)")
        if "database or disk is full" in text:  # (SQLite's ENOSPC: MLflow's traceback, naming no file)
            where = (sqlite_file(store) if store else None) or db
            return f"no space left on device while writing {where} (SQLite: database or disk is full): free space"
        if "disk I/O error" in text and not optuna_error:  # (SQLite: its file made unwritable under an open
            where = (sqlite_file(store) if store else None) or db  # connection, `chattr +i`; a failing disk: round 16,
            return (f"the MLflow store {where} could not be written (SQLite: disk I/O error: the file made "  # H31)
                    "unwritable while in use, say by `chattr +i`, or its disk failing): make it writable again "
                    "(lsattr / chattr -i, chmod) or check the disk, then rerun")
        if "database is locked" in text and not optuna_error:
            return f"{db} {LOCKED}"
        if "readonly database" in text or "read-only database" in text:
            return (f"{db} became read-only (attempt to write a readonly database): make the file and its folder "
                    "writable, then rerun")
        if "database disk image is malformed" in text or "file is not a database" in text or \
                "no such table" in text and not optuna_error and store is not None and sqlite_file(store) is not None:
            return f"{db} is damaged ({_first(text, 'malformed', 'not a database', 'no such table')}); {DAMAGED_ADVICE}"
        if "unable to open database file" in text:
            return f"{db} cannot be opened (unable to open database file): check its folder exists and is writable"
        if "Detected out-of-date database schema" in text and store:
            try:
                found = text.split("found version ")[1].split(",")[0]
                schema_revision(sqlite_file(store) or store, store, found)
            except StoreFault as fault:
                return str(fault)
            except (IndexError, ImportError):
                pass
        if type(e).__name__ == "StorageInternalError":  # (Optuna's: its own text says only that one was raised)
            cause = e.__cause__ or e
            where = f"the Optuna storage {storage}" if storage else "the Optuna storage"
            refused = storage_refusal(e)
            if refused:
                return f"{where} {refused}, then rerun the same command (the finished trials are kept in it)"
            return (f"{where} failed ({type(cause).__name__}: {_first(str(cause))}); the finished trials are kept in "
                    "it: once it answers again, rerun the same command")
    return None


def _written_path(e: BaseException) -> str | None:
    """The file a failed write without a file name was writing, where its traceback shows it: the ``pathlib.Path`` of
    the innermost ``write_text`` / ``write_bytes`` / ``open`` (a full disk fails the write or the close, and those
    errors name no file: "no space left on device while writing a file" named nothing)."""
    tb, found = e.__traceback__, None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in ("write_text", "write_bytes", "open") and \
                isinstance(me := frame.f_locals.get("self"), PurePath):
            found = str(me)
        if frame.f_code.co_name in ("save_file", "save") and any(lib in frame.f_code.co_filename for lib in (
                "safetensors", "PIL")) and frame.f_locals.get("filename"):  # (a model's weights, H18; a figure's
            found = os.fspath(frame.f_locals["filename"])  # PNG, drawn by matplotlib through Pillow, H32: round 16)
        if frame.f_code.co_name == "copyfile" and frame.f_code.co_filename.endswith("shutil.py") and \
                frame.f_locals.get("dst") is not None:  # (its error names the source: round 15, H04)
            found = os.fspath(frame.f_locals["dst"])
        tb = tb.tb_next
    return found


def _full_store(store: str | None) -> Path | None:
    """The MLflow store's SQLite file when the disk holding it is full (under 64 KiB free): the file system a write
    without a file name most likely failed on (held-out round 15, H04: "while writing a file" named no file, and the
    one folder the line named, the checkpoints', was on another disk)."""
    db = sqlite_file(store) if store else None
    try:
        st = os.statvfs(db.parent) if db is not None else None
    except OSError:
        return None
    return db if st is not None and st.f_bavail * st.f_frsize < 64 * 1024 else None


def _os_line(e: OSError, store: str | None = None) -> str:
    written = _written_path(e) if e.errno in _NO_SPACE else None
    path = written or (e.filename if e.filename is not None else None)
    why = e.strerror or os.strerror(e.errno)
    where = f" while writing {path}" if path is not None else " while writing a file"
    if path is None and e.errno in _NO_SPACE and (db := _full_store(store)) is not None:
        where = f" on the disk of the MLflow store {db} (a write there failed)"
    if e.errno == errno.EFBIG:
        return f"no space left on device{where} ({why}: the file-size limit, ulimit -f): raise it or free space"
    if e.errno in _NO_SPACE:
        return f"no space left on device{where} ({why}): free space"
    if e.errno in _READ_ONLY:
        kind = "a read-only file system" if e.errno == errno.EROFS else f"{why}: no permission"
        return f"{path} cannot be written ({kind}); make it writable, or choose another folder"
    return f"{path}: {why} (something not pobench's is in the way); move it away"
