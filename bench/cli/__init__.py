"""The `bench` command line (console script ``bench = bench.cli:entry``, which runs ``main``): ``main`` dispatches
to one module per command (``list``, ``train``, ``warmstart``, ``eval``, ``run``, ``report``, ``tune``); ``flags``
holds the flags several commands share. Command modules parse and check flags and call the library (bench/*.py,
bench/comparison/, bench/engines/, bench/tune/, reports/); nothing outside this package (and the entry points
``__main__``) imports it."""

import os
import signal
import sys


def _stopped_while_loading(signum, frame) -> None:  # noqa: ARG001
    """Ctrl-C while the command line loads (its imports: seconds; nothing is written yet): one line, exit 130, at
    once. (Raised as KeyboardInterrupt instead, it could strike inside a C extension being imported, pydantic's
    for MLflow, and leave as a traceback: seen in CI.)"""
    os.write(2, b"bench: stopped by SIGINT while loading; kept nothing\n")
    os._exit(130)


# as a program only (`python -m bench.cli`: argv[0] is "-m" while the package loads; the console script `bench`;
# `python -m bench`, whose bench/__main__.py imports this module):
# a process that imports this module (a test, a notebook) keeps its own Ctrl-C. ``entry`` installs the handlers of
# a running command.
_PROGRAM = sys.argv[0] if sys.argv else ""
if (_PROGRAM == "-m" or os.path.basename(_PROGRAM) == "bench"
        or _PROGRAM.endswith(os.path.join("bench", "__main__.py"))) \
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _stopped_while_loading)

try:
    from bench.cli.main import build_parser, entry, main
except KeyboardInterrupt:  # (Ctrl-C while loading in a process that imports this module as a library)
    print("bench: stopped by SIGINT while loading; kept nothing", file=sys.stderr)
    raise SystemExit(130) from None

__all__ = ["build_parser", "entry", "main"]
