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
    never each other nor the package's ``make_engine``; ``types`` and ``scoring`` use no other pobench module."""
    pkg = ROOT / "bench" / "rollout"

    def bench_imports(name: str) -> set[str]:
        return {mod for _, mod in imported_modules((pkg / f"{name}.py").read_text())
                if mod == "bench" or mod.startswith("bench.")}

    for engine in ("hf", "vllm"):
        assert bench_imports(engine) <= {"bench.rollout.types", "bench.rollout.scoring"}, engine
    assert bench_imports("types") == set()
    assert bench_imports("scoring") == set()
