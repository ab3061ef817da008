"""docs/METRICS.md documents exactly the metric names of ``reports/metric_keys.py`` (and of ``reports.derived``): a name
added, renamed or dropped on one side and not the other fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def test_every_key_states_the_values_it_can_take():
    """A key without a declared domain fails here (its band would not stay within its values, an accuracy would not
    be shown in percent); so does a documented objective/ key without one, or a domain for an undocumented one."""
    declared = set(metric_keys.DOMAINS) | set(metric_keys.TEMPLATE_DOMAINS)
    assert set(metric_keys.names().values()) == declared
    doc_objective = {k for k in documented(DOC.read_text()) if k.startswith("objective/")}
    assert doc_objective - {metric_keys.POLICY_LOSS} == set(metric_keys.OBJECTIVE_DOMAINS)


@pytest.mark.parametrize("key,want", [
    ("eval/accuracy", metric_keys.ACCURACY), ("rollout/accuracy", metric_keys.ACCURACY),
    ("eval/gsm8k/pass_at_8", metric_keys.ACCURACY), ("eval/gsm8k/maj_at_8_ci_low", metric_keys.ACCURACY),
    ("eval/gsm8k/problems", metric_keys.NON_NEGATIVE), ("time/eval_gsm8k_seconds", metric_keys.NON_NEGATIVE),
    ("train/kl_ref", metric_keys.NON_NEGATIVE), ("rollout/refill_completions", metric_keys.NON_NEGATIVE),
    ("objective/clip_frac_low", metric_keys.SHARE), ("objective/policy_loss", metric_keys.ANY),
    ("train/loss", metric_keys.ANY), ("some/unknown_key", metric_keys.ANY)])
def test_domain_of_a_key_and_of_a_template(key, want):
    assert metric_keys.domain(key) == want


def test_held_out_keys_are_the_keys_a_held_out_evaluation_reports():
    """``held_out_keys`` (what `bench tune --metric` is checked against before any work) names exactly the ``eval/``
    keys ``bench.evaluate.eval_metrics`` reports, greedy only and with sampling (k = 1, as a training run evaluates)."""
    from bench.evaluate import EvalResult, eval_metrics
    from evaluators.metrics import summarize

    for sampled in (False, True):
        samples = [[True], [False]] if sampled else None
        keys = [["1"], ["2"]] if sampled else None
        res = EvalResult(benchmark="arith", version="1", answer_kind="number", k=1, n_samples=1 if sampled else 0,
                         temperature=1.0, seed=0, metrics=summarize([True, False], samples, keys, 1), rows=[],
                         seconds=0.0)
        reported = {k for k in eval_metrics(res) if k.startswith("eval/")}
        assert metric_keys.held_out_keys("arith", sampled) == reported
