"""The report's "claims" section: a seed paper's headline claims put to the test on this comparison's runs.

For an objective whose paper states claims against named references (``CLAIMS``: TEPO, arXiv 2604.12736, against
GRPO and DAPO), each claim present in the comparison gets one verdict per reference, read off one interval over the
seeds both ran (paired by seed, so the data order and the starting policy cancel):

- convergence, "reduces convergence time by 50%": the per-seed ratio of times to convergence (TEPO / reference, in
  the load-independent cost unit the convergence table uses), summarised by its geometric mean with a Student-t
  interval of the log ratios. *Supported*: the interval lies below 1 (faster) and reaches 0.5 (a halving is
  compatible); *contradicted*: it lies above 0.5 (a halving is ruled out; it may still be faster, said in the text);
  else *not resolved*, with the seeds a paired test would need to tell a halving from no change at the observed spread.
  A seed where either run never reached the target leaves the ratio undefined: such seeds are counted and left out.
- stability, "less entropy collapse": the relative change of the mean rollout entropy over training (the mean of the
  last ``ENTROPY_WINDOW`` logged steps over the mean of the first, minus 1: each run's ``RunDerived.entropy_change``),
  TEPO − reference: *supported* above 0 (TEPO's entropy falls less), *contradicted* below 0.
- stability, "smaller accuracy drawdown": reference − TEPO largest fall of held-out accuracy below an earlier peak:
  *supported* above 0, *contradicted* below 0.
- final accuracy, "outperforms": TEPO − reference final held-out accuracy: *supported* above 0, *contradicted*
  below 0.

Every interval is Bonferroni-corrected over the rows of the table (each at 1 − 0.05 / rows), so the verdicts hold
together at 95%. "Not resolved with N seeds (would need M)": M is the number of seeds a paired t-test at the same
level needs for 80% power, taking the observed SD of the per-seed differences as the truth and, as the effect, the
claimed one (log 0.5 for the 50% claim) or else the observed mean difference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from reports import stats
from reports.derived import ENTROPY_WINDOW, RunDerived
from reports.tables import Table, Units, fmt

SUPPORTED, CONTRADICTED, UNRESOLVED = "supported", "contradicted", "not resolved"


@dataclass(frozen=True)
class Claim:
    key: str
    label: str         # the claim in a few words (the table's first column)
    text: str          # the paper's words (the caption quotes them)
    measure: str       # what is compared, in the table's words


@dataclass(frozen=True)
class PaperClaims:
    objective: str
    source: str
    references: tuple[str, ...]
    claims: tuple[Claim, ...]


CLAIMS: dict[str, PaperClaims] = {"tepo": PaperClaims(
    "tepo", "arXiv 2604.12736 (abstract)", ("grpo", "dapo"), (
        Claim("convergence", "50% faster convergence", "reduces convergence time by 50% compared with GRPO/DAPO",
              "time to convergence ratio"),
        Claim("entropy", "less entropy collapse",
              "avoids the entropy collapse of undifferentiated entropy regularisation",
              "entropy change, difference"),
        Claim("drawdown", "more stable training", "markedly enhances training stability",
              "drawdown, reference − TEPO"),
        Claim("final", "higher final accuracy", "state-of-the-art accuracy (outperforms GRPO/DAPO)",
              "final accuracy, difference"),
    ))}


@dataclass
class Verdict:
    claim: Claim
    reference: str
    n: int                      # seeds used
    estimate: float | None      # the mean difference, or the geometric-mean ratio for convergence
    low: float | None
    high: float | None
    verdict: str
    seeds_needed: int | None = None
    why: str = ""


def _t_interval(x: np.ndarray, level: float) -> tuple[float, float, float] | None:
    """(mean, low, high) of the Student-t interval of the mean at ``level``; None with < 2 values."""
    if len(x) < 2:
        return None
    from scipy import stats as st

    m, sd = float(x.mean()), float(x.std(ddof=1))
    h = float(st.t.ppf(0.5 + level / 2, len(x) - 1) * sd / math.sqrt(len(x)))
    return m, m - h, m + h


def seeds_needed(effect: float, sd: float, alpha: float) -> int | None:
    """Seeds a two-sided paired t-test at ``alpha`` needs for 80% power when the per-seed differences have mean
    ``effect`` and SD ``sd`` (``stats.paired_power``); None when sd is 0; MAX_SEEDS + 1 beyond that many."""
    if sd <= 1e-12:
        return None
    if abs(effect) <= 1e-12:
        return stats.MAX_SEEDS + 1
    k = 2
    while stats.paired_power(abs(effect) / sd, k, alpha) < stats.POWER:
        k = k + 1 if k < 64 else int(k * 1.25)
        if k > stats.MAX_SEEDS:
            return stats.MAX_SEEDS + 1
    return k


def _judge(claim: Claim, ref: str, diffs: np.ndarray, level: float, *, ratio: bool, dropped: int) -> Verdict:
    alpha = 1 - level
    why = f"{dropped} seed(s) left out: a run did not reach the target" if dropped else ""
    ci = _t_interval(diffs, level)
    if ci is None:
        return Verdict(claim, ref, len(diffs), None, None, None, UNRESOLVED,
                       why=(why + "; " if why else "") + "fewer than 2 seeds to compare")
    m, lo, hi = ci
    sd = float(diffs.std(ddof=1))
    if ratio:  # log ratios: the claim is a halving
        est, lo_r, hi_r = math.exp(m), math.exp(lo), math.exp(hi)
        if hi_r < 1 and lo_r <= 0.5:
            v = SUPPORTED
        elif lo_r > 0.5:
            v = CONTRADICTED
        else:
            v = UNRESOLVED
        need = seeds_needed(math.log(0.5), sd, alpha) if v == UNRESOLVED else None
        return Verdict(claim, ref, len(diffs), est, lo_r, hi_r, v, need, why)
    v = SUPPORTED if lo > 0 else CONTRADICTED if hi < 0 else UNRESOLVED
    need = seeds_needed(m, sd, alpha) if v == UNRESOLVED else None
    return Verdict(claim, ref, len(diffs), m, lo, hi, v, need, why)


def claim_verdicts(groups: Mapping[str, Sequence[tuple[int, RunDerived]]],
                   ttc: Mapping[str, Mapping[int, float | None]]) -> list[Verdict]:
    """The verdicts of every paper in ``CLAIMS`` whose objective and at least one reference are in ``groups``.

    ``ttc``: objective -> seed -> its time to convergence in the report's cost unit (None: not reached)."""
    todo = []
    for paper in CLAIMS.values():
        if paper.objective not in groups:
            continue
        for ref in paper.references:
            if ref in groups:
                todo += [(paper.objective, ref, c) for c in paper.claims]
    if not todo:
        return []
    level = 1 - stats.ALPHA / len(todo)
    by_seed = {o: dict(rs) for o, rs in groups.items()}
    out = []
    for obj, ref, claim in todo:
        seeds = sorted(set(by_seed[obj]) & set(by_seed[ref]))
        a, b = by_seed[obj], by_seed[ref]
        dropped = 0
        if claim.key == "convergence":
            pairs = [(ttc[obj].get(s), ttc[ref].get(s)) for s in seeds]
            ok = [(x, y) for x, y in pairs if x and y and x > 0 and y > 0]
            dropped = len(pairs) - len(ok)
            diffs = np.array([math.log(x / y) for x, y in ok])
        elif claim.key == "entropy":
            diffs = np.array([a[s].entropy_change - b[s].entropy_change for s in seeds
                              if a[s].entropy_change is not None and b[s].entropy_change is not None])
        elif claim.key == "drawdown":
            diffs = np.array([b[s].acc_drawdown - a[s].acc_drawdown for s in seeds
                              if a[s].acc_drawdown is not None and b[s].acc_drawdown is not None])
        else:
            diffs = np.array([a[s].final_acc - b[s].final_acc for s in seeds
                              if a[s].final_acc is not None and b[s].final_acc is not None])
        v = _judge(claim, ref, diffs, level, ratio=claim.key == "convergence", dropped=dropped)
        if claim.key == "convergence" and v.verdict == CONTRADICTED and v.high is not None and v.high < 1:
            v.why = (v.why + "; " if v.why else "") + (f"faster, by {1 - v.high:.0%} to {1 - v.low:.0%}, "
                                                       "not by half")
        out.append(v)
    return out


def claims_table(verdicts: list[Verdict], units: Units, cost_unit: str) -> Table:
    rows, csv_rows = [], []
    for v in verdicts:
        if v.claim.key == "convergence":
            est = lambda x: fmt(x, 2)  # noqa: E731
        elif v.claim.key == "entropy":
            est = lambda x: fmt(x, 3, sign=True)  # noqa: E731
        else:
            est = units.diff
        interval = "n/a" if v.low is None else f"[{est(v.low)}, {est(v.high)}]"
        verdict = v.verdict
        if v.verdict == UNRESOLVED and v.estimate is not None:
            need = "n/a" if v.seeds_needed is None else (f"> {stats.MAX_SEEDS:,}" if v.seeds_needed > stats.MAX_SEEDS
                                                         else str(v.seeds_needed))
            verdict = (f"not resolved with {v.n} seeds (would need {need})" if v.seeds_needed is None
                       or v.seeds_needed > v.n else f"not resolved with {v.n} seeds (at the edge of what {v.n} "
                       "seeds detect)")
        rows.append([v.claim.label, v.reference, v.claim.measure, str(v.n),
                     "n/a" if v.estimate is None else est(v.estimate), interval,
                     verdict + (f" ({v.why})" if v.why else "")])
        csv_rows.append([v.claim.key, v.claim.text, v.reference, v.n, v.estimate, v.low, v.high, v.verdict,
                         v.seeds_needed, v.why])
    m = len(verdicts)
    quoted = "; ".join(f"{c.label}: “{c.text}”" for c in dict.fromkeys(v.claim for v in verdicts))
    caption = (f"The seed paper's claims (TEPO, {CLAIMS['tepo'].source}: {quoted}) on this comparison's runs, paired "
               f"by seed; difference = TEPO − reference. "
               f"Time to convergence in {cost_unit}; ratio = TEPO / reference, geometric mean over seeds with a "
               f"Student-t interval of the log ratios; supported when the interval lies below 1 and reaches 0.5, "
               f"contradicted when it lies above 0.5. Entropy change = mean rollout entropy of the last "
               f"{ENTROPY_WINDOW} logged steps / the first {ENTROPY_WINDOW}, − 1 (a fraction). Drawdown and accuracy "
               f"in {units.diff_unit}. "
               f"Other rows: supported when the interval lies above 0, contradicted below 0. Each interval at "
               f"{1 - stats.ALPHA / max(m, 1):.2%} (Bonferroni over the {m} rows: 95% for the table as a whole). Would "
               "need: seeds for 80% power at that level, at the observed SD, for the claimed halving or the observed "
               "difference.")
    return Table("claims", "The seed paper's claims", caption,
                 ["claim", "against", "measure", "n", "estimate", "interval", "verdict"], rows,
                 ["claim", "text", "reference", "n", "estimate", "low", "high", "verdict", "seeds_needed", "note"],
                 csv_rows)
