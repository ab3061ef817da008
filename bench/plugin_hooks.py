"""A loaded plugin's code at the process's end: its ``os._exit`` (``guard_os_exit``: held-out round 10), the exit
hooks it registers with ``atexit`` (``watch_exit_hooks``: round 14, H03 and H01) and the exceptions of the threads it
starts (``watch_thread_errors``: round 14, H07); installed by ``bench.plugins.load_plugins``. The command line
(``bench.cli.main.entry``) gives the exit hooks their bound (``bound_exit_hooks``) once the command has its exit code.

Exit hooks: a plugin's ``atexit.register(lambda: time.sleep(1000))`` (a flush to a dead server, a join on a stuck
thread) kept `bench train` alive after its result for ever, deaf to SIGTERM and SIGINT (the command ignores them for
the interpreter's shutdown); an ``os._exit(5)`` in one printed a traceback ending in ``PluginExit`` (raised by the
guard where no command handles it). Once ``watch_exit_hooks`` ran, ``atexit.register`` records each hook with the file
of the code that registered it; at exit a plugin's hook (its function's file, or that code's, is a loaded plugin's)
runs where and when the interpreter runs it, but:

- the plugins' hooks together get ``PLUGIN_EXIT_GRACE_S`` from the first one's start: one still running then is
  named in one line and the process exits with the command's code, its streams flushed (the exit hooks after it are
  not run; the command's work and its records were complete before any ran);
- a SIGTERM, SIGINT or SIGHUP while one runs ends the process the same way, its line naming the signal; the exit
  code stays the command's (its result was complete: a signal no longer changes it, as for the rest of the shutdown);
- an ``os._exit(n)`` / ``sys.exit(n)`` or an exception in one is one line naming the plugin's hook and what it did,
  ignored: the exit code stays the command's (the codes pobench documents each say how the work ended; a plugin's
  clean-up after the work does not change them), and the hooks after it run.

A hook registered by other code (MLflow's, a library's) runs as before."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

#: how long the exit hooks of plugins may take, all together, once the command has ended
PLUGIN_EXIT_GRACE_S = 5.0
#: set (to anything but 0) to see the traceback of an exception a plugin's code raised, instead of its one line
TRACEBACK_ENV = "POBENCH_TRACEBACK"

#: the signals that end the process while a plugin's exit hook runs (pobench's stop signals: bench.runs.stop)
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_PLUGIN_AT: list[Callable[[str], str | None]] = []  # (the plugin a source file belongs to, or None)
_HOOKS: list[_ExitHook] = []  # the hooks registered since watch_exit_hooks
_END: dict[str, Any] = {"code": None, "deadline": None, "running": None, "watched": False}
_CHANGED = threading.Condition()  # (notified when a plugin's hook starts or ends)


def _plugin(filename: str | None) -> str | None:
    try:  # (never in the way of the exit)
        return _PLUGIN_AT[0](filename) if filename and _PLUGIN_AT else None
    except Exception:  # noqa: BLE001
        return None


def _say(line: str) -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.write(f"bench: warning: {line}\n")
        sys.stderr.flush()


def _real_exit() -> Callable[[int], Any]:
    return getattr(os._exit, "pobench_real", os._exit)


# ------------------------------------------------------------------ exit hooks (atexit)
class _ExitHook:
    """A hook registered with ``atexit`` after ``watch_exit_hooks``: its function and arguments, and where it was
    registered. Equal to its function (``atexit.unregister(func)`` finds it); shown as it is."""

    def __init__(self, func: Callable[..., Any], args: tuple, kwargs: dict, caller: Any) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs
        self.caller = (caller.f_code.co_filename, caller.f_lineno) if caller is not None else (None, 0)
        code = getattr(getattr(func, "__func__", func), "__code__", None)
        self.code = (code.co_filename, code.co_firstlineno) if code is not None else None

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.func or bool(other == self.func)

    def __hash__(self) -> int:
        try:
            return hash(self.func)
        except TypeError:  # (an unhashable callable: a hook is still one)
            return id(self.func)

    def __repr__(self) -> str:
        return repr(self.func)

    def plugin(self) -> str | None:
        return _plugin(self.code[0] if self.code else None) or _plugin(self.caller[0])

    def name(self) -> str:
        file, line = self.code or self.caller
        what = getattr(self.func, "__qualname__", None) or type(self.func).__name__
        return f"{what} ({file}:{line}, registered with atexit)"

    def __call__(self) -> None:
        spec = self.plugin()
        if spec is None or threading.current_thread() is not threading.main_thread():
            self.func(*self.args, **self.kwargs)
            return
        _run_plugin_hook(self, spec)


def watch_exit_hooks(plugin_at: Callable[[str], str | None]) -> None:
    """From now on (once per process), ``atexit.register`` records its hook (``_ExitHook``): a plugin's is bounded
    and its faults are one line at exit (module doc). Before the first plugin is imported: most register there."""
    if _PLUGIN_AT:
        return
    _PLUGIN_AT.append(plugin_at)
    real = atexit.register

    def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        hook = _ExitHook(func, args, kwargs, sys._getframe(1))
        _HOOKS.append(hook)
        real(hook)
        return func

    register.__doc__ = real.__doc__
    register.pobench_real = real  # type: ignore[attr-defined]
    atexit.register = register


def bound_exit_hooks(code: int) -> None:
    """The command has ended with ``code`` (``bench.cli.main.entry``): the exit code kept whatever a plugin's exit
    hook does; where a plugin registered one, a watcher (a daemon thread, started now: not every Python starts one
    during its shutdown) ends the process once they have run ``PLUGIN_EXIT_GRACE_S``."""
    _END["code"] = code
    if _END["watched"] or not any(hook.plugin() for hook in _HOOKS):
        return
    _END["watched"] = True
    threading.Thread(target=_watch, name="pobench-exit-hooks", daemon=True).start()


def _run_plugin_hook(hook: _ExitHook, spec: str) -> None:
    with _CHANGED:
        if _END["deadline"] is None:
            _END["deadline"] = time.monotonic() + PLUGIN_EXIT_GRACE_S
        _END["running"] = (hook, spec)
        _CHANGED.notify_all()
    before = {}
    for sig in STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            before[sig] = signal.signal(sig, _on_signal)
    code = f" ({_END['code']})" if _END["code"] is not None else ""
    try:
        hook.func(*hook.args, **hook.kwargs)
    except SystemExit as e:  # (os._exit: bench.plugin_hooks.PluginExit, raised for it; or sys.exit)
        _say(f"plugin {spec}'s exit hook {hook.name()} called {getattr(e, 'call', 'sys.exit')}({e.code!r}) after the "
             f"command ended: ignored, the exit code stays the command's{code} (fix the plugin: an exit hook should "
             "not end the process)")
    except BaseException as e:  # noqa: BLE001  (the interpreter would print it as ignored, with its traceback)
        if os.environ.get(TRACEBACK_ENV, "0") not in ("", "0"):
            raise
        text = (str(e).strip().splitlines() or [""])[0][:300]
        where = _innermost(e.__traceback__)[1]
        _say(f"plugin {spec}'s exit hook {hook.name()} raised {type(e).__name__}{': ' + text if text else ''}{where} "
             f"after the command ended: ignored, the exit code stays the command's{code} (fix the plugin; "
             f"{TRACEBACK_ENV}=1 shows the traceback)")
    finally:
        with _CHANGED:
            _END["running"] = None
            _CHANGED.notify_all()
        for sig, handler in before.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler)


def _on_signal(signum: int, frame: Any) -> None:
    running, code = _END["running"], _END["code"]
    what = f"plugin {running[1]}'s exit hook {running[0].name()}" if running else "a plugin's exit hook"
    _say(f"{what} was still running after the command ended when {signal.Signals(signum).name} came: not waiting "
         f"for it; exit {code if code is not None else 128 + signum}, the command's (the exit hooks after it are not "
         "run)")
    _real_exit()(code if code is not None else 128 + signum)


def _watch() -> None:
    with _CHANGED:
        while True:
            running, deadline = _END["running"], _END["deadline"]
            left = deadline - time.monotonic() if running is not None else None
            if left is not None and left <= 0:
                break
            _CHANGED.wait(left)
    hook, spec = running
    _say(f"plugin {spec}'s exit hook {hook.name()} did not end within {PLUGIN_EXIT_GRACE_S:g} s after the command "
         f"ended: not waiting for it; exit {_END['code']}, the command's (the exit hooks after it are not run; a "
         "plugin's exit hook should end promptly: bound its waits)")
    _real_exit()(_END["code"])


def _innermost(tb: Any) -> tuple[str | None, str]:
    """(the plugin, `` at file:line (in function)``) of the innermost frame of ``tb`` in a plugin's file, or (None,
    '')."""
    last, spec = None, None
    while tb is not None:
        found = _plugin(tb.tb_frame.f_code.co_filename)
        if found:
            last, spec = tb, found
        tb = tb.tb_next
    if last is None:
        return None, ""
    return spec, f" at {last.tb_frame.f_code.co_filename}:{last.tb_lineno} (in {last.tb_frame.f_code.co_name})"


# ------------------------------------------------------------------ a plugin's thread that raised
def watch_thread_errors() -> None:
    """From now on, an exception that ends a thread of a plugin's (its traceback passes through a plugin's file, or
    its target is a plugin's function) is one line naming the plugin's thread, the exception and where, instead of
    Python's ``Exception in thread ...`` and its traceback (held-out round 14, H07); the command goes on as before.
    Left alone where the hook is not Python's own (a plugin's or a library's)."""
    if threading.excepthook is threading.__excepthook__:
        threading.excepthook = _thread_error


def _thread_error(args: Any) -> None:
    target = getattr(getattr(args.thread, "_target", None), "__code__", None)
    spec, where = _innermost(args.exc_traceback)
    spec = spec or _plugin(target.co_filename if target is not None else None)
    if spec is None or args.exc_type is SystemExit or os.environ.get(TRACEBACK_ENV, "0") not in ("", "0"):
        threading.__excepthook__(args)
        return
    text = (str(args.exc_value).strip().splitlines() or [""])[0][:300]
    name = getattr(args.thread, "name", "?")
    _say(f"thread {name} of plugin {spec} raised {args.exc_type.__name__}{': ' + text if text else ''}{where}: the "
         f"thread ended, the command went on (fix the plugin; {TRACEBACK_ENV}=1 shows the traceback)")


# ------------------------------------------------------------------ os._exit called by a plugin's code
class PluginExit(SystemExit):
    """``os._exit(code)`` called by a loaded plugin's code in the command's own thread: raised instead (``call``,
    ``where``: what and where, for ``bench.faults.exit_called``), so it is handled as its ``sys.exit`` is."""

    call = "os._exit"

    def __init__(self, code: Any, where: str) -> None:
        super().__init__(code)
        self.where = where


def guard_os_exit(plugin_at: Callable[[str], str | None]) -> None:
    """Replace ``os._exit`` in this process (once) by a function that, called by a plugin's code (``plugin_at``: the
    plugin a source file belongs to, or None), raises ``PluginExit`` in the main thread: held-out round 10, an
    ``os._exit(0)`` in a plugin's loss ended `bench train` with exit 0, nothing said, its run left RUNNING. Any other
    caller (multiprocessing ending a child, a library), and a process forked since (a plugin's own child), exits as
    before; a plugin's call in another thread cannot be raised where the command would see it: one line on stderr and
    exit 1 instead of its code (the run is ended FAILED by the next command in that experiment)."""
    if getattr(os._exit, "pobench_guard", False):
        return
    real, pid = os._exit, os.getpid()

    def _exit(code: int) -> None:
        caller = sys._getframe(1)
        try:
            spec = plugin_at(caller.f_code.co_filename) if os.getpid() == pid else None
        except Exception:  # noqa: BLE001  (never in the way of an exit: an interpreter ending, say)
            spec = None
        if spec is None:
            real(code)
        where = f"{caller.f_code.co_filename}:{caller.f_lineno} (in {caller.f_code.co_name})"
        if threading.current_thread() is threading.main_thread():
            raise PluginExit(code, where)
        with contextlib.suppress(Exception):
            sys.stderr.write(f"pobench: error: plugin {spec} called os._exit({code!r}) in a thread at {where}; ended "
                             "with exit 1 (fix the plugin: raise an exception instead)\n")
            sys.stderr.flush()
        real(1)

    _exit.pobench_guard = True
    _exit.pobench_real = real
    os._exit = _exit
