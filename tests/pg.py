"""A real, throw-away PostgreSQL server for tests: initdb into a temp dir, start on a free loopback port, stop.

Used by the Optuna multi-worker test (``tests/bench/test_tune.py``). The server binaries come from Debian's
``postgresql`` package (``apt-get install -y postgresql``; `.ci/start-postgres` installs them); when they are absent the
fixture skips with that reason. PostgreSQL refuses to run as root, so under root the cluster is owned by and run as
the ``postgres`` system user (via ``runuser``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.net import free_port

INSTALL_HINT = "apt-get install -y postgresql"


def find_bin_dir() -> Path | None:
    """Folder holding initdb, pg_ctl and createdb (Debian's versioned folder first, then PATH)."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if all(os.access(Path(d) / b, os.X_OK) for b in ("initdb", "pg_ctl", "createdb")):
            return Path(d)
    found = [shutil.which(b) for b in ("initdb", "pg_ctl", "createdb")]
    if all(found) and len({Path(str(f)).resolve().parent for f in found}) == 1:
        return Path(str(found[0])).resolve().parent
    return None


def unavailable_reason() -> str | None:
    """Why a server cannot be started here (None when it can)."""
    if find_bin_dir() is None:
        return f"PostgreSQL server binaries (initdb, pg_ctl) not found; install them with `{INSTALL_HINT}`"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root and `runuser` is missing (needed to run the server as `postgres`)"
    return None


class PostgresServer:
    """``with PostgresServer() as pg: url = pg.create_database("optuna")``."""

    def __init__(self) -> None:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self.bin = find_bin_dir()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="pobench-pg-"))  # not under pytest's 0700 root-owned tmp folders
        self.data = self.root / "data"
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *argv: str, server_side: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if server_side and self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stdout[-1500:]}{res.stderr[-1500:]}")
        return res

    def start(self) -> PostgresServer:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        return self.serve()

    def serve(self) -> PostgresServer:
        """Start the server on its data folder (again, after a ``pg_ctl stop``: a restarted server)."""
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off -c max_connections=100"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", opts, "-w", "-t", "60",
                  "start")
        deadline = time.time() + 30
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.2)
        raise RuntimeError(f"postgres not accepting connections on port {self.port}: {self.log_tail()}")

    def log_tail(self) -> str:
        log = self.root / "server.log"
        return log.read_text()[-2000:] if log.exists() else "(no log)"

    def create_database(self, name: str) -> str:
        """Create database ``name``; returns its SQLAlchemy URL (psycopg2 driver)."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name, server_side=False)
        return self.url(name)

    def url(self, name: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
