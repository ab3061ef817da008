"""The guard around a plugin's import (``KeepProcessState``): the process-wide state pobench relies on, which a
plugin's import may change (the working folder, torch's default dtype, the warning filters, the stop signals'
handlers, the output streams, the umask), put back and named; used by bench/plugins.py for every plugin it imports.
And, once plugins are loaded, the processes their code starts (``watch_children``). (Their ``os._exit``, exit hooks
and threads' exceptions: bench/plugin_hooks.py.)"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import sysconfig
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.runs.stop import STOP_SIGNALS


def _default_dtype() -> Any:
    """torch's default dtype, which a plugin may change at import (tensors pobench makes would be float64, and torch
    refuses to mix them); None before torch is imported."""
    torch = sys.modules.get("torch")
    return torch.get_default_dtype() if hasattr(torch, "get_default_dtype") else None


#: the signals whose handlers are pobench's (bench/runs/stop.py, bench/cli/main.py ``entry``): a plugin's are put back
GUARDED_SIGNALS = tuple(s.name for s in STOP_SIGNALS)


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
    - the handlers of the stop signals, SIGINT, SIGTERM and SIGHUP (round 9: ``signal.signal(SIGTERM, SIG_IGN)`` made a
      scheduler's stop silently ignored; the run trained to the end and under a scheduler became SIGKILL and a run left
      RUNNING): the command's handlers (``bench.cli.main.entry``, installed before any plugin is imported) are put back,
      so a SIGTERM stops the command with its one line and 143. (A signal that comes in the instant between the plugin
      ignoring it and this guard's exit is lost: nothing is written yet at that point.)

    - the environment variables of MLflow and pobench (``MLFLOW_*``, ``POBENCH_*``; round 11, H04: a plugin setting
      ``MLFLOW_TRACKING_URI`` at import silently moved the command's records to another store, which later commands
      without the plugin never read): put back as they were, named (not their values: a password may be among them);
    - the file-mode creation mask (``os.umask``; round 14, H06: ``os.umask(0o777)`` made every file and folder pobench
      then wrote, the MLflow store and the run folders among them, mode 000, nothing said): put back, named.

    And the command's output streams: a plugin that closes ``sys.stdout`` / ``sys.stderr`` (round 9: the run trained,
    then "I/O operation on closed file", the plugin not named) is refused (``closed`` names them, ``_check_streams``);
    they are opened again on their file descriptors, so the refusal's line can be written."""

    def __enter__(self) -> KeepProcessState:
        self.reads = FileReads().__enter__()
        self.cwd, self.dtype, self.changed = os.getcwd(), _default_dtype(), []
        self.filters = list(warnings.filters)
        self.handlers = {name: signal.getsignal(getattr(signal, name)) for name in GUARDED_SIGNALS}
        self.environ = _guarded_environ()
        self.umask = _umask()
        self.children_before = child_processes()
        self.children: list[int] = []  # processes the import started that still run (held-out round 11, H05)
        self.closed = ""
        return self

    def __exit__(self, *exc) -> None:
        self.reads.__exit__()
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
        self._environment()
        self._file_mode_mask()
        self.children = sorted(child_processes() - self.children_before)
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

    def _environment(self) -> None:
        now = _guarded_environ()
        if now == self.environ:
            return
        names = sorted(k for k in {*now, *self.environ} if now.get(k) != self.environ.get(k))
        for k in names:
            if k in self.environ:
                os.environ[k] = self.environ[k]
            else:
                os.environ.pop(k, None)
        self.changed.append(f"the environment variable(s) {', '.join(names)} while imported; pobench put them back "
                            "(the command records where its flags and your environment say, e.g. --tracking-uri; a "
                            "plugin should not set MLflow's or pobench's variables)")

    def _file_mode_mask(self) -> None:
        now = _umask()
        if now == self.umask:
            return
        os.umask(self.umask)
        self.changed.append(f"the process's umask to {now:04o} while imported; pobench put back {self.umask:04o} (with "
                            f"{now:04o} every file pobench writes, the MLflow store and the run folders among them, "
                            f"would be made with mode {0o666 & ~now:03o}; a plugin should give the files it makes "
                            "their mode instead: os.open(path, flags, mode), os.chmod)")


def _umask() -> int:
    """The process's file-mode creation mask (from Linux's ``/proc/self/status``, which reads it without setting it:
    another thread may create a file meanwhile; else set and put back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: the environment variables a plugin's import may not change: where the command records and how (MLflow's store, its
#: credentials, pobench's own settings)
GUARDED_ENV_PREFIXES = ("MLFLOW_", "POBENCH_")


def _guarded_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(GUARDED_ENV_PREFIXES)}


def child_processes(pid: int | None = None) -> set[int]:
    """The live (not zombie) child processes of ``pid`` (default this process), from Linux's ``/proc``; empty
    elsewhere."""
    pid = os.getpid() if pid is None else pid
    out = set()
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return out
    for e in entries:
        try:
            fields = Path(f"/proc/{e}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(pid) and fields[0] != "Z":
            out.add(int(e))
    return out


def process_name(pid: int) -> str:
    """A child's command line, shortened (for a warning); a fork of this process (``os.fork``) is said to be one."""
    if pid in _FORKED:
        return f"{pid} (a fork of this command's process, by os.fork)"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"{pid} ({cmd[:80]})" if cmd else str(pid)


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


# ------------------------------------------------------------------ the files a plugin's import reads
_RECORDING: list[list[tuple[str, str]]] = []   # the lists of the imports being recorded (nested: each gets the read)
_hooked = False


@functools.lru_cache(maxsize=1)
def _stdlib() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(str(Path(paths[k]).resolve()) + os.sep for k in ("stdlib", "platstdlib") if paths.get(k))


def _caller(frame) -> str:
    """The file of the innermost frame from ``frame`` out that is not the standard library's (``pathlib``,
    ``runpy``, ``json``, the import system's frozen modules): the code that asked for the file to be opened."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not _library(name):
            return name
        frame = frame.f_back
    return ""


@functools.lru_cache(maxsize=4096)
def _library(filename: str) -> bool:
    """Whether a code file is the standard library's (cached: the hook sees the same few files again and again)."""
    return filename.startswith("<frozen ") or os.path.realpath(filename).startswith(_stdlib())


def _on_audit(event: str, args: tuple) -> None:
    """Python's audit hook (``sys.addaudithook``: it stays for the process's life, so it does nothing unless an
    import is recorded or the processes plugins start are watched): an ``open`` for reading is recorded with the file
    of the code that asked for it; a process a loaded plugin's code starts, with that plugin (``watch_children``)."""
    if event == "subprocess.Popen" and _PLUGIN_AT:
        _started(sys._getframe(1))
        return
    if event == "os.chdir" and _PLUGIN_AT and not _RECORDING and os.getpid() == _WATCHED[0]:
        _refuse_chdir(sys._getframe(1), args[0])  # (at import: put back and named by KeepProcessState instead)
        return
    if event == "os.fork" and _PLUGIN_AT:  # (held-out round 14, H16: the child's pid is known after, ``_forked``)
        spec = _plugin_caller(sys._getframe(1))
        _FORKING[:] = [(spec, child_processes())] if spec is not None else []
        return
    if event == "os.system" and _PLUGIN_AT:  # (its shell is waited for; what it put in the background is not)
        spec = _plugin_caller(sys._getframe(1))
        if spec is not None and spec not in _SHELLS:
            _SHELLS.append(spec)
        return
    if event != "open" or not _RECORDING:
        return
    try:  # (an exception here would be the open's own)
        path, mode, flags = args
        if isinstance(path, int) or (flags or 0) & (os.O_WRONLY | os.O_RDWR) or \
                (isinstance(mode, str) and any(c in mode for c in "wax+")):
            return
        entry = (os.path.abspath(os.fsdecode(path)), _caller(sys._getframe(1)))
        for reads in _RECORDING:
            reads.append(entry)
    except Exception:  # noqa: BLE001
        pass


class FileReads:
    """Around a plugin's import: ``files``, every file opened for reading while it ran (a data file its settings
    come from, a file it runs by path: ``runpy.run_path``, ``exec(open(...).read())``, a module loaded with
    ``importlib.util.spec_from_file_location``; held-out round 10), each as (absolute path, the file of the code that
    opened it: the innermost caller outside the standard library). bench/plugins.py keeps those its own code opened
    and puts their content into its digest."""

    def __enter__(self) -> FileReads:
        global _hooked
        if not _hooked:
            sys.addaudithook(_on_audit)
            _hooked = True
        self.files: list[tuple[str, str]] = []
        _RECORDING.append(self.files)
        return self

    def __exit__(self, *exc) -> None:
        _RECORDING[:] = [r for r in _RECORDING if r is not self.files]


# ------------------------------------------------------------------ the processes a plugin's code starts
_PLUGIN_AT: list[Callable[[str], str | None]] = []  # (set by watch_children: the plugin a source file belongs to)
_STARTED: list[tuple[weakref.ref, str]] = []  # (the Popen a plugin's code made, the plugin)
_SHELLS: list[str] = []  # the plugins whose code called os.system
_WATCHED = [0]  # the process watch_children was called in (a process a plugin forked may change its own folder)
_FORKING: list[tuple[str, set[int]]] = []  # (the plugin calling os.fork now, this process's children before it)
_FORKED: dict[int, str] = {}  # pid: the plugin whose code made that process by os.fork


class PluginChdir(RuntimeError):
    """A loaded plugin's code called ``os.chdir`` after its import (held-out round 14, H15): refused, raised in its
    code (a plugin's fault: its run ends FAILED, its checkpoints kept)."""


def _refuse_chdir(frame, path) -> None:
    """PluginChdir when a plugin's code is among ``frame``'s callers (``plugins.plugin_failure`` names it and its
    line): every relative path of the command (its run folder, store, data) would name another file, and pobench
    took its run folder for deleted."""
    spec = None
    with contextlib.suppress(Exception):  # (an error of this check would be the chdir's own)
        while frame is not None and spec is None:
            spec = _PLUGIN_AT[0](frame.f_code.co_filename)
            frame = frame.f_back
    if spec is not None:  # (plugin_failure adds the plugin and where: ``plugin X raised PluginChdir: ... at f:n``)
        shown = repr(os.fsdecode(path) if not isinstance(path, int) else path)[:80]
        raise PluginChdir(f"os.chdir({shown}) refused: the command's run folder, store and data are paths relative "
                          "to the folder it started in; give the plugin's own files absolute paths instead, then "
                          "run the command again (the changed plugin trains a new run: with --run-name, give "
                          "another; this run's checkpoints stay)")


def watch_children(plugin_at: Callable[[str], str | None]) -> None:
    """From now on, record each process a loaded plugin's code starts through ``subprocess`` (``Popen``, ``run``,
    ``os.popen``: a frame of a plugin's file, per ``plugin_at``, among its callers) at any time, while it trains as
    much as while imported: ``started_children`` names them. Held-out round 12 (H03): one a plugin's loss started was
    not named when the command ended (round 11's H05 names those its import started: ``KeepProcessState.children``),
    and kept a pipeline reading the command's output waiting. And (round 14, H16) each process a plugin's code makes
    by ``os.fork`` (audit event ``os.fork``, then ``os.register_at_fork``: the new child). (A process made by
    ``os.posix_spawn`` or ``multiprocessing`` directly is not recorded.)"""
    global _hooked
    if not _PLUGIN_AT:
        _PLUGIN_AT.append(plugin_at)
        _WATCHED[0] = os.getpid()
        os.register_at_fork(after_in_parent=_forked, after_in_child=_FORKING.clear)
    if not _hooked:
        sys.addaudithook(_on_audit)
        _hooked = True


def _forked() -> None:
    """After ``os.fork`` in this process: the child a plugin's code made (``_FORKING``) recorded with that plugin."""
    if _FORKING:
        spec, before = _FORKING.pop()
        _FORKED.update(dict.fromkeys(child_processes() - before, spec))


def _started(frame) -> None:
    """``frame``: ``subprocess.Popen._execute_child``'s, about to start the process (its pid set once started):
    recorded when a plugin's code is among its callers. A weak reference: the Popen a plugin drops while its process
    runs stays alive in ``subprocess._active``, one that ended is not kept open here."""
    try:  # (an exception here would be the Popen's own)
        popen = frame.f_locals.get("self")
        spec = _plugin_caller(frame.f_back) if popen is not None else None
        if spec is not None:
            _STARTED.append((weakref.ref(popen), spec))
    except Exception:  # noqa: BLE001
        pass


def _plugin_caller(frame) -> str | None:
    """The plugin whose code is ``frame`` or one of its callers (``watch_children``'s ``plugin_at``), or None."""
    try:
        while frame is not None:
            spec = _PLUGIN_AT[0](frame.f_code.co_filename)
            if spec is not None:
                return spec
            frame = frame.f_back
    except Exception:  # noqa: BLE001  (an exception here would be the caller's own)
        pass
    return None


def shell_starters() -> list[str]:
    """The plugins whose code started a process (``started_children``) or a shell (``os.system``): those a process
    left in the background by it (:func:`output_holders`) is named after."""
    return list(dict.fromkeys([*(spec for _, spec in started_children()), *_SHELLS]))


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command's name (0: state, 1: ppid, 3: session, 19: start time)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def output_holders() -> list[int]:
    """The processes, on Linux, that hold this process's standard output or error open for writing where it is a
    pipe, other than this process, its ancestors and its live descendants, in its session and started after it: a
    process a plugin left in the background through a shell (``sh -c 'cmd &'``, ``os.system('cmd &')``; held-out
    round 13, H13) is no child of this process (its shell ended: it was orphaned), and keeps a pipeline reading the
    command's output waiting."""
    try:
        pipes = {os.readlink(f"/proc/self/fd/{fd}") for fd in (1, 2)}
        me = _stat("self")
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except (OSError, IndexError):
        return []
    pipes = {p for p in pipes if p.startswith("pipe:")}
    if not pipes:
        return []
    skip, pid = {os.getpid()}, os.getppid()
    while pid > 1 and pid not in skip:  # (this process's ancestors: the shell or script that started it)
        skip.add(pid)
        try:
            pid = int(_stat(pid)[1])
        except (OSError, IndexError, ValueError):
            break
    parents: dict[int, int] = {}
    for e in entries:
        with contextlib.suppress(OSError, IndexError, ValueError):
            parents[int(e)] = int(_stat(e)[1])

    def ours(pid: int) -> bool:  # (a live descendant of this process: multiprocessing's resource tracker, a pool's
        seen = set()  # forkserver and workers, a child a plugin started: named as such, not as left in the background)
        while pid > 1 and pid not in seen:
            seen.add(pid)
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    out = []
    for e in entries:
        try:
            fields = _stat(e)
            if int(e) in skip or fields[0] == "Z" or fields[3] != me[3] or int(fields[19]) < int(me[19]) \
                    or ours(int(e)):
                continue
            fd_dir = f"/proc/{e}/fd"
            for fd in os.listdir(fd_dir):
                if os.readlink(f"{fd_dir}/{fd}") in pipes and _writes(f"/proc/{e}/fdinfo/{fd}"):
                    out.append(int(e))
                    break
        except (OSError, IndexError, ValueError):
            continue
    return out


def _writes(fdinfo: str) -> bool:
    """Whether the open file of ``fdinfo`` (``/proc/<pid>/fdinfo/<fd>``) is open for writing (a pipe's write end)."""
    for line in Path(fdinfo).read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
    return False


def started_children() -> list[tuple[int, str]]:
    """(pid, plugin) of each process a loaded plugin's code started (``watch_children``), running or not."""
    out = list(_FORKED.items())
    for ref, spec in _STARTED:
        pid = getattr(ref(), "pid", None)
        if isinstance(pid, int):
            out.append((pid, spec))
    return out
