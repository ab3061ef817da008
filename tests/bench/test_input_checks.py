"""Bad input meets a clear answer before any training: flags every message suggests exist, degenerate configurations
are refused or warned about, data files with a BOM or bad rows are handled as documented."""

from __future__ import annotations

import json
import time

import pytest

from bench import cli
from bench.cli.flags import config_from_args
from tests.conftest import fresh_store

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


# ------------------------------------------------------------------ degenerate configurations
@pytest.mark.parametrize("argv, field", [
    (["train", "--group-size", "1"], "group_size"),
    (["train", "--lr", "inf"], "lr"),
    (["train", "--lr", "nan"], "lr"),
    (["train", "--temperature", "inf"], "temperature"),
    (["run", "--group-size", "1", "--no-progress"], "group_size"),
    (["run", "--lr", "inf", "--no-progress"], "lr"),
])
def test_degenerate_config_is_refused_naming_the_field(argv, field, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"`{field}`" in err and len(err.strip().splitlines()) == 1, err
    assert time.perf_counter() - t0 < 30  # refused before any model is loaded or run trained
    assert not (tmp_path / ".pobench").exists()


def test_empty_algos_is_an_error_not_the_defaults(capsys, tmp_path, monkeypatch):
    from bench.comparison.plan import resolve_algos

    for given in ("", " , ", []):
        with pytest.raises(ValueError, match="names no objective"):
            resolve_algos(given)
    monkeypatch.chdir(tmp_path)
    # --steps 0 would stop a run of the defaults too, with another message: the message tells them apart
    assert cli.main(["run", "--algos", "", "--steps", "0", "--no-progress"]) == 2
    assert "--algos '' names no objective" in capsys.readouterr().err


def test_unknown_characters_are_warned_with_count_and_example(capsys):
    from bench.model import load_policy, unknown_characters, warn_unknown_characters

    _, tok = load_policy("builtin:tiny-arith")
    texts = ["What is 2 + 3?", "小明有 3 个苹果, 吃了 1 个", "Add 😀 and 1", "Plain ASCII, 100% known: ~`|{}"]
    assert unknown_characters(tok, texts) == (2, "小", texts[1])
    assert warn_unknown_characters(tok, texts, "training prompts") == 2
    err = capsys.readouterr().err
    assert "2 of 4 training prompts" in err and "'小'" in err and "<unk>" in err
    assert warn_unknown_characters(tok, [texts[0], texts[3]], "prompts") == 0
    assert capsys.readouterr().err == ""


def test_training_warns_about_unknown_characters_before_the_first_step(tmp_path, capsys):
    """The loop itself warns (before step 1), for the training and the held-out prompts."""
    from bench.config import TrainConfig
    from bench.engines.entry import train

    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [*GSM, {"question": "小明有 3 个苹果", "answer": "#### 3"}]))
    cfg = TrainConfig(task="gsm8k", data=str(data), eval_data=str(data), steps=1, prompts_per_step=2, group_size=2,
                      max_new_tokens=8, eval_every=0, eval_problems=3, samples_every=0, track_ref_kl=False,
                      output_dir=str(tmp_path / "runs"), tracking_uri=fresh_store(tmp_path))
    train(cfg)
    err = capsys.readouterr().err
    assert "1 of 3 training prompts contain characters the tokenizer does not know" in err
    assert "1 of 3 held-out prompts" in err
