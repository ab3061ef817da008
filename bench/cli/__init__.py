"""The `bench` command line (console script ``bench = bench.cli:entry``, which runs ``main``): ``main`` dispatches
to one module per command (``list``, ``train``, ``warmstart``, ``eval``, ``run``, ``report``, ``tune``); ``flags``
holds the flags several commands share. Command modules parse and check flags and call the library (bench/*.py,
bench/tune/, reports/)."""

from bench.cli.main import build_parser, entry, main, quiet_libraries

__all__ = ["build_parser", "entry", "main", "quiet_libraries"]
