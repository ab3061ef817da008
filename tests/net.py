"""Loopback ports for tests that start servers (MLflow, PostgreSQL) or need a port nothing listens on."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port that was free a moment ago (bound, then released: nothing listens on it now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
