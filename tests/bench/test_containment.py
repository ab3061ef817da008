"""User-given names never write or delete outside their folder: run names, experiments and studies become one safe
path component (reports/paths.py, through bench/runs/folders.py), and `--force` deletes only pobench's run folders. The
issue's reproductions run as a user runs them: `bench ...` in a scratch folder, three levels deep, and
every file outside the working folder is checked to be untouched. (The commands run in the test's process, in that
folder: the paths do not depend on the process, and a new one costs seconds of imports.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.config import TrainConfig
from bench.runs.folders import claim_run_folder, experiment_dir, remove_run_folder
from bench.tune.outputs import study_dir
from reports.paths import MARKER, UnsafePath
from tests.conftest import fresh_store

TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8", "--samples-every",
        "0", "--checkpoint-every", "1", "--eval-problems", "4"]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def scratch(tmp_path):
    """A working folder three levels below ``tmp_path``, with a foreign file beside each level (and MLflow's default
    store of the folder, ``mlflow.db``, copied from an empty one: creating it takes seconds)."""
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    fresh_store(work)
    for d in (tmp_path, tmp_path / "a", tmp_path / "a" / "b"):
        (d / "sibling.txt").write_text(f"foreign file in {d.name}")
    return tmp_path, work


def errors(err: str) -> list[str]:
    """pobench's lines on stderr (MLflow logs its own INFO lines when it creates a store)."""
    return [ln for ln in err.strip().splitlines() if " INFO mlflow" not in ln]


def outside_unchanged(root: Path, work: Path, before: dict[str, bytes]) -> None:
    after = snapshot(root)
    inside = str(work.relative_to(root))
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p) and not p.startswith(inside)}
    assert not changed, f"written or deleted outside the working folder: {sorted(changed)}"


# ------------------------------------------------------------------ names become one component under their root
@pytest.mark.parametrize("name", ["../../../ESC1", "/tmp/abs-run", "a/b", ".", "..", "../x/../../y"])
def test_run_name_is_one_folder_under_output_dir(tmp_path, name):
    cfg = TrainConfig(run_name=name, output_dir=str(tmp_path / "runs"))
    assert cfg.run_dir().resolve().parent == (tmp_path / "runs").resolve()
    assert cfg.run_label() == name  # the MLflow run name stays as given


@pytest.mark.parametrize("name", ["../../../X", "/etc", ".."])
def test_experiment_and_study_are_one_folder_under_their_root(tmp_path, name):
    assert experiment_dir(tmp_path, name).resolve().parent == tmp_path.resolve()
    assert study_dir(tmp_path, name).resolve().parent == tmp_path.resolve()
    assert experiment_dir(tmp_path, "pobench") == tmp_path / "pobench"  # safe names keep their folders


@pytest.mark.slow
def test_bench_train_run_name_escaping_writes_under_output_dir(scratch, bench_here):
    root, work = scratch
    before = snapshot(root)
    rc, _, err = bench_here(["train", "--run-name", "../../../ESC1", "--eval-every", "0", *TINY], work)
    assert rc == 0, err[-3000:]
    outside_unchanged(root, work, before)
    # <output_dir>/<experiment>/<run name made safe>, and the run folders' locks beside it
    (run,) = [p for p in (work / ".pobench" / "runs" / "pobench").iterdir() if p.name != ".locks"]
    assert run.name.startswith("ESC1-") and (run / MARKER).is_file() and (run / "final").is_dir()
    assert [p.name for p in (run.parent / ".locks").iterdir()] == [f"{run.name}.run.lock"]


@pytest.mark.slow
def test_bench_run_experiment_escaping_writes_under_output_dir(scratch, bench_here):
    root, work = scratch
    before = snapshot(root)
    rc, _, err = bench_here(["run", "--experiment", "../../../X", "--algos", "grpo", "--seeds", "0", "--workers", "1",
                             "--no-progress", "--no-report", "--eval-every", "0", *TINY], work)
    assert rc == 0, err[-3000:]
    outside_unchanged(root, work, before)
    (exp,) = (work / ".pobench" / "runs").iterdir()
    assert exp.name.startswith("X-") and (exp / ".locks").is_dir()
    assert [p for p in exp.iterdir() if (p / MARKER).is_file()]


@pytest.mark.slow
def test_bench_tune_study_escaping_writes_under_its_folders(scratch, bench_here):
    root, work = scratch
    before = snapshot(root)
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--study", "../../../../X", "--trials", "1", "--workers",
                             "1", "--eval-every", "1", *TINY], work)
    assert rc == 0, err[-3000:]
    outside_unchanged(root, work, before)
    outputs = [p for p in (work / ".pobench" / "tune").iterdir() if p.is_dir()]
    assert len(outputs) == 1 and outputs[0].name.startswith("X-") and (outputs[0] / "summary.csv").is_file()
    (trial_run,) = [p for p in (work / ".pobench" / "runs").iterdir() if p.name != ".locks"]
    assert "X-" in trial_run.name and (trial_run / MARKER).is_file()
    assert [p.name for p in (trial_run.parent / ".locks").iterdir()] == [f"{trial_run.name}.run.lock"]


# ------------------------------------------------------------------ only pobench's folders are written into / deleted
def test_bench_train_refuses_a_foreign_folder_as_its_run_folder(scratch, bench_here):
    root, work = scratch
    (work / "e" / "nb").mkdir(parents=True)  # bench train's folder: <output_dir>/<experiment>/<run name>
    (work / "e" / "nb" / "important.txt").write_text("notes")
    before = snapshot(root)
    rc, _, err = bench_here(["train", "--run-name", "nb", "--experiment", "e", "--output-dir", ".", "--eval-every",
                             "0", *TINY], work)
    assert rc == 2
    assert len(errors(err)) == 1 and "nb exists and is not a pobench run folder" in err, err
    assert snapshot(root) == before  # nothing written, nothing deleted


@pytest.mark.slow
def test_bench_run_force_refuses_a_foreign_folder_before_any_record(scratch, bench_here):
    """`--force` deletes a pair's run folder: one holding a file pobench never writes is refused, in one line,
    before the comparison's MLflow run exists (no run is left RUNNING)."""
    from mlflow import MlflowClient

    from bench.comparison.plan import base_config, plan, run_dir

    root, work = scratch
    flags = ["--algos", "grpo", "--seeds", "0", "--workers", "1", "--no-progress", "--no-report", "--eval-every",
             "0", *TINY]
    cfg = base_config(None, steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8, samples_every=0,
                      checkpoint_every=1, eval_problems=4, eval_every=0)
    _, (pair,) = plan(cfg, ["grpo"], [0], {"grpo": {}})
    target = work / run_dir(cfg, pair)
    (target / "ckpt-0000001").mkdir(parents=True)
    (target / "ckpt-0000001" / "state.json").write_text("{}")
    (target / "important.txt").write_text("notes")
    rc, _, err = bench_here(["run", "--force", *flags], work)
    assert rc == 2
    assert len(errors(err)) == 1 and "not deleting it" in err, err
    assert (target / "important.txt").read_text() == "notes"
    client = MlflowClient(f"sqlite:///{work}/mlflow.db")
    exps = client.search_experiments()
    assert not client.search_runs([e.experiment_id for e in exps])  # no comparison run was opened


def _legacy_run(folder: Path) -> Path:
    """A run folder as a pobench before the marker left it: no marker."""
    (folder / "ckpt-0000002").mkdir(parents=True)
    (folder / "ckpt-0000002" / "state.json").write_text("{}")
    (folder / "ckpt-0000002" / "model.pt").write_bytes(b"x")
    (folder / "config.yaml").write_text("algo: grpo\nseed: 0\n")
    (folder / "final").mkdir()
    return folder


def test_force_deletes_marked_and_empty_run_folders_only(tmp_path):
    root = tmp_path / "exp"
    marked = claim_run_folder(root / "new")
    (marked / "config.yaml").write_text("x")
    assert remove_run_folder(marked, root) == [] and not marked.exists()
    empty = root / "empty"
    empty.mkdir()
    assert remove_run_folder(empty, root) == [] and not empty.exists()
    # unmarked: an earlier version's run folder (checkpoint, config.yaml) or a user's folder with a config.yaml
    legacy = _legacy_run(root / "old")
    notes = root / "notes"
    notes.mkdir()
    (notes / "config.yaml").write_text("algo: grpo\nsteps: 3\n")
    for folder in (legacy, notes):
        before = snapshot(folder)
        with pytest.raises(UnsafePath, match="not deleting it"):
            remove_run_folder(folder, root)
        assert snapshot(folder) == before
    assert remove_run_folder(root / "absent", root) == []


def test_an_unmarked_folder_is_never_claimed(tmp_path):
    """Neither an earlier version's run folder nor a symlink is written into or marked."""
    legacy = _legacy_run(tmp_path / "grpo-s0")
    with pytest.raises(UnsafePath, match="not writing into it"):
        claim_run_folder(legacy)
    assert not (legacy / MARKER).exists()
    link = tmp_path / "link"
    link.symlink_to(tmp_path.parent)
    with pytest.raises(UnsafePath):
        claim_run_folder(link)
    assert claim_run_folder(tmp_path / "fresh") == tmp_path / "fresh" and (tmp_path / "fresh" / MARKER).is_file()


# ------------------------------------------------------------- issue 29: no "adopted" folder (bench/runs/folders.py)
def _looks_like_an_old_run(folder: Path) -> Path:
    """A folder of the user's that only looks like a run folder of an earlier pobench: a commented ``config.yaml``
    whose keys are all TrainConfig fields, and the user's own work in ``final/``."""
    (folder / "final").mkdir(parents=True)
    (folder / "final" / "thesis.tex").write_text("\\chapter{Results}\n")
    (folder / "config.yaml").write_text("# my settings for the thesis runs\nalgo: grpo\nsteps: 3\n")
    return folder


def test_bench_run_force_never_deletes_an_unmarked_folder_that_looks_like_an_old_run(scratch, bench_here):
    """`bench run --force` deleted ``final/thesis.tex`` through a pair's folder that pobench never marked: it is
    refused in one line naming the folder, and every file in it stays."""
    from bench.comparison.plan import base_config, plan, run_dir

    root, work = scratch
    cfg = base_config(None, steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8, samples_every=0,
                      checkpoint_every=1, eval_problems=4, eval_every=0)
    _, (pair,) = plan(cfg, ["grpo"], [0], {"grpo": {}})
    target = _looks_like_an_old_run(work / run_dir(cfg, pair))
    before, kept = snapshot(root), snapshot(target)
    rc, _, err = bench_here(["run", "--force", "--algos", "grpo", "--seeds", "0", "--workers", "1", "--no-progress",
                             "--no-report", "--eval-every", "0", *TINY], work)
    assert rc == 2, err[-3000:]
    assert len(errors(err)) == 1 and str(target.relative_to(work)) in err and MARKER in err, err
    assert snapshot(target) == kept  # thesis.tex and config.yaml kept, no marker written
    outside_unchanged(root, work, before)


def test_bench_train_never_writes_into_or_marks_an_unmarked_folder(scratch, bench_here):
    """`bench train --run-name` overwrote a commented ``config.yaml`` and marked the folder as pobench's (so a later
    `--force` could delete it): refused in one line, nothing written."""
    root, work = scratch
    target = _looks_like_an_old_run(work / "e" / "mine")
    before = snapshot(root)
    rc, _, err = bench_here(["train", "--run-name", "mine", "--experiment", "e", "--output-dir", ".",
                             "--eval-every", "0", *TINY], work)
    assert rc == 2, err[-3000:]
    assert len(errors(err)) == 1 and str(target.relative_to(work)) in err, err
    assert snapshot(root) == before and not (target / MARKER).exists()


# ------------------------------------------------------------------ issue 29: names from plugins become paths
UNSAFE_NAMES = ["../../x", "/abs/x", "../evil", "a/b", "a b", ".hidden", "", "x" * 97]


@pytest.fixture
def registries():
    """The objective and task registries as they were, after the test."""
    from algorithms import registry as objectives
    from evaluators import benchmarks as tasks

    kept = [(d, dict(d)) for d in (objectives._REGISTRY, tasks._GENERATED, tasks._REGISTERED_BY)]
    yield
    for d, before in kept:
        d.clear()
        d.update(before)


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_a_name_that_is_not_one_path_component_is_refused_at_registration(name, registries):
    """Objective and task names become run names, folders, lock files and MLflow keys: one that is not already one
    safe path component is refused when it is registered (one line), so it never reaches a path."""
    from algorithms import list_objectives, register
    from evaluators import list_benchmarks, register_task
    from evaluators.arith import ArithTask

    with pytest.raises(ValueError, match="one path component") as e:
        register(name, base="grpo", description="escapes")
    assert "\n" not in str(e.value) and name not in list_objectives()
    with pytest.raises(ValueError, match="one path component"):
        register_task(lambda **_: ArithTask(), name=name)
    assert name not in list_benchmarks()


def test_a_plugin_objective_named_to_escape_is_refused_before_any_file_is_written(scratch, bench_here, registries):
    """An objective registered as ``../../../../../x`` made `bench run` create its pair's lock file outside the
    working folder (bench/comparison/pairs.py built it from the raw name): the plugin is refused in one line."""
    root, work = scratch
    (work / "escape.py").write_text("from algorithms import register\n"
                                    "register('../../../../../x', base='grpo', description='escapes')\n")
    before = snapshot(root)
    rc, _, err = bench_here(["run", "--plugin", "escape.py", "--algos", "../../../../../x", "--seeds", "0",
                             "--workers", "1", "--no-progress", "--no-report", "--eval-every", "0", *TINY], work)
    outside_unchanged(root, work, before)
    assert rc == 2, err[-3000:]
    assert len(errors(err)) == 1 and "escape.py" in err and "../../../../../x" in err, err
    assert not (work / ".pobench").exists()


def test_summary_keys_of_any_objective_label_are_mlflow_keys():
    """The comparison run's ``summary/<objective>/...`` keys: a label read back from a store (a variant, a name of
    another version) never makes a key MLflow refuses (``../evil`` ended `bench run` in a traceback)."""
    from mlflow.utils.validation import _validate_metric_name

    from reports import metric_keys as K
    from reports.sections import summary_key

    keys = {label: summary_key(K.SUMMARY_GAIN, label) for label in ("../evil", "grpo+3f2a1b", "a/../b", ".x", "tepo")}
    for key in keys.values():
        _validate_metric_name(key)
    assert keys["tepo"] == "summary/tepo/gain" and keys["grpo+3f2a1b"] == "summary/grpo_3f2a1b/gain"  # as before
    assert len(set(keys.values())) == len(keys)
