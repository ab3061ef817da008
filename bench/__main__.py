"""`python -m bench ...` = ``bench ...`` (``bench.cli.entry``: SIGINT and SIGTERM are one line and exit 130 / 143.
Held-out round 9: this ran ``main`` alone, so SIGTERM kept its default action and ended the process silently, in the
middle of whatever it was writing)."""

from bench.cli import entry

entry()
