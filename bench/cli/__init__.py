"""The `bench` command line (console script ``bench = bench.cli:entry``, which runs ``main``): ``main`` dispatches
to one module per command (``list``, ``train``, ``warmstart``, ``eval``, ``run``, ``report``, ``tune``); ``flags``
holds the flags several commands share. Command modules parse and check flags and call the library (bench/*.py,
bench/compare/, bench/engines/, bench/tune/, reports/); nothing outside this package (and the entry points
``__main__``) imports it."""

try:
    from bench.cli.main import build_parser, entry, main
except KeyboardInterrupt:  # Ctrl-C while the command line loads (`python -m bench.cli` imports this first)
    import sys

    print("bench: stopped by SIGINT while loading; kept nothing", file=sys.stderr)
    raise SystemExit(130) from None

__all__ = ["build_parser", "entry", "main"]
