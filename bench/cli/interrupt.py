"""Ctrl-C (SIGINT) and SIGTERM in the command line: one line saying what the command kept and how to go on.

``bench.cli.main.entry`` installs :func:`on_signal` for the stop signals (SIGHUP too: ``bench.runs.stop.STOP_SIGNALS``)
(``bench.runs.stop``: KeyboardInterrupt, SIGTERM once); a command that keeps something catches the KeyboardInterrupt and
raises :class:`Stopped` with what it kept and the command to resume or rerun; ``main`` prints :func:`line` and exits 130
(SIGINT), 143 (SIGTERM) or 129 (SIGHUP). A command calls :func:`finished` once its result is written (``bench report``),
after which a signal no longer changes the exit code. Its own module so a command module can use it without importing
``bench.cli.main`` (which imports every command module)."""

from __future__ import annotations

import shlex
import sys
from typing import Any

from bench.runs import stop

# set once the command's result is written (`finished`): from then on a signal no longer interrupts the process
_FINISHED = {"done": False}


class Stopped(Exception):
    """A command stopped by SIGINT / SIGTERM: ``kept`` (what is kept: "nothing", a checkpoint, pairs, trials) and
    ``then`` (how to go on, with the exact command)."""

    def __init__(self, kept: str, then: str) -> None:
        super().__init__(f"kept {kept}; {then}")
        self.kept, self.then = kept, then


def finished() -> None:
    """A command calls this once its result is complete (`bench report`: the report is written): a signal after it
    no longer changes the exit code (in a process started by ``bench.cli.main.entry``)."""
    _FINISHED["done"] = True


@stop.recording
def on_signal(signum: int, frame: Any = None) -> None:
    """SIGINT / SIGTERM handler: KeyboardInterrupt while the command works (``bench.runs.stop.interrupt``), nothing once
    it has :func:`finished`."""
    if not _FINISHED["done"]:
        stop.interrupt(signum, frame)


def rerun(resume_flag: bool = False) -> str:
    """``rerun: <the command>`` (``resume with: <command> --resume`` with ``resume_flag``)."""
    return f"{'resume with' if resume_flag else 'rerun'}: {rerun_command(resume_flag=resume_flag)}"


def rerun_to_resume() -> str:
    """For commands that resume by being run again (`bench run`, `bench tune`)."""
    return f"resume by rerunning the same command: {rerun_command()}"


def line(command: str, stopped: Stopped | None = None) -> str:
    """The one line a stopped command prints: ``bench <command>: stopped by SIGTERM; kept ...; <how to go on>``
    (without ``stopped``: nothing kept, rerun the command)."""
    stopped = stopped or Stopped("nothing", rerun())
    return f"bench {command}: stopped by {stop.name()}; {stopped}"


def exit_code() -> int:
    """130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP)."""
    return stop.exit_code()


#: the arguments of the command ``bench.cli.main.main`` runs now (its ``argv``: this process's ``sys.argv[1:]`` for
#: the ``bench`` command, the list given to ``main`` in a notebook or a test); empty outside ``main``
COMMAND_ARGS: list[list[str]] = []


def command_args() -> list[str]:
    """The arguments of the command running (``COMMAND_ARGS``), else this process's."""
    return list(COMMAND_ARGS[-1] if COMMAND_ARGS else sys.argv[1:])


def rerun_command(resume_flag: bool = False, argv: list[str] | None = None) -> str:
    """The command running (``command_args``), as the user types it (``bench <command> ...``), plus ``--resume``
    when ``resume_flag`` and it is not there yet: what the one-line message of a stopped run tells the user to run."""
    args = command_args() if argv is None else list(argv)
    if resume_flag and "--resume" not in args:
        args.append("--resume")
    return shlex.join(["bench", *args])
