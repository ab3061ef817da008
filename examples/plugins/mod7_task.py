"""Example plugin: a task of your own, with its own data and its own verifier (docs/PLUGINS.md).

    bench run --plugin examples/plugins/mod7_task.py --task mod7 --algos grpo --seeds 0

``mod7`` asks for a remainder modulo 7; its problems are the JSONL files next to this one (``mod7/train.jsonl``,
``mod7/test.jsonl``: ``question`` and ``answer`` per line; ``--data`` / ``--eval-data`` give others), and its
verifier accepts any final integer congruent to the answer (``10`` for ``3``), which the built-in one would not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from evaluators import Benchmark, register_task
from evaluators.tasks import Problem

HERE = Path(__file__).resolve().parent / "mod7"


@dataclass(frozen=True)
class Mod7(Benchmark):
    def reward(self, completion: str, problem: Problem) -> float:
        """1.0 when the completion's last integer is congruent to the answer modulo 7."""
        numbers = re.findall(r"-?\d+", completion)
        return 1.0 if numbers and (int(numbers[-1]) - int(problem.answer)) % 7 == 0 else 0.0


register_task(Mod7("mod7", "1.0", "integer", "Remainders modulo 7 (example plugin: own data, own verifier)",
                   hub_id="", hub_splits=(("train", "train"), ("test", "test")), data_dir=str(HERE)))
