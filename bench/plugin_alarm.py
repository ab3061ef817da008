"""SIGALRM in a process that loaded plugins (held-out round 13, H30). pobench sets no alarm of its own, so one that
fires is a plugin's: ``signal.alarm`` / ``signal.setitimer`` of a timeout helper that forgot to cancel it. Python's
default action for SIGALRM ends the process at once: exit 142, nothing printed, the run left RUNNING.

Once plugins are loaded (``bench.plugins.load_plugins``), SIGALRM whose action is still the default raises
:class:`PluginAlarm` where the process is: a plugin's fault like any other. A run that trains keeps its last finished
step (checkpointed), is ended FAILED with the cause in ``pobench.failure``; the command prints one line naming SIGALRM
and exits 1 (a `bench run` / `bench tune` pool worker: its pair or trial fails with that line). The interval timer is
cancelled as it fires (a repeating ``setitimer`` would break the checkpoint). A plugin that installs its own SIGALRM
handler (at import or later) keeps it: its alarms are its own business. Inside a call to the MLflow store
(``bench.runs.stop.uninterrupted``) the alarm is put off by :data:`DEFER_S`, so no SQLite transaction is cut. The
alarm's setter is named when a plugin's code (per ``plugin_at``) called ``signal.alarm`` / ``signal.setitimer``
through the ``signal`` module (recorded by a wrapper of both); else the loaded plugins are."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from typing import Any

from bench.faults import InterruptRaised

#: how long an alarm that fires inside a call to the MLflow store is put off
DEFER_S = 0.1

_PLUGIN_AT: list[Callable[[str], str | None]] = []
_ARMED: dict[str, str | None] = {"by": None}  # "plugin X (signal.alarm at file:line)" of the last alarm a plugin set
_LOADED: list[Callable[[], list[str]]] = []  # the specs of the loaded plugins (for a setter not recorded)


class PluginAlarm(InterruptRaised):
    """SIGALRM fired with no handler set once plugins were loaded: a plugin's forgotten alarm (a fault of its code,
    which ends its run FAILED, exit 1; handled where an interrupt raised by code is: ``faults.InterruptRaised``)."""


def guard_alarm(plugin_at: Callable[[str], str | None], loaded: Callable[[], list[str]]) -> None:
    """From now on (once per process; main thread only), SIGALRM with the default action raises
    :class:`PluginAlarm`; ``signal.alarm`` / ``signal.setitimer`` called by a plugin's code record where."""
    if not _PLUGIN_AT:
        _PLUGIN_AT.append(plugin_at)
        _LOADED.append(loaded)
        signal.alarm = _recording(signal.alarm)
        signal.setitimer = _recording(signal.setitimer)
    try:
        if signal.getsignal(signal.SIGALRM) == signal.SIG_DFL:
            signal.signal(signal.SIGALRM, _fired)
    except ValueError:  # (not the main thread: nothing pobench runs there sets it either)
        pass


def ignore_after_command() -> None:
    """The command has ended: a plugin's alarm still pending is ignored (not raised into the interpreter's exit)."""
    try:
        if signal.getsignal(signal.SIGALRM) is _fired:
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
    except ValueError:
        pass


def _recording(real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:  # (never in the way of the call)
            frame = sys._getframe(1)
            while frame is not None:
                spec = _PLUGIN_AT[0](frame.f_code.co_filename)
                if spec is not None:
                    _ARMED["by"] = (f"set by plugin {spec} at {frame.f_code.co_filename}:{frame.f_lineno} (in "
                                    f"{frame.f_code.co_name}: signal.{real.__name__})")
                    break
                frame = frame.f_back
        except Exception:  # noqa: BLE001
            pass
        return real(*args, **kwargs)

    call.pobench_real = real  # type: ignore[attr-defined]
    return call


def _fired(signum: int, frame: Any) -> None:
    from bench.runs import stop

    real_setitimer = getattr(signal.setitimer, "pobench_real", signal.setitimer)
    if stop._HELD["depth"]:  # (inside ``stop.uninterrupted``: a store's write)
        real_setitimer(signal.ITIMER_REAL, DEFER_S)
        return
    real_setitimer(signal.ITIMER_REAL, 0)  # (a repeating timer: once is enough)
    loaded = ", ".join(_LOADED[0]()) if _LOADED else "?"
    by = _ARMED["by"] or f"of a plugin's (pobench sets none; loaded: {loaded})"
    raise PluginAlarm(f"SIGALRM: an alarm {by} fired with no handler set; Python's default would have ended the "
                      "command silently (exit 142): fix the plugin: cancel its alarm (signal.alarm(0)) once its "
                      "timeout is over, or install its own SIGALRM handler")
