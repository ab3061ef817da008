"""`python -m bench`: the `bench` command line, as the console script runs it (``bench.cli.entry``: its SIGINT /
SIGTERM handling included; it ran ``main`` alone, so a stop signal was no stop line and a plugin's interrupt looked
like one)."""

from bench.cli import entry

entry()
