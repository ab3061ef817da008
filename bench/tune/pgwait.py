"""Bounded, interruptible requests to an Optuna storage on PostgreSQL (psycopg2).

psycopg2 waits for the server inside libpq, where no signal handler runs and no timeout applies once connected: a
server that hangs (SIGSTOPped, a frozen VM: the kernel still accepts and acknowledges, nothing answers) held
`bench tune` for good, deaf to SIGTERM (held-out round 11, H15). Here psycopg2 waits through a callback
(``psycopg2.extensions.set_wait_callback``, its documented way to make requests interruptible): ``select`` on the
connection's socket, so a stop signal's KeyboardInterrupt comes at once, and, for the connections of a storage
registered by :func:`bound`, an ``OperationalError`` when the server sends nothing for ``seconds`` (the whole
connection set-up included; after a stop signal, at most :data:`AFTER_STOP_S`). The callback serves every psycopg2
connection of the process; others wait without a bound, as before, but interruptibly.
"""

from __future__ import annotations

import select
import time

from bench.runs import stop

AFTER_STOP_S = 5.0  # the bound once a stop signal came: the stop's own clean-up must not wait a scheduler's grace out
_BOUNDS: dict[tuple[str, str, str], float] = {}  # (host, port, database) of a storage: seconds without an answer
_HUNG: dict[tuple[str, str, str], float] = {}  # a storage whose request went unanswered: when its later ones give up


def bound(url: str, seconds: float) -> None:
    """Bound each wait of the connections to the PostgreSQL database of SQLAlchemy URL ``url`` (psycopg2) by
    ``seconds`` without an answer; nothing for another URL or driver."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() != "postgresql" or u.get_driver_name() != "psycopg2":
        return
    import psycopg2.extensions

    _BOUNDS[(u.host or "", str(u.port or 5432), u.database or "")] = seconds
    if psycopg2.extensions.get_wait_callback() is not _wait:
        psycopg2.extensions.set_wait_callback(_wait)


def _key(conn) -> tuple[str, str, str]:
    import psycopg2.extensions

    dsn = psycopg2.extensions.parse_dsn(conn.dsn)
    return dsn.get("host", ""), str(dsn.get("port", 5432)), dsn.get("dbname", "")


def _wait(conn) -> None:
    """psycopg2's wait callback: poll the connection until its request is done. Once a request of a bounded storage
    got no answer, the requests after it (Optuna's and pobench's clean-up: a trial failed, runs ended; a dozen) share
    :data:`AFTER_STOP_S` in all until the server answers again, so a hung server ends the command within about
    bound + 5 s, not a bound per request."""
    import psycopg2
    import psycopg2.extensions as ext

    key = _key(conn)
    limit = _BOUNDS.get(key)
    while True:
        state = conn.poll()
        if state == ext.POLL_OK:
            return
        if state not in (ext.POLL_READ, ext.POLL_WRITE):
            raise psycopg2.OperationalError(f"unexpected state of the connection: {state}")
        fds = ([conn.fileno()], []) if state == ext.POLL_READ else ([], [conn.fileno()])
        wait = limit
        if limit is not None and stop.received() is not None:
            wait = min(limit, AFTER_STOP_S)
        if limit is not None and key in _HUNG:
            wait = max(0.0, min(limit, _HUNG[key] - time.monotonic()))
        if any(select.select(*fds, [], wait)):  # (a signal's KeyboardInterrupt is raised here, at once)
            if state == ext.POLL_READ:  # (the server sent something; a socket is writable with the server hung)
                _HUNG.pop(key, None)
            continue
        _HUNG.setdefault(key, time.monotonic() + AFTER_STOP_S)
        raise psycopg2.OperationalError(f"the server did not answer within {limit:g} s (hung or overloaded)")
