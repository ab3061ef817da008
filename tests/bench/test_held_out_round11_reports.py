"""Held-out round 11: reports and evaluations of one comparison or folder that do not add up or run at once (a run
whose tags were edited, two commands writing one folder, a prompt past the model's context, the comparison's own run
deleted, an unknown --comparison): said in one line or a note, never a silent choice or a silent loss."""

from __future__ import annotations

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


# ------------------------------------------------------------------ H17: two `bench eval --out E` at once
def test_a_second_eval_into_an_out_folder_another_eval_writes_now_is_refused(tmp_path, bench_here):
    """Held-out round 11 (H17): two `bench eval --out E` of different settings at once both ended 0 and both said
    `wrote E/results.json`; only one's results remained. The folder is now held while the command works: a second
    one meanwhile is refused in one line naming the folder and the other process, exit 2, before any work; the
    first's results are whole."""
    import json
    import sys
    import time

    from tests import launch

    first = launch.Popen([sys.executable, "-m", "bench.cli", "eval", "--benchmarks", "arith", "--limit", "100",
                          "--out", "E", "--seed", "1", "--no-mlflow"], cwd=tmp_path, stdout=launch.PIPE,
                         stderr=launch.PIPE, text=True)
    try:
        pid = tmp_path / ".locks" / "E.eval.lock.pid"
        deadline = time.time() + 120
        while not pid.exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert pid.exists(), first.communicate()
        rc, out, err = bench_here(["eval", "--benchmarks", "arith", "--limit", "5", "--out", "E", "--seed", "2",
                                   "--no-mlflow"], tmp_path)
        running = first.poll() is None
    finally:
        fout, ferr = first.communicate(timeout=300)
    assert running, "the first evaluation ended before the second was refused: the test proves nothing"
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert "--out E: another bench eval" in lines[0] and f"process {first.pid}" in lines[0], lines[0]
    assert "arith" not in out  # no evaluation
    assert first.returncode == 0, ferr[-3000:]
    assert json.loads((tmp_path / "E" / "results.json").read_text())["seed"] == 1
