"""Tables of a comparison: per-objective summaries over seeds, written as Markdown, LaTeX (booktabs) and CSV.

Statistics: mean over seeds with a 95% Student-t confidence interval (half-width ``t_{0.975, n-1} * s / sqrt(n)``;
none with one seed); a paired t-test of each objective against the baseline on per-seed values over the seeds both
ran (``scipy.stats.ttest_rel``). A quantity that does not exist for some seeds (a target never reached) is never
averaged with made-up values: the table states how many seeds reached it and gives the mean only when all did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def mean_ci(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, 95% CI half-width) of the values; half-width ``None`` with fewer than two values."""
    v = [float(x) for x in values]
    if not v:
        return None, None
    m = float(np.mean(v))
    if len(v) < 2:
        return m, None
    from scipy import stats

    return m, float(stats.t.ppf(0.975, len(v) - 1) * np.std(v, ddof=1) / math.sqrt(len(v)))


@dataclass
class PairedTest:
    n: int
    mean_diff: float | None
    t: float | None
    p: float | None
    note: str = ""


def paired_test(a: dict[int, float], b: dict[int, float]) -> PairedTest:
    """Paired t-test of ``a`` against ``b`` (seed -> value) over their common seeds."""
    seeds = sorted(set(a) & set(b))
    n = len(seeds)
    if n == 0:
        return PairedTest(0, None, None, None, "n/a (no common seed)")
    diffs = [a[s] - b[s] for s in seeds]
    md = float(np.mean(diffs))
    if n < 2:
        return PairedTest(n, md, None, None, "n/a (1 seed)")
    if np.allclose(diffs, diffs[0]):
        return PairedTest(n, md, None, None, "n/a (identical differences across seeds)")
    from scipy import stats

    res = stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds])
    return PairedTest(n, md, float(res.statistic), float(res.pvalue))


# ---------------------------------------------------------------- formatting
def fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{x:.{digits}f}"


def fmt_mean_ci(values: Sequence[float], digits: int = 3) -> str:
    m, h = mean_ci(values)
    if m is None:
        return "n/a"
    return fmt(m, digits) if h is None else f"{fmt(m, digits)} ± {fmt(h, digits)}"


@dataclass
class Table:
    """One table: a title, a caption, column names, formatted rows (for Markdown/LaTeX) and numeric rows (CSV)."""

    name: str
    title: str
    caption: str
    columns: list[str]
    rows: list[list[str]]
    csv_columns: list[str]
    csv_rows: list[list] = field(default_factory=list)

    def markdown(self) -> str:
        out = [f"| {' | '.join(self.columns)} |", "|" + "|".join("---" for _ in self.columns) + "|"]
        out += [f"| {' | '.join(c.replace('|', '/') for c in r)} |" for r in self.rows]
        return "\n".join(out) + "\n"

    def latex(self) -> str:
        def esc(s: str) -> str:
            s = s.replace("\\", "\\textbackslash{}")
            for ch in "_%&#$":
                s = s.replace(ch, "\\" + ch)
            return s.replace("±", "$\\pm$").replace("×", "$\\times$").replace("≥", "$\\geq$")

        spec = "l" + "r" * (len(self.columns) - 1)
        lines = ["\\begin{table}[t]", "\\centering", "\\small", f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
                 " & ".join(esc(c) for c in self.columns) + " \\\\", "\\midrule"]
        lines += [" & ".join(esc(c) for c in r) + " \\\\" for r in self.rows]
        lines += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{esc(self.caption)}}}",
                  f"\\label{{tab:{self.name}}}", "\\end{table}"]
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.csv_columns)
        for r in self.csv_rows:
            w.writerow(["" if v is None or (isinstance(v, float) and not math.isfinite(v)) else
                        (repr(float(v)) if isinstance(v, float) else v) for v in r])
        return buf.getvalue()

    def write(self, out_dir: Path) -> list[Path]:
        paths = []
        for ext, text in (("md", f"### {self.title}\n\n{self.markdown()}\n{self.caption}\n"),
                          ("tex", self.latex()), ("csv", self.csv())):
            p = out_dir / f"{self.name}.{ext}"
            p.write_text(text)
            paths.append(p)
        return paths
