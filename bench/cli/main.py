"""The `bench` command line: one subcommand per module of this package, each exposing `register(subparsers)`.

A subcommand module defines `register(sub)` which adds its parser and sets `func=callable(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time

import bench
from bench import faults
from bench.cli import interrupt
from bench.cli.flags import load_cli_plugins
from bench.cli.interrupt import rerun_command
from bench.plugin_alarm import ignore_after_command
from bench.plugin_hooks import bound_exit_hooks
from bench.plugins import plugin_children, plugin_failure, plugin_threads
from bench.runs import stop
from bench.workers import quiet_libraries

# the subcommands (the modules of this package), in the order `bench --help` lists them
COMMANDS = ["list", "train", "warmstart", "eval", "run", "report", "compare", "tune"]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `bench`: every subcommand's, or, given ``command``, that one's in full and the others by name
    only, their modules not imported (a process runs one command: the others' imports, Optuna's among them, would
    cost it seconds of CPU; their flags and help lines are read only by `bench --help` and `bench COMMAND --help`)."""
    parser = argparse.ArgumentParser(prog="bench", description="pobench: policy-optimization ablations for LLM RL")
    parser.add_argument("--version", action="version", version=f"pobench {bench.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if command is None or name == command:
            importlib.import_module(f"bench.cli.{name}").register(sub)
        else:
            sub.add_parser(name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    interrupt.COMMAND_ARGS.append(argv)  # (the command a line tells to rerun: this one, whoever called main)
    try:
        return _main(argv)
    finally:
        interrupt.COMMAND_ARGS.pop()


def _main(argv: list[str]) -> int:
    quiet_libraries()  # (MLflow's own tracebacks of the store's errors among them: the fault's line says it)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        load_cli_plugins(args)  # --plugin / the config's plugins: before any objective or task name is read
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:  # user errors: one clear line, no traceback
        # (one a plugin's own code raised names the plugin and its file:line, as any other exception of it does)
        print(f"bench {args.command}: error: {plugin_failure(e, causes=False) or e}", file=sys.stderr)
        return 2
    except interrupt.Stopped as e:  # SIGINT / SIGTERM: what the command kept, how to resume it
        print(interrupt.line(args.command, e), file=sys.stderr)
        return interrupt.exit_code()
    except faults.InterruptRaised as e:  # raised by code, no signal came: that code's fault (its plugin named)
        print(f"bench {args.command}: error: {plugin_failure(e) or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # a command that keeps nothing: rerun it
        if stop.raised_by_code(e):  # (outside a run's training: the same fault)
            print(f"bench {args.command}: error: {plugin_failure(e) or faults.interrupt_raised(e)}", file=sys.stderr)
            return 1
        print(interrupt.line(args.command), file=sys.stderr)
        return interrupt.exit_code()
    except SystemExit as e:  # no command exits from inside its work: a plugin's sys.exit, which ended it silently
        print(f"bench {args.command}: error: {faults.exit_called(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # a fault of the MLflow store, the Optuna storage or the file system met during the work
        line = faults.describe(e)
        if line is None and (plugin := plugin_failure(e)) is not None:  # a plugin's code raised: its one line
            print(f"bench {args.command}: error: {plugin}", file=sys.stderr)
            return 1
        if line is None and isinstance(e, faults.RaisedInWork):  # (a plugin's wrong result: its line names it)
            print(f"bench {args.command}: error: {e}", file=sys.stderr)
            return 1
        if line is None:  # anything else is a bug: its traceback
            raise
        print(f"bench {args.command}: stopped: {line}", file=sys.stderr)
        return 1
    except BaseException as e:  # a plugin's own BaseException subclass (or GeneratorExit): its one line
        plugin = plugin_failure(e)
        if plugin is None:
            raise
        print(f"bench {args.command}: error: {plugin}", file=sys.stderr)
        return 1


def entry() -> None:
    """The console script ``bench`` and ``python -m bench.cli``: :func:`main`, then exit with its code. SIGINT (Ctrl-C),
    SIGTERM (a scheduler's stop) and SIGHUP (a closed terminal) (``bench.runs.stop.STOP_SIGNALS``) are one line (what
    was kept, the command to resume or rerun) and exit 130 / 143 / 129 while the command works (bench/cli/interrupt.py);
    once its result is complete (``bench.cli.interrupt.finished``) or it has returned, a signal no longer changes the
    exit code. (The interpreter's shutdown takes seconds with MLflow and torch loaded, and Python restores the default
    SIGINT action for it, which would end the process by the signal.)"""
    for sig in stop.STOP_SIGNALS:
        signal.signal(sig, interrupt.on_signal)
    code = 130
    try:
        code = main()
    except KeyboardInterrupt:  # (a signal while main started or returned)
        code = interrupt.exit_code()
        print(f"bench: stopped by {stop.name()}; kept nothing; rerun: {rerun_command()}", file=sys.stderr)
    finally:
        interrupt.finished()
        for sig in stop.STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        ignore_after_command()  # (a plugin's alarm still pending: not raised into the interpreter's exit)
    _leave_plugin_threads(code)
    bound_exit_hooks(code)  # (a plugin's atexit hook: bounded, its faults one line, the exit code this one: H03)
    if stop.received() is not None:
        _forget_unhandled_interrupt()
    sys.exit(code)


def _forget_unhandled_interrupt() -> None:
    """CPython marks an interrupt "unhandled" when it struck inside code run by ``PyRun_String`` (some C extensions
    run Python that way while imported) and, at exit, then ends the process by SIGINT whatever the exit code: a
    SIGTERM caught and answered with its one line still looked like a Ctrl-C (killed by signal 2, 130 to a shell)
    instead of 143. Running one statement through the same C function clears that mark (no effect elsewhere)."""
    try:
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"pass")
    except (ImportError, AttributeError, OSError):  # (not CPython: no such mark)
        pass


PLUGIN_THREAD_GRACE_S = 5.0


def _leave_plugin_threads(code: int) -> None:
    """A non-daemon thread a plugin started would keep the process alive after the command, for ever and deaf to
    SIGINT / SIGTERM: given ``PLUGIN_THREAD_GRACE_S`` to end, then named in one line and left behind (the process
    exits with the command's code, its outputs written and flushed)."""
    left = plugin_threads()
    deadline = time.monotonic() + PLUGIN_THREAD_GRACE_S
    for t, _ in left:
        t.join(max(0.0, deadline - time.monotonic()))
    left = [(t, p) for t, p in left if t.is_alive()]
    children = plugin_children()
    if children:  # (not waited for: named, as the threads are)
        from bench.plugin_guard import process_name

        names = ", ".join(f"{process_name(pid)} (started by plugin {spec})" for pid, spec in children)
        print(f"bench: warning: child process(es) {names} still running after the command ended: not waiting for "
              "them; they keep the command's output open (a plugin should wait for the processes it starts, or end "
              "them with the work)", file=sys.stderr)
    if left:
        names = ", ".join(f"{t.name} (plugin {p.spec})" for t, p in left)
        print(f"bench: warning: thread(s) {names} still running after the command ended: not waiting for them (a "
              "plugin's background thread should be a daemon, or end with the work)", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    entry()
