"""The guard around a plugin's import (``KeepProcessState``): the process-wide state pobench relies on, which a
plugin's import may change (the working folder, torch's default dtype, the warning filters, the stop signals'
handlers, the output streams), put back and named; used by bench/plugins.py for every plugin it imports."""

from __future__ import annotations

import os
import signal
import sys
import warnings
from typing import Any


def _default_dtype() -> Any:
    """torch's default dtype, which a plugin may change at import (tensors pobench makes would be float64, and torch
    refuses to mix them); None before torch is imported."""
    torch = sys.modules.get("torch")
    return torch.get_default_dtype() if hasattr(torch, "get_default_dtype") else None


#: the signals whose handlers are pobench's (bench/runs/stop.py, bench/cli/main.py ``entry``): a plugin's are put back
GUARDED_SIGNALS = ("SIGINT", "SIGTERM")


def _handler_name(handler: Any) -> str:
    if handler in (signal.SIG_IGN, signal.SIG_DFL):
        return signal.Handlers(handler).name
    return getattr(handler, "__qualname__", None) or repr(handler)


class KeepProcessState:
    """Around a plugin's import: process-wide state pobench relies on, which a plugin's import may change, is put
    back right after it; ``changed`` says what was changed, each a phrase of the command's warning naming the plugin
    (bench/cli/flags.py), in every process that loads it. This is the one place for such state:

    - the working folder (``os.chdir``; held-out round 6): every relative path of the command (its run folder, data,
      store, the plugin file itself) named another file, and pobench reported them as deleted;
    - torch's default dtype (``torch.set_default_dtype``; round 8): a float64 default failed the run deep in pobench's
      code, the plugin not named. Set back to what it was (torch's float32 when the plugin is what imported torch);
    - the warning filters (``warnings.simplefilter("error")``; round 9): a library's deprecation warning (SQLAlchemy's,
      inside MLflow's client) became an exception and a traceback. A filter the import added that turns warnings into
      errors is taken out, and a filter it removed (``warnings.resetwarnings()``) put back; the filters a library adds
      for its own warnings while the plugin imports it (``ignore`` / ``always`` / ``default``: MLflow's, SciPy's)
      stay, so a plugin that only imports libraries is not warned about;
    - the handlers of SIGINT and SIGTERM (round 9: ``signal.signal(SIGTERM, SIG_IGN)`` made a scheduler's stop
      silently ignored; the run trained to the end and under a scheduler became SIGKILL and a run left RUNNING):
      the command's handlers (``bench.cli.main.entry``, installed before any plugin is imported) are put back, so a
      SIGTERM stops the command with its one line and 143. (A signal that comes in the instant between the plugin
      ignoring it and this guard's exit is lost: nothing is written yet at that point.)

    And the command's output streams: a plugin that closes ``sys.stdout`` / ``sys.stderr`` (round 9: the run trained,
    then "I/O operation on closed file", the plugin not named) is refused (``closed`` names them, ``_check_streams``);
    they are opened again on their file descriptors, so the refusal's line can be written."""

    def __enter__(self) -> KeepProcessState:
        self.cwd, self.dtype, self.changed = os.getcwd(), _default_dtype(), []
        self.filters = list(warnings.filters)
        self.handlers = {name: signal.getsignal(getattr(signal, name)) for name in GUARDED_SIGNALS}
        self.closed = ""
        return self

    def __exit__(self, *exc) -> None:
        try:
            now = os.getcwd()
        except OSError:  # (it went into a folder since removed)
            now = "(a removed folder)"
        if now != self.cwd:
            os.chdir(self.cwd)
            self.changed.append(f"the working folder to {now} while imported; pobench changed it back to "
                                f"{self.cwd}, where the command's relative paths are read (a plugin should not call "
                                "os.chdir)")
        after = _default_dtype()
        if after is not None and after != (self.dtype or sys.modules["torch"].float32):
            sys.modules["torch"].set_default_dtype(self.dtype or sys.modules["torch"].float32)
            self.changed.append(f"torch's default dtype to {after} while imported; pobench changed it back (a plugin "
                                "should not change torch's global settings: give a dtype to the tensors it makes "
                                "instead)")
        self._warning_filters()
        self._signal_handlers()
        closed = [name for name, fd in (("stdout", 1), ("stderr", 2)) if _reopen_closed(name, fd)]
        self.closed = " and ".join(f"sys.{name}" for name in closed)

    def _warning_filters(self) -> None:
        now = list(warnings.filters)
        errors = [f for f in now if f[0] == "error" and f not in self.filters]
        removed = [f for f in self.filters if f not in now]
        if not errors and not removed:
            return
        warnings.filters[:] = [f for f in now if f not in self.filters and f not in errors] + self.filters
        mutated = getattr(warnings, "_filters_mutated", None)  # (what warnings.catch_warnings calls as it puts the
        if mutated is not None:  # filters back: the interpreter's caches of what each warning did are dropped)
            mutated()
        what = [f"added {len(errors)} filter(s) turning warnings into errors, as warnings.simplefilter(\"error\"): "
                "a library's warning would stop the command"] if errors else []
        what += [f"removed {len(removed)} filter(s), as warnings.resetwarnings()"] if removed else []
        self.changed.append(f"the process's warning filters ({'; '.join(what)}) while imported; pobench put them back "
                            "(a plugin should filter warnings inside its own code only: with "
                            "warnings.catch_warnings(): ...)")

    def _signal_handlers(self) -> None:
        for name, before in self.handlers.items():
            sig = getattr(signal, name)
            after = signal.getsignal(sig)
            if after == before or before is None:  # (None: a handler not installed from Python; cannot be put back)
                continue
            try:
                signal.signal(sig, before)
            except ValueError:  # (not the main thread: the plugin could not have changed it either)
                continue
            self.changed.append(f"the handler of {name} to {_handler_name(after)} while imported; pobench put its "
                                f"own back ({name} stops the command, with its one line; a plugin should not install "
                                "signal handlers at import)")


def _reopen_closed(name: str, fd: int) -> bool:
    """When ``sys.<name>`` is closed: a new text stream on its file descriptor ``fd`` in its place (the descriptor
    stays open: Python's standard streams do not close theirs); returns whether it was closed."""
    stream = getattr(sys, name)
    if stream is None or not stream.closed:
        return False
    try:
        setattr(sys, name, open(fd, "w", encoding=getattr(stream, "encoding", None) or "utf-8",  # noqa: SIM115
                                errors=getattr(stream, "errors", None) or "backslashreplace", closefd=False,
                                buffering=1))
    except (OSError, ValueError):  # (the descriptor closed too: nowhere to write)
        pass
    return True


def check_streams(spec: str, keep: KeepProcessState) -> None:
    """ValueError (one line naming the plugin) when it closed the command's output streams while imported."""
    if keep.closed:
        raise ValueError(f"plugin {spec} closed {keep.closed} while imported, where pobench writes its output and its "
                         "errors: fix the plugin (leave the command's streams open)")
