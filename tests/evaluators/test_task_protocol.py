"""Every registered task (the generated ``arith`` and each file benchmark) implements the `Task` protocol: isinstance
holds, and each of its methods runs on a tiny input with the one signature callers use."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluators import Task, get_benchmark, get_task, list_benchmarks
from evaluators.arith import ArithTask
from evaluators.verify import KINDS

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
NAMES = list_benchmarks()


def _check_metadata(task: Task, name: str) -> None:
    assert isinstance(task, Task), f"{name}: {type(task).__name__} does not implement evaluators.tasks.Task"
    assert task.name == name
    assert isinstance(task.version, str) and task.version
    assert task.answer_kind in KINDS
    assert isinstance(task.description, str) and task.description
    assert isinstance(task.generated, bool)


def _check_reward(task: Task, problems) -> None:
    for p in problems:
        right = task.reward(f"The final answer is $\\boxed{{{p.answer}}}$.", p)
        assert right == 1.0 and isinstance(right, float), (task.name, p.id, p.answer)
        assert task.reward("I do not know.", p) == 0.0


def test_the_registry_names_generated_and_file_tasks():
    kinds = {name: get_benchmark(name).generated for name in NAMES}
    assert kinds["arith"] is True
    assert [n for n, generated in kinds.items() if not generated] == NAMES[:-1]


@pytest.mark.parametrize("name", [n for n in NAMES if get_benchmark(n).generated])
def test_generated_task_implements_the_protocol(name):
    task = get_benchmark(name)
    _check_metadata(task, name)
    problems = task.load("test", data=None, limit=3, skip_bad_rows=True)  # skip_bad_rows: nothing to skip
    assert len(problems) == 3
    again, source = task.load_rows("test", data=None, limit=3, skip_bad_rows=False)
    assert again == problems and source.source == "generated" and not source.skipped
    pool = task.train_pool(7, 5, data=None, skip_bad_rows=True)
    assert len(pool) == 5 and list(pool) == list(task.train_pool(7, 5)) != list(task.train_pool(8, 5))
    assert not {p.question for p in pool} & {p.question for p in task.load("test", limit=50)}
    _check_reward(task, problems)
    for call in (lambda: task.load("test", data="x.jsonl"), lambda: task.load_rows(data="x.jsonl"),
                 lambda: task.train_pool(0, 3, data="x.jsonl")):
        with pytest.raises(ValueError, match="generated procedurally; it takes no `data` source"):
            call()


@pytest.mark.parametrize("name", [n for n in NAMES if not get_benchmark(n).generated])
def test_file_task_implements_the_protocol(name, tmp_path):
    task = get_benchmark(name)
    _check_metadata(task, name)
    real = DATA / name / "test.jsonl"
    if not real.is_file():
        pytest.skip(f"real data file not found at {real} (../shared/data/{name}/test.jsonl)")
    rows = [line for line in real.read_text().splitlines() if line.strip()][:4]
    tiny = tmp_path / "test.jsonl"
    tiny.write_text("\n".join(rows) + "\n")
    problems = task.load("test", data=tiny, limit=3, skip_bad_rows=False)
    assert len(problems) == 3
    again, source = task.load_rows("test", data=tiny, limit=3, skip_bad_rows=True)
    assert again == problems and source.source == str(tiny) and not source.skipped
    train = tmp_path / "train.jsonl"
    train.write_text(tiny.read_text())
    pool = task.train_pool(3, 1, data=train, skip_bad_rows=False)  # size does not cut a file task's split
    assert sorted(p.id for p in pool) == sorted(p.id for p in task.load("train", data=train))
    assert list(pool) == list(task.train_pool(3, 1, data=train))
    _check_reward(task, problems)


def test_get_task_passes_a_task_only_the_settings_it_takes():
    assert get_task("arith", difficulty=3).difficulty == 3
    assert get_task("gsm8k", difficulty=3) is get_benchmark("gsm8k")
    with pytest.raises(ValueError, match="takes no options"):
        get_benchmark("gsm8k", difficulty=3)
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'"):
        get_task("gsm9k", difficulty=3)


def test_a_task_missing_a_method_fails_the_protocol(monkeypatch):
    assert isinstance(ArithTask(1), Task)
    monkeypatch.delattr(ArithTask, "train_pool")
    assert not isinstance(ArithTask(1), Task)
