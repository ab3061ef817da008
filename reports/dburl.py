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
