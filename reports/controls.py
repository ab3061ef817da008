"""The report's positive-controls section: did this comparison detect the objectives that are worse by construction?

A positive control (``algorithms``: ``register(..., control_of=BASE)``, e.g. ``ctrl-reversed``, ``ctrl-shuffled``)
is an objective whose credit assignment is broken on purpose, so that it must end below ``BASE``. A comparison that
detects it has shown that its seeds, steps and evaluations can find a difference of that size; one that does not
cannot be trusted to find one, and its report says so first.

Each control is compared with its base (or, when the base is not in the comparison, with the report's baseline: said
in the table) on per-seed final held-out accuracy over the seeds both ran: the mean paired difference (control −
reference, negative = worse, as expected) with its 95% Student-t interval, the standardised effect d_z (mean / SD of
the per-seed differences), the paired t-test (``reports.tables.paired_test``, scipy) and Holm's correction over the
controls of the comparison (a family of its own: the controls' tests do not dilute the real objectives' ones).
Verdict: ``detected`` when the Holm-corrected p < 0.05 and the difference is negative; ``wrong direction`` when it is
significant and positive (the control beat its reference: a bug, or a regime where the reference itself fails);
``not detected`` otherwise; ``not testable`` with fewer than two common seeds or identical differences.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from reports import stats
from reports.record import CONTROL_OF
from reports.tables import Table, Units, fmt, fmt_p, paired_test

DETECTED, WRONG, MISSED, UNTESTABLE = "detected", "wrong direction", "not detected", "not testable"


def control_bases(runs) -> dict[str, str]:
    """variant -> the objective it is a positive control of, from each run's ``pobench.control_of`` tag (runs written
    before the tag existed: the registry's ``control_of``, when the name is registered here)."""
    out: dict[str, str] = {}
    for r in runs:
        base = r.tags.get(CONTROL_OF)
        if not base:
            from algorithms.registry import get_spec

            try:
                base = get_spec(r.objective).control_of
            except ValueError:  # a plugin's objective not loaded here: no tag, nothing known
                base = None
        if base and r.variant == r.objective:  # a control run with overrides is no longer the control as registered
            out[r.variant] = base
    return out


@dataclass
class ControlResult:
    control: str
    reference: str
    reference_is_base: bool      # False: the control's base is not in the comparison; the baseline was used
    n: int
    diff: float | None           # mean of (control − reference) final accuracy over common seeds
    half_width: float | None     # its 95% Student-t half-width
    d_z: float | None            # diff / SD of the per-seed differences
    p: float | None
    p_holm: float | None = None
    verdict: str = UNTESTABLE
    why: str = ""


def control_results(finals: Mapping[str, Mapping[int, float]], bases: Mapping[str, str],
                    baseline: str | None) -> list[ControlResult]:
    """One result per control present in ``finals`` (objective -> {seed: final accuracy}), Holm over the controls."""
    out = []
    for ctrl, base in bases.items():
        if ctrl not in finals:
            continue
        ref = base if base in finals else baseline
        if ref is None or ref not in finals or ref == ctrl:
            out.append(ControlResult(ctrl, ref or "none", False, 0, None, None, None, None,
                                     why=f"neither its base {base} nor a baseline is in the comparison"))
            continue
        test = paired_test(finals[ctrl], finals[ref])
        seeds = sorted(set(finals[ctrl]) & set(finals[ref]))
        diffs = np.array([finals[ctrl][s] - finals[ref][s] for s in seeds])
        _, h = stats.mean_ci(diffs) if len(diffs) else (None, None)
        sd = float(diffs.std(ddof=1)) if len(diffs) > 1 else 0.0
        out.append(ControlResult(ctrl, ref, ref == base, test.n, test.mean_diff, h,
                                 test.mean_diff / sd if sd > 1e-12 and test.mean_diff is not None else None, test.p,
                                 why=test.note))
    for r, p in zip(out, stats.holm([r.p for r in out])):
        r.p_holm = p
        if p is None:
            r.verdict = UNTESTABLE
        elif p < stats.ALPHA and r.diff < 0:
            r.verdict = DETECTED
        elif p < stats.ALPHA:
            r.verdict = WRONG
        else:
            r.verdict = MISSED
    return out


def controls_table(results: list[ControlResult], units: Units) -> Table:
    rows, csv_rows = [], []
    for r in results:
        ci = "n/a" if r.diff is None or r.half_width is None else (
            f"[{units.diff(r.diff - r.half_width)}, {units.diff(r.diff + r.half_width)}]")
        ref = r.reference if r.reference_is_base else f"{r.reference} (baseline; base not run)"
        rows.append([r.control, ref, str(r.n), units.diff(r.diff) if r.diff is not None else "n/a", ci,
                     fmt(r.d_z, 2), r.why or fmt_p(r.p), fmt_p(r.p_holm) if r.p_holm is not None else "n/a",
                     r.verdict])
        csv_rows.append([r.control, r.reference, r.reference_is_base, r.n, r.diff, r.half_width, r.d_z, r.p,
                         r.p_holm, r.verdict, r.why])
    caption = (f"Positive controls: objectives worse than their base by construction (their description: `bench list "
               f"--details NAME`). diff = mean over seeds of (control − reference) final held-out accuracy "
               f"({units.diff_unit}; negative = worse, as expected), with its 95% Student-t interval; d_z = diff / SD "
               "of the per-seed differences; p: paired t-test; p (Holm): corrected over the controls. Detected: "
               "Holm p < 0.05 and diff < 0. A comparison that detects its controls has shown it can find a "
               "difference of that size with these seeds; one that does not cannot.")
    return Table("controls", "Positive controls: could this comparison detect a difference?", caption,
                 ["control", "reference", "n", "diff", "95% CI", "d_z", "p", "p (Holm)", "verdict"], rows,
                 ["control", "reference", "reference_is_base", "n", "mean_diff", "ci95_half_width", "d_z", "p_value",
                  "p_holm", "verdict", "note"], csv_rows)


def controls_note(results: list[ControlResult], units: Units) -> str:
    """The sentence the report opens with: no control, every control detected, or which were not (said first)."""
    if not results:
        return ("No positive control in this comparison (`bench run --controls`, on by default): nothing shows that "
                "it could have detected a difference, so a difference it does not find may simply be too small for "
                "it.")

    def said(r: ControlResult) -> str:
        d = "n/a" if r.diff is None else f"{units.diff(r.diff)} {units.diff_unit}"
        return f"{r.control} ({d} vs {r.reference}, Holm p {fmt_p(r.p_holm) if r.p_holm is not None else 'n/a'})"

    bad = [r for r in results if r.verdict != DETECTED]
    if not bad:
        weakest = min(results, key=lambda r: abs(r.diff))
        return (f"Positive controls: this comparison detected every control: {'; '.join(said(r) for r in results)}. "
                f"It can find a loss of {units.acc(abs(weakest.diff))} {units.diff_unit} in final accuracy with "
                f"these seeds (the smallest control detected).")
    parts = []
    for verdict in (MISSED, WRONG, UNTESTABLE):
        these = [r for r in bad if r.verdict == verdict]
        if these:
            parts.append(f"{verdict}: " + "; ".join(said(r) + (f" [{r.why}]" if r.why else "") for r in these))
    return ("**This comparison did not detect all of its positive controls** (" + "; ".join(parts) + "): it cannot "
            "be trusted to detect a difference of that size, and the absence of a difference below says little.")
