"""Tables as a venue takes them: every LaTeX special character escaped (checked by compiling with pdflatex and
reading the text back when a TeX engine is installed), percent and a true minus sign, the best value in bold, the
caption above, no table wider than a page; and no "inf" / "None" anywhere in a report."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reports.tables import MINUS, Table, Units, best_rows, fmt, latex_escape
from tests.conftest import fresh_store

SPECIALS = "a\\b{c}d$e&f#g^h_i~j%k<l>m|n"
PREAMBLE = ("\\documentclass{article}\n\\usepackage[textwidth=7in,textheight=9in]{geometry}\n"
            "\\usepackage{booktabs}\n\\begin{document}\n")


def test_every_special_character_is_escaped():
    esc = latex_escape(SPECIALS)
    for raw, want in (("\\", "$\\backslash$"), ("{", "\\{"), ("}", "\\}"), ("$", "$\\$$"), ("&", "\\&"),
                      ("#", "\\#"), ("^", "\\^{}"), ("_", "\\_"), ("~", "\\~{}"), ("%", "\\%"), ("<", "$<$"),
                      (">", "$>$"), ("|", "$|$")):
        assert want in esc, raw
    # nothing special left unescaped: strip the escapes, what remains is letters
    rest = re.sub(r"\$\\backslash\$|\$\\\$\$|\$[<>|]\$|\\[\^~]\{\}|\\[{}&#_%]", "", esc)
    assert rest == "abcdefghijklmn"
    assert latex_escape("−0.5 ± 1 × 2 ≥ 3 μ θ") == "$-$0.5 $\\pm$ 1 $\\times$ 2 $\\geq$ 3 $\\mu$ $\\theta$"


def test_numbers_percent_true_minus_and_best_in_bold():
    u = Units()
    assert u.acc(0.6971) == "69.7" and u.diff(-0.004) == f"{MINUS}0.4" and u.diff(0.012) == "+1.2"
    assert u.diff(-0.0001) == "0.0"                       # no "−0.0"
    assert Units(percent=False).acc(0.6971) == "0.697"
    assert fmt(-1.5, 2) == f"{MINUS}1.50" and fmt(float("inf")) == "n/a" and fmt(None) == "n/a"
    assert best_rows([0.2, 0.5, None, 0.5], "max") == {1, 3} and best_rows([3.0, 1.0], "min") == {1}
    assert best_rows([0.5, 0.5], "max") == set()          # all equal: nothing stands out
    t = Table("t", "T", "cap", ["objective", "acc"], [["a", "60.0"], ["b", "70.0"]], ["objective", "acc"],
              [["a", 0.6], ["b", 0.7]])
    t.emphasise(1, [0.6, 0.7], "max")
    assert "| b | **70.0** |" in t.markdown() and "\\textbf{70.0}" in t.latex() and "\\textbf{60.0}" not in t.latex()
    tex = t.latex()
    assert tex.index("\\caption") < tex.index("\\begin{tabular}")     # caption above the table


def _compile(tmp: Path, body: str) -> str:
    """pdflatex the body; returns its log (the test fails on a LaTeX error)."""
    (tmp / "doc.tex").write_text(PREAMBLE + body + "\n\\end{document}\n")
    res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    return (tmp / "doc.log").read_text(errors="replace")


needs_tex = pytest.mark.skipif(shutil.which("pdflatex") is None,
                               reason="no pdflatex: the escaping is checked by test_every_special_character_is_escaped")


@needs_tex
def test_latex_compiles_and_prints_the_special_characters(tmp_path):
    t = Table("specials", "T", f"caption {SPECIALS} −1 ± 2", ["col " + SPECIALS, "x"], [[SPECIALS, "−3.0"]],
              ["a"], [])
    _compile(tmp_path, t.latex())
    if shutil.which("pdftotext") is None or shutil.which("pdffonts") is None:
        pytest.skip("no pdftotext / pdffonts (poppler-utils) to read the PDF back (the table compiled)")
    text = subprocess.run(["pdftotext", "doc.pdf", "-"], cwd=tmp_path, capture_output=True, text=True).stdout
    # as printed: ^ and ~ are accents (U+02C6, U+02DC), _ a rule pdftotext reads as a space
    assert "a\\b{c}d$e&f#g\u02c6h i\u02dcj%k<l>m|n" in text, text
    assert "¡" not in text and "¿" not in text                         # OT1's stand-ins for < and >
    fonts = subprocess.run(["pdffonts", "doc.pdf"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert "Type 3" not in fonts, fonts                                # no bitmap font pulled in by an escape


@pytest.fixture(scope="module")
def ten_objectives(tmp_path_factory):
    """A report of 10 objectives x 3 seeds (the size of `bench run --ablation tepo`) without figures."""
    from mlflow import MlflowClient

    from reports.report import build_report
    from tests.reports.conftest import handmade_series, log_run

    tmp = tmp_path_factory.mktemp("ten")
    uri = fresh_store(tmp)
    client = MlflowClient(uri)
    exp = client.create_experiment("ten", artifact_location=str(tmp / "art"))
    names = ["tepo", "tepo-no-mask", "tepo-mask-all", "tepo-mask-adv", "tepo-mask-entropy", "tepo-token-ratio",
             "tepo-seq-mean", "tepo-likelihood-credit", "tepo-kl-old", "tepo-entropy-old"]
    for i, o in enumerate(names):
        for s in (0, 1, 2):
            ser = handmade_series(o, s)
            ser["eval/accuracy"] = [(st, v + 0.004 * i) for st, v in ser["eval/accuracy"]]
            log_run(client, exp, o, s, "c1", series=ser)
    return build_report("ten", tracking_uri=uri, out_root=tmp / "out", figures_too=False, log_artifacts=False,
                        store_derived=False)


@needs_tex
def test_every_report_table_compiles_within_the_page_width(ten_objectives, tmp_path):
    body = "\n".join(t.latex() for t in ten_objectives.tables.values())
    log = _compile(tmp_path, body)
    assert "Overfull \\hbox" not in log, re.findall(r"Overfull \\hbox.*", log)[:5]


def test_no_inf_or_none_in_a_report(ten_objectives):
    """No Python None, inf or nan printed; the word "none" is a cell ("entropy blow-up: none (0/3)")."""
    for f in ten_objectives.out_dir.iterdir():
        if f.suffix in (".md", ".tex", ".csv"):
            text = f.read_text()
            assert not re.search(r"\binf\b|\bnan\b", text, re.IGNORECASE), (f.name, text[:300])
            assert not re.search(r"\bNone\b", text), (f.name, text[:300])


def test_a_page_wide_stability_table_splits_between_the_failures_and_the_rest(ten_objectives):
    """Three failure onsets joined the stability table: wider than a page, its LaTeX stacks two blocks, the onsets,
    the drawdown and the entropy change (when and how far a run fell) above, the summaries over the steps below, each
    block repeating the objective column and no wider than the page."""
    t = ten_objectives.tables["stability"]
    blocks = t.latex().split("\\begin{tabular}{l")[1:]
    assert len(blocks) == 2
    first, second = (b.split("\\midrule")[0] for b in blocks)
    for words in ("collapse", "blow-up", "drawdown", "change"):           # (headers break across two lines)
        assert words in first and words not in second, words
    for words in ("slope", "spikes", "KL", "var.", "zero-adv."):
        assert words in second and words not in first, words
    assert "tepo-likelihood-credit" in blocks[0] and "tepo-likelihood-credit" in blocks[1]
    # a table within the page is not split at its breaks
    narrow = Table("n", "N", "c", ["objective", "a", "b"], [["x", "1", "2"]], ["objective", "a", "b"], breaks=(2,))
    assert narrow.latex().count("\\begin{tabular}") == 1
