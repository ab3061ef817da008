"""Inputs checked before work (bench/preflight.py): sources resolved and read before any model loads, offline sources
named by their flag, unparseable reference answers and over-long prompts counted, a --params file for another
objective refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench import cli, preflight
from bench.comparison.plan import load_params
from bench.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def gsm(path: Path, answers: list[str], question: str = "Ann has 2 pens and gets 3 more. How many?") -> Path:
    path.write_text("".join(json.dumps({"question": question, "answer": f"so\n#### {a}"}) + "\n" for a in answers))
    return path


@pytest.mark.parametrize("argv", [["run", "--algos", "grpo", "--seeds", "0", "--no-progress"], ["train"],
                                  ["eval", "--model", "builtin:tiny-arith", "--benchmarks", "gsm8k", "--no-mlflow"]])
def test_no_parseable_answer_is_refused_before_any_work(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bad = gsm(tmp_path / "bad.jsonl", ["banana", "pear", "plum"])
    data = ["--data", str(bad)] if argv[0] == "eval" else ["--task", "gsm8k", "--data", str(bad), "--eval-data",
                                                           str(bad)]
    assert cli.main([*argv, *data]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none of the 3 reference answers" in err and "'banana'" in err, err
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl"]  # no store, no run folder, no output


def test_some_unparseable_answers_and_long_prompts_are_counted(tmp_path):
    data = gsm(tmp_path / "d.jsonl", ["5", "banana", "7", "8"])
    long = tmp_path / "long.jsonl"  # the built-in model reads characters: 400 of them with 48 new tokens pass 256
    long.write_text("".join(json.dumps({"question": q, "answer": "#### 2"}) + "\n"
                            for q in ("1+1 " * 100, "1+1?", "1+1 " * 100, "1+1 " * 55)))  # 220: only with 48
    warnings = preflight.check_inputs(TrainConfig(task="gsm8k", data=str(data), eval_data=str(long),
                                                  max_new_tokens=48))
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("1 of 4 reference answers of the training data (--data ")
    assert "'banana'" in warnings[0]
    assert warnings[1].startswith("3 of 4 held-out prompts plus --max-new-tokens 48 exceed the model's context of "
                                  "256 tokens")


OFFLINE_COMMANDS = {"train": [], "run": ["--algos", "grpo", "--no-progress"], "tune": ["--algo", "grpo"]}
_ONE_PROCESS = """
import json, os, sys, time
from bench.cli.main import main
for cmd, (folder, argv) in json.loads(sys.argv[1]).items():
    os.chdir(folder)
    t0 = time.perf_counter()
    rc = main(argv)
    print(f"=== {cmd} {rc} {time.perf_counter() - t0:.1f}", file=sys.stderr, flush=True)
"""


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> dict[str, tuple[int, list[str], float, Path]]:
    """``{command: (exit code, stderr lines, seconds, folder)}`` of `bench train|run|tune ... --task gsm8k --data
    FILE` with HF_HUB_OFFLINE=1, each in a folder of its own, one after another in one fresh process: the hub
    libraries read the offline setting when they are imported, as in the user's process (a process for each of the
    three commands imported everything three times: ~7 CPU-seconds each). Everything the process wrote to stderr is
    in the lines of the command that wrote it."""
    root = tmp_path_factory.mktemp("offline")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HOME": str(root / "hf"),
           "POBENCH_CACHE_DIR": str(root / "cache")}
    env.pop("POBENCH_DATA_DIR", None)
    plan = {}
    for cmd, extra in OFFLINE_COMMANDS.items():
        (root / cmd).mkdir()
        data = gsm(root / cmd / "train.jsonl", ["5", "6"])
        plan[cmd] = [str(root / cmd), [cmd, *extra, "--task", "gsm8k", "--data", str(data)]]
    done = subprocess.run([sys.executable, "-c", _ONE_PROCESS, json.dumps(plan)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got, lines = {}, []
    for line in done.stderr.splitlines():
        if line.startswith("=== "):
            _, cmd, rc, seconds = line.split()
            got[cmd] = (int(rc), lines, float(seconds), root / cmd)
            lines = []
        else:
            lines.append(line)
    assert list(got) == list(OFFLINE_COMMANDS) and not lines, done.stderr[-3000:]
    return got


@pytest.mark.parametrize("cmd", list(OFFLINE_COMMANDS))
def test_offline_hub_source_is_one_line_naming_the_flag(cmd, offline):
    rc, lines, seconds, folder = offline[cmd]
    assert rc == 2, lines[-40:]
    assert "\n".join(lines).strip().splitlines() == [
        f"bench {cmd}: error: --eval-data: the test split of gsm8k (openai/gsm8k) could not be read from the Hugging "
        "Face hub (HF_HUB_OFFLINE is set); pass a local JSONL / JSON / parquet file or folder with --eval-data PATH"]
    assert seconds < 60  # no retries
    assert not (folder / "mlflow.db").exists() and not (folder / ".pobench").exists()


def test_offline_hub_model_not_in_the_cache_names_model(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert cli.main(["train", "--model", "org/not-cached"]) == 2
    err = capsys.readouterr().err
    assert "--model org/not-cached: not in the local Hugging Face cache" in err and "--model PATH" in err
    refs = tmp_path / "hub" / "models--org--not-cached" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("a" * 40)
    preflight.check_model("org/not-cached")  # cached: accepted


def test_params_written_for_another_objective(tmp_path, capsys, monkeypatch):
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump({"algo": "grpo", "objective_overrides": {"kl_coef": 0.2}}))
    with pytest.raises(ValueError, match=r"objective 'grpo' \(its `algo:` line\).*not among the objectives run "
                                         r"\(dapo\)"):
        load_params(best, ["dapo"])
    assert load_params(best, ["grpo", "dapo"]) == {"grpo": {"kl_coef": 0.2}, "dapo": {}}  # only where it belongs
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--algos", "dapo", "--params", str(best), "--no-progress"]) == 2
    assert "its `algo:` line" in capsys.readouterr().err


# ------------------------------------------------------------------ issue 29: a data file's error names file:line
def _undecodable(path: Path) -> Path:
    """A data file whose third line holds bytes that are not UTF-8 (a Latin-1 "é")."""
    good = json.dumps({"question": "Ann has 2 pens and gets 3 more. How many?", "answer": "#### 5"}).encode()
    path.write_bytes(good + b"\n" + good + b"\n" + b'{"question": "caf\xe9 costs 3", "answer": "#### 3"}\n')
    return path


@pytest.mark.parametrize("suffix, where", [(".jsonl", ":3"), (".json", ":3"), (".parquet", "")])
def test_a_data_file_that_cannot_be_read_is_one_line_naming_file_and_line(suffix, where, tmp_path, monkeypatch,
                                                                         capsys):
    """Non-UTF-8 bytes in a data file crashed the error message itself (bench/preflight.py rebuilt the
    UnicodeDecodeError with one argument: a TypeError traceback); a file that is no parquet gave pyarrow's error. Now
    one line naming ``file:line`` (where the file has lines) and the flag, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    bad = _undecodable(tmp_path / f"bad{suffix}")
    assert cli.main(["train", "--task", "gsm8k", "--data", str(bad), "--eval-data", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("bench train: error: --data: ") and f"{bad}{where}" in err, err
    assert sorted(os.listdir(tmp_path)) == [bad.name]  # no store, no run folder


def test_skip_bad_rows_skips_an_undecodable_line(tmp_path):
    from evaluators.sources import read_file

    rows = read_file(_undecodable(tmp_path / "d.jsonl"), skip_bad_rows=True)
    assert len(rows.rows) == 2 and len(rows.skipped) == 1 and rows.skipped[0].startswith(f"{tmp_path}/d.jsonl:3:")


# ------------------------------------------------------------------ issue 29: values outside an objective's ranges
def test_tepo_thresholds_outside_their_declared_ranges_are_one_warning_before_training(tmp_path, monkeypatch,
                                                                                       capsys):
    """TEPO's KL-mask thresholds beyond the ranges TEPO declares (τ_A = 5 above every standardised advantage of a
    small group, τ_H = 3 nats) keep the mask from ever firing: they were accepted without a word. Now one warning
    line names the objective, each field, its value and its declared range, before any model loads (a warning, not a
    refusal: a value outside the search range can be a deliberate ablation). No objective's defaults warn."""
    from algorithms import default_config, list_objectives

    cfg = TrainConfig(algo="tepo", objective_overrides={"adv_threshold": 5.0, "entropy_threshold": 3.0})
    (line,) = [w for w in preflight.check_inputs(cfg) if "declares" in w]
    assert line.startswith("objective tepo: adv_threshold=5 (declared range [0, 1]), entropy_threshold=3 (declared "
                           "range [0, 0.5]) are outside"), line
    assert not [n for n in list_objectives() if default_config(n).outside_ranges()]
    assert not [w for w in preflight.check_inputs(TrainConfig(algo="tepo", objective_overrides={"kl_coef": 0.0,
                                                                                                "adv_threshold": 5.0}))
                if "declares" in w]  # the mask is off: its threshold acts on nothing


@pytest.mark.slow
def test_bench_run_warns_of_params_outside_an_objective_s_ranges(tmp_path, bench_here, monkeypatch):
    """The same through `bench run --params` (the fake trainer: the warning comes before any pair trains)."""
    from tests.bench import fake_trainer
    from tests.conftest import fresh_store

    fake_trainer.inject(monkeypatch.setattr)
    fresh_store(tmp_path)
    (tmp_path / "p.yaml").write_text("tepo: {adv_threshold: 5.0}\n")
    rc, _, err = bench_here(["run", "--algos", "grpo,tepo", "--params", "p.yaml", "--seeds", "0", "--workers", "1",
                             "--no-progress", "--no-report", "--steps", "1", "--eval-every", "0"], tmp_path)
    assert rc == 0, err[-3000:]
    warned = [ln for ln in err.splitlines() if "declares" in ln]
    assert warned == ["bench run: warning: objective tepo: adv_threshold=5 (declared range [0, 1]) is outside the "
                      "range it declares (bench list --details): a threshold there may keep its term from ever acting "
                      "(TEPO's KL mask); check the value"], err
