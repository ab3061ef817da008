"""The command line as a newcomer meets it: `--help` of `bench` and of every subcommand, help texts that state each
default once and truly."""

from __future__ import annotations

import argparse

import pytest

from bench import cli


def _subcommands() -> list[str]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


def test_every_subcommand_is_registered():
    assert set(_subcommands()) >= {"list", "train", "warmstart", "eval", "run", "report", "tune"}


@pytest.mark.parametrize("argv", [["--help"], ["-h"]])
def test_top_level_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in _subcommands():
        assert name in out


def test_bare_bench_prints_help(capsys):
    assert cli.main([]) == 2
    assert "usage: bench" in capsys.readouterr().out


@pytest.mark.parametrize("name", _subcommands())
def test_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([name, "--help"])
    assert e.value.code == 0
    assert f"usage: bench {name}" in capsys.readouterr().out


# ------------------------------------------------------------------ help texts and docs state the code's defaults
def _option_entries(argv: list[str], capsys) -> dict[str, str]:
    """{flag: its help entry, whitespace-normalised} from `bench <cmd> --help`."""
    import re

    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    out = capsys.readouterr().out.split("\noptions:\n", 1)[1]
    entries = {}
    for chunk in re.split(r"\n  (?=-)", "\n" + out):
        chunk = " ".join(chunk.split())
        m = re.match(r"(?:-\w, )?(--[a-z][a-z-]*)", chunk)
        if m:
            entries[m.group(1)] = chunk
    return entries


@pytest.mark.parametrize("name", ["train", "run", "tune", "report", "eval"])
def test_help_states_each_default_at_most_once(name, capsys):
    entries = _option_entries([name], capsys)
    assert entries
    for flag, text in entries.items():
        assert text.count("(default") <= 1, f"bench {name} {flag}: {text}"
        assert "default: None" not in text, f"bench {name} {flag}: {text}"


@pytest.mark.parametrize("name", ["train", "run", "tune", "report", "eval"])
def test_tracking_uri_help_states_the_real_default(name, capsys):
    from reports.load import DEFAULT_TRACKING_URI

    text = _option_entries([name], capsys)["--tracking-uri"]
    assert DEFAULT_TRACKING_URI in text and "mlruns" not in text


def test_tracking_uri_default_is_the_stated_one(tmp_path, monkeypatch):
    """What the help states is what MLflow resolves to in a fresh process in a fresh folder."""
    import os
    import subprocess
    import sys

    from reports.load import DEFAULT_TRACKING_URI

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", "from reports.record import tracking_uri; print(tracking_uri(None))"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip().replace(str(tmp_path) + "/", "") == DEFAULT_TRACKING_URI.replace("///", "///")


def test_bench_run_help_shows_the_defaults_it_uses(capsys):
    from bench.comparison.plan import DEFAULTS

    entries = _option_entries(["run"], capsys)
    for name, value in DEFAULTS.train.items():
        assert f"(default of bench run: {value!r})" in entries["--" + name.replace("_", "-")]
    assert ",".join(map(str, DEFAULTS.seeds)) in entries["--seeds"]
    assert ",".join(DEFAULTS.algos) in entries["--algos"]


def _effective_default(cmd: str, flag: str):
    """The value a subcommand uses when `flag` is not given."""
    import dataclasses

    from bench.comparison.plan import DEFAULTS
    from bench.config import TrainConfig

    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    dest = flag[2:].replace("-", "_")
    value = sub.choices[cmd].get_default(dest)
    if value is None:
        fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
        if cmd == "run" and dest in DEFAULTS.train:
            return DEFAULTS.train[dest]
        if dest in fields and fields[dest].default is not dataclasses.MISSING:
            return fields[dest].default
    return value


DOCS = {"docs/TUNING.md": "tune", "docs/EVALUATORS.md": "eval", "docs/REPORTS.md": "run"}


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_docs_state_the_code_defaults(doc):
    """Every "`--flag ...` (default N)" in a doc page equals the default of its command."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / doc).read_text()
    found = re.findall(r"`(--[a-z][a-z-]*)[^`]*`[^(`]{0,40}\(default:? ([0-9][0-9.e-]*)[),;]", text)
    for flag, stated in found:
        real = _effective_default(DOCS[doc], flag)
        assert real is not None and float(stated) == float(real), f"{doc}: {flag} documented as {stated}, is {real}"


def test_docs_state_the_default_comparison():
    """A `bench run` example without --seeds / --algos that names objectives or seeds names the code's defaults."""
    import re
    from pathlib import Path

    from bench.comparison.plan import DEFAULTS

    root = Path(__file__).resolve().parents[2]
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            m = re.match(r"\s*(?:.*&& )?bench run(?P<flags>[^#]*)#(?P<comment>.*)", line)
            if not m:
                continue
            seeds = re.search(r"seeds ([0-9][0-9, ]*)", m["comment"])
            if seeds and "--seeds" not in m["flags"]:
                stated = [int(s) for s in re.findall(r"\d+", seeds.group(1))]
                assert stated == list(DEFAULTS.seeds), f"{doc.name}: {line.strip()}"
            objs = re.search(r"(?:train )?([a-z]+(?:, [a-z]+)+)", m["comment"])
            if objs and "--algos" not in m["flags"] and "--ablation" not in m["flags"]:
                assert objs.group(1).split(", ") == list(DEFAULTS.algos), f"{doc.name}: {line.strip()}"


@pytest.mark.parametrize("name", _subcommands())
def test_a_commands_parser_is_the_same_without_the_other_commands(name):
    """`bench NAME ...` builds NAME's parser only (the other commands by name: their modules are not imported); its
    flags, defaults and help are those of the full parser's NAME."""
    def sub_of(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        assert list(sub.choices) == _subcommands()
        return sub.choices[name]

    full, alone = sub_of(cli.build_parser()), sub_of(cli.build_parser(name))
    assert alone.format_help() == full.format_help()
    assert [(a.dest, a.default, a.required) for a in alone._actions] == \
        [(a.dest, a.default, a.required) for a in full._actions]


def test_transformers_is_quietened_once_imported(tmp_path, monkeypatch):
    """``quiet_libraries`` does not import transformers (seconds of CPU for every process): its hook quietens the
    module when something imports it; one that is loaded already is quietened at once."""
    import sys

    from bench import workers

    (tmp_path / "loud.py").write_text("level = 'info'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "loud", raising=False)
    seen = []
    sys.meta_path.insert(0, workers._AfterImport("loud", lambda m: seen.append(m.level)))
    import loud

    assert seen == ["info"] and loud.__loader__.exec_module.__name__ == "exec_module"
    assert not [f for f in sys.meta_path if isinstance(f, workers._AfterImport) and f.name == "loud"]  # (once)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_info()
    workers.quiet_libraries()
    assert hf_logging.get_verbosity() == hf_logging.ERROR and not hf_logging.is_progress_bar_enabled()
