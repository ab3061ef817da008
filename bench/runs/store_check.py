"""The checks a command makes of its MLflow store before any work (every command: ``check_reachable``): the store
answers within ``$POBENCH_MLFLOW_TIMEOUT`` (an MLflow server's API with the user's credentials, a database server's
connection, a SQLite file's revision and tables), the experiment's artifact folder can be written, the output folder
is not inside MLflow's artifact folder, and a `bench train --comparison ID` joins a comparison of its own
configuration. Each failure is one ValueError line (exit 2), before any run or folder is made.
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench import faults
from bench.inputs import check_tracking_scheme
from bench.runs import server_answers, tracking
from bench.runs.tracking import TIMEOUT_ENV, bounded_http, database_server, store_client, timeout_s
from reports import record
from reports.dburl import connect_error, redact
from reports.record import mlflow_error, open_client


def check_reachable(uri: str | None, *, reads_only: bool = False, experiment: str | None = None) -> str:
    """Resolve the tracking URI and, for an MLflow server (http/https), check that it answers within
    ``$POBENCH_MLFLOW_TIMEOUT`` seconds (default 5): one ValueError line naming the URI otherwise, before any model
    is loaded. (MLflow's own client retries a refused connection for about four minutes before it gives up.) A local
    SQLite store is checked without writing it (``bench.faults.check_store``); a command that only reads
    (``reads_only``: `bench report`, `bench compare`) refuses one that does not exist rather than create an empty one.
    ``experiment``, the one the command records into: when it exists, the folder its runs' files go to is checked
    (:func:`check_artifact_location`). Returns the resolved URI."""
    timeout = timeout_s()  # (a malformed value refused whatever the store: held-out round 11, H02, it was ignored
    # for a local SQLite store, and refused only once a server was asked)
    resolved = check_tracking_scheme(record.tracking_uri(uri))  # foo://bar: one line, not MLflow's traceback
    faults.note(store=resolved)  # (what a fault of the store met later names)
    db = record.sqlite_file(resolved)
    if reads_only and db is not None and not db.exists():
        raise ValueError(f"no MLflow store at {db} (the tracking URI {resolved}): nothing to read; run `bench run` "
                         "here first, or give --tracking-uri (or MLFLOW_TRACKING_URI) of the store that holds the runs")
    if not resolved.startswith(("http://", "https://")):
        faults.check_store(resolved)  # read-only, not SQLite, truncated, another schema revision: one line now
        check_store_lock(resolved)
        if database_server(resolved):
            why = connect_error(resolved, timeout)  # (PostgreSQL, MySQL, ...: down, no such database: held-out
            if why is not None:  # round 10, H04: MLflow's traceback from the first request)
                raise ValueError(f"the MLflow store {redact(resolved)} cannot be used: {why}; start its database "
                                 "server or create the database, or fix --tracking-uri / MLFLOW_TRACKING_URI")
        if experiment is not None:
            check_artifact_location(resolved, experiment)
        return resolved
    try:
        with urllib.request.urlopen(resolved.rstrip("/") + "/health", timeout=timeout):
            pass
    except urllib.error.HTTPError:  # the server answered (maybe 401 / 404 behind a proxy): its API is asked below
        pass
    except (OSError, ValueError) as e:  # URLError (refused, DNS), timeouts, malformed URLs
        why = getattr(e, "reason", None) or e
        raise ValueError(f"MLflow tracking server {resolved} cannot be reached within {timeout:g} s ({why}); start it, "
                         f"or fix --tracking-uri / MLFLOW_TRACKING_URI ({TIMEOUT_ENV} sets the wait)") from None
    check_api(resolved, timeout)
    if experiment is not None:
        check_artifact_location(resolved, experiment)
    return resolved


def check_store_lock(uri: str) -> None:
    """Refuse (StoreFault, one line, exit 2) a local store whose lock file (``<db>.lock``,
    ``reports.record.store_lock``, taken when a process first opens the store) is not a file (a folder, a dangling
    link): held-out round 13 (H31), a folder ``mlflow.db.lock`` stopped `bench train` once the work had begun (exit
    1, "stopped:", ``.pobench`` made)."""
    lock = record.store_lock_path(uri)
    if lock is None or not (lock.exists() or lock.is_symlink()):
        return
    store = record.sqlite_file(uri) or uri
    if not lock.is_file():
        what = "a folder" if lock.is_dir() else "a link to nothing" if lock.is_symlink() else "not a file"
        raise faults.StoreFault(f"{lock} is {what}: pobench locks the MLflow store {store} with that file while it "
                                "opens the store; move it away (pobench does not remove what it did not write), or "
                                "give another --tracking-uri")


def check_comparison(cfg: Any) -> None:
    """``bench train --comparison ID``: the runs the experiment already holds under ``ID`` (a `bench run`
    comparison's run and pairs, or earlier `bench train --comparison ID` runs) must have been trained under this run's
    configuration (``pobench.config_hash``), else the report of ``ID`` would be refused for good as mixing configs
    (held-out round 10, H06): one ValueError line naming both hashes and what to do, before any work. A run of the
    same configuration joins ``ID`` (e.g. one more objective compared under the same conditions). An ``ID`` no run
    of the experiment carries is refused too: the help says it joins an existing comparison."""
    if not cfg.comparison:
        return
    if "'" in cfg.comparison:
        raise ValueError(f"--comparison {cfg.comparison!r}: a quote (') cannot be searched for in MLflow; choose an "
                         "id without one")
    uri = record.tracking_uri(cfg.tracking_uri)
    db = record.sqlite_file(uri)
    client = None if db is not None and not db.exists() else store_client(uri)
    experiment = client.get_experiment_by_name(cfg.experiment) if client is not None else None
    member = record.member_tag(cfg.comparison)
    runs = [] if experiment is None else [
        *client.search_runs([experiment.experiment_id], f"tags.`{record.COMPARISON}` = '{cfg.comparison}'",
                            max_results=1000),
        *client.search_runs([experiment.experiment_id], f"tags.`{member}` = '1'", max_results=1000)]
    if not runs:  # a typo'd or made-up id: the run joined a comparison nobody ran (held-out round 11, H19)
        from reports.load import list_comparisons

        known = sorted(list_comparisons(client, experiment.experiment_id)) if experiment is not None else []
        shown = ", ".join(known[:10]) + (" ..." if len(known) > 10 else "")
        raise ValueError(f"--comparison {cfg.comparison}: no such comparison in experiment {cfg.experiment!r} of "
                         f"{redact(uri)} (existing: {shown or 'none'}); "
                         "give the id of an existing one (`bench run` makes comparisons), or drop --comparison")
    hashes = {r.data.tags.get(record.CONFIG_HASH) for r in runs if r.data.tags.get(member) != "0"} - {None}
    own = cfg.comparison_hash()
    if hashes - {own}:
        theirs = ", ".join(sorted(hashes - {own}))
        raise ValueError(f"--comparison {cfg.comparison}: the runs of that comparison in experiment {cfg.experiment!r} "
                         f"were trained under another configuration (config hash {theirs}; this run's: {own}), so "
                         "its report would mix configurations; drop --comparison (the run gets none), or give the "
                         "flags that comparison was trained with (`bench run` compares objectives under one config)")


def check_api(uri: str, timeout: float) -> None:
    """Ask the MLflow server ``uri`` two requests of its API, as the work will, with the user's credentials
    (``MLFLOW_TRACKING_TOKEN`` / ``_USERNAME`` / ``_PASSWORD``): the first experiment, and an experiment that cannot
    exist (id -1: an MLflow server answers with its error, never with an experiment). A ValueError line when it
    refuses access (401 / 403), answers something that is not MLflow's JSON (another web server at that address), or
    answers another error status. Held-out round 10 (H05): train / run / eval / tune met those at their first
    request, bench train after loading the model and making run folders, with MLflow's traceback. Held-out round 11:
    a redirect loop (H06: two tracebacks), JSON of another shape or a body cut off (H07: a misleading line after a run
    folder was made), a rate limit (H08: urllib3's words, cut) are each one line too
    (``bench.runs.server_answers.not_mlflow``)."""
    import re

    try:
        with bounded_http(timeout):
            client = open_client(uri)
            client.search_experiments(max_results=1)
            found = _experiment_that_cannot_exist(client)
    except Exception as e:  # noqa: BLE001  (worded below; anything else is met again by the work)
        text = str(e)
        m = re.search(r"error code (\d+) != 200", text)
        status = int(m.group(1)) if m else faults.answered_status(e)
        if status in (401, 403):
            raise ValueError(f"the MLflow tracking server {uri} refused access (HTTP {status}): give credentials "
                             "in MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, "
                             "or fix --tracking-uri / MLFLOW_TRACKING_URI") from None
        if "not in a valid JSON format" in text:
            body = text.split("Response body:", 1)[-1].strip()[:80] if "Response body:" in text else ""
            raise ValueError(f"{uri} answered the MLflow API with something that is not MLflow's (JSON expected"
                             f"{'; got ' + body if body else ''}): it is not an MLflow tracking server; fix "
                             "--tracking-uri / MLFLOW_TRACKING_URI") from None
        cut_off = tracking._no_answer(e) if tracking._is_connection_error(e) else None
        line = server_answers.not_mlflow(uri, e, timeout, cut_off)
        if line is None and status is not None:
            line = (f"the MLflow tracking server {uri} answered its API with HTTP {status} "
                    f"{server_answers.status_advice(status)}")
        if line is not None:
            raise ValueError(line) from None
        return
    if found is not None:
        raise ValueError(f"{uri} answered the MLflow API's request for an experiment that cannot exist (id -1) with "
                         f"one ({found}): it is not an MLflow tracking server (every request answered alike); fix "
                         "--tracking-uri / MLFLOW_TRACKING_URI")


def _experiment_that_cannot_exist(client: Any) -> str | None:
    """What the server answers for experiment -1: None for MLflow's own error answer (no such experiment, or an
    invalid id), else the experiment it returned, in a few words (a server answering every request alike)."""
    try:
        exp = client.get_experiment("-1")
    except mlflow_error() as e:
        if getattr(e, "error_code", None) in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND",
                                              "BAD_REQUEST"):
            return None
        raise
    if exp is None or exp.experiment_id == "-1":
        return None
    return f"id {exp.experiment_id!r}, name {exp.name!r}"


def check_artifact_location(uri: str, experiment: str) -> None:
    """Refuse (one line, before any run) the existing experiment ``experiment`` of the store ``uri`` when its runs'
    files go to a local folder that cannot be made or written (``bench.faults.check_artifact_folder``); nothing to
    check for an experiment that does not exist yet (pobench gives it a folder beside the store) or a store not made
    yet. A store that fails to answer here is met again, with its own line, by the work. (A local SQLite store is
    read with ``sqlite3``, read-only: MLflow's store object, once made, keeps its connections to that file for the
    process, and a store deleted meanwhile is then not made anew.)"""
    location = _experiment_location(uri, experiment)
    if location:
        check_artifact_home(uri, experiment, location)
        faults.check_artifact_folder(experiment, location)


def check_artifact_home(uri: str, experiment: str, location: str) -> None:
    """Refuse (one line) the experiment of a local SQLite store whose runs' files go to pobench's folder of another
    store: ``<folder>/mlartifacts/<experiment>`` (:func:`reports.record.artifact_location`, stored as an absolute
    path) of a folder other than the store's own. Held-out round 17 (H21): a project folder copied or moved keeps
    ``mlflow.db``, whose experiment still pointed at the old folder: every new run's files went into the old project
    (or recreated the moved-away folder). A location of the user's own choice (another shape, a remote one) is kept."""
    own = record.artifact_location(uri, experiment)
    if own is None or not location.startswith(("/", "file:")):
        return
    kept = Path(location.removeprefix("file://").removeprefix("file:"))
    if kept.parent.name != record.ARTIFACTS or kept.name != Path(own).name:
        return
    if os.path.normpath(kept.resolve()) == os.path.normpath(own):
        return
    db = record.sqlite_file(uri)
    raise ValueError(f"the MLflow store {db}: experiment {experiment!r} keeps its runs' files in {kept}, not beside "
                     f"this store (the folder was copied or moved?): new runs' files would go there; give another "
                     f"--experiment (a new one keeps them beside this store), or run from {kept.parent.parent}")


def check_outside_artifacts(uri: str, experiment: str, folder: str | Path, flag: str) -> None:
    """Refuse (one line) a folder pobench writes run folders into (``--output-dir``) inside MLflow's artifact folder
    of the store ``uri``: ``mlartifacts/`` beside a local SQLite store, or the local folder of ``experiment``'s runs'
    files (held-out round 10, H20: `bench train --output-dir mlartifacts` put its run folder and ``.locks`` among the
    runs' ``<run id>/`` folders, as `bench report --out-root mlartifacts` is refused)."""
    roots = []
    db = record.sqlite_file(record.tracking_uri(uri))
    if db is not None:
        roots.append(db.parent.resolve() / record.ARTIFACTS)
    location = _experiment_location(record.tracking_uri(uri), experiment)
    if location and location.startswith(("/", "file:")):
        roots.append(Path(location.removeprefix("file://").removeprefix("file:")).resolve())
    out = Path(folder).resolve()
    for root in roots:
        if out == root or root in out.parents:
            raise ValueError(f"{flag} {folder}: inside MLflow's artifact folder {root} (its runs' files, which the "
                             f"store points to): not writing run folders there; choose another {flag}")


def _experiment_location(uri: str, experiment: str) -> str | None:
    """Where the existing experiment ``experiment`` of the store ``uri`` keeps its runs' files; None for none (an
    experiment or store not made yet, a store that does not answer: met again by the work)."""
    db = record.sqlite_file(uri)
    if db is not None:
        if not db.exists():
            return None
        import sqlite3

        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=20)
            try:
                row = con.execute("select artifact_location from experiments where name = ?", (experiment,)).fetchone()
            finally:
                con.close()
        except sqlite3.Error:
            return None
        return row[0] if row else None
    try:
        with bounded_http(timeout_s()) if uri.startswith(("http://", "https://")) else contextlib.nullcontext():
            exp = open_client(uri).get_experiment_by_name(experiment)
    except (mlflow_error(), OSError):
        return None
    return exp.artifact_location if exp is not None else None
