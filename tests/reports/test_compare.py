"""`bench compare A B`: two stored comparisons side by side, each as its own report has it, and what differs in
their configurations."""

from __future__ import annotations

import csv
import shutil
import subprocess
import types

import pytest
from mlflow import MlflowClient

from bench.cli import main
from reports.record import get_or_create_experiment
from reports.report import build_report


def _log(uri, handmade, comparison, objectives, steps, engine=None):
    client = MlflowClient(uri)
    exp_id = get_or_create_experiment(client, uri, "cmp2")  # (its files beside the store, as pobench's)
    for o in objectives:
        for s in (0, 1, 2):
            rid = handmade.log_run(client, exp_id, o, s, comparison, config_hash=f"h{comparison}")
            client.log_param(rid, "lr", "3e-05")
            client.log_param(rid, "eval_every", str(steps // 4))
            client.log_param(rid, f"tags.pobench.in.{comparison}", "1")     # TrainConfig.tags, flattened
            if engine:
                client.set_tag(rid, "pobench.engine", engine)


def test_compare_two_comparisons_side_by_side(handmade, local_uri, tmp_path, capsys):
    _log(local_uri, handmade, "cNative", ("grpo", "tepo", "dapo"), 20)
    _log(local_uri, handmade, "cTrl", ("grpo", "tepo"), 40, engine="trl")
    out = tmp_path / "out"
    assert main(["compare", "cNative", "cTrl", "--experiment", "cmp2", "--tracking-uri", local_uri,
                 "--out-root", str(out)]) == 0
    printed = capsys.readouterr().out
    folder = out / "cmp2" / "compare-cNative-cTrl"
    assert f"tables in {folder / 'compare.md'}" in printed

    with open(folder / "compare_config.csv") as f:
        cfg = {r["field"]: r for r in csv.DictReader(f)}
    assert (cfg["eval_every"]["cNative"], cfg["eval_every"]["cTrl"]) == ("5", "10")
    assert (cfg["engine"]["cNative"], cfg["engine"]["cTrl"]) == ("native", "trl")
    assert cfg["objectives"]["cNative"] == "grpo, tepo, dapo" and "lr" not in cfg and "seed" not in cfg
    assert not [k for k in cfg if k.startswith("tags.")]

    # each group holds exactly what that comparison's own report holds
    own = {c: build_report("cmp2", c, local_uri, out_root=tmp_path / "own", figures_too=False, log_artifacts=False,
                           store_derived=False) for c in ("cNative", "cTrl")}
    with open(folder / "compare_accuracy.csv") as f:
        side = {r["objective"]: r for r in csv.DictReader(f)}
    for c, rep in own.items():
        with open(rep.out_dir / "accuracy.csv") as f:
            for row in csv.DictReader(f):
                for k, v in row.items():
                    if k != "objective":
                        assert side[row["objective"]][f"{c}.{k}"] == v, (c, k)
    assert side["dapo"]["cTrl.final_mean"] == ""                   # not in that comparison
    md = (folder / "compare_accuracy.md").read_text()
    cells = {c: next(r for r in own[c].tables["accuracy"].rows if r[0] == "tepo")[1:] for c in own}
    line = next(x for x in md.splitlines() if x.startswith("| tepo |"))
    assert [c.strip("* ") for c in line.strip("|").split("|")[1:]] == cells["cNative"] + cells["cTrl"]
    assert "| objective | cNative: n |" in md and "| dapo |" in md and "–" in md
    tex = (folder / "compare_accuracy.tex").read_text()
    assert "\\multicolumn{5}{c}{cNative}" in tex and "\\cmidrule(lr)" in tex
    if shutil.which("pdflatex"):
        doc = tmp_path / "doc.tex"
        doc.write_text("\\documentclass{article}\n\\usepackage[textwidth=7in]{geometry}\n\\usepackage{booktabs}\n"
                       "\\begin{document}\n" + "\n".join(p.read_text() for p in folder.glob("*.tex"))
                       + "\\end{document}\n")
        res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout[-2000:]
        assert "Overfull \\hbox" not in (tmp_path / "doc.log").read_text()


def test_compare_bad_input_is_one_line(local_uri, tmp_path, capsys):
    assert main(["compare", "cA", "--tracking-uri", local_uri, "--out-root", str(tmp_path)]) == 2
    assert "at least two" in capsys.readouterr().err
    assert main(["compare", "cA", "cA", "--tracking-uri", local_uri, "--out-root", str(tmp_path)]) == 2
    assert "named twice" in capsys.readouterr().err
    assert main(["compare", "cA", "cB", "--experiment", "nowhere", "--tracking-uri", local_uri,
                 "--out-root", str(tmp_path)]) == 2
    assert "no MLflow experiment named 'nowhere'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("spec,want", [("c1", ("pobench", "c1")), ("exp:c1", ("exp", "c1")),
                                       ("a:b:c1", ("a:b", "c1"))])
def test_parse_spec(spec, want):
    from reports.compare import parse_spec

    assert parse_spec(spec, "pobench") == want


def test_what_differs_lists_only_settings_whose_resolved_values_differ(handmade, local_uri, tmp_path):
    """cA ran grpo, dapo, tepo and cB grpo, dapo. Before, a field one side's objectives have and the other's lack
    (ratio_level: grpo's and dapo's, not tepo's) or one that differs between the objectives of one side (clip_low:
    tepo's is not grpo's) read "–" against a value, as if changed. Now an objective's fields are compared per
    objective both ran, a setting a run did not record counts as its default, and only real changes are listed."""
    from bench.cli.compare import default_params

    client = MlflowClient(local_uri)
    exp_id = get_or_create_experiment(client, local_uri, "cmp3")

    def log(comparison, objectives, edit):
        for o in objectives:
            for s in (0, 1):
                rid = handmade.log_run(client, exp_id, o, s, comparison, config_hash=f"h{comparison}")
                params = {k: v for k, v in default_params(o).items() if k.startswith("objective.")}
                params.update({"shared_prefix": "True", "eval_every": "5", "inputs.model": "f407a9"})
                edit(o, params)
                for k, v in params.items():
                    client.log_param(rid, k, v)

    def older(o, params):  # cB: an older record, and one real change
        del params["shared_prefix"], params["inputs.model"]       # not recorded: shared_prefix's default is True
        params.pop("objective.overlong_buffer_frac", None)        # (dapo: its default, as cA recorded it)
        if o == "grpo":
            params["objective.kl_coef"] = "0.1"                   # changed: 0.04 in cA

    log("cA", ("grpo", "dapo", "tepo"), lambda o, p: p.update({"warmup_steps": "5"}))
    log("cB", ("grpo", "dapo"), older)
    out = tmp_path / "out"
    assert main(["compare", "cA", "cB", "--experiment", "cmp3", "--tracking-uri", local_uri,
                 "--out-root", str(out)]) == 0
    folder = out / "cmp3" / "compare-cA-cB"
    with open(folder / "compare_config.csv") as f:
        cfg = {r["field"]: r for r in csv.DictReader(f)}
    changed = [k for k in cfg if k not in ("objectives", "seeds", "experiment", "baseline")]
    assert sorted(changed) == ["objective.kl_coef (grpo)", "warmup_steps"], changed
    assert (cfg["objective.kl_coef (grpo)"]["cA"], cfg["objective.kl_coef (grpo)"]["cB"]) == ("0.04", "0.1")
    assert (cfg["warmup_steps"]["cA"], cfg["warmup_steps"]["cB"]) == ("5", "0 (default)")
    assert not any("–" in (r["cA"], r["cB"]) for r in cfg.values())
    caption = (folder / "compare_config.md").read_text()
    assert "(grpo, dapo)" in caption and "tepo: cA) make a different objective set" in caption
    assert "no default known here, so not compared: inputs.model." in caption


def test_what_differs_without_known_defaults_compares_what_both_recorded(handmade, local_uri):
    """The table alone (no defaults given): a setting one side did not record is noted, not shown as changed."""
    from reports.compare import config_table

    def analysis(params_of):
        runs = [types.SimpleNamespace(variant=o, objective=o, seed=s, params=params_of(o), tags={})
                for o in ("grpo", "dapo") for s in (0, 1)]
        cmp = types.SimpleNamespace(runs=runs, objectives=["grpo", "dapo"], experiment="e")
        return types.SimpleNamespace(comparison=cmp, baseline="grpo")

    a = analysis(lambda o: {"lr": "3e-05", "objective.clip_high": "0.2" if o == "grpo" else "0.28"})
    b = analysis(lambda o: {"lr": "1e-05", "objective.clip_high": "0.2"} if o == "grpo" else {"lr": "1e-05"})
    t = config_table(["a", "b"], [a, b])
    rows = {r[0]: r[1:] for r in t.rows}
    assert rows["lr"] == ["3e-05", "1e-05"] and "objective.clip_high (dapo)" not in rows
    assert not [k for k in rows if k.startswith("objective.")]
    assert "not compared: objective.clip_high (dapo)." in t.caption
