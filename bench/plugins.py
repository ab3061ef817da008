"""Plugins: objectives, tasks and reward functions of your own, in every process that trains (docs/PLUGINS.md).

A plugin is a Python module or ``.py`` file that registers objectives (``algorithms.register``) and tasks
(``evaluators.register_task``; a task's ``reward`` is its reward function) when imported. It is named by
``--plugin MODULE_OR_FILE.py`` (repeatable, on every command) or the config key ``plugins``, or installed under the
entry-point group ``pobench.plugins`` (loaded in every process). ``load_plugins`` imports them, once per process: in
the command's process, and in every worker that trains (a spawned process, a Ray task, each ``torchrun`` process, each
verl worker), each of which is given the same list. A ``.py`` file is imported under a name derived from its path
(``pobench_plugin_<stem>_<hash>``), the same in every process, so objects defined there pickle between them.

Identity: ``identity(specs)`` (each plugin's file name and a digest of its source, of the source of every module it
imports from outside installed packages and of the files its code reads while imported: bench/plugin_identity.py;
and the resolved ``settings`` of the objectives it registers) enters
``TrainConfig.comparison_hash``, so a changed plugin, or a changed module of the user's it imports, trains again;
``plugins_tag(specs)`` is what a run's ``pobench.plugins`` tag holds. Imports by a name computed at run time cannot
be known from the source: each is a warning (``Plugin.unknown``), printed once by the command line.
``with_plugins(cfg, objectives)`` adds to a config the plugins that the objectives and tasks it uses came from when
they were registered by a module the config does not name yet (an import in a notebook), and ``check_shippable``
refuses, before any worker starts, an objective or task registered in ``__main__`` (a notebook cell), which no
worker can import.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from algorithms import get_spec, list_objectives, registered_advantage
from algorithms.registry import default_config
from bench import plugin_imports
from bench.plugin_alarm import guard_alarm
from bench.plugin_guard import (
    KeepProcessState,
    check_streams,
    child_processes,
    output_holders,
    shell_starters,
    started_children,
    watch_children,
)
from bench.plugin_hooks import TRACEBACK_ENV, guard_os_exit, watch_exit_hooks, watch_thread_errors
from bench.plugin_identity import plugin_digest, short_name, source_of
from evaluators import list_benchmarks, task_module
from evaluators.hints import NOT_REGULAR, missing_file, not_regular

ENTRY_POINT_GROUP = "pobench.plugins"
#: JSON list of plugins for processes that get no argument from pobench (verl's workers: bench/engines/verl)
PLUGINS_ENV = "POBENCH_PLUGINS"
BUILTIN_MODULES = ("algorithms", "evaluators")
MAIN_MODULES = ("__main__", "__mp_main__")
#: a folder named as a plugin (by its path, or by a module name that imports it as an empty namespace package)
FOLDER_REFUSAL = "is a folder; give a .py file or an importable module name"


@dataclass(frozen=True)
class Plugin:
    """A loaded plugin: as named (``spec``), the module it was imported as, its source and its digest."""

    spec: str
    module: str
    path: str
    digest: str
    entry_point: bool = False
    imports: tuple[str, ...] = ()   # the local modules its digest covers besides its own source
    unknown: tuple[str, ...] = ()   # where it imports by a computed name (``file:line``): not in its digest
    changed: tuple[str, ...] = ()   # process-wide state it changed while imported, put back (_KeepProcessState)
    reads: tuple[str, ...] = ()     # the files its code read while imported (their content is in its digest)

    @property
    def label(self) -> str:
        """``<file name>@<digest>``: what the comparison hash takes."""
        return f"{Path(self.path).name if self.path else self.module}@{self.digest}"

    @property
    def recorded(self) -> str:
        """``<file name>@<digest>`` (and ``~<settings>``: ``settings``) plus ``+<module>`` for each local module and
        ``+<file name>`` for each file read at import the digest covers: what a run records."""
        return self.label + settings(self) + "".join(f"+{m}" for m in (*self.imports, *map(short_name, self.reads)))


_LOADED: dict[str, Plugin] = {}     # key: the absolute file path of a file plugin, else the module name
_ENTRY_POINTS: list[Plugin] = []
_entry_points_loaded = False


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def _key(spec: str) -> str:
    if not _is_file(spec):
        return spec
    try:
        return str(Path(spec).expanduser().resolve())
    except (RuntimeError, OSError):  # (a symbolic link loop: Python 3.11's "Symlink loop" traceback; named by
        return os.path.abspath(os.path.expanduser(spec))  # _import_file)


def file_module_name(path: str | Path) -> str:
    """The module name a plugin file is imported as: the same in every process that loads the same path."""
    p = Path(path).resolve()
    stem = "".join(c if c.isalnum() else "_" for c in p.stem)
    return f"pobench_plugin_{stem}_{hashlib.sha256(str(p).encode()).hexdigest()[:8]}"


def _new_modules(before: set[str]) -> list[str]:
    return [m for m in list(sys.modules) if m not in before]


def _import_file(spec: str) -> Plugin:
    if not os.path.exists(os.path.expanduser(spec)):  # (before resolve(), which raises for a symbolic link loop)
        raise ValueError(f"plugin {spec}: {missing_file(spec)}")
    path = Path(spec).expanduser().resolve()
    if path.is_dir():  # (held-out round 9: "no such file" for a folder that exists)
        raise ValueError(f"plugin {spec}: {FOLDER_REFUSAL}")
    if not_regular(path):
        raise ValueError(f"plugin {spec}: {NOT_REGULAR}; give a .py file")
    if not path.is_file():
        raise ValueError(f"plugin {spec}: {missing_file(path)}")
    name = file_module_name(path)
    plugin_imports.mark()
    before = set(sys.modules)
    with KeepProcessState() as kept:
        if name not in sys.modules:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)
            except BaseException as e:
                del sys.modules[name]
                raise _failed(spec, e, beside=path.parent) from e
    check_streams(spec, kept)
    _CHILDREN.update(dict.fromkeys(kept.children, spec))
    digest, imports, unknown, reads = plugin_digest(path, [m for m in _new_modules(before) if m != name],
                                                    kept.reads.files)
    return Plugin(spec, name, str(path), digest, imports=imports, unknown=unknown, changed=tuple(kept.changed),
                  reads=reads)


_FILES: list = [None, {}]  # (the plugins and file names _plugin_files made its table from, the table)


def _plugin_files() -> dict[str, Plugin]:
    """{real path of a source file: its plugin}: every loaded plugin's file and the local modules its digest covers.
    Made again only when the plugins or their modules' files changed: the process-start hooks ask for it at every
    frame of every ``subprocess`` call and ``os.chdir`` (a realpath per file each time: 30 CPU-s over the suite)."""
    named = [(p, (p.path, *(getattr(sys.modules.get(m), "__file__", None) for m in (p.module, *p.imports))))
             for p in [*_LOADED.values(), *_ENTRY_POINTS]]
    if named != _FILES[0]:
        files: dict[str, Plugin] = {}
        for p, paths in named:
            files.update({os.path.realpath(f): p for f in paths if f})
        _FILES[:] = [named, files]
    return _FILES[1]


def _loaded_specs() -> list[str]:
    return [p.spec for p in [*_LOADED.values(), *_ENTRY_POINTS]]


@functools.lru_cache(maxsize=4096)
def _real_path(filename: str) -> str:
    """``os.path.realpath`` of a code file's name (cached: the hooks see the same few files again and again)."""
    return os.path.realpath(filename)


def _plugin_at(filename: str) -> str | None:
    """The plugin (as named) whose source file ``filename`` is, or None."""
    plugin = _plugin_files().get(_real_path(filename))
    return None if plugin is None else plugin.spec


_CHILDREN: dict[int, str] = {}  # pid: the plugin whose import started that process


def plugin_children() -> list[tuple[int, str]]:
    """(pid, plugin) of the child processes a plugin started that still run, at its import (held-out round 11, H05:
    a pipeline waited 45 s for one, nothing said) or later, while it trained (round 12, H03: ``watch_children``):
    they keep the command's output open after it ends. And, where plugins are loaded, the processes no longer its
    children that hold the command's output pipe open (round 13, H13: ``sh -c 'cmd &'``, ``os.system('cmd &')``:
    ``output_holders``), named after the plugins that started a process or a shell."""
    found = {**_CHILDREN, **dict(started_children())}
    live = child_processes() if found else set()
    out = [(pid, spec) for pid, spec in found.items() if pid in live]
    starters = shell_starters() or [p.spec for p in _LOADED.values()]
    if starters:  # (orphans: processes left in the background through a shell, which hold the output open)
        by = starters[0] if len(starters) == 1 else f"one of {', '.join(starters)}"
        out += [(pid, by) for pid in output_holders() if pid not in found]
    return out


def plugin_threads() -> list[tuple[threading.Thread, Plugin]]:
    """The live non-daemon threads a loaded plugin started (their target, or their class's ``run``, is in a plugin's
    file): the interpreter would wait for them at exit for ever, deaf to Ctrl-C."""
    files, out = _plugin_files(), []
    for t in threading.enumerate():
        if t is threading.main_thread() or t.daemon or not t.is_alive():
            continue
        for fn in (getattr(t, "_target", None), type(t).run):
            code = getattr(fn, "__code__", None)
            plugin = files.get(os.path.realpath(code.co_filename)) if code is not None else None
            if plugin is not None:
                out.append((t, plugin))
                break
    return out


def plugin_failure(error: BaseException, causes: bool = True) -> str | None:
    """The one line of an exception a loaded plugin's code raised (its objective, estimator, task or reward, at any
    depth under pobench's calls): the plugin, the exception and the plugin's line where it was raised, and what to do;
    None when no frame of its traceback (or of its causes') is a plugin's, or ``$POBENCH_TRACEBACK`` asks for the
    traceback. An exception pobench raises about a plugin (a wrong shape, a NaN) names it already; ``causes`` False
    looks at ``error``'s own traceback only (a ValueError pobench raised from a plugin's exception keeps its line)."""
    if os.environ.get(TRACEBACK_ENV, "0") not in ("", "0"):
        return None
    files, seen, e = _plugin_files(), set(), error
    while e is not None and id(e) not in seen and files:
        seen.add(id(e))
        tb, last = e.__traceback__, None
        while tb is not None:
            if os.path.realpath(tb.tb_frame.f_code.co_filename) in files:
                last = tb
            tb = tb.tb_next
        if last is not None:
            where = f"{last.tb_frame.f_code.co_filename}:{last.tb_lineno} (in {last.tb_frame.f_code.co_name})"
            text = (str(e).strip().splitlines() or [""])[0][:300]
            plugin = files[os.path.realpath(last.tb_frame.f_code.co_filename)]
            return (f"plugin {plugin.spec} raised {type(e).__name__}{': ' + text if text else ''} at {where}: fix the "
                    f"plugin ({TRACEBACK_ENV}=1 shows the traceback)")
        e = (e.__cause__ or e.__context__) if causes else None
    return None


def _failed(spec: str, e: BaseException, beside: Path | None = None) -> BaseException:
    """A plugin that raised while imported: one line naming it (a ``sys.exit`` in it included, which would otherwise
    end the command silently with the plugin's code); an interrupt stays an interrupt, unless no signal came: a
    ``raise KeyboardInterrupt`` of the plugin's code is its fault, as any other exception (held-out round 11, H18:
    exit 1, not worded as a plugin that failed to load)."""
    from bench.runs.stop import raised_by_code

    if isinstance(e, KeyboardInterrupt) and not raised_by_code(e):
        return e
    if isinstance(e, KeyboardInterrupt):
        text = f": {e}" if str(e) else ""
        return ValueError(f"plugin {spec} failed to load: KeyboardInterrupt{text} (raised by its code while no signal "
                          "came)")
    if isinstance(e, SystemExit):
        return ValueError(f"plugin {spec} failed to load: it called sys.exit({e.code!r}) while imported")
    hint = ""
    top = (getattr(e, "name", None) or "").split(".")[0] if isinstance(e, ModuleNotFoundError) else ""
    if top and beside is not None and ((beside / f"{top}.py").is_file() or (
            beside / top / "__init__.py").is_file()):  # (held-out round 13, H14: a module beside the plugin file)
        hint = (f" ({top!r} is beside the plugin in {beside}, which is not on Python's path: a plugin file is "
                f"imported, not run as a script; add that folder to PYTHONPATH)")
    return ValueError(f"plugin {spec} failed to load: {type(e).__name__}: {e}{hint}")


def _import_module(spec: str, entry_point: bool = False) -> Plugin:
    plugin_imports.mark()
    before = set(sys.modules)
    with KeepProcessState() as kept:
        try:
            module = importlib.import_module(spec)
        except ModuleNotFoundError as e:
            if e.name and spec.startswith(e.name):
                raise ValueError(f"plugin {spec!r}: no module named {e.name!r} (give an importable module or a .py "
                                 "file)") from None
            raise _failed(spec, e) from e
        except BaseException as e:
            raise _failed(spec, e) from e
    check_streams(spec, kept)
    _CHILDREN.update(dict.fromkeys(kept.children, spec))
    source = source_of(module)
    if not source and getattr(module, "__path__", None) is not None:  # a namespace package: a folder, no code run
        raise ValueError(f"plugin {spec}: {FOLDER_REFUSAL} ({', '.join(module.__path__)} has no __init__.py: "
                         "imported, it runs no code and registers nothing)")
    if not source:
        return Plugin(spec, module.__name__, source, "none", entry_point, changed=tuple(kept.changed))
    digest, imports, unknown, reads = plugin_digest(source, _new_modules(before), kept.reads.files)
    return Plugin(spec, module.__name__, source, digest, entry_point, imports, unknown, tuple(kept.changed), reads)


def load_entry_points() -> list[Plugin]:
    """The installed plugins (entry-point group ``pobench.plugins``), imported once per process; an entry point
    that names a function (``module:function``) is called after its module is imported."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            watch_exit_hooks(_plugin_at)  # (the exit hooks its import registers: bounded at exit, H03)
            plugin = _import_module(ep.module, entry_point=True)
            if ep.attr:
                try:
                    ep.load()()
                except Exception as e:
                    raise ValueError(f"plugin entry point {ep.name} = {ep.value} failed: {type(e).__name__}: "
                                     f"{e}") from e
            _ENTRY_POINTS.append(plugin)
    return list(_ENTRY_POINTS)


def load_plugins(specs: Sequence[str] | None = ()) -> list[Plugin]:
    """Import the installed plugins and ``specs`` (module names or ``.py`` files), each once per process, in order;
    returns the ``specs``' plugins. A missing file or module, or one that fails to import: ValueError, one line.
    Once a plugin is loaded, its code calling ``os._exit`` raises instead (``bench.plugin_hooks.guard_os_exit``),
    the processes its code starts are recorded (``bench.plugin_guard.watch_children``), a SIGALRM no handler
    takes is a plugin's fault, not the process's end (``bench.plugin_alarm.guard_alarm``), the exit hooks it
    registers are bounded and an exception ending its thread is one line (``bench.plugin_hooks``)."""
    load_entry_points()
    if specs:  # (its signal.alarm recorded from the import on: ``from signal import alarm`` gets the recording one)
        guard_alarm(_plugin_at, _loaded_specs)
        watch_exit_hooks(_plugin_at)  # (the same for atexit.register: most plugins register at import)
    out = []
    for spec in specs or ():
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"plugins: each entry must be a module name or a .py file, got {spec!r}")
        key = _key(spec)
        if key not in _LOADED:
            _LOADED[key] = _import_file(spec) if _is_file(spec) else _import_module(spec)
        out.append(_LOADED[key])
    if _LOADED or _ENTRY_POINTS:  # (a process without plugins keeps its os._exit)
        guard_os_exit(_plugin_at)
        guard_alarm(_plugin_at, _loaded_specs)  # (a plugin's forgotten signal.alarm: one line, not exit 142, H30)
        watch_children(_plugin_at)  # (the processes their code starts: named at the command's end, H03)
        watch_thread_errors()  # (an exception ending a plugin's thread: one line, round 14 H07)
    return out


def plugins_from_env() -> list[str]:
    """The plugins named in ``$POBENCH_PLUGINS`` (a JSON list): how a verl worker, started by verl, learns them."""
    raw = os.environ.get(PLUGINS_ENV, "").strip()
    specs = json.loads(raw) if raw else []
    if not isinstance(specs, list):
        raise ValueError(f"${PLUGINS_ENV} must be a JSON list of module names or .py files, got {raw[:200]!r}")
    return specs


def normalized(specs: Sequence[str]) -> list[str]:
    """``specs`` with files as absolute paths (a worker may run in another folder) and without repeats."""
    out: list[str] = []
    for spec in specs:
        s = _key(spec)
        if s not in out:
            out.append(s)
    return out


def settings(plugin: Plugin) -> str:
    """``~<digest>`` of the resolved settings (every config field, defaults included) of each objective ``plugin``
    registered, '' when it registers none: a value its code reads from anywhere at import (an environment variable, a
    file its digest does not cover) is part of the objective (held-out round 10); what its code reads later, while it
    trains, is not known here."""
    names = [n for n in list_objectives() if _module_of(get_spec(n).module) is plugin]
    if not names:
        return ""
    resolved = {n: dataclasses.asdict(default_config(n)) for n in names}
    text = json.dumps(resolved, sort_keys=True, default=lambda o: getattr(o, "__qualname__", type(o).__name__))
    return "~" + hashlib.sha256(text.encode()).hexdigest()[:8]


def identity(specs: Sequence[str]) -> list[str]:
    """What ``TrainConfig.comparison_hash`` takes of the plugins: each one's file name and digest (its source, the
    local modules it imports and the files it read at import, by content, not path: a moved file is the same plugin,
    an edited one is not) and its objectives' resolved ``settings``."""
    return [p.label + settings(p) for p in load_plugins(specs)]


def run_imports_tags(specs: Sequence[str]) -> dict[str, str]:
    """The tags of a finishing run recording the modules of the user's its plugins' code imported after they loaded
    and their identity does not cover (bench/plugin_imports.py: checked before the run is reused); {} without
    plugins."""
    loaded = [*load_plugins(specs), *_ENTRY_POINTS] if specs or _ENTRY_POINTS else []
    covered = [p.path for p in loaded] + [source_of(sys.modules[m]) for p in loaded for m in p.imports
                                         if m in sys.modules]
    return plugin_imports.tags(plugin_imports.imported(c for c in covered if c)) if loaded else {}


def plugins_tag(specs: Sequence[str]) -> str:
    """The ``pobench.plugins`` tag of a run: ``<file>@<digest>`` of each plugin named and each installed one."""
    return ",".join(p.recorded for p in [*load_plugins(specs), *_ENTRY_POINTS])


# ------------------------------------------------------------------ a pool worker's plugins against the command's
#: how the line of a worker whose plugins changed begins (each pair's short line; the whole line is said once)
PLUGINS_CHANGED = "the plugins changed on disk while the command started its worker processes"


def plugins_changed(plugins: list[str], expected: str | None) -> str | None:
    """The one line of a worker whose plugins are not those the command identified (``plugins_tag``: each file's
    digest) when it planned its jobs: a plugin file edited while the pool started trained the edited code under the
    comparison id of the first (held-out round 13, H37). Its tasks fail with it; none trains. It names the files that
    differ (held-out round 14, H19: a plugin writing its own file at import changes it at every run, and "rerun once
    the files stay unchanged" was a dead end for it); before its first ``; ``: each pair's short line."""
    here = plugins_tag(plugins)
    if expected is None or here == expected:
        return None
    before, now = ({e.split("@")[0]: e for e in tag.split(",") if e} for tag in (expected, here))
    files = ", ".join(sorted(f for f in {*before, *now} if before.get(f) != now.get(f)))
    return (f"{PLUGINS_CHANGED}: {files} (nothing trained with them); {expected or 'none'} when it planned its runs, "
            f"{here or 'none'} in the worker; rerun the same command once {files} stays unchanged (a plugin that "
            "writes its own file when imported changes it at every run: make it write elsewhere)")


# ------------------------------------------------------------------ where objectives and tasks come from
def _module_of(module: str) -> Plugin | None:
    for p in [*_LOADED.values(), *_ENTRY_POINTS]:
        if module == p.module or module.startswith(p.module + "."):
            return p
    return None


def _builtin(module: str) -> bool:
    return module.split(".")[0] in BUILTIN_MODULES


def objective_source(name: str) -> str:
    """Where objective ``name`` was registered: ``built-in``, ``plugin <file>@<digest>``, ``installed plugin ...``,
    ``__main__`` or the module's name."""
    return _describe(get_spec(name).module)


def task_source(name: str) -> str:
    """Where task ``name`` was registered (as `objective_source`)."""
    return _describe(task_module(name))


def describe_module(module: str) -> str:
    """Where something registered in ``module`` came from (as `objective_source`): an advantage estimator's."""
    return _describe(module)


def _describe(module: str) -> str:
    if _builtin(module):
        return "built-in"
    p = _module_of(module)
    if p is not None:
        return f"{'installed ' if p.entry_point else ''}plugin {p.label} ({p.path})"
    return module or "unknown"


def _used(cfg: Any, objectives: Sequence[str]) -> list[tuple[str, str, str]]:
    """(kind, name, registering module) of each objective and task ``cfg`` (a TrainConfig: bench.config imports
    this module) uses with ``objectives``."""
    names = list(dict.fromkeys([*objectives, cfg.algo]))
    used = [("objective", a, get_spec(a).module) for a in names]
    # an advantage estimator a plugin registered, named by an objective's defaults or by the config's overrides
    estimators = [get_spec(a).defaults.get("advantage_estimator") for a in names]
    estimators.append(cfg.objective_overrides.get("advantage_estimator"))
    used += [("advantage estimator", e, spec.module) for e in dict.fromkeys(estimators)
             if e and (spec := registered_advantage(e)) is not None]
    tasks = [t for t in dict.fromkeys([cfg.task, cfg.eval_task]) if t and t in list_benchmarks()]
    return used + [("task", t, task_module(t)) for t in tasks]


def with_plugins(cfg: Any, objectives: Sequence[str] = ()) -> Any:
    """``cfg`` with its plugins loaded and normalised, plus the module of every objective / task it uses that was
    registered by an importable module it does not name (e.g. imported in a notebook), so that workers import it
    and its digest enters the comparison hash."""
    load_plugins(cfg.plugins)
    specs = normalized(cfg.plugins)
    for _, _, module in _used(cfg, objectives):
        if _builtin(module) or module in MAIN_MODULES or not module:
            continue
        p = _module_of(module)
        if p is None:
            specs.append(module)
            load_plugins([module])
        elif p.entry_point or _key(p.spec) in specs:
            continue
        else:
            specs.append(_key(p.spec))
    return cfg if specs == list(cfg.plugins) else dataclasses.replace(cfg, plugins=specs)


def check_shippable(cfg: Any, objectives: Sequence[str] = ()) -> None:
    """Refuse (ValueError, one line) an objective or task registered in ``__main__`` when workers in other processes
    will train: they cannot import a notebook cell or a script's main module."""
    for kind, name, module in _used(cfg, objectives):
        if module in MAIN_MODULES:
            raise ValueError(f"{kind} {name!r} is registered in __main__ (a notebook cell or a script), which the "
                             "worker processes cannot import: put it in a module or .py file and name it as a plugin "
                             "(--plugin FILE.py, or plugins=[...] in the config), or use --workers 1")
