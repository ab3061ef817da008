"""What a plugin's identity covers (bench/plugins.py ``identity``): the digest of its source, of the source of every
module it imports from outside installed packages (:func:`local_imports`), and of the files its code read while
imported (:func:`read_files`, from the reads ``bench.plugin_guard.FileReads`` saw), in :func:`plugin_digest`. A
changed plugin, a changed module of the user's it imports, or a changed file it read, makes another comparison.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

#: pobench's own packages: their code is the run's pobench version and commit (tags), not a plugin's identity
POBENCH_PACKAGES = ("algorithms", "evaluators", "reports", "bench")


def source_digest(path: str | Path) -> str:
    """Digest (12 hex) of a plugin's source: the file, or every ``.py`` file of a package folder."""
    p = Path(path)
    files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def source_of(module) -> str:
    """A module's source: its file, or its package folder."""
    file = getattr(module, "__file__", None) or ""
    if file.endswith("__init__.py"):
        return str(Path(file).parent)
    return file


# ------------------------------------------------------------------ what a plugin's code is
@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[Path, ...]:
    """The folders of installed code: the standard library, site-packages, the interpreter's prefixes."""
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(),
              site.getusersitepackages()}
    return tuple(Path(r).resolve() for r in roots if r)


def _local_unit(top: str) -> Path | None:
    """The source of top-level module ``top`` when it is the user's own code (a ``.py`` file, or its package folder):
    not installed, not pobench's, not built in; None otherwise. Found without importing anything."""
    if top in POBENCH_PACKAGES or top in sys.builtin_module_names:
        return None
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # (a module in sys.modules without a spec: __main__)
        return None
    if found is None:
        return None
    if found.submodule_search_locations:  # a package (a namespace package: its first folder)
        unit = Path(next(iter(found.submodule_search_locations)))
    elif found.origin and found.origin.endswith(".py"):
        unit = Path(found.origin)
    else:  # built in, frozen, an extension module
        return None
    unit = unit.resolve()
    return None if any(r == unit or r in unit.parents for r in _installed_roots()) else unit


def _imported_names(tree: ast.AST, where: Path, unknown: list[str]) -> list[str]:
    """Every module a source imports, at its top or inside a function, by ``import`` / ``from`` statements and by
    ``importlib.import_module`` / ``__import__`` with a literal name; a computed name goes to ``unknown``."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and node.args and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))):
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.append(first.value)
            else:
                unknown.append(f"{where}:{node.lineno}")
    return names


def _py_files(unit: Path) -> list[Path]:
    return sorted(unit.rglob("*.py")) if unit.is_dir() else [unit]


def local_imports(source: str | Path, also: Sequence[str] = ()) -> tuple[dict[str, Path], list[str]]:
    """The user's own modules a plugin's code runs (module doc): top-level module name -> its file or package
    folder, followed through what those import in turn; ``also``: modules seen imported while it loaded (a computed
    name among them). Returns them with the places that import by a computed name (``file:line``)."""
    own = Path(source).resolve()
    found: dict[str, Path] = {}
    unknown: list[str] = []
    tops = dict.fromkeys(n.split(".")[0] for n in also)
    queue = [own, *[u for u in map(_local_unit, tops) if u is not None]]
    scanned: set[Path] = set()
    while queue:
        unit = queue.pop()
        if unit in scanned:
            continue
        scanned.add(unit)
        if unit != own and not (own.is_dir() and own in unit.parents):
            found[unit.stem if unit.is_file() else unit.name] = unit
        for f in _py_files(unit):
            try:
                tree = ast.parse(f.read_bytes(), str(f))
            except (OSError, SyntaxError, ValueError):
                continue
            for name in _imported_names(tree, f, unknown):
                dep = _local_unit(name.split(".")[0])
                if dep is not None:
                    queue.append(dep)
    return dict(sorted(found.items())), unknown


def short_name(path: str) -> str:
    return Path(path).name


@functools.lru_cache(maxsize=1)
def _pobench_roots() -> tuple[Path, ...]:
    found = (importlib.util.find_spec(p) for p in POBENCH_PACKAGES)
    return tuple(Path(loc).resolve() for f in found if f and f.submodule_search_locations
                 for loc in f.submodule_search_locations)


def _not_users(path: Path) -> bool:
    """Whether ``path`` is installed code, pobench's, or a device's or the kernel's file: never a plugin's input."""
    return path.parts[1:2] in (("proc",), ("sys",), ("dev",)) or \
        any(r == path or r in path.parents for r in (*_installed_roots(), *_pobench_roots()))


def users_file(path: str) -> bool:
    """Whether the file ``path`` is the user's: not installed code, not pobench's, nor a device's file (most files
    ruled out by their prefix, without resolving them)."""
    return not path.startswith(_excluded_prefixes()) and not _not_users(Path(path).resolve())


@functools.lru_cache(maxsize=1)
def _excluded_prefixes() -> tuple[str, ...]:
    """``_not_users``'s folders as path prefixes: most files an import opens are ruled out without resolving them."""
    return tuple(str(r).rstrip(os.sep) + os.sep for r in (*_installed_roots(), *_pobench_roots())) + \
        ("/proc/", "/sys/", "/dev/")


def read_files(opened: Sequence[tuple[str, str]], source: str | Path, deps: Sequence[Path] = ()) -> tuple[str, ...]:
    """The files a plugin's own code (or a local module's, or code it ran by path) read while it was imported
    (``opened``: bench/plugin_guard.py ``FileReads``): those opened by code that is not installed nor pobench's,
    less the sources its digest covers already (its own, its local modules'); a cached ``.pyc`` stands for its
    source. A file an installed library reads (its own configuration) is not the plugin's."""
    covered = [Path(source).resolve(), *(Path(d).resolve() for d in deps)]
    out: dict[str, None] = {}
    users: dict[str, bool] = {}  # caller -> whether it is the user's code (the same few callers, many files)
    for path, caller in opened:
        if caller not in users:
            users[caller] = not caller.startswith("<frozen ") and \
                (caller.startswith("<") or not _not_users(Path(caller).resolve()))
        if not users[caller] or path.startswith(_excluded_prefixes()):  # (a module an import opened, mostly)
            continue
        p = Path(path).resolve()
        if p.suffix == ".pyc":
            try:
                p = Path(importlib.util.source_from_cache(str(p))).resolve()
            except ValueError:
                continue
        if _not_users(p) or any(c == p or c in p.parents for c in covered) or not p.is_file():
            continue
        out[str(p)] = None
    return tuple(sorted(out, key=lambda f: (short_name(f), f)))


def plugin_digest(source: str | Path, also: Sequence[str] = (), opened: Sequence[tuple[str, str]] = ()
                  ) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(digest, the local modules it covers, the computed-name imports, the files read at import it covers) of a
    plugin's code: its own source digest when it imports nothing of the user's and reads no file (the digest runs
    stored before this covered), else a digest of that, of each local module's name and source digest, and of each
    file's name and content its code read while imported (``read_files``; by content, not path)."""
    from bench.runs.identity import file_digest  # (cached by path, size, times and inode)

    own = source_digest(source)
    deps, unknown = local_imports(source, also)
    reads = read_files(opened, source, list(deps.values()))
    if not deps and not reads:
        return own, (), tuple(unknown), ()
    h = hashlib.sha256(own.encode())
    for name, unit in deps.items():
        h.update(f"\0{name}\0{source_digest(unit)}".encode())
    for f in reads:
        h.update(f"\0file:{short_name(f)}\0{file_digest(f)}".encode())
    return h.hexdigest()[:12], tuple(deps), tuple(unknown), reads
