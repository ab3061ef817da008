"""What a comparison can and cannot support, stated in the report instead of left to the reader.

- ``varies``: a figure or panel is drawn only for a quantity that varies (an all-zero clip panel says nothing);
- ``ranking_note``: fewer than ``MIN_SEEDS_TO_RANK`` seeds, or overlapping 95% intervals of the final held-out
  accuracy, support no ranking of the objectives, and the report says so;
- ``first_evaluation_note``: a convergence target every run meets at its first evaluation does not separate them;
- ``final_acc_interval``: the Wilson interval of one run's final held-out accuracy (a binomial proportion over the
  evaluated problems, correct at 0 and 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from reports.record import GIT_COMMIT, GIT_DIRTY, VERSION

MIN_SEEDS_TO_RANK = 3


def values(runs, key: str) -> list[float]:
    """Every finite value of ``key`` over the runs and steps."""
    return [v for r in runs for _, v in r.series.get(key, []) if v is not None and math.isfinite(v)]


def varies(runs, key: str) -> bool:
    """Some run logged ``key`` and its values are not all equal."""
    vals = values(runs, key)
    return bool(vals) and max(vals) - min(vals) > 1e-12


def constant_reason(runs, key: str) -> str:
    """Why ``key`` is not drawn: never logged, or the constant it stays at."""
    vals = values(runs, key)
    if not vals:
        return f"no run logged `{key}`"
    return f"`{key}` is {vals[0]:g} at every step of every run"


def unresolved(final_by_objective: dict[str, list[float]], mean_ci) -> tuple[str, list[str]] | None:
    """(the objective with the highest mean, the others no ranking separates from it), or None when every other one
    is separated (or there is nothing to rank): all others with fewer than ``MIN_SEEDS_TO_RANK`` seeds, else those
    whose 95% interval overlaps the best one's."""
    if len(final_by_objective) < 2 or any(not v for v in final_by_objective.values()):
        return None
    ci = {o: mean_ci(v) for o, v in final_by_objective.items()}
    best = max(ci, key=lambda o: ci[o][0])
    if min(len(v) for v in final_by_objective.values()) < MIN_SEEDS_TO_RANK:
        return best, [o for o in ci if o != best]
    lo_best = ci[best][0] - (ci[best][1] or 0)
    tied = [o for o in ci if o != best and ci[o][0] + (ci[o][1] or 0) >= lo_best]
    return (best, tied) if tied else None


def ranking_note(final_by_objective: dict[str, list[float]], mean_ci) -> str | None:
    """One sentence when the final accuracies do not support a ranking, else None.

    ``mean_ci(values) -> (mean, half-width | None)`` is the report's interval over seeds."""
    found = unresolved(final_by_objective, mean_ci)
    if found is None:
        return None
    best, tied = found
    n_min = min(len(v) for v in final_by_objective.values())
    if n_min < MIN_SEEDS_TO_RANK:
        return (f"No ranking is supported: {n_min} seed(s) per objective (fewer than {MIN_SEEDS_TO_RANK}) give no "
                f"usable interval over seeds, so differences between objectives may be seed noise; rerun with more "
                f"seeds (--seeds).")
    return (f"No ranking of {best} against {', '.join(tied)} is supported: their 95% intervals of final held-out "
            f"accuracy over seeds overlap.")


def first_evaluation_note(ttc_steps: Sequence[int | None], first_eval_steps: Sequence[int | None],
                          target: float, initial: Sequence[float]) -> str | None:
    """A note when every run reaches the target at its first evaluation after step 0 (or at step 0)."""
    if not ttc_steps or any(t is None for t in ttc_steps):
        return None
    if all(t == 0 for t in ttc_steps):
        return None  # said by the step-0 note
    if all(t is not None and f is not None and t <= f for t, f in zip(ttc_steps, first_eval_steps)):
        start = f" (step-0 accuracy {100 * min(initial):.1f}-{100 * max(initial):.1f}%)" if initial else ""
        return (f"Every run reaches the convergence target {100 * target:.1f}% at its first evaluation{start}: time to "
                f"convergence does not separate the objectives; set a higher target with --target-acc.")
    return None


def final_acc_interval(final_acc: float | None, n_problems: int | None) -> tuple[float | None, float | None]:
    """Wilson 95% interval of a run's final held-out accuracy over ``n_problems`` problems ((None, None) if unknown)."""
    if final_acc is None or not n_problems:
        return None, None
    from evaluators.metrics import wilson_ci

    return wilson_ci(round(final_acc * n_problems), n_problems)


def written_by_note(runs) -> str | None:
    """A note when the comparison's runs were written by more than one pobench version, commit or dirty state (a run
    `bench run` reused from an earlier checkout): which runs, by which."""
    def by(r) -> str:
        dirty = " with uncommitted changes" if r.tags.get(GIT_DIRTY) == "1" else ""
        return (f"pobench {r.tags.get(VERSION, 'unknown')} at commit {r.tags.get(GIT_COMMIT, 'unknown')[:10]}"
                f"{dirty}")

    groups: dict[str, list[str]] = {}
    for r in runs:
        groups.setdefault(by(r), []).append(f"{r.variant} seed {r.seed}")
    if len(groups) < 2:
        return None
    parts = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(groups.items()))
    return (f"The runs were not all written by one identified pobench code ({parts}): a difference between them may "
            "come from the code, not the objective; rerun with --force from one clean checkout to rule that out.")
