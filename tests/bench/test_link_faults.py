"""Held-out round 6 of issue 29 (real files, a real SQLite store, real processes): links and reused folders. A
symbolic or hard link where pobench writes (an --out folder, an output file, a checkpoint, final, the store) is never
written through or followed; a folder of the user's is refused before any work; a reused --out keeps no stale file;
a config key given twice is refused; a comparison run whose config cannot be stored is not left RUNNING."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.runs import checkpoint
from bench.runs.folders import claim_run_folder
from tests.bench.test_held_out_faults import TINY
from tests.bench.test_plugins import _registries_as_they_were  # noqa: F401  (autouse: the plugin's mod7 leaves)
from tests.bench.test_signals import statuses
from tests.conftest import fresh_store


def test_a_symlinked_out_folder_is_refused_and_its_target_untouched(tmp_path, bench_here):
    """Round 6: `bench eval --out link` (and `bench tune --out link`), `link` a symbolic link to a folder of the
    user's: their results.json was overwritten and the folder marked as pobench's. Now one line, nothing written."""
    paper = tmp_path / "paper"
    paper.mkdir()
    (paper / "results.json").write_text("mine")
    (tmp_path / "out").symlink_to(paper)
    rc, out, err = bench_here(["eval", "--benchmarks", "arith", "--limit", "2", "--k", "1", "--no-mlflow", "--out",
                               "out"], tmp_path)
    assert rc == 2 and "is a symbolic link" in err and "Traceback" not in err, err[-3000:]
    assert sorted(p.name for p in paper.iterdir()) == ["results.json"] and (paper / "results.json").read_text() == \
        "mine"


def test_warmstart_into_a_users_model_folder_is_refused_before_training(tmp_path, bench_here):
    """Round 6: `bench warmstart --out mymodel` overwrote the user's config.json / model.safetensors, unchecked."""
    mine = tmp_path / "mymodel"
    mine.mkdir()
    (mine / "config.json").write_text("{\"mine\": 1}")
    rc, out, err = bench_here(["warmstart", "--out", "mymodel", "--steps", "2", "--eval", "0", "--no-progress"],
                              tmp_path)
    assert rc == 2 and "holds files pobench did not write" in err, err[-3000:]
    assert sorted(p.name for p in mine.iterdir()) == ["config.json"]


def test_eval_outputs_replace_links_and_drop_the_files_of_benchmarks_no_longer_evaluated(tmp_path, bench_here):
    """Round 6: a rerun of `bench eval --out E` wrote through the user's hard link (E/results.json) and symbolic link
    (E/arith.csv) into their own files; and a benchmark evaluated before but not now kept its CSV beside results
    that no longer listed it. Now each file is replaced whole (a link is replaced, not written through) and the
    earlier benchmark's CSV goes."""
    plugin = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "mod7_task.py"
    base = ["eval", "--limit", "2", "--k", "1", "--no-mlflow", "--out", "E"]
    rc, out, err = bench_here([*base[:1], "--plugin", str(plugin), "--benchmarks", "arith,mod7", *base[1:]], tmp_path)
    assert rc == 0 and (tmp_path / "E" / "mod7.csv").exists(), err[-3000:]
    keep = tmp_path / "keep"
    keep.mkdir()
    os.link(tmp_path / "E" / "results.json", keep / "base.json")
    (keep / "mine.csv").write_text("mine")
    (tmp_path / "E" / "arith.csv").unlink()
    (tmp_path / "E" / "arith.csv").symlink_to(keep / "mine.csv")
    before = (keep / "base.json").read_text()
    rc, out, err = bench_here([*base[:1], "--benchmarks", "arith", "--seed", "1", *base[1:]], tmp_path)
    assert rc == 0, err[-3000:]
    assert (keep / "base.json").read_text() == before and (keep / "mine.csv").read_text() == "mine"
    assert not (tmp_path / "E" / "arith.csv").is_symlink() and not (tmp_path / "E" / "mod7.csv").exists()
    assert [b["benchmark"] for b in json.loads((tmp_path / "E" / "results.json").read_text())["benchmarks"]] == \
        ["arith"]


def test_a_symlinked_checkpoint_is_never_followed_when_checkpoints_rotate(tmp_path):
    """Round 6: a checkpoint folder moved to another disk and linked back: the rotation deleted model.pt / state.json
    in the link's target (outside the run folder), or with nothing else there died on rmtree's refusal of a link.
    Now the link and its target are left alone."""
    run = claim_run_folder(tmp_path / "run")
    checkpoint.save_state(run, 1, {"note": "x"})
    elsewhere = tmp_path / "bigdisk" / "ckpt1"
    elsewhere.parent.mkdir()
    (run / "ckpt-0000001").rename(elsewhere)
    (run / "ckpt-0000001").symlink_to(elsewhere)
    for with_note in (False, True):
        if with_note:
            (elsewhere / "notes.txt").write_text("n")
        checkpoint.save_state(run, 2 + with_note, {"note": "y"})
        assert (elsewhere / "state.json").exists() and (run / "ckpt-0000001").is_symlink()
    assert checkpoint.step_of(checkpoint.latest(run)) == 3


def test_a_comparison_run_whose_config_cannot_be_stored_is_not_left_running(tmp_path, bench_here):
    """Round 6: `mlartifacts/pobench` a file: `bench run` stopped in one line but left the comparison run RUNNING."""
    uri = fresh_store(tmp_path)
    (tmp_path / "mlartifacts").mkdir(exist_ok=True)
    (tmp_path / "mlartifacts" / "pobench").write_text("x")
    rc, out, err = bench_here(["run", "--algos", "grpo", "--seeds", "0", "--no-controls", "--no-progress",
                               "--no-report", "--tracking-uri", uri, *TINY], tmp_path)
    assert rc != 0 and "Traceback" not in err, err[-3000:]
    assert "RUNNING" not in statuses(uri, "pobench"), statuses(uri, "pobench")


def test_a_key_given_twice_in_a_config_is_one_line_and_merge_keys_still_override(tmp_path):
    """Round 6: `algo: grpo` then `algo: dapo` in one --config trained dapo without a word (YAML's loader keeps the
    last). Now one line naming the key and its line; a `<<: *base` merge overridden by a key stays valid YAML."""
    from bench.inputs import read_yaml

    (tmp_path / "twice.yaml").write_text("algo: grpo\nsteps: 2\nalgo: dapo\n")
    with pytest.raises(ValueError, match=r"at line 3, column 1: the key 'algo' is given twice"):
        read_yaml(tmp_path / "twice.yaml")
    (tmp_path / "merge.yaml").write_text("base: &b {lr: 1, steps: 2}\nrun:\n  <<: *b\n  lr: 3\n")
    assert read_yaml(tmp_path / "merge.yaml")["run"] == {"lr": 3, "steps": 2}


def test_a_store_that_is_a_dangling_symbolic_link_is_one_line_before_any_work(tmp_path):
    """Round 6: `mlflow.db` a link to a missing file: ~100 s of MLflow's retries, then "deleted while in use"."""
    from bench import faults

    (tmp_path / "mlflow.db").symlink_to(tmp_path / "gone" / "x.db")
    with pytest.raises(faults.StoreFault, match="is a symbolic link to .*which does not exist"):
        faults.check_store(f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_a_final_folder_moved_away_and_linked_back_is_replaced_and_its_target_kept(tmp_path):
    """Round 6: `final` moved to a model zoo and symlinked back: the next final left pobench's own `.final.old` link,
    which a later resume refused as "something not pobench's". Now the link goes, the zoo's copy stays."""
    run = claim_run_folder(tmp_path / "run")
    checkpoint.save_final(run, lambda d: (d / "w.bin").write_bytes(b"1"))
    zoo = tmp_path / "zoo" / "m"
    zoo.parent.mkdir()
    (run / "final").rename(zoo)
    (run / "final").symlink_to(zoo)
    for n in (b"2", b"3"):
        checkpoint.save_final(run, lambda d, n=n: (d / "w.bin").write_bytes(n))
        assert not (run / ".final.old").exists() and not (run / ".final.old").is_symlink()
        assert not (run / "final").is_symlink() and (run / "final" / "w.bin").read_bytes() == n
    assert (zoo / "w.bin").read_bytes() == b"1"


def test_a_resume_replaces_a_linked_config_and_never_writes_through_it(tmp_path, bench_here):
    """Round 7: a run's config.yaml hard-linked by a backup (`cp -al`), or symlinked to the user's hand-edited YAML,
    was rewritten in place by `bench train --resume` (a longer --steps rewrites it): the backup's config said 2 steps
    beside its 1-step checkpoint, the user's file lost its comments. Now the file is replaced, the links' targets
    keep what they held."""
    argv = ["train", "--run-name", "r", *TINY]
    steps = argv.index("--steps") + 1

    def resume(n: int) -> None:
        rc, _, err = bench_here([*argv[:steps], str(n), *argv[steps + 1:], "--resume"], tmp_path)
        assert rc == 0, err[-3000:]
        assert not (run / "config.yaml").is_symlink() and f"steps: {n}" in (run / "config.yaml").read_text()

    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    run = next(tmp_path.glob(".pobench/runs/*/r"))
    backup = tmp_path / "backup"
    backup.mkdir()
    for name in ("config.yaml", "inputs.json"):
        os.link(run / name, backup / name)
    before = {p.name: p.read_bytes() for p in backup.iterdir()}
    resume(2)
    assert {p.name: p.read_bytes() for p in backup.iterdir()} == before
    mine = tmp_path / "my-master.yaml"
    mine.write_text((run / "config.yaml").read_text() + "# my master config, hand-edited\n")
    (run / "config.yaml").unlink()
    (run / "config.yaml").symlink_to(mine)
    kept = mine.read_text()
    resume(3)
    assert mine.read_text() == kept


def test_an_unknown_parent_run_id_is_one_line_before_the_evaluation_and_a_real_one_is_used(tmp_path, bench_here):
    """Round 7: `bench eval --parent-run-id <unknown>` evaluated, wrote its outputs, then ended in MLflow's
    traceback "Run with id=... not found". Now one line, exit 2, before the model loads; a real id nests the run."""
    from mlflow import MlflowClient

    uri = fresh_store(tmp_path)
    argv = ["eval", "--benchmarks", "arith", "--limit", "2", "--k", "1", "--tracking-uri", uri]
    rc, _, err = bench_here([*argv, "--parent-run-id", "0123456789abcdef0123456789abcdef"], tmp_path)
    assert rc == 2 and "--parent-run-id 0123456789abcdef0123456789abcdef: no such run in" in err, err[-3000:]
    assert "Traceback" not in err and not (tmp_path / ".pobench").exists()
    client = MlflowClient(uri)
    parent = client.create_run(client.create_experiment("train")).info.run_id
    rc, out, err = bench_here([*argv, "--parent-run-id", parent], tmp_path)
    assert rc == 0, err[-3000:]
    child = out.strip().splitlines()[-1].rsplit(" ", 1)[-1]
    assert client.get_run(child).data.tags.get("mlflow.parentRunId") == parent


def test_a_config_pipe_and_a_storage_linked_to_dev_null_are_named_for_what_they_are(tmp_path, bench_here):
    """Round 7: `--config <(...)` or a FIFO was "no such file" (it exists: a pipe, which a command that reads its
    config twice cannot take); `--storage sqlite:///null.db`, a link to /dev/null, was "cannot be reached: disk I/O
    error" with nothing to do. Each is now named for what it is, with what to give instead, exit 2, nothing made."""
    os.mkfifo(tmp_path / "cfg.fifo")
    rc, _, err = bench_here(["train", "--config", "cfg.fifo"], tmp_path)
    assert rc == 2 and "--config cfg.fifo: not a regular file (a pipe or device)" in err, err
    (tmp_path / "null.db").symlink_to(os.devnull)
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--trials", "1", "--storage", "sqlite:///null.db", *TINY[:-2]],
                            tmp_path)
    assert rc == 2, err[-3000:]
    assert f"null.db is not a regular file, a link to {os.devnull}; give the path of a SQLite file" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.fifo", "null.db"]


def test_runs_and_report_in_one_folder_are_refused_before_training(tmp_path, bench_here):
    """Round 7: `bench run --output-dir reports/out` (the report root's default) trained its pairs, then refused to
    write the report into reports/out/pobench, the folder its own runs had just made, calling it "not created by
    pobench". Now one line before any training; the runs and the report in different folders go on as before."""
    argv = ["run", "--algos", "grpo", "--seeds", "0", "--workers", "1", "--no-progress", *TINY]
    rc, out, err = bench_here([*argv, "--output-dir", "reports/out"], tmp_path)
    assert rc == 2 and "put the runs and the report of experiment 'pobench' in one folder" in err, err[-3000:]
    assert "finished" not in out and not (tmp_path / "reports").exists()


def test_a_deleted_experiment_is_restored_with_a_note(tmp_path, bench_here):
    """Round 7: an experiment the user deleted in MLflow was made active again without a word by the next command
    that records into it. It still is (its runs come back with it), and the command says so."""
    from mlflow import MlflowClient

    uri = fresh_store(tmp_path)
    client = MlflowClient(uri)
    client.delete_experiment(client.create_experiment("gone", artifact_location=str(tmp_path / "art")))
    rc, _, err = bench_here(["train", "--run-name", "r", "--experiment", "gone", "--tracking-uri", uri, *TINY],
                            tmp_path)
    assert rc == 0, err[-3000:]
    assert "pobench: note: experiment 'gone' had been deleted in the MLflow store" in err, err
    assert client.get_experiment_by_name("gone").lifecycle_stage == "active"


def test_a_store_deleted_during_bench_eval_is_said_when_the_evaluation_is_logged(tmp_path, bench_here, monkeypatch):
    """Round 7: `mlflow.db` deleted while `bench eval` evaluated: MLflow made a fresh store at the same path and the
    evaluation went into it, silently (the runs the old one held gone without a word). Now a warning says so."""
    from bench.cli import eval as eval_cmd

    uri = fresh_store(tmp_path)
    real = eval_cmd.evaluate

    def deleting(*a, **kw):  # the store deleted while the benchmark is evaluated
        (tmp_path / "mlflow.db").unlink(missing_ok=True)
        return real(*a, **kw)

    monkeypatch.setattr(eval_cmd, "evaluate", deleting)
    rc, _, err = bench_here(["eval", "--benchmarks", "arith", "--limit", "2", "--k", "1", "--tracking-uri", uri],
                            tmp_path)
    assert rc == 0, err[-3000:]
    assert f"the MLflow store {tmp_path / 'mlflow.db'} was deleted while the evaluation ran" in err, err
