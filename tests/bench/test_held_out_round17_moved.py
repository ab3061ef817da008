"""Held-out round 17 (issue 29): a pair whose run folder was moved away is trained again, not "reused", and
`bench eval --comparison` says its final model was moved or deleted (H09); a store whose experiment keeps its runs'
files in another (copied or moved) project folder is refused before any work (H21)."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.conftest import fresh_store

RUN = ["run", "--algos", "grpo,dapo", "--seeds", "0", "--no-controls", "--workers", "1", "--steps", "2",
       "--no-report", "--no-progress"]


def _runs(uri: str, objective: str) -> list:
    from reports.record import open_client

    client = open_client(uri)
    exp = client.get_experiment_by_name("pobench")
    return client.search_runs([exp.experiment_id], f"tags.`pobench.objective` = '{objective}' and "
                              "tags.`pobench.kind` = 'train'")


def test_a_pair_whose_run_folder_was_moved_away_is_trained_again_and_eval_says_moved_or_deleted(
        tmp_path, bench_here, monkeypatch):
    """H09: after `bench run`, the user renamed a pair's run folder (`mv .../grpo-s0-<h> .../mygrpo`); the same
    `bench run` said "grpo seed 0: reused" though its final model was gone (the plan checked only the MLflow record),
    and `bench eval --comparison` said to run it from the folder `bench run` ran in, where it was run. Now the rerun
    trains the pair again as a new run, saying why, and leaves the moved folder alone; `bench eval` run there says the
    final model was moved or deleted and the ways on (its old hint only where the folder is elsewhere)."""
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    uri = fresh_store(tmp_path)
    rc, out, err = bench_here(RUN, tmp_path)
    assert rc == 0, err[-3000:]
    cid = re.search(r"\bc[0-9a-f]{10}\b", out + err).group(0)
    runs = tmp_path / ".pobench" / "runs" / "pobench"
    (folder,) = runs.glob("grpo-s0-*")
    moved = runs / "mygrpo"
    folder.rename(moved)
    (moved / "notes.txt").write_text("mine")
    before = sorted(p.relative_to(moved) for p in moved.rglob("*"))

    # the comparison's final models from where `bench run` ran: moved or deleted, with the ways on
    rc, _, err = bench_here(["eval", "--comparison", cid, "--benchmarks", "arith", "--limit", "4"], tmp_path)
    assert rc == 2 and f"{folder}/final" in err and "moved or deleted" in err, err[-3000:]
    assert "move each back there" in err and "the same `bench run`" in err, err[-3000:]
    assert "run bench eval from the folder bench run ran in" not in err, err[-3000:]
    elsewhere = tmp_path / "elsewhere"  # (from another folder: the old hint, which is true there)
    elsewhere.mkdir()
    rc, _, err = bench_here(["eval", "--comparison", cid, "--benchmarks", "arith", "--limit", "4",
                             "--tracking-uri", uri], elsewhere)
    assert rc == 2 and "run bench eval from the folder bench run ran in" in err, err[-3000:]

    rc, out, err = bench_here(RUN, tmp_path)
    said = out + err
    assert rc == 0, said[-3000:]
    assert not re.search(r"grpo\s+seed 0: reused", said), said[-3000:]
    assert f"grpo seed 0: its final model {folder}/final is gone (moved or deleted): trained again" in said, said
    assert re.search(r"dapo\s+seed 0: reused", said), said[-3000:]
    assert folder.is_dir() and sorted(p.relative_to(moved) for p in moved.rglob("*")) == before
    grpo = _runs(uri, "grpo")
    assert len(grpo) == 2 and all(r.info.status == "FINISHED" for r in grpo)
    members = [r for r in grpo if r.data.tags.get(f"pobench.in.{cid}") == "1"]
    assert len(members) == 1 and members[0].info.start_time == max(r.info.start_time for r in grpo)

    rc, out, err = bench_here(RUN, tmp_path)  # the new run is there: reused
    assert rc == 0 and re.search(r"grpo\s+seed 0: reused", out + err) and "is gone" not in out + err, out + err


def _copied_project(tmp_path):
    """``base/`` with a store whose experiment 'pobench' pobench made (its files beside it), copied to ``copy/``."""
    from reports.record import get_or_create_experiment, open_client

    base = tmp_path / "base"
    uri = fresh_store(base)
    get_or_create_experiment(open_client(uri), uri, "pobench")
    shutil.copytree(base, tmp_path / "copy")
    return base, tmp_path / "copy"


@pytest.mark.parametrize("argv", [
    ["train", "--steps", "1", "--no-progress"],
    [*RUN],
    ["eval", "--comparison", "c0123456789", "--benchmarks", "arith", "--limit", "4"],
    ["eval", "--benchmarks", "arith", "--limit", "4"],
    ["tune", "--algo", "grpo", "--trials", "1", "--steps", "1", "--seeds", "0", "--workers", "1"],
], ids=["train", "run", "eval-comparison", "eval", "tune"])
def test_a_copied_projects_store_pointing_at_the_old_folder_is_refused_before_any_work(tmp_path, bench_here, argv):
    """H21: MLflow stores an experiment's artifact location as an absolute path; a copied project's `mlflow.db` kept
    `<base>/mlartifacts/pobench`, so every new run of the copy wrote its files into the old project. Now each command
    that records runs refuses it in one line (exit 2) before any work: nothing made in either folder."""
    base, copy = _copied_project(tmp_path)
    rc, out, err = bench_here(argv, copy)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert (f"experiment 'pobench' keeps its runs' files in {base.resolve()}/mlartifacts/pobench, not beside this "
            "store (the folder was copied or moved?)") in lines[0], lines[0]
    assert "give another --experiment" in lines[0] and f"run from {base.resolve()}" in lines[0], lines[0]
    assert {p.name for p in copy.iterdir()} <= {"mlflow.db", "mlflow.db.lock"}, list(copy.iterdir())
    assert not (base / "mlartifacts").exists()


def test_a_moved_project_is_refused_without_recreating_the_old_folder_and_another_experiment_works(
        tmp_path, bench_here, monkeypatch):
    """H21, moved (`mv proj proj2`): MLflow recreated the moved-away folder at the old path. Now refused, the old path
    stays absent; the way on the line gives (another --experiment) keeps the new runs' files beside the store."""
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    base, copy = _copied_project(tmp_path)
    shutil.rmtree(base)  # (copy/ is now the moved project)
    rc, _, err = bench_here(RUN, copy)
    assert rc == 2 and "not beside this store" in err and not base.exists(), err[-3000:]
    rc, _, err = bench_here([*RUN, "--experiment", "other"], copy)
    assert rc == 0 and not base.exists(), err[-3000:]
    assert list((copy / "mlartifacts" / "other").iterdir())


def test_an_experiment_whose_files_go_where_the_user_chose_is_not_refused(tmp_path):
    """H21's check refuses pobench's own layout of another folder only: a remote location, or a local folder of
    another shape (made outside pobench), is the user's choice and kept; pobench's own layout here passes."""
    from bench.runs.store_check import check_artifact_home

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for location in ("s3://bucket/pobench", str(tmp_path.parent / "shared-files"),
                     f"file://{tmp_path.parent}/elsewhere/pobench", str(tmp_path / "mlartifacts" / "pobench")):
        check_artifact_home(uri, "pobench", location)
    with pytest.raises(ValueError, match="not beside this store"):
        check_artifact_home(uri, "pobench", f"file://{tmp_path.parent}/old/mlartifacts/pobench")
