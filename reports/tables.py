"""Tables of a comparison, written as Markdown, LaTeX (booktabs) and CSV.

A :class:`Table` holds formatted cells (Markdown and LaTeX) and numeric rows (CSV, always fractions and full
precision). Formatting: accuracies in percent by default (``Units.percent``; fractions as an option), differences of
accuracies in percentage points with a sign, negative numbers with a true minus sign (U+2212; ``$-$`` in LaTeX), the
best value of a column in bold where "best" has a direction (highest accuracy, shortest time). LaTeX: every special
character escaped (``\\ { } $ & # ^ _ ~ %``; ``< > |``, which the default OT1 encoding prints as other glyphs, and
``\\ $`` as math symbols, whose fonts are Type 1 in every TeX installation; ``[ ]`` braced, so a cell never reads as
the optional argument of ``\\\\``), Greek letters and symbols as math, the caption above the table.

Statistics over seeds live in reports/stats.py (``mean_ci`` is re-exported here for the tables' callers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reports.metric_keys import domain
from reports.stats import mean_ci

MINUS = "\u2212"


@dataclass(frozen=True)
class Units:
    """How accuracies are shown, in tables, notes, figures and curves.csv alike: percent (``69.7``, points for
    differences) or fractions (``0.697``). Which metrics are accuracies: ``reports.metric_keys.domain``."""

    percent: bool = True

    @property
    def scale(self) -> float:
        return 100.0 if self.percent else 1.0

    @property
    def acc_digits(self) -> int:
        return 1 if self.percent else 3

    @property
    def unit(self) -> str:
        return "%" if self.percent else "fraction"

    @property
    def diff_unit(self) -> str:
        return "points" if self.percent else "fraction"

    def factor(self, key: str) -> float:
        """What a logged value of metric ``key`` is multiplied by to be shown: the accuracy scale for an accuracy, 1
        for every other metric (shown as logged)."""
        return self.scale if domain(key).accuracy else 1.0

    def unit_of(self, key: str) -> str:
        """The unit metric ``key`` is shown in: ``%`` / ``fraction`` for an accuracy, else "as logged" (its unit is
        in docs/METRICS.md)."""
        return self.unit if domain(key).accuracy else "as logged"

    def acc(self, x: float | None) -> str:
        return fmt(None if x is None else x * self.scale, self.acc_digits)

    def acc_ci(self, m: float | None, h: float | None) -> str:
        return pm(None if m is None else m * self.scale, None if h is None else h * self.scale, self.acc_digits)

    def diff(self, x: float | None) -> str:
        return fmt(None if x is None else x * self.scale, self.acc_digits, sign=True)

    def interval(self, lo: float | None, hi: float | None) -> str:
        if lo is None or hi is None:
            return "n/a"
        return f"[{self.acc(lo)}, {self.acc(hi)}]"


# ---------------------------------------------------------------- paired t-test
@dataclass
class PairedTest:
    n: int
    mean_diff: float | None
    t: float | None
    p: float | None
    note: str = ""


def paired_test(a: dict[int, float], b: dict[int, float]) -> PairedTest:
    """Paired t-test of ``a`` against ``b`` (seed -> value) over their common seeds (``scipy.stats.ttest_rel``)."""
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
def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and not math.isfinite(x))


def fmt(x: float | None, digits: int = 3, sign: bool = False) -> str:
    """A number for a table: ``n/a`` when missing or not finite, a true minus sign, ``+`` when ``sign``."""
    if not _finite(x):
        return "n/a"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        text = str(int(x))
    else:
        text = f"{x:.{digits}f}"
        if float(text) == 0:
            text = text.lstrip("-")
    if text.startswith("-"):
        return MINUS + text[1:]
    return ("+" + text) if sign and float(x) > 0 and float(text) != 0 else text


def pm(m: float | None, h: float | None, digits: int = 3) -> str:
    if not _finite(m):
        return "n/a"
    return fmt(m, digits) if not _finite(h) else f"{fmt(m, digits)} ± {fmt(h, digits)}"


def fmt_mean_ci(values: Sequence[float], digits: int = 3) -> str:
    m, h = mean_ci(values)
    return pm(m, h, digits)


def fmt_p(p: float | None) -> str:
    if not _finite(p):
        return "n/a"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def best_rows(values: Sequence[float | None], direction: str) -> set[int]:
    """Rows holding the best value ("max" | "min") of a column (all of them on a tie; none when < 2 values)."""
    idx = [i for i, v in enumerate(values) if _finite(v)]
    if len(idx) < 2:
        return set()
    vals = [values[i] for i in idx]
    best = max(vals) if direction == "max" else min(vals)
    if all(abs(v - best) <= 1e-12 for v in vals):
        return set()  # every row equal: nothing stands out
    return {i for i in idx if abs(values[i] - best) <= 1e-12}


# ---------------------------------------------------------------- LaTeX escaping
# < > | \ $ as math symbols: their text-mode commands take textcomp's fonts, which many TeX installations have only as
# bitmaps (Type 3 fonts in the PDF); the math fonts are Type 1 everywhere
_LATEX = {"\\": r"$\backslash$", "{": r"\{", "}": r"\}", "$": r"$\$$", "&": r"\&", "#": r"\#", "%": r"\%",
          "_": r"\_", "^": r"\^{}", "~": r"\~{}", "<": r"$<$", ">": r"$>$", "|": r"$|$",
          "[": "{[}", "]": "{]}",  # never read as the optional argument of a preceding \\
          "±": r"$\pm$", "×": r"$\times$", "≥": r"$\geq$", "≤": r"$\leq$", MINUS: "$-$", "·": r"$\cdot$",
          "‖": r"$\|$", "√": r"$\surd$", "—": "---", "–": "--", "…": r"\ldots{}", "≈": r"$\approx$",
          "→": r"$\rightarrow$", "∞": r"$\infty$", "Δ": r"$\Delta$", "Σ": r"$\Sigma$", "Â": r"$\hat{A}$"}
_GREEK = {"α": "alpha", "β": "beta", "γ": "gamma", "δ": "delta", "ε": "epsilon", "η": "eta", "θ": "theta",
          "κ": "kappa", "λ": "lambda", "μ": "mu", "ν": "nu", "π": "pi", "ρ": "rho", "σ": "sigma", "τ": "tau",
          "φ": "phi", "χ": "chi", "ψ": "psi", "ω": "omega"}
_LATEX.update({k: f"$\\{v}$" for k, v in _GREEK.items()})


def latex_escape(text: str) -> str:
    """``text`` as LaTeX source that prints it: specials escaped, symbols and Greek letters as math."""
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


# LaTeX widths (points, \small Computer Modern): the full text width of a two-column venue (7 in, what table* spans)
# and one column of it; a printed character is about 4.6 pt, a column's padding 12 pt (2 \tabcolsep)
PAGE_PT = 504.0
COLUMN_PT = 240.0
CHAR_PT = 4.6
COLSEP_PT = 12.0


def _printed_width(text: str) -> float:
    return CHAR_PT * len(text)


def _header_lines(name: str, rows: list[list[str]], j: int) -> list[str]:
    """A header longer than its column's cells, in two lines broken at the space nearest its middle."""
    longest = max([len(r[j]) for r in rows] or [0])
    if len(name) <= max(10, longest) or " " not in name:
        return [name]
    spaces = [i for i, ch in enumerate(name) if ch == " "]
    cut = min(spaces, key=lambda i: abs(i - len(name) / 2))
    return [name[:cut], name[cut + 1:]]


@dataclass
class Table:
    """One table: a title, a caption, column names, formatted rows (Markdown / LaTeX), numeric rows (CSV) and the
    cells to emphasise (``bold``: (row, column) of a column's best value)."""

    name: str
    title: str
    caption: str
    columns: list[str]
    rows: list[list[str]]
    csv_columns: list[str]
    csv_rows: list[list] = field(default_factory=list)
    bold: set[tuple[int, int]] = field(default_factory=set)
    groups: list[str] = field(default_factory=list)  # a group label per column ("" = none): a header row above
    breaks: tuple[int, ...] = ()  # columns that begin a new stacked LaTeX block when the table is wider than a page

    def emphasise(self, column: int, values: Sequence[float | None], direction: str) -> None:
        """Bold the best value(s) of ``column`` (``values`` in row order)."""
        self.bold |= {(r, column) for r in best_rows(values, direction)}

    def _cell(self, r: int, c: int, text: str, latex: bool) -> str:
        if latex:
            text = latex_escape(text)
            return f"\\textbf{{{text}}}" if (r, c) in self.bold else text
        text = text.replace("|", "/")
        return f"**{text}**" if (r, c) in self.bold and text else text

    def markdown(self) -> str:
        names = [f"{g}: {c}" if g else c for g, c in zip(self.groups or [""] * len(self.columns), self.columns)]
        out = [f"| {' | '.join(names)} |", "|" + "|".join("---" for _ in self.columns) + "|"]
        out += [f"| {' | '.join(self._cell(i, j, c, False) for j, c in enumerate(r))} |"
                for i, r in enumerate(self.rows)]
        return "\n".join(out) + "\n"

    def latex(self) -> str:
        """booktabs, caption above; ``table*`` when wider than a column of a two-column page, and the columns split
        into stacked blocks (each repeating the first column) where one row would be wider than the page: at the
        columns of ``breaks`` (related columns kept together), and wherever a block would still be too wide."""
        widths = [max([_printed_width(line) for line in _header_lines(c, self.rows, j)]
                      + [_printed_width(r[j]) for r in self.rows]) + COLSEP_PT for j, c in enumerate(self.columns)]
        wide = sum(widths) > PAGE_PT
        blocks, current = [], [0]
        for j in range(1, len(self.columns)):
            if len(current) > 1 and (sum(widths[k] for k in current) + widths[j] > PAGE_PT
                                     or (wide and j in self.breaks)):
                blocks.append(current)
                current = [0]
            current.append(j)
        blocks.append(current)
        env = "table*" if max(sum(widths[k] for k in b) for b in blocks) > COLUMN_PT else "table"
        lines = [f"\\begin{{{env}}}[t]", "\\centering", "\\small", f"\\caption{{{latex_escape(self.caption)}}}",
                 f"\\label{{tab:{self.name}}}"]
        for n, cols in enumerate(blocks):
            if n:
                lines.append("\\par\\medskip")
            lines += [f"\\begin{{tabular}}{{l{'r' * (len(cols) - 1)}}}", "\\toprule", *self._group_rows(cols),
                      " & ".join(self._header(j) for j in cols) + " \\\\", "\\midrule"]
            lines += [" & ".join(self._cell(i, j, r[j], True) for j in cols) + " \\\\" for i, r in enumerate(self.rows)]
            lines += ["\\bottomrule", "\\end{tabular}"]
        lines.append(f"\\end{{{env}}}")
        return "\n".join(lines) + "\n"

    def _group_rows(self, cols: list[int]) -> list[str]:
        """The group header row of a block of columns (multicolumn labels, cmidrules under them), or none."""
        if not self.groups or not any(self.groups[j] for j in cols):
            return []
        cells, rules, k = [], [], 0
        while k < len(cols):
            label, span = self.groups[cols[k]], 1
            while k + span < len(cols) and self.groups[cols[k + span]] == label:
                span += 1
            if label:
                cells.append(f"\\multicolumn{{{span}}}{{c}}{{{latex_escape(label)}}}")
                rules.append(f"\\cmidrule(lr){{{k + 1}-{k + span}}}")
            else:
                cells += [""] * span
            k += span
        return [" & ".join(cells) + " \\\\", " ".join(rules)]

    def _header(self, j: int) -> str:
        parts = _header_lines(self.columns[j], self.rows, j)
        if len(parts) == 1:
            return latex_escape(parts[0])
        align = "l" if j == 0 else "r"
        return f"\\begin{{tabular}}[b]{{@{{}}{align}@{{}}}}" + " \\\\ ".join(latex_escape(p) for p in parts) + \
            "\\end{tabular}"

    def csv(self) -> str:
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.csv_columns)
        for r in self.csv_rows:
            w.writerow(["" if not _finite(v) else (repr(float(v)) if isinstance(v, float) else v) for v in r])
        return buf.getvalue()

    def frame(self):
        """The numeric rows as a pandas DataFrame (columns ``csv_columns``; missing values as NaN / None)."""
        import pandas as pd

        return pd.DataFrame([[None if not _finite(v) or v == "" else v for v in r] for r in self.csv_rows],
                            columns=self.csv_columns)

    def write(self, out_dir: Path) -> list[Path]:
        paths = []
        for ext, text in (("md", f"### {self.title}\n\n{self.markdown()}\n{self.caption}\n"),
                          ("tex", self.latex()), ("csv", self.csv())):
            p = out_dir / f"{self.name}.{ext}"
            p.write_text(text)
            paths.append(p)
        return paths
