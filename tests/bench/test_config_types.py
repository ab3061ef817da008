"""Config values are checked for their type before any work (bench/inputs.py): one line naming the field, the value
and the expected type; numbers written as text (``lr: 1e-5``, a string to YAML 1.1) are numbers; booleans come only
from booleans or true/false words; invalid YAML, a folder or a binary file as ``--config`` is one line. Each of the
issue's "Config files" reproductions is a case here (in-process through ``bench.cli.main``, which is what the console
script runs; a few as real processes)."""

from __future__ import annotations

import argparse
import sys

import pytest

from bench import cli
from bench.cli.flags import config_from_args
from bench.comparison.plan import load_params
from bench.config import TrainConfig
from tests import launch


def _yaml(tmp_path, text: str, name: str = "c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _refused(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("text, expected", [
    ("lr: 1e-5", 1e-5), ("lr: 3E-4", 3e-4), ("lr: '2e-5'", 2e-5), ("lr: 1", 1.0),
])
def test_numbers_written_as_text_are_numbers(tmp_path, text, expected):
    args = cli.build_parser().parse_args(["train", "--config", str(_yaml(tmp_path, text))])
    cfg = config_from_args(args)
    assert cfg.lr == expected and isinstance(cfg.lr, float)


@pytest.mark.parametrize("text, field, expected", [
    ("lr: [1]", "lr", "a number"),
    ('temperature: "hot"', "temperature", "a number"),
    ("adam_betas: 0.9", "adam_betas", "a list of numbers"),
    ("adam_betas: [0.9, fast]", "adam_betas", "a list of numbers"),
    ("objective_overrides: 5", "objective_overrides", "a mapping"),
    ("algo: 5", "algo", "a string"),
    ("model: null", "model", "a string"),
    ("tags: [a]", "tags", "a mapping"),
    ("steps: true", "steps", "an integer"),
    ("steps: 2.5", "steps", "an integer"),
    ('skip_bad_rows: "maybe"', "skip_bad_rows", "true or false"),
    ("skip_bad_rows: 1", "skip_bad_rows", "true or false"),
    ("engine_args: [x]", "engine_args", "a mapping"),
    ("run_name: [x]", "run_name", "a string or null"),
])
@pytest.mark.parametrize("cmd", ["train", "run"])
def test_wrong_type_is_one_line_naming_field_value_and_type(tmp_path, capsys, monkeypatch, text, field, expected,
                                                            cmd):
    monkeypatch.chdir(tmp_path)
    extra = ["--no-progress"] if cmd == "run" else []
    line = _refused(capsys, [cmd, "--config", str(_yaml(tmp_path, text)), *extra])
    value = text.split(":", 1)[1].strip().replace("null", "None")
    assert f"`{field}`=" in line and f"expected {expected}" in line, line
    assert value.strip("\"'[]").split(",")[0] in line  # the value as given
    assert not (tmp_path / ".pobench").exists() and not (tmp_path / "mlflow.db").exists()  # before any work


def test_tags_of_the_wrong_type_fail_before_the_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, ["train", "--config", str(_yaml(tmp_path, "tags: {a: [1, 2]}"))])
    assert "tag 'a'" in line
    assert not (tmp_path / ".pobench").exists()


@pytest.mark.parametrize("word, value", [("true", True), ('"no"', False), ("'off'", False), ("yes", True),
                                         ('"True"', True)])
def test_booleans_from_booleans_and_true_false_words_only(tmp_path, word, value):
    assert TrainConfig.load(_yaml(tmp_path, f"skip_bad_rows: {word}")).skip_bad_rows is value


def test_a_config_built_in_code_is_checked_too():
    cfg = TrainConfig(lr="1e-5", steps="3", objective_overrides={"clip_low": "0.1"})
    cfg.validate()
    assert cfg.lr == 1e-5 and cfg.steps == 3 and cfg.objective_overrides == {"clip_low": 0.1}
    with pytest.raises(ValueError, match=r"`seed`=-1: a seed must be .* \(--seed\)"):
        TrainConfig(seed=-1).validate()


# ------------------------------------------------------------------ objective overrides and --params
def test_objective_overrides_flag_takes_yaml_flow_syntax_as_its_help_shows():
    for text in ("{kl_coef: 0.1}", '{"kl_coef": 0.1}', "{kl_coef: 1e-1}"):
        args = cli.build_parser().parse_args(["train", "--algo", "tepo", "--objective-overrides", text])
        assert config_from_args(args).objective_overrides == {"kl_coef": 0.1}
    args = cli.build_parser().parse_args(["train", "--adam-betas", "[0.9, 0.95]"])
    assert config_from_args(args).adam_betas == [0.9, 0.95]


def test_objective_override_of_the_wrong_type_names_objective_field_and_value(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, ["train", "--algo", "tepo", "--objective-overrides", "{kl_coef: strong}"])
    assert "tepo field `kl_coef`='strong': expected a number" in line


@pytest.mark.parametrize("text, match", [
    ("kl_coef: strong", r"--params .*p.yaml: tepo field `kl_coef`='strong': expected a number"),
    ("tepo: {kl_coef: [1]}", r"tepo field `kl_coef`=\[1\]: expected a number"),
    ("tepo: 5", "expected a mapping"),
    ("kl_coef: 1e-2", None),
])
def test_params_values_are_typed(tmp_path, text, match):
    path = _yaml(tmp_path, text, "p.yaml")
    if match is None:
        assert load_params(path, ["tepo"])["tepo"] == {"kl_coef": 0.01}
        return
    with pytest.raises(ValueError, match=match):
        load_params(path, ["tepo"])


# ------------------------------------------------------------------ files that are not YAML
@pytest.mark.parametrize("cmd", ["train", "run", "tune"])
def test_invalid_yaml_names_file_line_and_column(tmp_path, capsys, monkeypatch, cmd):
    monkeypatch.chdir(tmp_path)
    path = _yaml(tmp_path, "steps: 3\nlr: [1e-5\ngroup_size: 4\n")
    line = _refused(capsys, [cmd, "--config", str(path), *(["--algo", "grpo"] if cmd == "tune" else [])])
    assert f"--config {path}: invalid YAML at line 3, column" in line, line


@pytest.mark.parametrize("cmd", ["train", "run", "tune"])
def test_a_folder_or_binary_file_as_config_is_one_line(tmp_path, capsys, monkeypatch, cmd):
    monkeypatch.chdir(tmp_path)
    extra = ["--algo", "grpo"] if cmd == "tune" else []
    (tmp_path / "d").mkdir()
    assert "is a folder" in _refused(capsys, [cmd, "--config", str(tmp_path / "d"), *extra])
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 4)
    assert "not a text file" in _refused(capsys, [cmd, "--config", str(tmp_path / "b.bin"), *extra])
    (tmp_path / "nul.yaml").write_bytes(b"steps: 3\n\x00\x01")  # valid UTF-8 that YAML refuses
    assert "invalid YAML" in _refused(capsys, [cmd, "--config", str(tmp_path / "nul.yaml"), *extra])
    assert "no such file" in _refused(capsys, [cmd, "--config", str(tmp_path / "absent.yaml"), *extra])


@pytest.mark.parametrize("cmd, content", [("run", None)])
def test_bad_config_files_as_a_user_meets_them(tmp_path, cmd, content):
    """A real process: exit 2, one line, no traceback (nothing else printed on the way). The same refusal of each
    command, and of each kind of bad file, in this process: test_invalid_yaml_... and test_a_folder_or_binary_...
    above."""
    if content is None:
        path = tmp_path / "binary.yaml"
        path.write_bytes(bytes(range(256)))
    else:
        path = _yaml(tmp_path, content)
    argv = [cmd, "--config", str(path), *(["--algo", "grpo"] if cmd == "tune" else [])]
    done = launch.run([sys.executable, "-m", "bench.cli", *argv], cwd=tmp_path, capture_output=True, text=True,
                      timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"bench {cmd}: error: --config {path}" in done.stderr, done.stderr


@pytest.mark.parametrize("field", ["tags", "engine_args", "objective_overrides"])
def test_a_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path, capsys, monkeypatch, field):
    """Round 7 of issue 29: `tags` holding a YAML alias bomb (nine levels of ten aliases: 10^9 shared leaves, a few
    hundred bytes of file) ran for minutes and gigabytes before its one line: validation copied the whole config
    (``to_dict``, which expands every shared list) before looking at the tags; under `engine_args` (round 7, left
    open) a later copy still expanded it. Now the file is refused as it is read, under any key (its values counted
    over the distinct objects: ``bench.inputs.YAML_MAX_VALUES``), and nothing is copied (a copy would raise here)."""
    levels = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    (tmp_path / "bomb.yaml").write_text(f"algo: grpo\n{field}:\n" + "".join(f"  {ln}\n" for ln in levels))

    def no_copy(self):
        raise ValueError("the config was copied whole during validation")

    monkeypatch.setattr(TrainConfig, "to_dict", no_copy)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--config", "bomb.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--config bomb.yaml: its aliases expand to more than 1,000,000 values" in err, err


def test_aliases_that_expand_to_a_few_values_are_read_and_one_containing_itself_is_refused(tmp_path):
    from bench.inputs import read_yaml, yaml_flag

    (tmp_path / "ok.yaml").write_text("base: &b {kl_coef: 0.1}\nobjective_overrides: *b\nseeds: &s [1, 2]\nmore: *s\n")
    assert read_yaml(tmp_path / "ok.yaml") == {"base": {"kl_coef": 0.1}, "objective_overrides": {"kl_coef": 0.1},
                                               "seeds": [1, 2], "more": [1, 2]}
    (tmp_path / "loop.yaml").write_text("tags: &t\n  self: *t\n")
    with pytest.raises(ValueError, match="an alias refers to the mapping or list that contains it"):
        read_yaml(tmp_path / "loop.yaml")
    bomb = "{a0: &a0 [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)) + "}"
    with pytest.raises(argparse.ArgumentTypeError, match="expand to more than"):
        yaml_flag(bomb)
