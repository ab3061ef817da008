"""What a trial of `bench tune` is scored by (``--metric``, ``--direction``), and a seed's score from its curve.

- ``eval/accuracy`` (any eval key): the value at the end of training, mean over seeds, maximised;
- ``steps_to:eval/accuracy>=0.5`` / ``seconds_to:eval/accuracy>=0.5``: training steps (or wall-clock seconds of
  training) until the held-out metric first reaches the threshold, mean over seeds, minimised; a seed that never gets
  there counts as twice the budget.

Named ``TuneMetric``: ``evaluators.metrics.Metric`` is a different thing (a mean with its confidence interval).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bench.tune.space import NUMBER
from reports import metric_keys as K


@dataclass(frozen=True)
class TuneMetric:
    """What a trial is scored by: ``eval/KEY`` at the end, or steps/seconds until ``eval/KEY >= threshold``."""

    key: str
    kind: str = "final"            # final | steps_to | seconds_to
    threshold: float | None = None
    direction: str = "maximize"

    @property
    def spec(self) -> str:
        return self.key if self.kind == "final" else f"{self.kind}:{self.key}>={self.threshold:g}"

    def intermediate(self, value: float) -> float:
        """The value reported to the pruner for an eval metric value (better = the study's direction)."""
        return -value if self.kind != "final" and self.direction == "minimize" else value


def parse_metric(text: str, direction: str | None = None) -> TuneMetric:
    m = re.fullmatch(rf"\s*(?:(?P<kind>steps_to|seconds_to):)?(?P<key>[\w/.\-]+)\s*(?:>=\s*(?P<thr>{NUMBER}))?\s*",
                     text or "")
    if not m or not m["key"].startswith("eval/"):
        raise ValueError(f"--metric {text!r}: expected an eval key (eval/accuracy), steps_to:eval/KEY>=X or "
                         f"seconds_to:eval/KEY>=X")
    kind = m["kind"] or "final"
    if (kind == "final") != (m["thr"] is None):
        raise ValueError(f"--metric {text!r}: a threshold (>=X) goes with steps_to:/seconds_to: and only with them")
    if direction not in (None, "maximize", "minimize"):
        raise ValueError(f"--direction {direction!r}: valid: maximize, minimize")
    default = "maximize" if kind == "final" else "minimize"
    return TuneMetric(m["key"], kind, float(m["thr"]) if m["thr"] else None, direction or default)


def check_reported(metric: TuneMetric, cfg) -> None:
    """``--metric`` refused in one line, before any study or run is created, when the held-out evaluation of ``cfg``
    does not report its key (held-out round 8: it was found after trial 0 had trained, with Optuna's traceback, the
    study's run left RUNNING and the study stored with the bad metric, refusing the corrected command)."""
    from evaluators.benchmarks import get_task

    name = cfg.eval_task or cfg.task
    try:
        name = get_task(name, difficulty=cfg.difficulty).name
    except Exception:  # (an unknown task is refused by its own check, with its own line)
        pass
    reported = K.held_out_keys(name, cfg.eval_temperature > 0 and cfg.eval_samples > 0, cfg.engine)
    if metric.key not in reported:
        from evaluators.hints import did_you_mean

        raise ValueError(f"--metric {metric.spec}: the held-out evaluation reports no {metric.key!r}"
                         f"{did_you_mean(metric.key, sorted(reported))}; it reports {', '.join(sorted(reported))}")


def trial_value(metric: TuneMetric, curve: dict[int, dict[str, float]], steps: int) -> float:
    """One seed's objective value from its evaluation curve {step: metrics}; ``steps``: the training budget."""
    key = metric.key
    if not curve:
        raise ValueError("training made no held-out evaluation (eval_every=0?): nothing to score a trial by")
    if metric.kind == "final":
        return float(curve[max(curve)][key])
    for step in sorted(curve):
        if curve[step].get(key, -math.inf) >= metric.threshold:
            return float(step if metric.kind == "steps_to" else curve[step][K.ELAPSED_S])
    last = curve[max(curve)]
    return float(2 * steps if metric.kind == "steps_to" else 2 * last[K.ELAPSED_S])
