"""An MLflow server that is not there: every command that logs to MLflow says so in one line naming the URI within
seconds, before any model is loaded (MLflow's client alone retries for about four minutes)."""

from __future__ import annotations

import socket
import time

import pytest

from bench import cli  # noqa: F401
from bench.runs import tracking  # noqa: F401  (imported here: the time bound measures the wait, not imports)
from tests.net import free_port

cli.build_parser()  # imports every subcommand module once, so the time bounds below measure the wait, not imports

CMDS = {
    "train": ["train", "--steps", "1"],
    "run": ["run", "--algos", "grpo", "--seeds", "0", "--steps", "1", "--no-progress"],
    "report": ["report"],
    "tune": ["tune", "--algo", "grpo", "--trials", "1", "--steps", "1"],
    "eval": ["eval", "--model", "builtin:tiny-arith", "--benchmarks", "arith", "--limit", "2"],
    "eval --comparison": ["eval", "--comparison", "c1", "--benchmarks", "arith"],
    "compare": ["compare", "c1", "c2"],
}


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    return free_port()


@pytest.fixture
def silent_port():
    """A loopback port that accepts connections and never answers (a hung server / a firewall that drops)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def _run(argv, uri, capsys, tmp_path, monkeypatch) -> tuple[int, str, float]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    t0 = time.perf_counter()
    rc = cli.main([*argv, "--tracking-uri", uri])
    return rc, capsys.readouterr().err, time.perf_counter() - t0


@pytest.mark.parametrize("cmd", sorted(CMDS))
def test_refused_connection_fails_fast_with_one_line(cmd, closed_port, capsys, tmp_path, monkeypatch):
    uri = f"http://127.0.0.1:{closed_port}"
    rc, err, seconds = _run(CMDS[cmd], uri, capsys, tmp_path, monkeypatch)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and uri in lines[0] and "cannot be reached" in lines[0], err
    assert seconds < 10, f"bench {cmd} took {seconds:.1f} s to notice"
    assert not (tmp_path / ".pobench").exists()  # nothing trained, no study opened


def test_silent_server_times_out_after_the_configured_seconds(silent_port, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("POBENCH_MLFLOW_TIMEOUT", "1")
    uri = f"http://127.0.0.1:{silent_port}"
    rc, err, seconds = _run(CMDS["train"], uri, capsys, tmp_path, monkeypatch)
    assert rc == 2 and uri in err and "within 1 s" in err, err
    assert 0.9 < seconds < 6


def test_a_real_server_passes_the_check(mlflow_server):
    from bench.runs.store_check import check_reachable

    assert check_reachable(mlflow_server) == mlflow_server
