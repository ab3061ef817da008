"""Benchmarks, answer verification and metrics for math reasoning.

`get_benchmark(name)` returns a versioned benchmark definition whose ``load()`` gives `Problem` rows from a local
file / folder or the Hugging Face hub and whose ``reward()`` is the verifier (`evaluators.verify.is_correct`), used
both as benchmark score and as training reward. See docs/EVALUATORS.md.
"""

from evaluators.benchmarks import Benchmark, get_benchmark, list_benchmarks
from evaluators.sources import BadRowError
from evaluators.tasks import Problem

__all__ = ["BadRowError", "Benchmark", "Problem", "get_benchmark", "list_benchmarks"]
