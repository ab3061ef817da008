"""The `bench` command line (console script ``bench = bench.cli:main``): ``main`` dispatches to one module per
command (``list``, ``train``, ``warmstart``, ``eval``, ``run``, ``report``, ``tune``); ``flags`` holds the flags several
commands share. Command modules parse and check flags and call the library (bench/*.py, bench/compare/, bench/engines/,
bench/tune/, reports/); nothing outside this package (and the entry points ``__main__``) imports it."""

from bench.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
