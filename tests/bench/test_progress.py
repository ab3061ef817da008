"""Progress where the output is a log file (issue 21 item 8): `bench run` prints plain lines (each pair started and
finished, a status line at most every POBENCH_PROGRESS_EVERY seconds) instead of a live display, and `bench train`
prints each held-out evaluation and a status line. (Under pytest the output is no terminal, as in a log file.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import main
from bench.cli.progress import TrainProgress
from bench.comparison import ComparisonSpec, base_config, run_comparison
from tests.conftest import fresh_store

from .fake_trainer import fake_step0, fake_train


def _run(tmp_path: Path):
    cfg = base_config(None, steps=3, eval_every=1, checkpoint_every=1, samples_every=0, experiment="log",
                      tracking_uri=fresh_store(tmp_path), output_dir=str(tmp_path / "runs"))
    return run_comparison(ComparisonSpec(cfg, ["grpo", "tepo"], [0], train_fn=fake_train, step0_fn=fake_step0,
                                         progress=True, report=False, workers=1))


def test_bench_run_in_a_log_file_prints_plain_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POBENCH_PROGRESS_EVERY", "0")  # a status line at every step
    res = _run(tmp_path)
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\r" not in out + err  # no terminal control sequences in the log
    lines = out.splitlines() + err.splitlines()  # progress on stdout, pair outcomes on stderr
    assert "  [1/2] training grpo seed 0" in out.splitlines() and "  [2/2] training tepo seed 0" in lines
    status = [x for x in lines if x.startswith(f"  comparison {res.comparison}: ")]
    done = [int(x.split(": ")[1].split("/")[0]) for x in status]
    assert done == sorted(done) and done[-1] == 6 and len(status) >= 6  # every step of both pairs, in order
    assert "grpo s0 step 1/3 (reward " in "\n".join(status)
    assert [x for x in lines if x.endswith(")") and ": finished (run " in x] == [
        f"  grpo seed 0: finished (run {res.pairs[0].run_id})", f"  tepo seed 0: finished (run {res.pairs[1].run_id})"]


def test_status_lines_are_spaced_by_the_interval(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POBENCH_PROGRESS_EVERY", "3600")
    res = _run(tmp_path)
    out = capsys.readouterr().out
    assert f"comparison {res.comparison}: " not in out and "[2/2] training tepo seed 0" in out


def test_a_bad_interval_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POBENCH_PROGRESS_EVERY", "often")
    with pytest.raises(ValueError, match="POBENCH_PROGRESS_EVERY='often'"):
        _run(tmp_path)


def test_train_progress_lines(capsys):
    with TrainProgress("grpo-s0", 4, every=0) as p:
        p.evaluated(0, {"eval/accuracy": 0.25})
        p.step(1, {"rollout/reward_mean": 0.5})
        p.step(2, {})
    with TrainProgress("grpo-s0", 4, enabled=False) as q:
        q.step(1, {"rollout/reward_mean": 0.5})
    assert capsys.readouterr().out.splitlines() == [
        "bench train: grpo-s0: held-out accuracy 0.2500 at step 0",
        "bench train: grpo-s0: step 1/4 after 0s, reward 0.500  held-out acc 0.250",
        "bench train: grpo-s0: step 2/4 after 0s, reward 0.500  held-out acc 0.250"]


@pytest.mark.slow
def test_bench_train_shows_each_evaluation(tmp_path, capsys):
    uri = fresh_store(tmp_path)
    assert main(["train", "--algo", "grpo", "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
                 "--max-new-tokens", "8", "--eval-problems", "4", "--eval-every", "1", "--samples-every", "0",
                 "--tracking-uri", uri, "--output-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    for step in (0, 1, 2):
        assert " held-out accuracy " in out and f" at step {step}\n" in out
    assert main(["train", "--algo", "grpo", "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
                 "--max-new-tokens", "8", "--eval-problems", "4", "--eval-every", "1", "--samples-every", "0",
                 "--tracking-uri", uri, "--output-dir", str(tmp_path / "runs2"), "--no-progress"]) == 0
    assert "held-out accuracy" not in capsys.readouterr().out
