"""The MLflow record of pobench, defined once: tag names, the tracking URI, the store and its experiments, version
tags and batch logging.

Both sides of the record use this module: ``bench`` writes runs (``bench train`` / ``run`` / ``tune`` / ``eval``),
``reports`` reads them and writes the derived numbers and the comparison run. Imports point one way (``bench`` uses
``algorithms``, ``evaluators`` and ``reports``, never the reverse), so the definitions both need live here, on the
``reports`` side, and depend on MLflow only.

Tags (``pobench.*``) of a training run: ``kind=train``, ``objective``, ``seed``, ``config_hash``, ``version``,
``git_commit``, ``model``, ``task``, ``control``, ``comparison`` (the comparison that trained it), the membership tag
``pobench.in.<comparison id>`` (``"1"``: a member, also when reused by a later comparison; ``"0"``: redone by
``--force``), ``overrides``, ``variant``; after a report, ``derived.<name>``. docs/METRICS.md and docs/REPORTS.md
describe every tag and metric; tests/bench/test_record_keys.py pins the keys ``bench run`` writes.

The local store: several processes write to one store (the workers of one ``bench run``, two commands started at
once in one folder). MLflow creates its tables and runs its migrations on the first connection; two processes doing
that at once corrupt a fresh SQLite store. :func:`open_client` takes an exclusive file lock (``<db>.lock`` next to
``mlflow.db``) around the first connection of each process, so exactly one process creates and migrates the store;
:func:`get_or_create_experiment` creates experiments under the same lock. The locks are ``fcntl`` locks
(``filelock``), released by the kernel when a process dies. Remote stores (``http(s)://``, PostgreSQL) need no lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from reports.dburl import with_driver
from reports.paths import safe_component

# ------------------------------------------------------------------ tag names
KIND = "pobench.kind"                # train | comparison | eval | tune-study | tune-trial
COMPARISON = "pobench.comparison"    # on a training run: the comparison that trained it; on a comparison run: its id
CONFIG_HASH = "pobench.config_hash"  # identical across the runs of one comparison
OBJECTIVE = "pobench.objective"
SEED = "pobench.seed"
VARIANT = "pobench.variant"          # objective name + override label, when overrides are given
OVERRIDES = "pobench.overrides"
VERSION = "pobench.version"
GIT_COMMIT = "pobench.git_commit"
GIT_DIRTY = "pobench.git_dirty"          # 1: the checkout had uncommitted changes to tracked files (0: none)
SOURCE_GIT_COMMIT = "mlflow.source.git.commit"  # MLflow's own name for the commit (its UI links it)
MEMBER_PREFIX = "pobench.in."
DERIVED_PREFIX = "pobench.derived."  # + a derived metric's name: why it has no value; + "comparison": its report
MODEL = "pobench.model"
TASK = "pobench.task"
CONTROL = "pobench.control"          # none | random-reward
CONTROL_OF = "pobench.control_of"    # a positive control's run: the objective it is worse than by construction
ENGINE = "pobench.engine"            # absent for the native loop; trl | verl
ENGINE_DISTRIBUTED = "pobench.engine_distributed"  # TRL engine: accelerate's distributed type
ENGINE_PROCESSES = "pobench.engine_processes"      # TRL engine: number of processes
STOPPED = "pobench.stopped"          # "early": stopped by a callback (pruner, convergence)
FAILURE = "pobench.failure"          # the cause, on a FAILED run
RESUMED_AFTER = "pobench.resumed_after"  # a resumed run that had ended FAILED / KILLED: "FAILED: <cause>; ..."
STEPS_EXTENDED = "pobench.steps_extended"  # resumed with a larger --steps: every length it was given, "40,60"
PLUGINS = "pobench.plugins"          # the plugins loaded: <file>@<source digest>, comma-separated (bench/plugins.py)
OBJECTIVES = "pobench.objectives"    # on a comparison run: its objectives, comma-separated
SEEDS = "pobench.seeds"              # on a comparison run: its seeds, comma-separated
BASELINE = "pobench.baseline"        # on a comparison run: the baseline its last report compared against
BENCHMARK = "pobench.benchmark"      # on an eval run of `bench eval --comparison`: the benchmark it evaluated
EVAL_KEY = "pobench.eval_key"        # ... and the hash of its evaluation settings (same key = reusable result)
FINAL_DIGEST = "pobench.final_digest"  # ... and the digest of the final weights it evaluated (reused on a match only)
STUDY = "pobench.study"              # tune runs: the Optuna study
TRIAL = "pobench.trial"              # tune-trial runs (and their training runs): the trial number
TRIAL_STATE = "pobench.trial_state"
FAIL_REASON = "pobench.fail_reason"
RETRY_OF = "pobench.retry_of"        # a re-queued trial: the number of the trial whose worker died
BEST_TRIAL = "pobench.best_trial"    # on a tune-study run
BEST_VALUE = "pobench.best_value"
CONFIRM = "pobench.confirm"          # on a tune-study run: the confirm's verdict, better | worse | unresolved | default
CONFIRM_TRIAL = "pobench.confirm_trial"  # ... the trial it confirmed against the default
CONFIRM_SEEDS = "pobench.confirm_seeds"  # ... and its fresh seeds, comma-separated
CONFIRM_OF = "pobench.confirm_of"    # a training run of `bench tune --confirm-seeds`: the study it was trained for


def member_tag(comparison: str) -> str:
    """The membership tag of a comparison, ``pobench.in.<id>`` (``"1"`` on its member runs)."""
    return f"{MEMBER_PREFIX}{comparison}"


# ------------------------------------------------------------------ tracking URI
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def tracking_uri(uri: str | None) -> str:
    """The MLflow tracking URI every command uses: ``uri`` when given, else ``$MLFLOW_TRACKING_URI``, else MLflow's
    own default, which is :data:`DEFAULT_TRACKING_URI` (``sqlite:///mlflow.db``) in the working folder, made absolute;
    a PostgreSQL backend-store URI gets the installed driver (reports/dburl.py).

    (MLflow resolves its default: the URI set by ``mlflow.set_tracking_uri`` in this process if any; a working folder
    that already holds a file store with runs in ``./mlruns`` makes MLflow choose that file store instead.)"""
    if uri:
        resolved = uri
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        resolved = os.environ["MLFLOW_TRACKING_URI"]
    else:
        import mlflow

        resolved = mlflow.get_tracking_uri()
    return with_driver(resolved) if resolved.startswith("postgres") else resolved


# ------------------------------------------------------------------ the store and its experiments
_READY: set[str] = set()  # URIs whose store this process has already opened under the lock


def store_lock_path(uri: str) -> Path | None:
    """The lock file that guards a local store's creation (``<db>.lock`` / ``<folder>.lock``); None if remote."""
    if uri.startswith("sqlite:"):
        p = sqlite_file(uri)
        return None if p is None else p.with_name(p.name + ".lock")
    if uri.startswith("file:") or "://" not in uri:  # MLflow's file store: a folder
        from urllib.parse import urlparse

        p = Path(urlparse(uri).path if uri.startswith("file:") else uri)
        return p.with_name(p.name + ".lock")
    return None


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive lock on a local store (a no-op for remote ones)."""
    path = store_lock_path(uri)
    if path is None:
        yield
        return
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield


def mlflow_error() -> type[Exception]:
    """MLflow's own exception class, for ``except`` clauses: MLflow is imported on first use (its import is about 2
    CPU-seconds, which a command that fails on its input, `bench list` or `bench --help` need not pay)."""
    from mlflow.exceptions import MlflowException

    return MlflowException


def open_client(uri: str):
    """An ``MlflowClient`` on ``uri`` whose store exists and is fully migrated.

    The first call of a process for a local store connects under :func:`store_lock`, so concurrent processes never
    create / migrate the same fresh store at once."""
    from mlflow import MlflowClient

    if uri in _READY or store_lock_path(uri) is None:
        return MlflowClient(tracking_uri=uri)
    with store_lock(uri):
        db = sqlite_file(uri)
        if db is not None and not db.exists() and not db.is_symlink():
            create_store(db)
        client = MlflowClient(tracking_uri=uri)
        # the first connection: creates and migrates the store (waited for while another process holds it locked)
        retry_locked(client.search_experiments, max_results=1)
    _READY.add(uri)
    return client


def sqlite_file(uri: str) -> Path | None:
    """The database file of a local SQLite URI (None for any other store, or an in-memory one)."""
    if not uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url

    db = make_url(uri).database
    return Path(db) if db and db != ":memory:" else None


def creating_name(db: Path) -> Path:
    """Where :func:`create_store` builds a new store before it is renamed to ``db``: ``.<name>.pobench-creating``
    beside it."""
    return db.with_name(f".{db.name}.pobench-creating")


#: MLflow's version: the bytes of an empty store its migrations made in this process (:func:`create_store`)
_EMPTY_STORE: dict[str, bytes] = {}


def create_store(db: Path) -> None:
    """Create a new local MLflow store at ``db`` whole or not at all: MLflow creates its tables and runs its
    migrations (1-3 CPU-seconds) in a file beside it (:func:`creating_name`), which is renamed to ``db`` once
    complete. Held-out round 9: a SIGTERM while MLflow created its tables in ``mlflow.db`` itself left a store of an
    old schema revision (or one without ``alembic_version``) that the next command refused, with advice to upgrade it.
    Called under :func:`store_lock` (one creator at a time), so a file at the temporary name is one a killed creator
    left: it is replaced. (MLflow adds its Default experiment at the first connection to ``db``.) A process's later
    stores are copies of the empty store its first one was before that rename (``_EMPTY_STORE``)."""
    import mlflow

    db = Path(os.path.abspath(db))
    tmp = creating_name(db)
    journal = tmp.with_name(tmp.name + "-journal")
    try:
        for left in (tmp, journal):
            left.unlink(missing_ok=True)
        made = _EMPTY_STORE.get(mlflow.__version__)
        if made is None:
            _migrate(tmp)
            _EMPTY_STORE[mlflow.__version__] = tmp.read_bytes()
        else:
            with open(tmp, "xb") as fh:
                fh.write(made)
        if not db.exists():  # (another program, not under pobench's lock, may have made one meanwhile: kept)
            os.replace(tmp, db)
    finally:
        for left in (tmp, journal):
            left.unlink(missing_ok=True)


def _migrate(path: Path) -> None:
    """MLflow's tables made and its migrations run in a new SQLite file ``path``."""
    from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine_with_retry

    engine = create_sqlalchemy_engine_with_retry(f"sqlite:///{path}")
    db_log = logging.getLogger("mlflow.store.db.utils")  # (its INFO lines "Creating initial MLflow database
    level = db_log.level  # tables..." / "Updating database tables" said in every first command: noise)
    db_log.setLevel(max(level, logging.WARNING))
    try:
        _initialize_tables(engine)
    finally:
        db_log.setLevel(level)
        engine.dispose()


#: the folder beside a local SQLite store where its experiments keep their runs' files (:func:`artifact_location`)
ARTIFACTS = "mlartifacts"


def artifact_location(uri: str, name: str) -> str | None:
    """Where a new experiment of a local SQLite store keeps its runs' files (config.yaml, report, study outputs):
    ``mlartifacts/<name made one safe path component>`` beside the database, so a store's files are found beside it,
    whatever the working folder was. (MLflow's own choice
    is ``./mlruns`` of the folder the creating process ran in: `bench run --tracking-uri sqlite:////data/mlflow.db`
    from a repository left the runs' files in the repository.) None for other stores: a tracking server chooses."""
    if not uri.startswith("sqlite:") or (lock := store_lock_path(uri)) is None:
        return None
    return str(lock.parent.resolve() / ARTIFACTS / safe_component(name, "experiment"))  # (bounded, distinct)


#: MLflow refuses a longer experiment name (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH), after work began
MAX_EXPERIMENT_NAME = 500


def check_experiment_name(name: object, flag: str = "--experiment") -> str:
    """``name`` when MLflow can store it as an experiment's name; ValueError (one line, naming ``flag``) otherwise,
    before any work."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{flag}={name!r}: give a non-empty experiment name")
    if len(name) > MAX_EXPERIMENT_NAME:
        raise ValueError(f"{flag}: an experiment name of {len(name)} characters; MLflow stores at most "
                         f"{MAX_EXPERIMENT_NAME}: give a shorter one")
    return name


def get_or_create_experiment(client, uri: str, name: str) -> str:
    """The id of experiment ``name`` (restored if deleted, created if absent: with :func:`artifact_location`), safe
    against concurrent creators. A name MLflow cannot store: ValueError, before the store is touched."""
    check_experiment_name(name)
    with store_lock(uri):
        exp = client.get_experiment_by_name(name)
        if exp is not None and exp.lifecycle_stage == "deleted":  # (said: its earlier runs come back with it)
            client.restore_experiment(exp.experiment_id)
            print(f"pobench: note: experiment {name!r} had been deleted in the MLflow store {uri}; restored it, with "
                  "its earlier runs, to record into it (give another --experiment to keep it deleted)",
                  file=sys.stderr)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_location(uri, name))
        except Exception:  # a remote store: another process created it between the two calls
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


# ------------------------------------------------------------------ writes that SQLite refused for a moment
LOCK_ATTEMPTS = 4  # each waits up to MLflow's SQLite busy timeout (20 s), then 0.25, 0.5, 1 s between attempts


class _LockedRetried(logging.Filter):
    """MLflow logs every "database is locked" of its SQLite store, traceback included, before raising it: on Ctrl-C
    or SIGTERM to a `bench run` with workers that is hundreds of lines under the one line the command prints.
    ``retry_locked`` retries those writes, and the last refusal is raised to the caller, so the log record goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "database is locked" not in record.getMessage()


def retry_locked(fn, *args: Any, attempts: int = LOCK_ATTEMPTS, first_wait: float = 0.25, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, called again (with doubling waits) while it fails with SQLite's "database is locked".

    MLflow's SQLite store waits up to 20 s for the write lock (``busy_timeout``) and then gives up. On Ctrl-C to a
    `bench run` with 2 workers on a loaded machine, both workers and the driver end their runs at once and one of them
    hit that limit (CI, 2 cores: a traceback instead of "interrupted; rerun the same command to resume"). The failed
    transaction is rolled back, so calling again is safe. Any other error is raised at once; the last attempt's error
    is raised as it is.

    Also retried: two processes setting the same new tag of one run at once (MLflow's ``set_tag`` reads, then inserts
    the row; the slower insert fails on the tags table's primary key): two `bench tune` workers marking one dead
    worker's trial (CI saw it on the study run's best-trial tags, which are now one batch: MLflow retries a batch's
    tags itself). Called again, the write finds the row and updates it.
    """
    db_log = logging.getLogger("mlflow.store.db.utils")  # (MLflow logs each refusal with its traceback)
    if not any(isinstance(f, _LockedRetried) for f in db_log.filters):
        db_log.addFilter(_LockedRetried())
    wait = first_wait
    for attempt in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not (_locked(e) or _tag_raced(e)) or attempt == attempts - 1:
                raise
            time.sleep(wait)
            wait = min(2 * wait, 8.0)
    raise AssertionError("unreachable")


def _locked(e: BaseException | None) -> bool:
    """SQLite's "database is locked", raised as it is (MLflow) or as the cause of another error (Optuna's storage
    raises StorageInternalError from it: a stopped `bench tune` lost a trial's re-queue to it)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if "database is locked" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _tag_raced(e: BaseException) -> bool:
    """The insert of a tag row lost to another process's insert of the same (run, key), or of a dataset row to
    another's insert of the same dataset (two pairs of a comparison starting at once log their common data: CI saw
    it): SQLite's and PostgreSQL's words for a duplicate primary key of MLflow's tags (``tag_pk``) or datasets
    (``dataset_pk``) table. Called again, the write finds the row."""
    text = str(e)
    return any(words in text for words in ("UNIQUE constraint failed: tags.key, tags.run_uuid", 'unique constraint '
                                           '"tag_pk"', "UNIQUE constraint failed: datasets.", 'unique constraint '
                                           '"dataset_pk"'))


# ------------------------------------------------------------------ batch logging
MAX_BATCH = 1000  # MLflow's limit on the metrics (and on all entries) of one log_batch call
MAX_BATCH_PARAMS_TAGS = 100  # MLflow's limit on the params, and on the tags, of one log_batch call


def log_batch(client, run_id: str, metrics: Iterable[Any] = (), params: Iterable[Any] = (),
              tags: Iterable[Any] = ()) -> None:
    """``client.log_batch`` in as many calls as MLflow's limits need (one call when everything fits in one)."""
    metrics, params, tags = list(metrics), list(params), list(tags)
    if len(metrics) + len(params) + len(tags) <= MAX_BATCH and len(params) <= MAX_BATCH_PARAMS_TAGS \
            and len(tags) <= MAX_BATCH_PARAMS_TAGS:
        if metrics or params or tags:
            retry_locked(client.log_batch, run_id, metrics=metrics, params=params, tags=tags)
        return
    for i in range(0, len(params), MAX_BATCH_PARAMS_TAGS):
        retry_locked(client.log_batch, run_id, params=params[i:i + MAX_BATCH_PARAMS_TAGS])
    for i in range(0, len(tags), MAX_BATCH_PARAMS_TAGS):
        retry_locked(client.log_batch, run_id, tags=tags[i:i + MAX_BATCH_PARAMS_TAGS])
    for i in range(0, len(metrics), MAX_BATCH):
        retry_locked(client.log_batch, run_id, metrics=metrics[i:i + MAX_BATCH])
