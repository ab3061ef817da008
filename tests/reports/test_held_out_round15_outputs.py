"""Held-out round 15, output folders: a user's edits to the files pobench wrote into its own output folder (a report
folder, `bench compare`'s, `bench eval --out`'s) were silently replaced by the next command (H14, H29). Now each such
command refuses before any work, in one line naming the edited files and what to do, exit 2, the edits kept
(``reports.edits.check_unedited``); once they are moved away, the same command writes again."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient

from reports.record import get_or_create_experiment
from tests.conftest import fresh_store


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip() and " INFO mlflow" not in ln]


def _log(uri: str, handmade, *comparisons: str) -> None:
    client = MlflowClient(uri)
    exp_id = get_or_create_experiment(client, uri, "e")
    for c in comparisons:
        for o in ("grpo", "tepo"):
            handmade.log_run(client, exp_id, o, 0, c)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_h14_a_report_file_the_user_edited_is_not_replaced_by_the_next_report(tmp_path, handmade, bench_here):
    """Held-out round 15 (H14): the user appends a caption to ``report.md`` and replaces ``accuracy.md``; the next
    `bench report` replaced both silently (rc 0) while saying "kept your files" for a file added under another name.
    Now: one line naming both and what to do, exit 2, the folder as the user left it; once the edited files are moved
    away, the same command writes the report again and keeps the added file."""
    uri = fresh_store(tmp_path)
    _log(uri, handmade, "c1")
    argv = ["report", "--experiment", "e", "--comparison", "c1", "--tracking-uri", uri, "--no-store"]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    folder = tmp_path / "reports" / "out" / "e" / "c1"
    with (folder / "report.md").open("a") as fh:
        fh.write("USER EDIT: my caption\n")
    (folder / "accuracy.md").write_text("edited\n")
    (folder / "notes.txt").write_text("mine\n")
    before = _files(folder)
    rc, out, err = bench_here(argv, tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1, (rc, out, err[-3000:])
    assert "accuracy.md, report.md changed since pobench wrote them" in lines[0] and str(folder) in lines[0], lines
    assert "move them away" in lines[0] and "run the same command again" in lines[0], lines
    assert _files(folder) == before  # (nothing replaced, nothing added)
    # what the line says to do: the edits moved away, the same command writes the report again
    (folder / "report.md").rename(tmp_path / "my-report.md")
    (folder / "accuracy.md").rename(tmp_path / "my-accuracy.md")
    rc, out, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    assert "USER EDIT" not in (folder / "report.md").read_text() and (folder / "notes.txt").read_text() == "mine\n"
    assert "kept your files" in out and "notes.txt" in out, out
    assert "USER EDIT: my caption" in (tmp_path / "my-report.md").read_text()


def test_h14_bench_compare_keeps_an_edited_table_the_same_way(tmp_path, handmade, bench_here):
    """Held-out round 15 (H14), `bench compare`: the same rule for its folder (one function for every command that
    rewrites its own output folder)."""
    uri = fresh_store(tmp_path)
    _log(uri, handmade, "c1", "c2")
    argv = ["compare", "c1", "c2", "--experiment", "e", "--tracking-uri", uri]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    folder = tmp_path / "reports" / "out" / "e" / "compare-c1-c2"
    (folder / "compare.md").write_text("my table\n")
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "compare.md changed since pobench wrote it" in err, err[-3000:]
    assert (folder / "compare.md").read_text() == "my table\n"


def test_h29_bench_eval_out_rerun_keeps_an_edited_result_file(tmp_path, bench_here):
    """Held-out round 15 (H29): `bench eval --out ev` again after the user appended ``# my edit`` to ``ev/arith.csv``
    replaced it silently (their added notes.txt was kept). Now one line naming it, exit 2, before the model loads; a
    rerun without an edit (or once it is moved away) writes as before."""
    argv = ["eval", "--benchmarks", "arith", "--limit", "2", "--max-new-tokens", "4", "--no-mlflow", "--out", "ev"]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    ev = tmp_path / "ev"
    (ev / "notes.txt").write_text("notes\n")
    with (ev / "arith.csv").open("a") as fh:
        fh.write("# my edit\n")
    before = _files(ev)
    rc, out, err = bench_here(argv, tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1, (rc, out, err[-3000:])
    assert "--out ev: arith.csv changed since pobench wrote it" in lines[0] and "move it away" in lines[0], lines
    assert _files(ev) == before
    (ev / "arith.csv").rename(tmp_path / "my-arith.csv")
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    assert (ev / "arith.csv").is_file() and "# my edit" not in (ev / "arith.csv").read_text()
    assert (ev / "notes.txt").read_text() == "notes\n"


def test_h14_bench_tune_show_out_keeps_an_edited_best_yaml(tmp_path, bench_here):
    """Held-out round 15 (H14), `bench tune --out` (here `--show --out`, which writes the same outputs from the
    stored study, no training): a ``best.yaml`` the user edited is not replaced; the same one line, exit 2."""
    import optuna

    storage = f"sqlite:///{tmp_path}/o.db"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.set_user_attr("metric", "eval/accuracy")
    study.set_user_attr("algo", "grpo")
    study.optimize(lambda t: t.suggest_float("kl_coef", 1e-3, 1.0), n_trials=3)
    argv = ["tune", "--show", "--study", "s", "--storage", storage, "--out", "O"]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0 and (tmp_path / "O" / "best.yaml").is_file(), err[-3000:]
    with (tmp_path / "O" / "best.yaml").open("a") as fh:
        fh.write("# chosen for the paper\n")
    before = _files(tmp_path / "O")
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "best.yaml changed since pobench wrote it" in err, err[-3000:]
    assert _files(tmp_path / "O") == before


def test_h14_bench_run_refuses_before_training_when_its_earlier_report_was_edited(tmp_path, bench_here,
                                                                                  monkeypatch):
    """Held-out round 15 (H14), `bench run` (whose report replaces the comparison's report folder after training):
    the edited report is refused before any pair trains or any run is deleted (``--force``), not after the training
    (the fake trainer: training is not the subject)."""
    from tests.bench.fake_trainer import inject

    inject(monkeypatch.setattr)
    uri = fresh_store(tmp_path)
    argv = ["run", "--algos", "grpo,dapo", "--seeds", "0", "--no-controls", "--workers", "1", "--steps", "2",
            "--eval-every", "1", "--samples-every", "0", "--no-progress", "--output-dir", "runs", "--tracking-uri", uri]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    (report,) = (tmp_path / "reports" / "out" / "pobench").glob("*/report.md")
    with report.open("a") as fh:
        fh.write("USER EDIT: my caption\n")
    runs_before = _files(tmp_path / "runs")
    n_runs = len(MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("pobench").experiment_id]))
    rc, _, err = bench_here([*argv, "--force"], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "report.md changed since pobench wrote it" in err, err[-3000:]
    assert "USER EDIT: my caption" in report.read_text() and _files(tmp_path / "runs") == runs_before
    client = MlflowClient(uri)
    assert len(client.search_runs([client.get_experiment_by_name("pobench").experiment_id])) == n_runs
