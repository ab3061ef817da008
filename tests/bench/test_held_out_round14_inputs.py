"""Held-out round 14, inputs and wording: a plugin's ``os.chdir`` while its run trains (H15), `bench warmstart`'s
refusals leaving a folder (H18), a symbolic link loop given as an input file (H23), and the wording of H13, H17 and
R3/H19: each one line naming its cause, nothing made on exit 2."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import fresh_store

TINY = ["--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--samples-every", "0",
        "--no-progress"]


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip() and " INFO mlflow" not in ln]


def _statuses(db: Path) -> dict[str, str]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return dict(con.execute("select name, status from runs"))
    finally:
        con.close()


# ------------------------------------------------------------------ H15: a plugin's os.chdir while its run trains
CHDIR = '''import os
from algorithms import register, register_advantage
_n = [0]


def kp(rewards):
    _n[0] += 1
    if _n[0] == 2:
        os.makedirs("elsewhere", exist_ok=True)
        os.chdir("elsewhere")
    return rewards - rewards.mean(dim=1, keepdim=True)


register_advantage("adv-cdmid", kp, description="changes the working folder at its 2nd call (test)")
register("grpo-cdmid", base="grpo", description="x", advantage_estimator="adv-cdmid")
'''


def test_a_plugin_changing_the_working_folder_while_its_run_trains_is_named(tmp_path, bench_here):
    """Held-out round 14 (H15): a plugin's advantage estimator calling ``os.chdir`` at its 2nd call: `bench train`
    said the run folder "was deleted, or its marker removed" (it was not: the working folder had changed under its
    relative paths), advised moving it away and training again from step 0, the plugin not named. Now the plugin's
    call is refused where it is made: one line naming the plugin's file and line and what to do, exit 1, the run
    FAILED, its checkpoint kept, and the way on
    named (the fixed plugin trains a new run); the working folder is the command's."""
    (tmp_path / "p_cdmid.py").write_text(CHDIR)
    uri = fresh_store(tmp_path)
    rc, _, err = bench_here(["train", "--plugin", "p_cdmid.py", "--algo", "grpo-cdmid", "--steps", "6",
                             "--checkpoint-every", "1", "--eval-every", "0", "--run-name", "c", *TINY,
                             "--tracking-uri", uri], tmp_path)
    lines = _lines(err)
    assert rc == 1 and len(lines) == 1, (rc, err[-3000:])
    assert "deleted" not in lines[0] and "p_cdmid.py:10 (in kp)" in lines[0] and "os.chdir" in lines[0], lines[0]
    assert Path.cwd() == tmp_path and not (tmp_path / "elsewhere").exists() or \
        not any((tmp_path / "elsewhere").iterdir())
    run = tmp_path / ".pobench" / "runs" / "pobench" / "c"
    assert sorted(p.name for p in run.glob("ckpt-*")) == ["ckpt-0000001"], sorted(run.iterdir())
    assert "with --run-name, give another" in lines[0], lines[0]  # (a changed plugin: --resume is refused)
    assert _statuses(tmp_path / "mlflow.db") == {"c": "FAILED"}


# ------------------------------------------------------------------ H18: bench warmstart's refusals make nothing
def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("flags, says", [
    (["--difficulty", "0"], "arith difficulty 0 is not defined; valid: [1, 2, 3, 4]"),
    (["--difficulty", "99"], "arith difficulty 99 is not defined"),
    (["--steps", "0"], "steps=0 must be >= 1"),
    (["--eval", "-1"], "--eval -1: must be >= 0"),
    (["--seed", "-1"], "--seed -1"),
    ([], "exists and holds files pobench did not write"),  # (m/ holds a user's file)
], ids=["difficulty-0", "difficulty-99", "steps-0", "eval-neg", "seed-neg", "users-folder"])
def test_a_refused_warmstart_makes_nothing(tmp_path, bench_here, flags, says):
    """Held-out round 14 (H18): `bench warmstart --out m --difficulty 0` (or 99) was refused in one line but left a
    folder ``m/`` holding ``.pobench-owned`` (and the lock folder ``.locks/``): the folder was claimed before the
    difficulty was checked. Every refusal of `bench warmstart` is now one line, exit 2, nothing made (the user's
    folder ``m/`` refused before the lock is taken)."""
    if not flags:
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "notes.txt").write_text("mine\n")
    before = _tree(tmp_path)
    rc, out, err = bench_here(["warmstart", "--out", "m", "--no-progress", *flags], tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and says in lines[0], (rc, err[-2000:])
    assert _tree(tmp_path) == before


# ------------------------------------------------------------------ H23: a symbolic link loop given as an input file
@pytest.mark.parametrize("argv, flag", [
    (["train", "--task", "gsm8k", "--data", "loop.jsonl", "--steps", "2"], "--data loop.jsonl"),
    (["train", "--config", "cfg.yaml"], "--config cfg.yaml"),
    (["eval", "--benchmarks", "gsm8k", "--data", "gsm8k=loop.jsonl"], "--data loop.jsonl"),
    (["train", "--plugin", "lp.py", "--steps", "2"], "plugin lp.py"),
], ids=["train-data", "config", "eval-data", "plugin"])
def test_a_symbolic_link_loop_given_as_an_input_file_is_named_for_what_it_is(tmp_path, bench_here, argv, flag):
    """Held-out round 14 (H23): ``ln -s loop.jsonl loop.jsonl`` given as ``--data`` / ``--config`` was "no such
    file" though ``ls`` lists it (a plugin file so linked: Python's "Symlink loop" traceback). Now one line says it is
    a symbolic link that points to itself (a loop), exit 2, nothing made (``evaluators.hints.missing_file``: the one
    wording of a missing input file)."""
    for name in ("loop.jsonl", "cfg.yaml", "lp.py"):
        (tmp_path / name).symlink_to(name)
    before = _tree(tmp_path)
    rc, _, err = bench_here([*argv, *TINY], tmp_path) if argv[0] == "train" else bench_here(argv, tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1, (rc, err[-2000:])
    assert f"{flag}: a symbolic link that points to itself" in lines[0] and "(a loop" in lines[0], lines[0]
    assert _tree(tmp_path) == before


# ------------------------------------------------------------------ wording of the round's PASS rows
@pytest.mark.parametrize("space", ["sp1.yaml", "nofile.yaml"])
def test_a_file_given_to_space_is_said_not_to_be_read(tmp_path, bench_here, space):
    """Held-out round 14 (H13): `bench tune --space sp1.yaml` was refused as "expected name=low:high, ..." only, as
    if the file had been read and found wrong. The line now says --space takes the ranges themselves, not a file,
    exit 2, nothing made."""
    (tmp_path / "sp1.yaml").write_text("lr: [1.0e-6, 1.0e-4]\n")
    before = _tree(tmp_path)
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--trials", "1", "--steps", "2", *TINY[:6], "--space",
                             space], tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1, (rc, err[-2000:])
    assert f"--space item '{space}': expected name=low:high" in lines[0] and "not a file" in lines[0], lines[0]
    assert _tree(tmp_path) == before


def test_a_file_where_the_default_output_folder_goes_is_named_as_the_default(tmp_path, bench_here):
    """Held-out round 14 (H17): a user's file ``.pobench`` where pobench keeps runs: `bench train` said
    "--output-dir .pobench/runs: not a folder", naming a flag the user did not give. The line now names the folder
    as --output-dir's default and says to move the file away or give another --output-dir, exit 2, the file kept;
    a given --output-dir is still named as given."""
    (tmp_path / ".pobench").write_text("mine\n")
    rc, _, err = bench_here(["train", "--steps", "2", *TINY], tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1, (rc, err[-2000:])
    assert ": error: .pobench/runs (the default --output-dir): not a folder (" in lines[0] and \
        "move that file away, or give another --output-dir" in lines[0], lines[0]
    assert (tmp_path / ".pobench").read_text() == "mine\n"
    rc, _, err = bench_here(["train", "--steps", "2", *TINY, "--output-dir", ".pobench/mine"], tmp_path)
    assert rc == 2 and "error: --output-dir .pobench/mine: not a folder" in err, err[-2000:]


SELFEDIT = '''import os
from algorithms import register
register("grpo-selfedit", base="grpo", description="appends to its own file at every import (test)")
with open(__file__, "a") as f:
    f.write(f"# loaded pid {os.getpid()}\\n")
'''


def test_a_plugin_editing_itself_at_import_is_said_once_naming_its_file(tmp_path, bench_here):
    """Held-out round 14 (R3/H19): a plugin appending to its own file at every import, `bench run --workers 2` of
    2 pairs: round 13's refusal held (nothing trained), but its sentence "rerun the same command once the plugin files
    stay unchanged" came 6 times (each pair's progress line, its detail, the summary) and is a dead end for such a
    plugin. Now each pair's line is short and names the file; the whole line, with both digests and what to do
    about a plugin that writes its own file, comes once."""
    (tmp_path / "p_selfedit.py").write_text(SELFEDIT)
    rc, out, err = bench_here(["run", "--plugin", "p_selfedit.py", "--algos", "grpo-selfedit", "--seeds", "0,1",
                               "--no-controls", "--workers", "2", "--steps", "1", *TINY[:6], "--eval-every", "0",
                               "--no-report", "--no-progress"], tmp_path)
    assert rc == 1 and "Traceback" not in out + err, (out + err)[-3000:]
    for seed in (0, 1):
        assert f"seed {seed}: failed: the plugins changed on disk while the command started its worker processes: " \
            "p_selfedit.py (nothing trained with them)" in out, out[-3000:]
    assert (out + err).count("rerun the same command once p_selfedit.py stays unchanged (a plugin that writes its "
                             "own file when imported") == 1, (out + err)[-3000:]
    assert not (tmp_path / ".pobench" / "runs" / "pobench").exists() or \
        not list((tmp_path / ".pobench" / "runs" / "pobench").glob("*/ckpt-*"))
