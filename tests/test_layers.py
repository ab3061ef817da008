"""Imports point one way: ``bench`` uses ``algorithms``, ``evaluators`` and ``reports``, never the reverse, and inside
``bench`` no module imports itself back through others (docs/ARCHITECTURE.md, "Imports point one way"). Read from the
source with ``ast``, so a lazy import inside a function (or under ``TYPE_CHECKING``) counts as much as one at the top
of a module. The documented layout is the tree, and no module is over 500 lines."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOWER = ("algorithms", "evaluators", "reports")


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import statement, at any depth; relative imports are skipped (they stay inside their
    own package)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def test_the_walk_finds_lazy_and_aliased_imports():
    src = "import os\ndef f():\n    from bench.model import x\n    import bench as b\nfrom .base import y\n"
    assert imported_modules(src) == [(1, "os"), (3, "bench.model"), (4, "bench")]


@pytest.mark.parametrize("package", LOWER)
def test_package_never_imports_bench(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    found = [f"{f.relative_to(ROOT)}:{line}: {mod}" for f in files
             for line, mod in imported_modules(f.read_text()) if mod == "bench" or mod.startswith("bench.")]
    assert not found, "imports must point one way (bench -> others), but:\n" + "\n".join(found)


def test_rollout_samplers_import_only_the_shared_modules():
    """Inside ``bench/rollout/`` (docs/ARCHITECTURE.md, "Rollout sampler"): the samplers use ``types`` and ``scoring``,
    never each other nor the package's ``make_sampler``; ``types`` and ``scoring`` use no other pobench module."""
    pkg = ROOT / "bench" / "rollout"

    def bench_imports(name: str) -> set[str]:
        return {mod for _, mod in imported_modules((pkg / f"{name}.py").read_text())
                if mod == "bench" or mod.startswith("bench.")}

    for sampler in ("hf", "vllm"):
        assert bench_imports(sampler) <= {"bench.rollout.types", "bench.rollout.scoring"}, sampler
    assert bench_imports("types") == set()
    assert bench_imports("scoring") == set()


# ------------------------------------------------------------------ no import circle inside bench/
def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str = "bench") -> dict[str, set[str]]:
    """{module: the modules of ``package`` it imports}, at any depth of its source. ``from a.b import c`` is an import
    of the module ``a.b.c`` when there is one, else of ``a.b``; a package's ``__init__`` is the package's name. An
    import of ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``: edges to them too (issue 30: ``bench.config``
    imported ``bench.engines.base``, whose package ``__init__`` reached the loops, which import ``bench.config``),
    except to the importing module's own packages, which Python has loaded before it."""
    modules = {module_name(f): f for f in sorted((ROOT / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                edges.update(subs or {node.module})
                if len(subs) < len(node.names):
                    edges.add(node.module)
        for target in list(edges):
            parts = target.split(".")
            edges.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                         if p in modules and not name.startswith(p + "."))
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_cycle_finder_finds_a_circle_through_a_lazy_import(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = import_graph("pkg")
    assert graph["pkg.a"] == {"pkg.sub.b", "pkg.sub"} and graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("import pkg.sub\n")
    assert find_cycle(import_graph("pkg")) is None
    # a package's __init__ runs on importing any of its modules: c -> pkg.sub.b runs pkg.sub, whose __init__ imports a
    (pkg / "c.py").write_text("from pkg.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("def g():\n    import pkg.a\n")
    (pkg / "a.py").write_text("import pkg.c\n")
    assert import_graph("pkg")["pkg.c"] == {"pkg.sub.b", "pkg.sub"}
    assert find_cycle(import_graph("pkg")) == ["pkg.a", "pkg.c", "pkg.sub", "pkg.a"]


def test_no_import_circle_in_bench():
    cycle = find_cycle(import_graph("bench"))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_only_the_command_line_imports_it():
    """Library code never imports ``bench.cli`` (entry points ``__main__`` may: they are command lines too)."""
    graph = import_graph("bench")
    found = sorted(m for m, deps in graph.items() if not m.startswith("bench.cli") and not m.endswith("__main__")
                   and any(d == "bench.cli" or d.startswith("bench.cli.") for d in deps))
    assert not found, f"library modules import the command line: {found}"


# ------------------------------------------------------------------ one training run's life: bench/runs
RUN_INSIDE = ("bench.runs.checkpoint", "bench.runs.folders", "bench.runs.locks", "bench.runs.lifecycle")


def outside_run_package(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside ``bench/runs`` that import its checkpoint, folder, lock or lifecycle code (they go through
    ``bench.runs.run``: the ``Run`` an engine enters, and what a command may ask of a run folder)."""
    return sorted(f"{m} -> {d}" for m, deps in graph.items() if not m.startswith("bench.runs")
                  for d in deps if d in RUN_INSIDE)


def test_checkpoint_folder_and_lock_code_is_reached_through_the_run_only():
    found = outside_run_package(import_graph("bench"))
    assert not found, "checkpoint / folder / lock code imported outside bench/runs:\n" + "\n".join(found)


def test_the_run_package_rule_sees_a_lazy_import(tmp_path, monkeypatch):
    """The rule above, on a tree where an engine imports the checkpoint module inside a function."""
    for d in ("bench", "bench/runs", "bench/engines"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "__init__.py").write_text("")
    for name in ("checkpoint", "run"):
        (tmp_path / "bench" / "runs" / f"{name}.py").write_text("")
    (tmp_path / "bench" / "engines" / "loop.py").write_text("def f():\n    from bench.runs import checkpoint\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert outside_run_package(import_graph("bench")) == ["bench.engines.loop -> bench.runs.checkpoint"]
    (tmp_path / "bench" / "engines" / "loop.py").write_text("from bench.runs.run import Run\n")
    assert outside_run_package(import_graph("bench")) == []


def test_the_engines_hold_only_their_step_and_adapter():
    """No engine folder holds run-life code: nothing in ``bench/engines`` defines checkpoint writing, folder claims
    or locks (they are ``bench/runs``')."""
    words = ("def save_final", "def claim_run_folder", "FileLock(", "def latest(", "def open_run")
    found = [f"{f.relative_to(ROOT)}: {w}" for f in sorted((ROOT / "bench" / "engines").rglob("*.py"))
             for w in words if w in f.read_text()]
    assert not found, found


# ------------------------------------------------------------------ the documented layout is the tree
def documented_layout(text: str) -> set[str]:
    """Paths listed in the code block under "## Layout" of docs/ARCHITECTURE.md: one entry per line, indented two
    spaces per level, a name ending in ``/`` is a folder."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    stack: list[str] = []
    out = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        stack = stack[:depth] + [name]
        out.add("".join(stack).rstrip("/"))
    return out


def actual_layout() -> set[str]:
    out = set()
    for package in ("algorithms", "evaluators", "reports", "bench", "examples"):
        out.add(package)
        for f in (ROOT / package).rglob("*"):
            rel = f.relative_to(ROOT)
            if "__pycache__" in rel.parts or f.name in ("__init__.py", "__main__.py"):
                continue
            if "assets" in rel.parts[:-1]:  # the shipped model's files: the folder is listed, not each file
                continue
            if f.is_dir() or f.suffix == ".py":
                out.add(rel.as_posix())
    return out


def test_the_layout_parser_reads_nesting():
    text = "## Layout\n```\na/   x\n  b/   y\n    c.py  z\n  d.py  w\n```\n"
    assert documented_layout(text) == {"a", "a/b", "a/b/c.py", "a/d.py"}


def test_architecture_doc_lists_exactly_the_modules_there_are():
    documented = documented_layout((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    actual = actual_layout()
    assert not actual - documented, f"modules missing from docs/ARCHITECTURE.md's layout: {sorted(actual - documented)}"
    assert not documented - actual, f"docs/ARCHITECTURE.md lists what is not there: {sorted(documented - actual)}"


def test_no_module_over_500_lines():
    long = {f.relative_to(ROOT).as_posix(): n for package in (*LOWER, "bench", "perf")
            for f in (ROOT / package).rglob("*.py") if (n := len(f.read_text().splitlines())) > 500}
    assert not long, f"split these modules (no file over 500 lines): {long}"


def test_a_command_that_needs_no_store_does_not_import_mlflow():
    """MLflow's import is about 2 CPU-seconds of a command's ~5 (issue 30, the suite's and a user's cost): `bench
    list`, `bench --help` and a command refused on its input before any work never import it (a module importing
    MLflow at its top on these paths fails this; ``reports.record.mlflow_error`` gives its exception class lazily)."""
    import subprocess

    code = ("import contextlib, io, sys\nfrom bench.cli.main import main\n"
            "for argv in (['list'], ['train', '--algo', 'nosuch'], ['run', '--algos', 'nosuch'],"
            " ['tune', '--algo', 'grpo', '--trials', '0'], ['report', '--help'], ['compare', '--help']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        with contextlib.suppress(SystemExit):\n"
            "            main(argv)\n"
            "print(sorted(m for m in sys.modules if m == 'mlflow' or m.startswith('mlflow.')))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-3000:]
