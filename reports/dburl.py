"""SQLAlchemy URLs of the databases pobench opens (the Optuna storage of `bench tune`, an MLflow backend store).

A PostgreSQL URL without a driver (``postgresql://user@host/db``, or Heroku-style ``postgres://``) means a different
driver in different SQLAlchemy versions (psycopg2 in 2.0, psycopg 3 in 2.1), so the URL as written in the README
worked or failed depending on the installed SQLAlchemy. Here it gets the driver that is installed: psycopg2 (what the
``postgres`` extra installs) first, else psycopg 3. A URL that names its driver (``postgresql+psycopg://``) is kept.
"""

from __future__ import annotations

import importlib.util

POSTGRES_DRIVERS = ("psycopg2", "psycopg")  # importable module = SQLAlchemy driver name, in order of preference
INSTALL_HINT = "pip install 'pobench[postgres]' (from a checkout: pip install -e '.[postgres]')"


def with_driver(url: str) -> str:
    """``url`` with an installed PostgreSQL driver named when it names none; other URLs unchanged.

    ValueError (one line, password hidden) when no PostgreSQL driver is installed."""
    from sqlalchemy.engine import make_url

    u = make_url(url)  # sqlalchemy.exc.ArgumentError when not a URL
    if u.drivername not in ("postgresql", "postgres"):
        return url
    for module in POSTGRES_DRIVERS:
        if importlib.util.find_spec(module) is not None:
            return u.set(drivername=f"postgresql+{module}").render_as_string(hide_password=False)
    raise ValueError(f"{u.render_as_string(hide_password=True)}: no PostgreSQL driver is installed (looked for "
                     f"{', '.join(POSTGRES_DRIVERS)}); {INSTALL_HINT}")


def redact(url: str) -> str:
    """A database URL with its password hidden (for logs, one-line errors and MLflow params)."""
    import re

    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy understands: shown as given minus anything that looks like user:pass@
        return re.sub(r"//[^/@]*@", "//***@", url)


#: the connect-timeout argument of each database's driver (SQLAlchemy passes ``connect_args`` to it)
CONNECT_TIMEOUT_ARG = {"postgresql": "connect_timeout", "mysql": "connect_timeout", "mssql": "timeout"}


def connect_error(url: str, timeout: float) -> str | None:
    """Connect once to the database server of ``url`` (a SQLAlchemy URL other than SQLite: an MLflow store on
    PostgreSQL, MySQL, SQL Server) within about ``timeout`` seconds and run ``SELECT 1``; None when it answers, else
    the cause in a few words (the first line of the driver's error: nothing listening, no such database, password
    refused, driver missing). Held-out round 10 (H04): such a store failing at the first request was a 200-line
    traceback from MLflow's store in every command."""
    import math

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    try:
        backend = make_url(url).get_backend_name()
    except Exception as e:  # noqa: BLE001  (one line: the URL itself is wrong)
        return f"not a SQLAlchemy URL ({_first(e)})"
    arg = CONNECT_TIMEOUT_ARG.get(backend)
    connect_args = {arg: max(1, math.ceil(timeout))} if arg else {}
    engine = None
    try:
        engine = create_engine(url, connect_args=connect_args, poolclass=_null_pool())
        with engine.connect() as con:
            con.execute(text("SELECT 1"))
    except ModuleNotFoundError as e:
        return f"database driver missing ({e.name}); for PostgreSQL {INSTALL_HINT}"
    except Exception as e:  # noqa: BLE001  (sqlalchemy's OperationalError and friends: the cause is the driver's)
        return _first(e.orig if getattr(e, "orig", None) is not None else e)
    finally:
        if engine is not None:
            engine.dispose()
    return None


def _null_pool():
    from sqlalchemy.pool import NullPool

    return NullPool


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]
