"""`bench tune`: search space from the registry, bad input, pruning, storage (SQLite, PostgreSQL, dead workers),
MLflow parent / trial runs, outputs, and a real 3-trial study on the tiny model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import yaml
from optuna.trial import TrialState

from bench import tune
from bench.cli import main as cli_main
from bench.tune.outputs import write_outputs
from bench.tune.runs import DEAD_REASON
from reports.paths import LISTING
from tests import launch

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("tune_worker.py")


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def _runs(uri, experiment, kind, study):
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    query = f"tags.`pobench.kind` = '{kind}' and tags.`pobench.study` = '{study}'"
    return client.search_runs([exp.experiment_id], query, max_results=1000)


# --------------------------------------------------------------------------------------------------- space, metric
def test_default_space_is_the_registry_declared_one():
    from algorithms import search_space

    for algo in ("tepo", "grpo", "dapo", "kl_cov"):
        space = tune.resolve_space(algo)
        declared = search_space(algo)
        assert set(space) == set(declared)
        for name, (low, high, log) in declared.items():
            assert (space[name].low, space[name].high, space[name].log) == (low, high, log)


def test_space_narrows_and_adds():
    space = tune.resolve_space("tepo", "kl_coef=1e-3:1e-2:log,credit=uniform|likelihood")
    assert (space["kl_coef"].low, space["kl_coef"].high, space["kl_coef"].log) == (1e-3, 1e-2, True)
    assert space["credit"].choices == ("uniform", "likelihood")
    assert "entropy_threshold" in space  # untouched declared ranges stay
    # a term switched off in the base config is not searched unless --space names it
    assert "kl_coef" not in tune.resolve_space("tepo", None, {"kl_coef": 0.0})
    # nor a field the base config fixes (--objective-overrides): the trials would silently replace its value
    fixed = {"clip_low": 3e-4, "clip_high": 4e-4, "kl_coef": 0.04}
    assert set(tune.resolve_space("tepo", None, fixed)) == {"adv_threshold", "entropy_threshold"}
    assert "kl_coef" in tune.resolve_space("tepo", "kl_coef=1e-3:1e-1:log", fixed)


@pytest.mark.parametrize("spec, words", [
    ("kl_cof=0.001:0.1", ["no parameter 'kl_cof'", "did you mean 'kl_coef'"]),
    ("kl_coef=0.1:0.01", ["inverted"]),
    ("kl_coef=0.1:0.1", ["empty"]),
    ("kl_coef=0:0.1:log", ["log range needs low > 0"]),
    ("clip_low=0.1:1.5", ["clip_low", "(0, 1)"]),
    ("credit=uniform|bogus", ["credit", "valid values"]),
    ("kl_coef", ["expected name=low:high"]),
])
def test_bad_space_names_the_problem(spec, words):
    with pytest.raises(ValueError) as e:
        tune.resolve_space("tepo", spec)
    for w in words:
        assert w in str(e.value)


def test_metric_parsing():
    assert tune.parse_metric("eval/accuracy") == tune.TuneMetric("eval/accuracy", "final", None, "maximize")
    m = tune.parse_metric("steps_to:eval/accuracy_sampled>=0.5")
    assert (m.kind, m.key, m.threshold, m.direction) == ("steps_to", "eval/accuracy_sampled", 0.5, "minimize")
    assert m.intermediate(0.3) == -0.3  # minimised study: higher accuracy must read as better
    for bad in ("train/loss", "steps_to:eval/accuracy", "eval/accuracy>=0.5", ""):
        with pytest.raises(ValueError, match="--metric"):
            tune.parse_metric(bad)


def test_unreachable_storage_fails_before_any_trial(tmp_path):
    with pytest.raises(ValueError, match="cannot be reached"):
        tune.open_storage(f"postgresql+psycopg2://u@127.0.0.1:{_closed_port()}/nodb")
    with pytest.raises(ValueError, match="not a SQLAlchemy URL"):
        tune.open_storage("definitely not a url")


def _closed_port() -> int:
    from tests.net import free_port

    return free_port()  # closed once the socket is: nothing listens there


def test_cli_bad_input_exits_before_creating_anything(tmp_path, capsys):
    db = tmp_path / "optuna.db"
    base = ["tune", "--algo", "tepo", "--storage", f"sqlite:///{db}", "--trials", "2",
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    assert cli_main([*base, "--space", "entropy_treshold=0:0.5"]) == 2
    assert "no parameter 'entropy_treshold'" in capsys.readouterr().err
    assert cli_main([*base, "--space", "kl_coef=1e-1:1e-3:log"]) == 2
    assert "inverted" in capsys.readouterr().err
    assert cli_main([*base, "--pruner", "mean"]) == 2
    assert "--pruner" in capsys.readouterr().err
    assert cli_main([*base[:3], "--storage", f"postgresql://x@127.0.0.1:{_closed_port()}/d", *base[5:]]) == 2
    assert "cannot be reached" in capsys.readouterr().err
    assert not db.exists() and not (tmp_path / "mlflow.db").exists()


# --------------------------------------------------------------------------------------------------- pruning
GOOD = [0.1, 0.5, 0.6, 0.7]
BAD = [0.1, 0.0, 0.0, 0.0]


def _scripted(curves, stops):
    """Stand-in train: the n-th call evaluates hand-made curve n; records where it was stopped."""
    from tests.bench.tune_worker import fake_train

    def train(cfg, on_eval=None):
        curve = curves[len(stops)]
        stops.append(None)
        res = fake_train(cfg, on_eval, curve=curve)
        stops[-1] = res.steps_done if res.steps_done < len(curve) - 1 else None
        return res
    return train


@pytest.mark.parametrize("pruner", ["median", "none"])
def test_pruner_stops_a_clearly_worse_curve(tmp_path, mlflow_server, pruner):
    from tests.bench.tune_worker import make_spec

    exp, study = f"prune-{_uid()}", f"s-{_uid()}"
    spec = make_spec(study, f"sqlite:///{tmp_path}/o.db", mlflow_server, exp, trials=3, steps=3, pruner=pruner)
    stops: list = []
    result = tune.run_study(spec, train_fn=_scripted([GOOD, GOOD, BAD], stops), log=lambda m: None)
    trials = result.get_trials()
    assert [t.state for t in trials[:2]] == [TrialState.COMPLETE] * 2
    assert [t.value for t in trials[:2]] == [0.7, 0.7]
    runs = {r.data.tags["pobench.trial"]: r for r in _runs(mlflow_server, exp, "tune-trial", study)}
    assert len(runs) == 3
    if pruner == "median":
        assert trials[2].state == TrialState.PRUNED
        assert stops == [None, None, 1]  # stopped at the first report after the warm-up
        assert trials[2].intermediate_values == {0: 0.1, 1: 0.0}
        assert runs["2"].info.status == "KILLED" and runs["2"].data.tags["pobench.trial_state"] == "PRUNED"
    else:
        assert trials[2].state == TrialState.COMPLETE and trials[2].value == 0.0 and stops == [None] * 3
        assert runs["2"].info.status == "FINISHED"
    assert runs["0"].info.status == "FINISHED" and runs["0"].data.metrics["tune/objective"] == 0.7
    parent = _runs(mlflow_server, exp, "tune-study", study)
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in runs.values()} == {parent[0].info.run_id}


def test_seeds_report_like_for_like_and_time_to_metric(tmp_path, mlflow_server):
    from tests.bench.tune_worker import make_spec

    exp, study = f"ttc-{_uid()}", f"s-{_uid()}"
    spec = make_spec(study, f"sqlite:///{tmp_path}/o.db", mlflow_server, exp, trials=1, steps=3, pruner="none",
                     metric="steps_to:eval/accuracy>=0.55", seeds=(0, 1))
    # seed 0 reaches 0.55 at step 2, seed 1 never: counted as twice the budget (6)
    result = tune.run_study(spec, train_fn=_scripted([GOOD, BAD], []), log=lambda m: None)
    t = result.trials[0]
    assert result.direction.name == "MINIMIZE" and t.value == pytest.approx((2 + 6) / 2)
    # seed i's step s is reported at i * (steps + 1) + s, sign-flipped for a minimised study
    assert t.intermediate_values == {0: -0.1, 1: -0.5, 2: -0.6, 3: -0.7, 4: -0.1, 5: 0.0, 6: 0.0, 7: 0.0}


@pytest.mark.slow
def test_outputs_and_show(tmp_path, mlflow_server, capsys):
    from tests.bench.tune_worker import fake_train, make_spec

    exp, study = f"out-{_uid()}", f"s-{_uid()}"
    storage = f"sqlite:///{tmp_path}/o.db"
    spec = make_spec(study, storage, mlflow_server, exp, trials=4, steps=2, pruner="none")
    result = tune.run_study(spec, train_fn=fake_train, log=lambda m: None)
    paths = write_outputs(result, tmp_path / "out")
    assert {"best.yaml", "summary.csv", "summary.md", "history.png", "importance.png", "contour.png",
            "importance.csv", "importance.md"} <= set(paths)
    best = yaml.safe_load((tmp_path / "out" / "best.yaml").read_text())
    assert best == {"algo": "tepo", "objective_overrides": result.best_params}
    from bench.config import TrainConfig

    TrainConfig(algo=best["algo"], objective_overrides=best["objective_overrides"]).validate()
    assert cli_main(["tune", "--show", "--study", study, "--storage", storage, "--out", str(tmp_path / "o2")]) == 0
    out = capsys.readouterr().out
    assert f"study {study}" in out and "COMPLETE" in out
    assert cli_main(["tune", "--show", "--study", "nope", "--storage", storage]) == 2
    assert study in capsys.readouterr().err  # lists the studies that exist


def _scored_study(values, params=("kl_coef", "entropy_threshold", "adv_threshold"), pruned: int = 0):
    """An in-memory study of ``len(values)`` complete trials (random parameters, the given values) and ``pruned``
    pruned ones: the importance tables need no training."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.set_user_attr("metric", "eval/accuracy")
    it = iter(values)

    def objective(trial):
        for p in params:
            trial.suggest_float(p, 1e-3, 1.0)
        v = next(it, None)
        if v is None:
            raise optuna.TrialPruned()
        return v(trial.params) if callable(v) else v

    study.optimize(objective, n_trials=len(values) + pruned)
    return study


def test_importance_table_is_optunas_fanova_and_sums_to_one(tmp_path):
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    from bench.tune.outputs import write_importance

    def value(p):  # kl_coef matters most, entropy_threshold a little, adv_threshold not at all
        return 1.0 - abs(p["kl_coef"] - 0.3) + 0.2 * p["entropy_threshold"]

    study = _scored_study([value] * 16, pruned=2)
    imp = tune.importances(study)
    optunas = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0))  # what importance.png shows
    assert imp.reason == "" and imp.n_complete == 16
    assert imp.normalized == pytest.approx(optunas, rel=1e-9) and sum(imp.normalized.values()) == pytest.approx(1.0)
    assert list(imp.normalized)[0] == "kl_coef"  # highest first
    assert 0 < sum(imp.variance.values()) <= 1 + 1e-9  # main effects: a share of the variance each
    write_importance(study, imp, tmp_path)
    import csv

    rows = list(csv.DictReader((tmp_path / "importance.csv").open()))
    assert {r["parameter"]: float(r["importance"]) for r in rows} == pytest.approx(optunas, rel=1e-9)
    assert {r["n_complete"] for r in rows} == {"16"}
    md = (tmp_path / "importance.md").read_text()
    assert "rests on 16 complete trials of 18" in md
    assert "it does not say whether the best setting beats the default" in md
    assert "Few trials" not in md  # 16 complete trials for 3 parameters


def test_importance_from_few_complete_trials_says_it_is_noise(tmp_path):
    from bench.tune.outputs import write_importance

    study = _scored_study([lambda p: p["kl_coef"]] * 4, params=("kl_coef", "entropy_threshold"), pruned=9)
    imp = tune.importances(study)
    assert imp.reason == "" and imp.n_complete == 4
    write_importance(study, imp, tmp_path)
    md = (tmp_path / "importance.md").read_text()
    assert "**Few trials:** 4 complete trials for 2 parameters (fewer than 10)" in md and "`--pruner none`" in md


@pytest.mark.parametrize("values, params, words", [
    ([0.5], ("kl_coef", "entropy_threshold"), "1 complete trial: importances need at least two"),
    ([0.1, 0.5, 0.3], ("kl_coef",), "one parameter searched (kl_coef): its importance is 1 by construction"),
    ([0.4, 0.4, 0.4], ("kl_coef", "entropy_threshold"), "all 3 complete trials have the same value (0.4)"),
])
def test_importance_table_says_why_it_cannot_be_computed(tmp_path, values, params, words):
    study = _scored_study(values, params)
    imp = tune.importances(study)
    assert imp.normalized == {} and words in imp.reason
    paths = write_outputs(study, tmp_path)
    assert (tmp_path / "importance.csv").read_text().strip() == "parameter,importance,variance_fraction,n_complete"
    assert f"Not computed: {words}" in (tmp_path / "importance.md").read_text()
    assert "importance.png" not in paths  # (Optuna would draw equal bars, or one bar of 1)
    assert f"importance.png not drawn: {words}" in (tmp_path / "summary.md").read_text()


def test_resume_with_other_settings_is_refused(tmp_path, mlflow_server):
    from tests.bench.tune_worker import fake_train, make_spec

    exp, study = f"res-{_uid()}", f"s-{_uid()}"
    storage = f"sqlite:///{tmp_path}/o.db"
    tune.run_study(make_spec(study, storage, mlflow_server, exp, trials=1, steps=2), train_fn=fake_train,
                   log=lambda m: None)
    with pytest.raises(ValueError, match="different settings.*steps"):
        tune.open_study(make_spec(study, storage, mlflow_server, exp, trials=1, steps=3))
    # same settings, more trials: resumes and adds one
    s = tune.run_study(make_spec(study, storage, mlflow_server, exp, trials=2, steps=2), train_fn=fake_train,
                       log=lambda m: None)
    assert [t.state for t in s.trials] == [TrialState.COMPLETE] * 2
    assert len(_runs(mlflow_server, exp, "tune-study", study)) == 1


def test_interrupted_trial_is_queued_again_on_resume(tmp_path, mlflow_server):
    from tests.bench.tune_worker import fake_train, make_spec

    exp, study = f"int-{_uid()}", f"s-{_uid()}"
    spec = make_spec(study, f"sqlite:///{tmp_path}/o.db", mlflow_server, exp, trials=2, steps=3, pruner="none")

    def interrupted(cfg, on_eval=None):
        def hook(step, metrics):
            on_eval(step, metrics)
            if step == 1:
                raise KeyboardInterrupt  # what Ctrl-C (or SIGTERM, inside bench.engines.train) does mid-training
        return fake_train(cfg, hook)

    with pytest.raises(KeyboardInterrupt):
        tune.run_study(spec, train_fn=interrupted, log=lambda m: None)
    s = tune.run_study(spec, train_fn=fake_train, log=lambda m: None)  # the rerun resumes
    t = s.trials
    assert [x.state for x in t] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert t[1].params == t[0].params  # the interrupted parameters ran first on resume
    runs = {r.data.tags["pobench.trial"]: r for r in _runs(mlflow_server, exp, "tune-trial", study)}
    assert runs["0"].info.status == "FAILED" and runs["0"].data.tags["pobench.fail_reason"] == "interrupted"
    assert runs["1"].data.tags["pobench.retry_of"] == "0" and "pobench.retry_of" not in runs["2"].data.tags


# --------------------------------------------------------------------------------------------------- workers
def _worker(storage, uri, exp, study, trials, **kw) -> subprocess.Popen:
    args = [sys.executable, str(WORKER), "--storage", storage, "--tracking-uri", uri, "--experiment", exp,
            "--study", study, "--trials", str(trials)]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return launch.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finished_by(output: str) -> set[int]:
    return {int(line.split("trial ")[1].split(":")[0]) for line in output.splitlines()
            if "] trial " in line and (": COMPLETE" in line or ": PRUNED" in line)}


@pytest.mark.slow
def test_two_workers_share_one_postgres_study(postgres, mlflow_server, tmp_path):
    url = postgres.create_database(f"optuna_{_uid()}")
    tune.open_storage(url)  # create the schema once, so the two workers do not race on CREATE TABLE
    exp, study, n = f"pg-{_uid()}", f"s-{_uid()}", 6
    barrier = tmp_path / "go"
    procs = [_worker(url, mlflow_server, exp, study, n, steps=3, step_s=0.3, barrier=barrier) for _ in range(2)]
    deadline = time.time() + 300
    while len(list(tmp_path.glob("go.ready.*"))) < 2 and time.time() < deadline and all(p.poll() is None
                                                                                       for p in procs):
        time.sleep(0.2)
    barrier.touch()  # both workers imported everything: their trials now overlap
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    by = [_finished_by(o) for o in outs]
    assert all(by), f"each worker ran trials: {outs}"
    assert not (by[0] & by[1]), "no trial ran in both workers"
    s = optuna.load_study(study_name=study, storage=url)
    finished = {t.number for t in s.trials if t.state in tune.FINISHED}
    assert finished == by[0] | by[1]  # none lost
    assert n <= len(finished) <= n + 1  # a worker may start one trial before it sees the quota reached
    assert all(t.state in tune.FINISHED for t in s.trials)
    runs = _runs(mlflow_server, exp, "tune-trial", study)
    assert sorted(int(r.data.tags["pobench.trial"]) for r in runs) == sorted(finished)  # one run per trial
    assert len(_runs(mlflow_server, exp, "tune-study", study)) == 1


def _storage_made(db: Path) -> bool:
    """Whether the worker has made the Optuna SQLite storage ``db`` whole (its version row is written last): read-only,
    so that this test's reads never create tables while the worker does (a CI saw the worker fail on "table ...
    already exists": the test's ``load_study`` had created it meanwhile)."""
    import sqlite3

    if not db.exists():
        return False
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return con.execute("select count(*) from alembic_version").fetchone()[0] > 0
        finally:
            con.close()
    except sqlite3.Error:
        return False


@pytest.mark.slow
def test_killed_worker_is_resumed_and_its_trial_retried(tmp_path, mlflow_server):
    storage = f"sqlite:///{tmp_path}/o.db"
    exp, study, n = f"kill-{_uid()}", f"s-{_uid()}", 3
    kw = dict(steps=6, step_s=1.0, heartbeat=1, grace=3)  # (a trial of ~6 s: a busy machine's poll still sees one)
    a = _worker(storage, mlflow_server, exp, study, n, **kw)
    victim = None
    deadline = time.time() + 120
    while victim is None and time.time() < deadline and a.poll() is None:
        time.sleep(0.5)
        if not _storage_made(tmp_path / "o.db"):  # (Optuna's load_study creates the tables it misses: not meanwhile)
            continue
        try:
            s = optuna.load_study(study_name=study, storage=storage)
        except (KeyError, sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):
            continue  # (no study yet, or the worker creating its storage's tables right now: a race of reads)
        running = [t for t in s.get_trials(states=(TrialState.RUNNING,)) if len(t.intermediate_values) >= 2]
        victim = running[0] if running else None
    if victim is None:  # (its exit and output, where it ended: a CI saw this once, without them)
        out = a.communicate(timeout=60)[0] if a.poll() is not None else "(still running)"
        a.kill()
        pytest.fail(f"worker never got mid-trial (exit {a.poll()}): {out[-3000:]}")
    os.kill(a.pid, signal.SIGKILL)
    a.communicate()
    time.sleep(4)  # past the grace period: the trial's heartbeat is stale
    # the next worker, in this process (the killed one was a process of its own, the subject; the one that resumes
    # its study is the same code wherever it runs): tune_worker.py's main, with 0.05 s steps (nobody waits for it)
    from tests.bench.tune_worker import fake_train, make_spec

    s = tune.run_study(make_spec(study, storage, mlflow_server, exp, n, kw["steps"], kw["heartbeat"], kw["grace"],
                                 "none"), train_fn=lambda cfg, on_eval=None: fake_train(cfg, on_eval, 0.05),
                       log=lambda msg: None)
    s = optuna.load_study(study_name=study, storage=storage)
    states = {t.number: t.state for t in s.trials}
    assert states[victim.number] == TrialState.FAIL
    retries = [t for t in s.trials if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retries) == 1 and retries[0].state in tune.FINISHED
    assert retries[0].params == victim.params
    assert sum(st in tune.FINISHED for st in states.values()) == n
    runs = {r.data.tags["pobench.trial"]: r for r in _runs(mlflow_server, exp, "tune-trial", study)}
    dead = runs[str(victim.number)]
    # (on this host its free trial lock tells the worker is gone, before the heartbeat does: bench/tune/study.py)
    assert dead.info.status == "FAILED" and dead.data.tags["pobench.fail_reason"] == DEAD_REASON
    assert runs[str(retries[0].number)].data.tags["pobench.retry_of"] == str(victim.number)


# --------------------------------------------------------------------------------------------------- real loop
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """`builtin:tiny-arith` when its shipped checkpoint is there, else the same architecture freshly initialised
    (the search mechanics under test do not depend on the warm start)."""
    from bench.model import BUILTIN_MODELS, build_char_tokenizer, tiny_config

    if (BUILTIN_MODELS["builtin:tiny-arith"] / "config.json").exists():
        return "builtin:tiny-arith"
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("tiny-init")
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_real_three_trial_study_on_the_tiny_model(tmp_path, mlflow_server, tiny_model):
    exp, study = f"real-{_uid()}", f"s-{_uid()}"
    db, out = tmp_path / "optuna.db", tmp_path / "out"
    argv = ["tune", "--algo", "tepo", "--trials", "3", "--steps", "1", "--seeds", "0", "--study", study,
            "--storage", f"sqlite:///{db}", "--tracking-uri", mlflow_server, "--out", str(out),
            "--space", "kl_coef=1e-3:1e-1:log,entropy_threshold=0:0.5",
            "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--eval-every", "1",
            "--max-new-tokens", "16", "--experiment", exp, "--output-dir", str(tmp_path / "runs"),
            "--samples-every", "0", "--model", tiny_model, "--workers", "1",  # (several: test_tune_workers.py)
            "--confirm-seeds", "1"]  # the best trial against the default, one real run each (test_tune_confirm.py)
    assert cli_main(argv) == 0
    s = optuna.load_study(study_name=study, storage=f"sqlite:///{db}")
    assert len(s.trials) == 3 and all(t.state in tune.FINISHED for t in s.trials)
    parent = _runs(mlflow_server, exp, "tune-study", study)
    trials = _runs(mlflow_server, exp, "tune-trial", study)
    assert len(parent) == 1 and len(trials) == 3
    client = _client(mlflow_server)
    for t in trials:
        assert t.data.tags["mlflow.parentRunId"] == parent[0].info.run_id
        assert {"kl_coef", "entropy_threshold"} <= set(t.data.params)
        assert [m.step for m in client.get_metric_history(t.info.run_id, "eval/accuracy")] == [0, 1]
        train_runs = client.search_runs([t.info.experiment_id], f"tags.mlflow.parentRunId = '{t.info.run_id}'")
        assert len(train_runs) == 1  # one seed: one training run nested under the trial
    best = yaml.safe_load((out / "best.yaml").read_text())
    # --space narrowed two ranges; the other declared ranges of tepo are searched too
    assert best["algo"] == "tepo" and set(best["objective_overrides"]) == set(tune.resolve_space("tepo"))
    assert best["objective_overrides"] == s.best_params
    assert 1e-3 <= best["objective_overrides"]["kl_coef"] <= 1e-1
    assert (out / "history.png").stat().st_size > 0
    confirm = s.user_attrs["confirm"]  # two real trainings on seed 1, scored from their MLflow record
    assert [(r["setting"], r["seed"], r["outcome"]) for r in confirm["runs"]] == [("default", 1, "finished"),
                                                                               ("best", 1, "finished")]
    for r in confirm["runs"]:
        history = client.get_metric_history(r["run_id"], "eval/accuracy")
        assert [m.step for m in history] == [0, 1] and r["value"] == history[-1].value
    assert "No difference resolved with 1 seed." in (out / "confirm.md").read_text()
    # `bench run` takes it: its --params reader resolves the overrides, and a 1-step comparison runs with them
    from bench.comparison.plan import load_params

    assert load_params(out / "best.yaml", ["tepo"]) == {"tepo": best["objective_overrides"]}
    assert cli_main(["run", "--algos", "tepo", "--seeds", "0", "--params", str(out / "best.yaml"), "--steps", "1",
                     "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--max-new-tokens", "16",
                     "--experiment", exp, "--tracking-uri", mlflow_server, "--output-dir", str(tmp_path / "run"),
                     "--model", tiny_model, "--no-report", "--no-progress"]) == 0
    ran = _client(mlflow_server).search_runs([parent[0].info.experiment_id], "tags.`pobench.kind` = 'train'")
    ran = [r for r in ran if "pobench.comparison" in r.data.tags and "pobench.confirm_of" not in r.data.tags
           and r.data.tags["pobench.objective"] == "tepo"]  # (not a positive control bench run adds)
    assert len(ran) == 1
    for k, v in best["objective_overrides"].items():
        assert float(ran[0].data.params[f"objective.{k}"]) == pytest.approx(v)


def test_postgresql_url_without_driver_gets_the_installed_one(monkeypatch):
    """SQLAlchemy 2.0 reads `postgresql://` as psycopg2, 2.1 as psycopg 3: the URL names the installed driver."""
    import importlib.util

    from reports import dburl

    installed = [m for m in dburl.POSTGRES_DRIVERS if importlib.util.find_spec(m) is not None]
    if not installed:
        pytest.skip("no PostgreSQL driver installed (the `postgres` extra installs psycopg2)")
    assert dburl.with_driver("postgresql://u:pw@h:5432/db") == f"postgresql+{installed[0]}://u:pw@h:5432/db"
    assert dburl.with_driver("postgres://u@h/db") == f"postgresql+{installed[0]}://u@h/db"
    assert dburl.with_driver("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"  # named: kept
    assert dburl.with_driver("sqlite:///x.db") == "sqlite:///x.db"
    monkeypatch.setattr(dburl, "POSTGRES_DRIVERS", ("no_such_driver_module",))
    with pytest.raises(ValueError, match=r"postgresql://u:\*\*\*@h/db: no PostgreSQL driver.*\[postgres\]"):
        tune.open_storage("postgresql://u:secret@h/db")


def test_readme_postgresql_url_works_against_a_real_server(postgres, capsys):
    """`bench tune --storage postgresql://...` as the README writes it, with the `postgres` extra installed."""
    from bench import cli

    plain = postgres.create_database(f"optuna_{_uid()}").replace("postgresql+psycopg2://", "postgresql://")
    assert plain.startswith("postgresql://")
    storage = tune.open_storage(plain)
    study = optuna.create_study(study_name="readme", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert cli.main(["tune", "--storage", plain, "--show"]) == 2  # connects, lists the studies, asks for --study
    err = capsys.readouterr().err
    assert f"studies in {plain}: readme" in err, err


def test_outputs_of_an_earlier_study_state_are_not_left_beside_the_new_ones(tmp_path):
    """Issue 29 (round 6): `bench tune --out O` (or `--show`) wrote its files over the earlier ones but left those
    it did not write this time: a best.yaml, contour and confirm table of a study whose trials now all failed (or of
    another study) stayed beside a summary without a best trial. Every output is also replaced whole, so a link the
    user put in the folder is replaced, and the file it points to untouched."""
    out = tmp_path / "out"
    first = _scored_study([0.1, 0.5, 0.3, 0.2], params=("kl_coef", "entropy_threshold"))
    first.set_user_attr("algo", "grpo")
    first.set_user_attr("confirm", {"same": True, "metric": "eval/accuracy", "seeds": [5], "trial": 1,
                                    "trial_value": 0.5, "fields": {"kl_coef": [0.0, 0.0]}, "runs": [],
                                    "direction": "maximize"})
    before = write_outputs(first, out)
    assert {"best.yaml", "contour.png", "importance.png", "history.png", "confirm.md", "confirm.csv"} <= set(before)
    mine = tmp_path / "mine.md"
    mine.write_text("my notes\n")
    (out / "summary.md").unlink()
    (out / "summary.md").symlink_to(mine)  # a link of the user's in place of an output

    second = _scored_study([], params=("kl_coef", "entropy_threshold"), pruned=2)  # no complete trial
    second.set_user_attr("algo", "grpo")
    now = write_outputs(second, out)
    assert {"best.yaml", "contour.png", "importance.png", "confirm.md", "confirm.csv"}.isdisjoint(now)
    left = sorted(p.name for p in out.iterdir() if p.name != LISTING)  # (the listing of what pobench wrote, H14)
    assert left == sorted(now), left  # nothing of the first study's state is left
    assert "best.yaml not written" in (out / "summary.md").read_text()
    assert not (out / "summary.md").is_symlink() and mine.read_text() == "my notes\n"
