"""Imports point one way: ``bench`` uses ``algorithms``, ``evaluators`` and ``reports``, never the reverse
(docs/ARCHITECTURE.md, "Imports point one way"). Read from the source with ``ast``, so a lazy import inside a function
counts as much as one at the top of a module."""

from __future__ import annotations

import ast
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


def test_rollout_engines_import_only_the_shared_modules():
    """Inside ``bench/rollout/`` (docs/ARCHITECTURE.md, "Rollout engine"): the engines use ``types`` and ``scoring``,
    never each other nor the package's ``make_sampler``; ``types`` and ``scoring`` use no other pobench module."""
    pkg = ROOT / "bench" / "rollout"

    def bench_imports(name: str) -> set[str]:
        return {mod for _, mod in imported_modules((pkg / f"{name}.py").read_text())
                if mod == "bench" or mod.startswith("bench.")}

    for engine in ("hf", "vllm"):
        assert bench_imports(engine) <= {"bench.rollout.types", "bench.rollout.scoring"}, engine
    assert bench_imports("types") == set()
    assert bench_imports("scoring") == set()


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
    for package in ("algorithms", "evaluators", "reports", "bench"):
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
    assert not long, f"split these modules (issue #9: no file over 500 lines): {long}"
