"""Benchmarks, answer verification and metrics for math reasoning.

`get_benchmark(name)` returns a versioned `Task` (a file benchmark or the generated ``arith``) whose ``load()`` gives
`Problem` rows from a local file / folder or the Hugging Face hub (or generates them), whose ``train_pool()`` is a
run's training problems and whose ``reward()`` is the verifier (`evaluators.verify.is_correct`), used both as
benchmark score and as training reward. See docs/EVALUATORS.md.
"""

from evaluators.benchmarks import (
    Benchmark,
    get_benchmark,
    get_task,
    list_benchmarks,
    register_task,
    task_module,
    unregister_task,
)
from evaluators.sources import BadRowError
from evaluators.tasks import Problem, Task

__all__ = ["BadRowError", "Benchmark", "Problem", "Task", "get_benchmark", "get_task", "list_benchmarks",
           "register_task", "task_module", "unregister_task"]
