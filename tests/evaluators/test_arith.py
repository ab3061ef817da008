"""The built-in arith task: deterministic streams, train/test disjointness, correct references, the GSM8K reward."""

from __future__ import annotations

import itertools
import re

import pytest

from evaluators.arith import DIFFICULTIES, ArithTask, Difficulty

_SUB_WORDS = ("loses", "sells", "uses")


def _content(question: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Operators and operands read back from the question text alone (not from the generator's internals)."""
    story, closing = question.split(". ")
    assert closing == "How many now?"
    clauses = story.split(", ")
    values = [int(re.search(r"\d+", clauses[0]).group())]
    ops = []
    for c in clauses[1:]:
        verb, number = c.split(" ")
        values.append(int(number))
        ops.append("-" if verb in _SUB_WORDS else "+")
    return tuple(ops), tuple(values)


def _evaluate(ops, values) -> int:
    total = values[0]
    for op, v in zip(ops, values[1:]):
        total = total + v if op == "+" else total - v
    return total


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_train_and_test_never_share_a_problem(difficulty):
    task = ArithTask(difficulty)
    test = {_content(p.question) for p in task.test_set(400)}
    for seed in (0, 1):
        train = {_content(p.question) for p in itertools.islice(task.train_stream(seed), 3000)}
        assert not (train & test)
    assert len(test) == 400  # distinct


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_reference_answers_are_the_arithmetic_of_the_question(difficulty):
    task = ArithTask(difficulty)
    level = DIFFICULTIES[difficulty]
    problems = task.test_set(200) + list(itertools.islice(task.train_stream(3), 200))
    for p in problems:
        ops, values = _content(p.question)
        assert level.min_operands <= len(values) <= level.max_operands
        assert all(1 <= v <= level.max_value for v in values)
        assert level.subtraction or "-" not in ops
        assert p.answer == str(_evaluate(ops, values))
        assert p.solution.endswith(f"#### {p.answer}")
        assert int(p.answer) >= 0
        # every worked step is true arithmetic
        for line in p.solution.splitlines()[:-1]:
            a, op, b, c = re.fullmatch(r"(\d+)([+-])(\d+)=(\d+)", line).groups()
            assert int(c) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    if difficulty <= 3:  # fits the default 48-token completion budget: " " + solution + eos
        assert max(len(p.solution) for p in problems) + 2 <= 48


def test_streams_are_deterministic_and_seeded():
    task = ArithTask(2)
    a = [p.question for p in itertools.islice(task.train_stream(7), 50)]
    b = [p.question for p in itertools.islice(ArithTask(2).train_stream(7), 50)]
    c = [p.question for p in itertools.islice(task.train_stream(8), 50)]
    assert a == b and a != c
    assert [p.question for p in task.test_set(100)] == [p.question for p in ArithTask(2).test_set(300)[:100]]
    assert len({p.id for p in task.test_set(300)}) == 300


def test_a_train_pool_is_its_stream_s_prefix_whatever_was_drawn_before_in_the_process():
    """The pool's problems are kept per (difficulty, seed) for the next run in the process: a shorter, then a longer,
    then another difficulty's or seed's pool each equal a fresh stream's prefix, and a caller's edit of its list
    reaches no other pool."""
    fresh = list(itertools.islice(ArithTask(3).train_stream(11), 300))
    short = ArithTask(3).train_pool(11, 40)
    short.clear()
    assert ArithTask(3).train_pool(11, 300) == fresh
    assert ArithTask(3).train_pool(11, 120) == fresh[:120]
    assert ArithTask(2).train_pool(11, 50) == list(itertools.islice(ArithTask(2).train_stream(11), 50))
    assert ArithTask(3).train_pool(12, 50) == list(itertools.islice(ArithTask(3).train_stream(12), 50))


def test_difficulty_changes_the_problems():
    ops1 = {len(_content(p.question)[1]) for p in ArithTask(1).test_set(100)}
    ops2 = {len(_content(p.question)[1]) for p in ArithTask(2).test_set(100)}
    subs3 = sum("-" in _content(p.question)[0] for p in ArithTask(3).test_set(100))
    assert ops1 == {2} and ops2 == {2, 3, 4} and subs3 > 20


def test_reward_is_the_gsm8k_verifier():
    task = ArithTask(2)
    p = task.test_set(1)[0]
    assert task.reward(" " + p.solution, p) == 1.0
    assert task.reward(f"blah\n#### {int(p.answer) + 1}", p) == 0.0
    assert task.reward(f"#### {int(p.answer):,}", p) == 1.0  # GSM8K-style normalisation (thousands separators)
    assert task.reward("", p) == 0.0


def test_benchmark_interface_and_bad_input(monkeypatch):
    task = ArithTask(1)
    assert (task.name, task.answer_kind) == ("arith", "number")
    assert [p.id for p in task.load("test", limit=5)] == [p.id for p in task.test_set(5)]
    assert len(task.load("train", limit=7)) == 7
    with pytest.raises(ValueError, match="difficulty 9"):
        ArithTask(9)
    with pytest.raises(ValueError, match="split"):
        task.load("validation")
    with pytest.raises(ValueError, match="no `data`"):
        task.load("test", data="x.jsonl")
    # a level with only 81 distinct problems (about 1/5 of them held out) runs out of test problems
    monkeypatch.setitem(DIFFICULTIES, 99, Difficulty(2, 2, 9, False))
    small = ArithTask(99)
    held_out = small.test_set(5)
    with pytest.raises(ValueError, match="fewer than 81"):
        small.test_set(81)
    assert held_out == small.test_set(5)
