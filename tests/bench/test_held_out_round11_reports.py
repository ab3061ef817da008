"""Held-out round 11: reports and evaluations of one comparison or folder that do not add up or run at once (a run
whose tags were edited, two commands writing one folder, a prompt past the model's context, the comparison's own run
deleted, an unknown --comparison): said in one line or a note, never a silent choice or a silent loss."""

from __future__ import annotations

import os
import signal

from tests.conftest import fresh_store


# ------------------------------------------------------------------ H11: two runs claiming one (objective, seed)
def _comparison(uri: str, objectives=("grpo", "dapo"), seeds=(0,)) -> dict[str, str]:
    """A hand-made comparison `c1` (experiment pobench) with its own run, as `bench run` records it; its training
    runs record their config (params algo, seed) as pobench's do. -> {"<objective>-s<seed>": run id}."""
    from mlflow import MlflowClient

    from reports.record import get_or_create_experiment
    from tests.reports.conftest import log_run

    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, uri, "pobench")
    ids = {}
    for o in objectives:
        for s in seeds:
            rid = ids[f"{o}-s{s}"] = log_run(client, exp_id, o, s, "c1")
            client.log_param(rid, "algo", o)
            client.log_param(rid, "seed", str(s))
    run = client.create_run(exp_id, run_name="comparison-c1", tags={
        "pobench.kind": "comparison", "pobench.comparison": "c1", "pobench.config_hash": "cfg000000001",
        "pobench.objectives": ",".join(objectives), "pobench.seeds": ",".join(map(str, seeds)),
        "pobench.baseline": objectives[0]})
    client.set_terminated(run.info.run_id)
    return ids


def _report(bench_here, tmp_path, uri, *more: str):
    return bench_here(["report", "--tracking-uri", uri, "--out-root", str(tmp_path / "out"), "--no-store", *more],
                      tmp_path)


def test_a_run_whose_objective_tag_was_edited_is_named_and_left_out_not_taken_for_another(tmp_path, bench_here):
    """Held-out round 11 (H11): the dapo run's `pobench.objective` tag edited to grpo: `bench report` took the dapo
    run's numbers for grpo, dropped the real grpo run and called dapo "deleted, or never trained", all silently. Now
    the edited run is named (id, what its tag says, what its params trained) and left out; grpo is the grpo run."""
    from mlflow import MlflowClient

    uri = fresh_store(tmp_path)
    ids = _comparison(uri)
    MlflowClient(tracking_uri=uri).set_tag(ids["dapo-s0"], "pobench.objective", "grpo")
    rc, out, err = _report(bench_here, tmp_path, uri)
    assert rc == 0, err[-2000:]
    notes = [ln for ln in out.splitlines() if ids["dapo-s0"] in ln]
    assert len(notes) == 1 and "pobench.objective=grpo" in notes[0] and "trained dapo seed 0" in notes[0] \
        and "left out" in notes[0], out
    assert "deleted, or never trained" not in out  # (the dapo pair is the edited run, said above)
    md = (tmp_path / "out" / "pobench" / "c1" / "report.md").read_text()
    assert ids["dapo-s0"] in md
    runs = (tmp_path / "out" / "pobench" / "c1" / "runs.csv").read_text()
    assert "dapo-s0" not in runs and "grpo-s0" in runs  # the grpo row is the grpo run's


def test_two_runs_claiming_one_pair_are_both_named_with_the_one_used(tmp_path, bench_here):
    """Held-out round 11 (H11), a pair trained twice into one comparison (both records agree with their tags):
    the later run was used without a word. Now a note names both run ids and which one is used (and how to choose
    the other)."""
    from mlflow import MlflowClient

    from reports.record import get_or_create_experiment
    from tests.reports.conftest import log_run

    uri = fresh_store(tmp_path)
    ids = _comparison(uri)
    client = MlflowClient(tracking_uri=uri)
    again = log_run(client, get_or_create_experiment(client, uri, "pobench"), "grpo", 0, "c1")
    client.log_param(again, "algo", "grpo")
    rc, out, err = _report(bench_here, tmp_path, uri)
    assert rc == 0, err[-2000:]
    notes = [ln for ln in out.splitlines() if ids["grpo-s0"] in ln]
    assert len(notes) == 1 and again in notes[0] and "both claim grpo seed 0" in notes[0] \
        and f"{again}, is used" in notes[0], out


def _while_first_holds(first, pid_file, second):
    """``second()`` run while the command ``first`` (a ``launch.Popen``) holds its folder (its lock's ``pid_file``
    written), stopped there with SIGSTOP (the second meets it at work, no race); returns what ``second`` returned and
    the first's (stdout, stderr) once it ended."""
    import time

    try:
        deadline = time.time() + 120
        while not pid_file.exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), first.communicate()
        os.kill(first.pid, signal.SIGSTOP)
        try:
            got = second()
        finally:
            os.kill(first.pid, signal.SIGCONT)
    finally:
        ended = first.communicate(timeout=300)
    return got, ended


# ------------------------------------------------------------------ H17: two `bench eval --out E` at once
def test_a_second_eval_into_an_out_folder_another_eval_writes_now_is_refused(tmp_path, bench_here):
    """Held-out round 11 (H17): two `bench eval --out E` of different settings at once both ended 0 and both said
    `wrote E/results.json`; only one's results remained. The folder is now held while the command works: a second
    one meanwhile is refused in one line naming the folder and the other process, exit 2, before any work; the
    first's results are whole."""
    import json
    import sys

    from tests import launch

    first = launch.Popen([sys.executable, "-m", "bench.cli", "eval", "--benchmarks", "arith", "--limit", "40",
                          "--out", "E", "--seed", "1", "--no-mlflow"], cwd=tmp_path, stdout=launch.PIPE,
                         stderr=launch.PIPE, text=True)
    second = ["eval", "--benchmarks", "arith", "--limit", "5", "--out", "E", "--seed", "2", "--no-mlflow"]
    (rc, out, err), (fout, ferr) = _while_first_holds(first, tmp_path / ".locks" / "E.eval.lock.pid",
                                                      lambda: bench_here(second, tmp_path))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert "--out E: another bench eval" in lines[0] and f"process {first.pid}" in lines[0], lines[0]
    assert "arith" not in out  # no evaluation
    assert first.returncode == 0, ferr[-3000:]
    assert json.loads((tmp_path / "E" / "results.json").read_text())["seed"] == 1


# ------------------------------------------------------------------ H21: two `bench report` of one comparison at once
def test_a_second_report_of_a_comparison_another_report_writes_now_is_refused(tmp_path, bench_here):
    """Held-out round 11 (H21): two `bench report` of one comparison with different settings at once
    (`--target-acc 0.7` and the default) both ended 0 saying `report in .../report.md`; one's report was silently
    replaced on disk and in MLflow. The report folder is now held while a report is made: a second `bench report`
    meanwhile is refused in one line naming the folder and the other process, exit 2; the first's report stays."""
    import sys

    from tests import launch

    uri = fresh_store(tmp_path)
    _comparison(uri, seeds=(0, 1))
    first = launch.Popen([sys.executable, "-m", "bench.cli", "report", "--tracking-uri", uri, "--out-root",
                          str(tmp_path / "out"), "--target-acc", "0.7"], cwd=tmp_path, stdout=launch.PIPE,
                         stderr=launch.PIPE, text=True)
    (rc, out, err), (fout, ferr) = _while_first_holds(first, tmp_path / "out" / "pobench" / ".locks" /
                                                      "c1.report.lock.pid", lambda: _report(bench_here, tmp_path, uri))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert "the report folder" in lines[0] and "c1: another bench report" in lines[0] \
        and f"process {first.pid}" in lines[0], lines[0]
    assert "report in" not in out
    assert first.returncode == 0, ferr[-3000:]
    assert "70.00% (given with --target-acc)" in (tmp_path / "out" / "pobench" / "c1" / "report.md").read_text()


def test_bench_run_s_report_waits_for_another_report_of_its_comparison_and_says_so(tmp_path):
    """Held-out round 11 (H21), `bench run`'s report at the end of its training (``build_report(on_busy=)``): a
    report of the same comparison being written meanwhile is waited for, with one line, not refused (the training
    is done) nor raced."""
    import threading

    from reports.paths import hold_out_folder, make_owned
    from reports.report import build_report

    uri = fresh_store(tmp_path)
    _comparison(uri)
    dest = tmp_path / "out" / "pobench" / "c1"
    make_owned(dest.parent, "reports")
    held: list = []  # another report's hold, as it takes it (in a thread of its own: filelock refuses a wait for
    thread = threading.Thread(target=lambda: held.append(hold_out_folder(dest, "report")))  # this thread's own lock)
    thread.start()
    thread.join()
    other = held[0]
    said: list[str] = []

    def on_busy(line: str) -> None:
        said.append(line)
        threading.Timer(0.5, other.release).start()

    rep = build_report("pobench", "c1", uri, out_root=tmp_path / "out", store_derived=False, log_artifacts=False,
                       figures_too=False, on_busy=on_busy)
    assert len(said) == 1 and "another bench report" in said[0] and "waiting for it to end" in said[0], said
    assert (rep.out_dir / "report.md").is_file()


# ------------------------------------------------------------------ H03: a prompt longer than the model's context
def _long_row_data(folder) -> str:
    import json

    rows = "".join(json.dumps({"question": f"What is {i}+1?" + (" x" * 2000 if i == 1 else ""), "answer": str(i + 1)})
                   + "\n" for i in range(4))
    (folder / "d.jsonl").write_text(rows)
    return "d.jsonl"


def test_a_row_whose_prompt_is_longer_than_the_model_s_context_is_one_line_naming_it(tmp_path, bench_here):
    """Held-out round 11 (H03): `bench eval` on a JSONL whose one row has a 6 MB question: a warning, then a 70-line
    RuntimeError traceback (the model asked for 36 TB), exit 1. Now the row is named (file:line) in one line before
    the model loads, exit 2; with --skip-bad-rows it is skipped and counted, the others evaluated with the usual
    completion length (the long row no longer cuts everyone's --max-new-tokens)."""
    data = _long_row_data(tmp_path)
    rc, out, err = bench_here(["eval", "--benchmarks", "gsm8k", "--data", data, "--no-mlflow"], tmp_path)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert "d.jsonl:2: its prompt is" in lines[0] and "context of 256 tokens" in lines[0] \
        and "--skip-bad-rows" in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]
    rc, out, err = bench_here(["eval", "--benchmarks", "gsm8k", "--data", data, "--no-mlflow", "--skip-bad-rows",
                               "--max-new-tokens", "8", "--out", "E"], tmp_path)
    assert rc == 0, err[-3000:]
    assert "gsm8k: skipped 1 row(s) whose prompt is not shorter than the model's context of 256 tokens: d.jsonl:2" \
        in err, err
    assert "Traceback" not in err and "gsm8k: 3 problems" in err, err


# ------------------------------------------------------------------ H20: the comparison's own run deleted
def test_a_report_whose_comparison_run_was_deleted_says_so_and_what_it_uses(tmp_path, bench_here):
    """Held-out round 11 (H20): the comparison's own MLflow run deleted in the UI, then `bench report`: a new
    comparison run made silently, the baseline "the default" instead of the recorded one, no word. Now a note names
    the deleted run, what it recorded (here the baseline dapo), that the report does not use it, that a new run holds
    the report, and how to restore it."""
    from mlflow import MlflowClient

    uri = fresh_store(tmp_path)
    _comparison(uri, objectives=("dapo", "grpo"))  # (its recorded baseline: dapo, the first)
    client = MlflowClient(tracking_uri=uri)
    gone = next(r.info.run_id for r in client.search_runs([client.get_experiment_by_name("pobench").experiment_id])
                if r.info.run_name == "comparison-c1")
    client.delete_run(gone)
    rc, out, err = _report(bench_here, tmp_path, uri)
    assert rc == 0, err[-2000:]
    notes = [ln for ln in out.splitlines() if gone in ln]
    assert len(notes) == 1 and "was deleted in MLflow (it recorded baseline dapo" in notes[0] \
        and "does not use its record" in notes[0] and "a new comparison run holds this report" in notes[0] \
        and f"restore_run('{gone}')" in notes[0], out
    md = (tmp_path / "out" / "pobench" / "c1" / "report.md").read_text()
    assert gone in md and "Baseline: grpo (the default)" in md


# ------------------------------------------------------------------ H19: `bench train --comparison <unknown id>`
def test_train_into_a_comparison_no_run_has_is_refused_before_any_work(tmp_path, bench_here):
    """Held-out round 11 (H19): `bench train --comparison deadbeef123` (an id no comparison has) trained and tagged
    its run into that made-up comparison, exit 0, no word (the help: it "joins an existing comparison"). Now one
    line naming the id, the experiment and the comparisons that exist, exit 2, before any run or folder."""
    uri = fresh_store(tmp_path)
    _comparison(uri)
    rc, out, err = bench_here(["train", "--steps", "1", "--comparison", "deadbeef123", "--tracking-uri", uri],
                              tmp_path)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert "--comparison deadbeef123: no such comparison in experiment 'pobench'" in lines[0] \
        and "(existing: c1)" in lines[0] and "drop --comparison" in lines[0], lines[0]
    assert not (tmp_path / ".pobench").exists()  # no run folder
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    assert len(client.search_runs([client.get_experiment_by_name("pobench").experiment_id])) == 3  # no new run
