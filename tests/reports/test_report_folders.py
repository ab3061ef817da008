"""Where reports go (issue 18, "Data deleted"): one folder per comparison, ``<out-root>/<experiment>/<comparison>/``,
each name one safe path component, swapped in only over a folder pobench made. Each reproduction runs `bench report`
in a scratch folder and checks that every foreign file is still there, unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from bench.cli import main
from reports.record import get_or_create_experiment
from tests.conftest import forkserver_context, fresh_store


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> content) but the MLflow store."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.name.startswith("mlflow.db")}


def _kept(before: dict[str, bytes], root: Path) -> bool:
    """Every file of ``before`` is still there with the same content."""
    after = _snapshot(root)
    return all(after.get(k) == v for k, v in before.items())


def _comparison(uri: str, experiment: str, handmade, comparison: str = "c1") -> None:
    client = MlflowClient(uri)
    exp_id = get_or_create_experiment(client, uri, experiment)  # (its files beside the store, as pobench's)
    for o in ("grpo", "tepo"):
        handmade.log_run(client, exp_id, o, 0, comparison)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """tmp/work is the working folder (with mlflow.db), beside a sibling file and folder; reports/ holds another
    experiment's report and a user's notes."""
    work = tmp_path / "work"
    (work / "reports" / "out" / "other").mkdir(parents=True)
    (work / "reports" / "out" / "other" / "report.md").write_text("another experiment's report")
    (work / "reports" / "notes.txt").write_text("mine")
    (work / "checkpoints").mkdir()
    (work / "checkpoints" / "model.pt").write_bytes(b"\0weights")
    (tmp_path / "sibling.txt").write_text("next to the working folder")
    (tmp_path / "sibling").mkdir()
    (tmp_path / "sibling" / "data.jsonl").write_text("{}\n")
    fresh_store(work)
    monkeypatch.chdir(work)
    return tmp_path


def _report(uri: str, *args: str) -> int:
    return main(["report", "--tracking-uri", uri, "--no-store", *args])


@pytest.mark.parametrize("experiment", ["..", ".", *[pytest.param(e, marks=pytest.mark.slow)
                                                     for e in ("../../x", "/abs", "a/b")]])
def test_an_experiment_name_never_leaves_the_report_root(scratch, handmade, experiment, capsys):
    uri = f"sqlite:///{scratch}/work/mlflow.db"
    _comparison(uri, experiment, handmade)
    before = _snapshot(scratch)
    assert _report(uri, "--experiment", experiment) == 0
    assert _kept(before, scratch)                        # nothing deleted, nothing changed
    made = [p for p in (scratch / "work" / "reports" / "out").iterdir() if p.name != "other"]
    assert len(made) == 1 and made[0].name not in (".", "..") and "/" not in made[0].name
    assert (made[0] / "c1" / "report.md").exists()


def test_experiment_dotdot_with_out_root_dot_keeps_the_parent_folder(scratch, handmade):
    """`bench report --experiment .. --out-root .` once deleted the parent of the working folder."""
    uri = f"sqlite:///{scratch}/work/mlflow.db"
    _comparison(uri, "..", handmade)
    before = _snapshot(scratch)
    assert _report(uri, "--experiment", "..", "--out-root", ".") == 0
    assert _kept(before, scratch)
    assert (scratch / "work" / "mlflow.db").exists()
    made = [p for p in (scratch / "work").iterdir() if (p / "c1" / "report.md").exists()]
    assert len(made) == 1 and made[0].parent == scratch / "work"


def test_a_foreign_folder_in_the_way_is_refused_in_one_line(scratch, handmade, capsys):
    """`mkdir nb; echo notes > nb/important.txt; bench report --experiment nb --out-root .`"""
    uri = f"sqlite:///{scratch}/work/mlflow.db"
    _comparison(uri, "nb", handmade)
    (scratch / "work" / "nb").mkdir()
    (scratch / "work" / "nb" / "important.txt").write_text("notes")
    before = _snapshot(scratch)
    assert _report(uri, "--experiment", "nb", "--out-root", ".") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("20")]  # (MLflow's logs)
    assert len(err) == 1 and "nb exists and was not created by pobench" in err[0], err
    assert _kept(before, scratch) and sorted(p.name for p in (scratch / "work" / "nb").iterdir()) == [
        "important.txt"]
    # the same for a foreign folder where the comparison's folder would go
    (scratch / "work" / "nb").rename(scratch / "work" / "nb-user")
    assert _report(uri, "--experiment", "nb", "--out-root", ".") == 0      # made by pobench from now on
    (scratch / "work" / "nb" / "c1" / ".pobench-owned").unlink()            # the comparison folder is not pobench's
    assert _report(uri, "--experiment", "nb", "--out-root", ".") == 2
    assert "c1 exists and was not created by pobench" in capsys.readouterr().err


def test_reporting_comparison_b_keeps_comparison_a(scratch, handmade):
    uri = f"sqlite:///{scratch}/work/mlflow.db"
    _comparison(uri, "two", handmade, "cA")
    _comparison(uri, "two", handmade, "cB")
    assert _report(uri, "--experiment", "two", "--comparison", "cA") == 0
    a = scratch / "work" / "reports" / "out" / "two" / "cA"
    files_a = {p.name: p.read_bytes() for p in a.iterdir()}
    assert _report(uri, "--experiment", "two", "--comparison", "cB") == 0
    assert {p.name: p.read_bytes() for p in a.iterdir()} == files_a
    assert (a.parent / "cB" / "report.md").exists()
    # reporting A again replaces A only, and leaves no temporary folder behind
    assert _report(uri, "--experiment", "two", "--comparison", "cA") == 0
    assert sorted(p.name for p in a.parent.iterdir()) == [".locks", ".pobench-owned", "cA", "cB"]  # (.locks: holds)


def test_a_symlinked_experiment_folder_pointing_out_is_refused(scratch, handmade, capsys):
    uri = f"sqlite:///{scratch}/work/mlflow.db"
    _comparison(uri, "linked", handmade)
    (scratch / "work" / "reports" / "out" / "linked").symlink_to(scratch / "sibling")
    before = _snapshot(scratch)
    assert _report(uri, "--experiment", "linked") == 2
    assert "outside" in capsys.readouterr().err
    assert _kept(before, scratch)


def test_bench_run_refuses_a_foreign_report_folder_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports" / "out" / "mine").mkdir(parents=True)
    (tmp_path / "reports" / "out" / "mine" / "notes.txt").write_text("keep")
    rc = main(["run", "--algos", "grpo", "--seeds", "0", "--steps", "1", "--experiment", "mine", "--no-progress",
               "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"])
    assert rc == 2 and "was not created by pobench" in capsys.readouterr().err
    assert not (tmp_path / ".pobench").exists()                      # nothing trained
    assert (tmp_path / "reports" / "out" / "mine" / "notes.txt").read_text() == "keep"


def _report_in_process(uri: str, out_root: str) -> str:
    from reports.report import build_report

    rep = build_report("par", "c1", uri, out_root=out_root, figures_too=False, log_artifacts=False,
                       store_derived=False)
    return str(rep.out_dir)


def test_three_reports_of_one_comparison_at_once_leave_one_complete_folder(handmade, tmp_path):
    """Three processes write the report of one comparison at once. (Forked from a forkserver that imported the report
    code once: three spawned processes imported it each, ~4 CPU-seconds apiece.)"""
    uri = fresh_store(tmp_path)
    _comparison(uri, "par", handmade)
    with forkserver_context("reports.report", __name__) as ctx, ctx.Pool(3) as pool:
        outs = pool.starmap(_report_in_process, [(uri, str(tmp_path / "out"))] * 3)
    assert len(set(outs)) == 1
    folder = tmp_path / "out" / "par"
    assert sorted(p.name for p in folder.iterdir()) == [".locks", ".pobench-owned", "c1"]   # no temporary or old
    # folder left (.locks: the report folder's hold, reports.paths.hold_out_folder)
    assert {"report.md", "accuracy.csv", "curves.csv", "runs.csv"} <= {p.name for p in (folder / "c1").iterdir()}


def test_a_users_file_in_a_report_folder_survives_the_next_report(scratch, handmade, capsys):
    """Held-out round 3: the rerun swapped the report folder in whole and deleted a user's notes put into it. Now
    they move into the new folder, the command says so, and they are not sent to MLflow with the report."""
    uri = f"sqlite:///{scratch}/work/mlflow.db"
    _comparison(uri, "e", handmade)
    assert _report(uri, "--experiment", "e") == 0
    folder = scratch / "work" / "reports" / "out" / "e" / "c1"
    (folder / "my-notes.md").write_text("the tepo curve is odd")
    (folder / "mine").mkdir()
    (folder / "mine" / "fig.png").write_bytes(b"\x89PNG mine")
    before = _snapshot(scratch)
    capsys.readouterr()
    assert _report(uri, "--experiment", "e") == 0
    mine = ("work/reports/out/e/c1/my-notes.md", "work/reports/out/e/c1/mine/fig.png")
    after = _snapshot(scratch)
    # (the report's own files, here and in MLflow's artifacts, are written again)
    assert [k for k, v in before.items() if ("/c1/" not in k and "mlartifacts/" not in k or k in mine)
            and after.get(k) != v] == []
    out = capsys.readouterr().out
    assert f"kept your files in {folder} (not pobench's; not sent to MLflow): mine/fig.png, my-notes.md" in out, out
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("e")
    (crun,) = client.search_runs([exp.experiment_id], "tags.`pobench.kind` = 'comparison'")
    sent = [a.path for a in client.list_artifacts(crun.info.run_id, "report")]
    assert "report/report.md" in sent and not {"report/my-notes.md", "report/mine"} & set(sent), sent
