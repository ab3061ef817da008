"""docs/METRICS.md documents exactly the metric names of ``reports/metric_keys.py`` (and of ``reports.derived``): a name
added, renamed or dropped on one side and not the other fails here."""

from __future__ import annotations

import re
from pathlib import Path

from reports import metric_keys
from reports.derived import STORED

DOC = Path(__file__).resolve().parents[2] / "docs" / "METRICS.md"
# every name of these namespaces is a constant
OWNED = ("rollout/", "train/", "eval/", "time/", "sys/", "perf/", "tune/", "summary/")


def documented(text: str) -> set[str]:
    """The names in the first column of the tables (``<x>`` written as the template field ``{x}``)."""
    out = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            out.update(re.findall(r"`([a-z_]+/[^`]+)`", line.split("|")[1]))
    return {re.sub(r"<(\w+)>", r"{\1}", k) for k in out}


def constants() -> set[str]:
    names = set(metric_keys.names().values()) - {metric_keys.EVAL_TASK}
    return names | {metric_keys.EVAL_TASK.format(task="{task}", metric=m) for m in metric_keys.EVAL_TASK_METRICS}


def test_the_parser_reads_the_first_column_only():
    text = "| key | meaning |\n|---|---|\n| `a/b`, `eval/<task>/x` | see `c/d` |\nnot `e/f`\n"
    assert documented(text) == {"a/b", "eval/{task}/x"}


def test_metrics_md_documents_exactly_the_constants():
    doc, names = documented(DOC.read_text()), constants()
    owned_doc = {k for k in doc if k.startswith(OWNED)}
    owned_names = {k for k in names if k.startswith(OWNED)}
    assert not owned_doc - owned_names, f"documented, no constant: {owned_doc - owned_names}"
    assert not owned_names - owned_doc, f"constants missing from docs/METRICS.md: {owned_names - owned_doc}"
    assert names - owned_names <= doc  # objective/* named here are documented too
    assert {k for k in doc if k.startswith("derived/")} == {f"derived/{d}" for d in STORED}


def test_every_constant_is_namespaced_and_unique():
    values = list(metric_keys.names().values())
    assert len(values) == len(set(values))
    assert all(v.startswith((*OWNED, "objective/")) for v in values)
    assert metric_keys.eval_key("gsm8k", "pass@4") == "eval/gsm8k/pass_at_4"
