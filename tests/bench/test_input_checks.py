"""Bad input meets a clear answer before any training: flags every message suggests exist, degenerate configurations
are refused or warned about, data files with a BOM or bad rows are handled as documented."""

from __future__ import annotations

import json

import pytest

from bench import cli
from bench.cmd_train import config_from_args

GSM = [{"question": "Ann has 2 pens and gets 3 more. How many?", "answer": "2+3=5\n#### 5"},
       {"question": "Bob has 1,000 coins and spends 1. How many?", "answer": "1000-1=999\n#### 999"}]


def _bad_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(GSM[0]) + "\n" + '{"question": "broken\n' + json.dumps(GSM[1]) + "\n")
    return path


@pytest.mark.parametrize("cmd", ["train", "run", "tune", "eval"])
def test_skip_bad_rows_is_accepted_where_messages_suggest_it(cmd):
    """Data errors say "pass --skip-bad-rows": every command that reads data files takes it."""
    required = {"eval": ["--model", "builtin:tiny-arith", "--benchmarks", "gsm8k"]}.get(cmd, [])
    args = cli.build_parser().parse_args([cmd, *required, "--skip-bad-rows"])
    assert args.skip_bad_rows is True


def test_bad_row_message_names_the_flag_and_the_flag_skips_it(tmp_path):
    from bench.data import TrainData, eval_problems

    path = _bad_file(tmp_path)
    with pytest.raises(ValueError, match=r"train.jsonl:2.*--skip-bad-rows"):
        TrainData("gsm8k", seed=0, steps=1, prompts_per_step=1, data=str(path))
    args = cli.build_parser().parse_args(["train", "--task", "gsm8k", "--data", str(path), "--skip-bad-rows"])
    cfg = config_from_args(args)
    data = TrainData(cfg.task, seed=0, steps=1, prompts_per_step=1, data=cfg.data, skip_bad_rows=cfg.skip_bad_rows)
    assert len(data.pool) == 2
    test = tmp_path / "test.jsonl"
    test.write_text(_bad_file(tmp_path).read_text())
    _, problems = eval_problems("gsm8k", limit=10, data=str(test), skip_bad_rows=True)
    assert len(problems) == 2
