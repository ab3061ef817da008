"""The testbed's selection criteria (docs/TESTBED.md) on one candidate's comparison: grpo and the positive controls on
seeds 0-4. Reads MLflow only; prints each criterion with its numbers and whether it is met. Usage:

    python examples/testbed/choose.py --experiment testbed-selection [--comparison ID] [--tracking-uri URI]
        [--cpu-seconds S] [--runs N]

``--cpu-seconds``: the CPU time the candidate's `bench run` took (user + sys, e.g. from ``/usr/bin/time``) and
``--runs`` the runs it trained, for the cost criterion (projected to the preset's 25 runs).
"""

from __future__ import annotations

import argparse

import numpy as np

from reports import stats
from reports.derived import KEY_ENTROPY, relative_change
from reports.load import load_comparison
from reports.report import analyse

BASELINE = "grpo"
PRESET_RUNS = 25          # grpo, dapo, tepo and two controls x 5 seeds
BUDGET = 2 * 30 * 60 * 0.9  # CPU-seconds: 90% of two free cores for 30 minutes


def criteria(experiment: str, comparison: str | None, tracking_uri: str | None, cpu_seconds: float | None,
             runs: int | None) -> list[tuple[str, bool | None, str]]:
    cmp = load_comparison(experiment, comparison, tracking_uri)
    a = analyse(cmp, baseline=BASELINE)
    base = {s: d for s, d in a.groups[BASELINE]}
    out = []
    start = [d.initial_acc for d in base.values()]
    final = [d.final_acc for d in base.values()]
    ok = all(0.10 <= x <= 0.60 for x in start) and max(final) < 0.90
    out.append(("1 headroom", ok, f"step-0 accuracy {min(start):.1%}-{max(start):.1%}; grpo final "
                                  f"{min(final):.1%}-{max(final):.1%}"))
    gains = [d.final_acc - d.initial_acc for d in base.values()]
    m, h = stats.mean_ci(gains)
    out.append(("2 the baseline learns", m - h > 0, f"grpo gain {100 * m:+.1f} ± {100 * h:.1f} points"))
    changes = [relative_change(r.series.get(KEY_ENTROPY, []), 5) for r in cmp.runs if r.variant == BASELINE]
    m, h = stats.mean_ci([c for c in changes if c is not None])
    out.append(("3 the baseline's entropy moves", abs(m) >= 0.10 and (m - h > 0 or m + h < 0),
                f"grpo entropy change {m:+.1%} ± {h:.1%} (per seed: {', '.join(f'{c:+.1%}' for c in changes)})"))
    ctrl = a.tables.get("controls")
    if ctrl is None:
        out.append(("4 the controls are detected", False, "no control in the comparison"))
    else:
        rows = ctrl.csv_rows
        text = "; ".join(f"{r[0]}: diff {100 * r[4]:+.1f} points, Holm p {r[8]:.2g}, {r[9]}" for r in rows)
        out.append(("4 the controls are detected", all(r[9] == "detected" for r in rows), text))
    if cpu_seconds and runs:
        projected = cpu_seconds / runs * PRESET_RUNS
        out.append(("5 cost", projected <= BUDGET, f"{cpu_seconds:.0f} CPU-s for {runs} runs -> {projected:.0f} CPU-s "
                                                   f"for {PRESET_RUNS} (budget {BUDGET:.0f})"))
    else:
        out.append(("5 cost", None, "give --cpu-seconds and --runs"))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="testbed-selection")
    p.add_argument("--comparison")
    p.add_argument("--tracking-uri")
    p.add_argument("--cpu-seconds", type=float)
    p.add_argument("--runs", type=int)
    args = p.parse_args()
    rows = criteria(args.experiment, args.comparison, args.tracking_uri, args.cpu_seconds, args.runs)
    for name, ok, text in rows:
        print(f"{name:<32} {'met' if ok else 'NOT met' if ok is False else '?':<8} {text}")
    met = all(ok for _, ok, _ in rows)
    print("all criteria met" if met else "not every criterion is met")
    return 0 if met else 1


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
