"""Answer extraction and verification: real formats, hand-made wrong answers, and the thread-safe timeout."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from evaluators.verify import MathVerifyPool, answer_key, answers_match, extract_answer, is_correct, last_boxed


@pytest.mark.parametrize("completion, kind, expected", [
    ("She makes 9 * 2 = $18 every day.\n#### 18", "number", "18"),
    ("#### 1,000", "number", "1000"),
    ("#### Step 1: add\n3 + 15 = 18\n#### Answer\nSo the answer is \\boxed{18}.", "number", "18"),  # headings
    ("#### Answer: 18", "number", "18"),
    ("#### $1,250.00", "number", "1250"),
    ("The answer is 18 dollars.", "number", "18"),
    ("so the total is \\boxed{\\$18.00}", "number", "18"),
    ("It is 25%.", "number", "25"),
    ("5-3=2", "number", "2"),
    ("He owes -5, so the answer is -5.", "number", "-5"),
    ("Answer: 3/4", "number", "0.75"),
    ("27.0", "integer", "27"),
    ("The final answer is 033", "integer", "33"),
    ("so $\\boxed{204}$ minutes", "integer", "204"),
    ("\\boxed 5", "integer", "5"),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "latex", "\\frac{\\sqrt{2}}{2}"),
    ("first \\boxed{1} then \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.", "latex",
     "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("$\\framebox{204}$ minutes", "latex", "204"),
    ("The final answer is $2^{1009}$. I hope it is correct.", "latex", "2^{1009}"),
    ("The final answer is 1,3,5.", "latex", "1,3,5"),
    ("$64,\\frac{1}{4}$", "latex", "64,\\frac{1}{4}"),
])
def test_extract_answer_real_formats(completion, kind, expected):
    assert extract_answer(completion, kind) == expected


@pytest.mark.parametrize("completion, kind", [
    ("", "number"), ("   ", "latex"), ("I think we should compute the sum first.", "latex"),
    ("Let me think about it.", "number"), ("We get \\boxed{", "latex"),
])
def test_no_final_answer_is_none(completion, kind):
    assert extract_answer(completion, kind) is None
    assert not is_correct(completion, "18", kind)


def test_last_boxed_nested_and_several():
    assert last_boxed("\\boxed{a} and \\boxed{\\frac{1}{\\sqrt{3}}}") == "\\frac{1}{\\sqrt{3}}"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("no box") is None


@pytest.mark.parametrize("completion, reference, kind", [
    ("#### 18", "18", "number"), ("The answer is $18.00.", "18", "number"), ("#### 1,000", "1000", "number"),
    ("\\boxed{27}", "27", "integer"), ("27.0", "27", "integer"), ("\\boxed{025}", "25", "integer"),
    ("\\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}", "latex"),
    ("\\boxed{14/3}", "\\frac{14}{3}", "latex"),  # needs math-verify
    ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", "latex"),  # needs math-verify
    ("The final answer is $\\frac14, 64$.", "64, \\frac{1}{4}", "latex"),  # sets in any order
    ("\\boxed{0.5}", "\\frac{1}{2}", "latex"),
])
def test_correct_answers(completion, reference, kind):
    assert is_correct(completion, reference, kind)


@pytest.mark.parametrize("completion, reference, kind", [
    ("#### 19", "18", "number"), ("#### 17", "18", "number"), ("The answer is 1,001.", "1000", "number"),
    ("\\boxed{28}", "27", "integer"), ("\\boxed{26}", "27", "integer"),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", "latex"), ("\\boxed{\\frac{14}{5}}", "\\frac{14}{3}", "latex"),
    ("\\boxed{(3, \\pi)}", "\\left( 3, \\frac{\\pi}{2} \\right)", "latex"),
    ("\\boxed{2^{1008}}", "2^{1009}", "latex"), ("\\boxed{1,3}", "1,3,5", "latex"),
])
def test_wrong_answers(completion, reference, kind):
    assert not is_correct(completion, reference, kind)


def test_answer_key_groups_equal_numbers():
    assert answer_key("18.0", "number") == answer_key("18", "number")
    assert answer_key("\\dfrac{1}{2}", "latex") == answer_key("\\frac{1}{2}", "latex")
    assert answer_key(None, "latex") is None


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="valid: number, integer, latex"):
        extract_answer("#### 1", "float")


def test_number_comparison_does_not_start_a_process(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("math-verify pool used for a plain number comparison")

    monkeypatch.setattr("evaluators.verify._math_verify_equal", boom)
    assert is_correct("#### 1,000", "1000", "number")
    assert not is_correct("\\boxed{12}", "13", "integer")
    assert is_correct("\\boxed{\\frac{1}{2}}", "0.5", "latex")
    assert not is_correct("#### lots of them", "18", "number")  # garbage from a weak policy: no round trip
    assert not is_correct("\\boxed{many}", "18", "integer")


PATHOLOGICAL = "9^{9^{9^{9^{9}}}}"


def test_timeout_fires_in_a_worker_thread():
    """math-verify's own SIGALRM timeout cannot run outside the main thread; ours must, and the process survives."""
    pool = MathVerifyPool(max_workers=1)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            pool.compare("1", "1", 60.0)  # start the child first so the deadline measures the comparison only
            start = time.monotonic()
            result = ex.submit(pool.compare, "1", PATHOLOGICAL, 1.0).result(timeout=60)
            elapsed = time.monotonic() - start
        assert result is None, "a pathological comparison should time out"
        assert elapsed < 10, f"the deadline was not enforced ({elapsed:.1f}s)"
        assert pool.timeouts == 1
        assert pool.compare("\\frac{1}{2}", "0.5", 60.0) is True  # a fresh child replaces the killed one
    finally:
        pool.close()


def test_is_correct_in_threads_and_timeout_counts_as_wrong():
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        futures = [ex.submit(is_correct, f"\\boxed{{{c}}}", r, "latex", 2.0) for c, r in
                   [("14/3", "\\frac{14}{3}"), ("(3, \\pi/2)", "(3, \\frac{\\pi}{2})"), (PATHOLOGICAL, "1"),
                    ("x+1", "1+x")]]
        results = [f.result(timeout=120) for f in futures]
    assert results == [True, True, False, True]
    assert answers_match("2", "2", "latex")


def _check_in_child(args):
    completion, reference = args
    return is_correct(completion, reference, "latex", 2.0)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_is_correct_in_worker_processes(method):
    import multiprocessing

    is_correct("\\boxed{14/3}", "\\frac{14}{3}", "latex")  # the parent's pool exists before the fork
    with multiprocessing.get_context(method).Pool(2) as workers:
        results = workers.map(_check_in_child, [("\\boxed{14/3}", "\\frac{14}{3}"), (f"\\boxed{{{PATHOLOGICAL}}}", "1"),
                                                 ("\\boxed{x+1}", "1+x"), ("\\boxed{x+2}", "1+x")])
    assert results == [True, False, True, False]
