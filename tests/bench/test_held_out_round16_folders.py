"""Held-out round 16, run folders: `bench run --force` replaced the user's edit of pobench's own ``config.yaml`` in a
finished pair's run folder without a word (H05), and deleted a user's symbolic link named like a checkpoint
(``ckpt-0000009 -> their folder``: the name was taken for pobench's, H06). Now an edited file pobench recorded is
refused before any work, in reports.edits' one line, exit 2; an entry pobench did not write is kept and named
whatever its name: a checkpoint is pobench's only as a folder holding its ``state.json`` (or, while written, its
marker), which rotation and a resume's leftover cleaning ask too (the fake trainer: training is not the subject)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from bench.runs import checkpoint
from bench.runs.folders import check_removable, claim_run_folder, not_written, remove_run_folder
from reports.paths import LISTING
from tests.conftest import fresh_store

ARGV = ["run", "--algos", "grpo,dapo", "--seeds", "0", "--no-controls", "--workers", "1", "--steps", "2",
        "--eval-every", "1", "--samples-every", "0", "--no-progress", "--no-report", "--output-dir", "runs"]


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip() and " INFO mlflow" not in ln]


def _files(folder: Path) -> dict[str, bytes | str]:
    return {str(p.relative_to(folder)): os.readlink(p) if p.is_symlink() else p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_symlink() or p.is_file()}


def _comparison(tmp_path: Path, bench_here, monkeypatch) -> tuple[list[str], Path, Path]:
    """The user's finished comparison (one grpo and one dapo pair), its argv and its two run folders."""
    from tests.bench.fake_trainer import inject

    inject(monkeypatch.setattr)
    argv = [*ARGV, "--tracking-uri", fresh_store(tmp_path)]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    grpo, dapo = (next((tmp_path / "runs" / "pobench").glob(f"{a}-s0-*")) for a in ("grpo", "dapo"))
    return argv, grpo, dapo


def _n_runs(uri: str) -> int:
    client = MlflowClient(uri)
    return len(client.search_runs([client.get_experiment_by_name("pobench").experiment_id]))


def test_h05_force_refuses_a_config_yaml_the_user_edited_before_any_work(tmp_path, bench_here, monkeypatch):
    """H05: `# my comment` appended to pobench's ``config.yaml``, ``notes.md`` and ``ckpt-N/mynote.txt`` added; the
    same `bench run ... --force`: the user's files were kept and named, the edited ``config.yaml`` replaced silently.
    Now one line naming it (reports.edits' wording), exit 2, before any run is deleted or trained: every file as the
    user left it, no MLflow run added; once it is moved away (the advice), the same command retrains, the added files
    kept and named. A run folder of a pobench before the digests (no listing) is replaced as before."""
    argv, grpo, _ = _comparison(tmp_path, bench_here, monkeypatch)
    with (grpo / "config.yaml").open("a") as fh:
        fh.write("# my comment\n")
    (grpo / "notes.md").write_text("my notes")
    ckpt = checkpoint.latest(grpo)
    (ckpt / "mynote.txt").write_text("why this step")
    before, n_runs = _files(tmp_path / "runs"), _n_runs(argv[-1])
    rc, out, err = bench_here([*argv, "--force"], tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert f"the run folder {grpo.relative_to(tmp_path)}: config.yaml changed since pobench wrote it (your edits): " \
           "not replacing it; move it away (or copy your edits elsewhere), then run the same command again" in lines[0]
    assert _files(tmp_path / "runs") == before and _n_runs(argv[-1]) == n_runs  # nothing deleted, trained, recorded
    (grpo / "config.yaml").rename(tmp_path / "my-config.yaml")
    rc, out, err = bench_here([*argv, "--force"], tmp_path)
    assert rc == 0, err[-3000:]
    kept = [ln for ln in _lines(err) if ln.startswith("--force: kept")]
    assert len(kept) == 1 and f"{ckpt.name}/mynote.txt" in kept[0] and "notes.md" in kept[0], err[-3000:]
    assert (grpo / "notes.md").read_text() == "my notes" and (ckpt / "mynote.txt").read_text() == "why this step"
    assert "# my comment" not in (grpo / "config.yaml").read_text()  # written again, recorded again
    assert "# my comment" in (tmp_path / "my-config.yaml").read_text()
    # a run folder of a pobench before the digests: no listing, its config.yaml replaced as before
    (grpo / LISTING).unlink()
    with (grpo / "config.yaml").open("a") as fh:
        fh.write("# an edit no digest tells\n")
    check_removable(grpo)


def test_h06_force_keeps_a_users_link_named_like_a_checkpoint(tmp_path, bench_here, monkeypatch):
    """H06: in the dapo pair's run folder a link ``ckpt-0000009 -> userdir`` (the user's folder) and a link
    ``link.txt -> ../userfile.txt``; the same `bench run ... --force` kept and named ``link.txt`` but deleted the
    link ``ckpt-0000009`` without a word (its name matched the checkpoints'). Now both are kept and named in the one
    line, their targets untouched, and the pair retrained beside them."""
    argv, _, dapo = _comparison(tmp_path, bench_here, monkeypatch)
    userdir = tmp_path / "userdir"
    userdir.mkdir()
    (userdir / "a").write_text("mine")
    (tmp_path / "runs" / "pobench" / "userfile.txt").write_text("my file")
    (dapo / "ckpt-0000009").symlink_to(userdir)
    (dapo / "link.txt").symlink_to("../userfile.txt")
    rc, out, err = bench_here([*argv, "--force"], tmp_path)
    assert rc == 0, err[-3000:]
    kept = [ln for ln in _lines(err) if ln.startswith("--force: kept")]
    assert len(kept) == 1 and "ckpt-0000009" in kept[0] and "link.txt" in kept[0] and dapo.name in kept[0], err
    assert os.readlink(dapo / "ckpt-0000009") == str(userdir) and os.readlink(dapo / "link.txt") == "../userfile.txt"
    assert (userdir / "a").read_text() == "mine" and (dapo.parent / "userfile.txt").read_text() == "my file"
    assert checkpoint.latest(dapo) is not None and checkpoint.latest(dapo).name != "ckpt-0000009"  # retrained


def test_h06_rotation_and_leftover_cleaning_ask_what_pobench_wrote_not_the_name(tmp_path, capsys):
    """H06, the same question where checkpoints rotate (``--keep-checkpoints``) and where a resume clears a write's
    leftover: a user's link named like a newer checkpoint (to a checkpoint kept on another disk) counted as the
    newest, so the rotation deleted the checkpoint just written; a user's folder named like a temporary checkpoint
    (``ckpt-N.tmp``) was deleted whole by the next checkpoint of that step and by `--force`. Now neither is counted
    nor touched: the link stays, the folder is named (and refused where pobench writes that step), while pobench's own
    leftover (its marker, or, written before the marker, only its files) is still cleared."""
    run = claim_run_folder(tmp_path / "run")
    elsewhere = tmp_path / "bigdisk" / "ckpt9"
    checkpoint.save_state(claim_run_folder(tmp_path / "other"), 9, {"note": "another run's"})
    elsewhere.parent.mkdir()
    (tmp_path / "other" / "ckpt-0000009").rename(elsewhere)
    (run / "ckpt-0000009").symlink_to(elsewhere)
    for step in (1, 2):
        checkpoint.save_state(run, step, {"note": "x"}, keep=1)
    assert (run / "ckpt-0000002" / "state.json").is_file() and not (run / "ckpt-0000001").exists()
    assert (elsewhere / "state.json").is_file() and (run / "ckpt-0000009").is_symlink()
    mine = run / "ckpt-0000003.tmp"
    mine.mkdir()
    (mine / "draft.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="pobench did not write"):
        checkpoint.save_state(run, 3, {"note": "y"})
    assert (mine / "draft.txt").read_text() == "mine"
    assert set(not_written(run)) == {run / "ckpt-0000009", mine / "draft.txt"}
    assert set(remove_run_folder(run, tmp_path)) == {run / "ckpt-0000009", mine / "draft.txt"}
    assert (mine / "draft.txt").read_text() == "mine" and (elsewhere / "state.json").is_file()
    for leftover in ("ckpt-0000004.tmp", "ckpt-0000005.tmp"):  # pobench's: marked, or only its files (before it)
        (run / leftover).mkdir()
    (run / "ckpt-0000004.tmp" / ".pobench-owned").write_text("checkpoint\n")
    (run / "ckpt-0000005.tmp" / "model.pt").write_bytes(b"half")
    checkpoint.save_state(run, 4, {"note": "z"})
    checkpoint.save_state(run, 5, {"note": "z"})
    assert (run / "ckpt-0000005" / "state.json").is_file() and not list(run.glob("ckpt-000000[45].tmp"))
    # a link at the very step pobench writes: replaced, as a linked `final` is, and said; its target untouched
    (run / "ckpt-0000009").unlink()
    (run / "ckpt-0000006").symlink_to(elsewhere)
    capsys.readouterr()
    checkpoint.save_state(run, 6, {"note": "w"})
    assert "ckpt-0000006 was a link pobench did not write" in capsys.readouterr().err
    assert not (run / "ckpt-0000006").is_symlink() and (elsewhere / "state.json").is_file()


def test_h05_a_resume_rewriting_config_yaml_refuses_the_users_edit_and_a_plain_resume_keeps_it(tmp_path):
    """H05, `bench train --resume` (``resume.check``, before any work): a larger ``--steps`` rewrites the run's
    ``config.yaml`` (``resume.record_extension``): the user's edit of it is refused in the same line; a resume with
    the same steps replaces nothing there and goes on (a resume keeps the files it does not rewrite)."""
    from dataclasses import replace

    from bench.config import TrainConfig
    from bench.runs import resume
    from bench.runs.folders import write_recorded
    from reports.edits import EditedOutputs

    cfg = TrainConfig(steps=2, output_dir=str(tmp_path), run_name="r")
    run = claim_run_folder(cfg.run_dir())
    resume.record_inputs(run, cfg)
    write_recorded(run / "config.yaml", cfg.save)
    checkpoint.save_state(run, 1, {"note": "x"})
    with (run / "config.yaml").open("a") as fh:
        fh.write("# my comment\n")
    resume.check(replace(cfg, resume=True), run)
    with pytest.raises(EditedOutputs, match=r"config.yaml changed since pobench wrote it \(your edits\): not replac"):
        resume.check(replace(cfg, steps=3, resume=True), run)
    assert (run / "config.yaml").read_text().endswith("# my comment\n")
