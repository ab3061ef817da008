"""Held-out round 11: MLflow tracking servers that answer wrongly (an error status late in a run, a redirect loop, JSON
of another shape, a rate limit), a store locked during `bench report`, and a malformed POBENCH_MLFLOW_TIMEOUT: one
line naming the cause and what to do, the documented exit code, nothing started or left RUNNING."""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request

import pytest

from bench import cli
from tests.bench.test_mlflow_unreachable import CMDS

cli.build_parser()  # (every subcommand module imported once)

TINY = ["--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--eval-every", "0",
        "--samples-every", "0", "--checkpoint-every", "1", "--no-progress"]


class FakeServer:
    """An HTTP server on loopback whose answer is set by ``mode``: ``proxy`` (to ``upstream``, a real `mlflow
    server`), ``500`` / ``429`` (an error status, MLflow's error JSON), ``redirectloop`` (307 to itself), ``wrongjson``
    (200, JSON of another shape), ``empty`` (200, ``{}``), ``half`` (200, a body cut off)."""

    def __init__(self, upstream: str | None = None, mode: str = "proxy") -> None:
        self.upstream, self.mode = upstream, mode
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, code: int, data: bytes, headers: dict[str, str] | None = None, length: int | None = None):
                self.send_response(code)
                for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) if length is None else length))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                mode = fake.mode
                if mode == "proxy":
                    req = urllib.request.Request(fake.upstream + self.path, data=body, method=self.command,
                                                 headers={k: v for k, v in self.headers.items()
                                                          if k.lower() not in ("host", "content-length")})
                    try:
                        with urllib.request.urlopen(req, timeout=60) as r:
                            code, data = r.status, r.read()
                    except urllib.error.HTTPError as e:
                        code, data = e.code, e.read()
                    return self._send(code, data)
                if mode in ("500", "429"):
                    return self._send(int(mode), b'{"error_code":"INTERNAL_ERROR","message":"boom"}',
                                      {"Retry-After": "3600"} if mode == "429" else None)
                if mode == "redirectloop":
                    return self._send(307, b"", {"Location": self.path})
                if mode == "half":
                    self._send(200, b'{"experiments": [', length=1000)
                    self.close_connection = True
                    return
                self._send(200, b'{"experiment": 5, "experiments": "nope", "run": [], "runs": 7}'
                           if mode == "wrongjson" else b"{}")

            do_POST = do_PATCH = do_DELETE = do_PUT = do_GET

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_server():
    """``fake_server(mode, upstream=None) -> FakeServer`` (closed at the end)."""
    made: list[FakeServer] = []

    def start(mode: str, upstream: str | None = None) -> FakeServer:
        made.append(FakeServer(upstream, mode))
        return made[-1]

    yield start
    for s in made:
        s.close()


def _runs(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp is not None else []


# ------------------------------------------------------------------ H09: HTTP 500 late in bench train
def test_a_server_answering_500_late_in_bench_train_is_a_stopped_line_and_the_resume_ends_it(
        tmp_path, bench_here, mlflow_server, fake_server, monkeypatch):
    """Held-out round 11 (H09): the tracking server answering HTTP 500 from the last step on: `stopped: the MLflow
    server ... answered retry_locked with HTTP 500` (an internal name), nothing of the checkpoint kept or --resume, the
    run left RUNNING and no end in run.json; the rerun then called it "killed". Now as for a lost server: one
    `stopped:` line with the cause, the checkpoint kept and the resume command, exit 1, the end recorded in run.json;
    the resume (server healthy) applies it and finishes the run."""
    from bench.runs import checkpoint
    from bench.runs.tracking import read_run_record

    proxy = fake_server("proxy", mlflow_server)
    real_save = checkpoint.save

    def save_then_fail_the_server(folder, step, **parts):
        out = real_save(folder, step, **parts)
        if step == 2:
            proxy.mode = "500"
        return out

    monkeypatch.setattr(checkpoint, "save", save_then_fail_the_server)
    argv = ["train", "--algo", "grpo", "--steps", "2", *TINY, "--experiment", "h09", "--tracking-uri", proxy.uri]
    rc, _, err = bench_here(argv, tmp_path, POBENCH_MLFLOW_TIMEOUT="2")
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err[-3000:]
    line = lines[0]
    assert line.startswith("bench train: stopped: ") and "HTTP 500" in line and proxy.uri in line, line
    assert "retry_locked" not in line and "fix the server; kept: the checkpoint of step 2" in line, line
    assert "resume with: " in line and "--resume" in line, line
    (record,) = (tmp_path / ".pobench" / "runs" / "h09").glob("*/run.json")
    found = read_run_record(record.parent)
    assert found["unsent_end"]["status"] == "FAILED" and "HTTP 500" in found["unsent_end"]["failure"], found

    proxy.mode = "proxy"  # the server is healthy again: the same command (no --resume) applies the recorded end
    monkeypatch.setattr(checkpoint, "save", real_save)
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 2 and "pass --resume" in err and "killed" not in err, err[-3000:]
    assert "whose end could not be sent when it stopped, was ended FAILED" in err, err[-3000:]
    assert [r.info.status for r in _runs(mlflow_server, "h09")] == ["FAILED"]
    rc, _, err = bench_here([*argv, "--resume"], tmp_path)  # the resume finishes the run
    assert rc == 0 and "killed" not in err, err[-3000:]
    (run,) = _runs(mlflow_server, "h09")
    assert run.info.status == "FINISHED" and "HTTP 500" in run.data.tags.get("pobench.resumed_after", ""), \
        (run.info.status, run.data.tags)


# ------------------------------------------------------------------ H06, H07, H08: answers no MLflow server gives
@pytest.mark.parametrize("mode,needles", [
    ("redirectloop", ["answered the MLflow API with a redirect loop", "or the proxy"]),
    ("wrongjson", ["answered the MLflow API with JSON that is not MLflow's", "not an MLflow tracking server"]),
    ("empty", ["for an experiment that cannot exist", "not an MLflow tracking server"]),
    ("half", ["with an answer cut off (connection closed by the server)", "not a working MLflow tracking server"]),
    ("429", ["answered its API with HTTP 429 (Too Many Requests", "wait 3600 s", "wait, then rerun"]),
])
def test_a_server_answering_not_as_mlflow_is_one_line_before_any_work(mode, needles, tmp_path, bench_here,
                                                                       fake_server):
    """Held-out round 11: a tracking "server" answering every request with a redirect to itself (H06: two chained
    tracebacks, exit 1, a run folder made), with 200 and JSON of another shape, `{}`, or a body cut off (H07: the
    pre-work check let it through; a misleading line blaming the artifact place after a run folder was made), or
    HTTP 429 (H08: urllib3's words, cut mid-word, no advice). Now each is one line naming the URI, before any work:
    exit 2, nothing made."""
    server = fake_server(mode)
    rc, _, err = bench_here([*CMDS["train"], "--tracking-uri", server.uri], tmp_path, POBENCH_MLFLOW_TIMEOUT="2")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert lines[0].startswith("bench train: error: ") and server.uri in lines[0], lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    assert "HTTPConnectionPool" not in lines[0] and "Traceback" not in err and "credentials" not in lines[0], lines[0]
    assert not list(tmp_path.iterdir())  # no run folder, no store


# ------------------------------------------------------------------ H02: a malformed POBENCH_MLFLOW_TIMEOUT
@pytest.mark.parametrize("value,needle", [("abc", "expected a number of seconds"),
                                          ("-5", "expected a positive number of seconds")])
@pytest.mark.parametrize("cmd", ["train", "report"])
def test_a_malformed_timeout_is_refused_with_a_local_store_too(cmd, value, needle, tmp_path, bench_here):
    """Held-out round 11 (H02): POBENCH_MLFLOW_TIMEOUT=abc (or -5) was refused only when the store is a server; with
    the local SQLite store `bench train` trained and said nothing. Now one line, exit 2, before any work, whatever
    the store."""
    from tests.conftest import fresh_store

    fresh_store(tmp_path)
    rc, _, err = bench_here(CMDS[cmd], tmp_path, POBENCH_MLFLOW_TIMEOUT=value)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert f"POBENCH_MLFLOW_TIMEOUT={value!r}: {needle}" in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


# ------------------------------------------------------------------ H10: bench tune against a server answering 500
def test_bench_tune_whose_server_answers_500_stops_within_the_bound_and_the_rerun_finishes(
        tmp_path, bench_here, mlflow_server, fake_server, monkeypatch):
    """Held-out round 11 (H10): `bench tune` whose server answered HTTP 500 from its first trial on was silent for
    minutes (MLflow's own retries, a SIGTERM acted on ~2 minutes later) and left its study run RUNNING, saying
    nothing of it. Now its requests are bounded as the other commands' are (``answering``): one `stopped:` line
    within seconds naming the server, the trials kept and what became of the study's run, exit 1; with the server
    healthy, the same command finishes the study and leaves no run RUNNING."""
    import time

    from bench.tune import runs as tune_runs
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    proxy = fake_server("proxy", mlflow_server)
    real_start = tune_runs.StudyRuns.start_trial

    def fail_from_the_first_trial(self, *args, **kwargs):
        proxy.mode = "500"
        return real_start(self, *args, **kwargs)

    monkeypatch.setattr(tune_runs.StudyRuns, "start_trial", fail_from_the_first_trial)
    argv = ["tune", "--algo", "grpo", "--trials", "2", "--steps", "2", "--eval-every", "1", "--workers", "1",
            "--experiment", "h10", "--tracking-uri", proxy.uri]
    t0 = time.monotonic()
    rc, _, err = bench_here(argv, tmp_path, POBENCH_MLFLOW_TIMEOUT="2")
    seconds = time.monotonic() - t0
    last = err.strip().splitlines()[-1]
    assert rc == 1 and last.startswith(f"bench tune: stopped: the MLflow server {proxy.uri} answered"), err[-3000:]
    assert "HTTP 500" in last and "kept: 0 of 2 trials finished of study 'tune-grpo'" in last, last
    assert "could not be ended (the server did not take it): the rerun continues it" in last, last
    assert "Traceback" not in err and seconds < 60, (seconds, err[-3000:])

    proxy.mode = "proxy"  # the server is healthy again: the same command finishes the study
    monkeypatch.setattr(tune_runs.StudyRuns, "start_trial", real_start)
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    runs = _runs(mlflow_server, "h10")
    assert runs and not [r.info.run_name for r in runs if r.info.status == "RUNNING"], \
        [(r.info.run_name, r.info.status) for r in runs]


# ------------------------------------------------------------------ H12: the store locked once the report is written
def test_bench_report_stopped_by_a_locked_store_says_the_report_is_kept(tmp_path, bench_here, monkeypatch):
    """Held-out round 11 (H12): `bench report` while another process held a write transaction on mlflow.db wrote
    the report folder, then said `stopped: the MLflow store ... stayed locked ...` (after every wait: 93 s) without a
    word of the report written. Now the line says it is kept, and where. (The lock is SQLite's "database is locked"
    as MLflow raises it after its waits, met by the first write after the folder is written.)"""
    import sqlite3

    from mlflow.exceptions import MlflowException

    from reports import report as report_module
    from tests.conftest import fresh_store
    from tests.reports.conftest import log_comparison

    uri = fresh_store(tmp_path)
    log_comparison(uri, experiment="h12", comparison="c12", objectives=("grpo", "dapo"), seeds=(0,))

    def locked(*args, **kwargs):
        try:
            raise sqlite3.OperationalError("database is locked")
        except sqlite3.OperationalError as e:
            raise MlflowException(f"(sqlite3.OperationalError) {e}") from e

    monkeypatch.setattr(report_module, "store", locked)
    rc, _, err = bench_here(["report", "--experiment", "h12"], tmp_path)
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, (rc, err[-3000:])
    folder = tmp_path / "reports" / "out" / "h12" / "c12"
    assert lines[0].startswith("bench report: stopped: the MLflow store") and "stayed locked" in lines[0], lines[0]
    assert f"kept: the report in {folder} (written before the store failed" in lines[0], lines[0]
    assert (folder / "report.md").is_file()


def test_bench_report_whose_server_stops_answering_once_the_report_is_written_says_it_is_kept(
        tmp_path, bench_here, monkeypatch, mlflow_server):
    """Held-out round 13 (H06): the MLflow server SIGSTOPped while `bench report` stored its numbers: the report
    folder was complete on disk, but the `stopped:` line of the server said nothing of it (H12's "kept" covered a
    local store's faults only). (The first request after the folder is written gets no answer, as MLflow raises it.)"""
    import requests

    from reports import report as report_module
    from tests.reports.conftest import log_comparison

    log_comparison(mlflow_server, experiment="r13h06", comparison="c06", objectives=("grpo", "dapo"), seeds=(0,))

    def no_answer(*args, **kwargs):
        raise requests.exceptions.ConnectionError("Read timed out.")

    monkeypatch.setattr(report_module, "store", no_answer)
    rc, _, err = bench_here(["report", "--experiment", "r13h06", "--tracking-uri", mlflow_server], tmp_path)
    lines = err.strip().splitlines()
    folder = tmp_path / "reports" / "out" / "r13h06" / "c06"
    assert rc == 1 and len(lines) == 1, (rc, err[-3000:])
    assert lines[0].startswith(f"bench report: stopped: MLflow tracking server {mlflow_server} stopped answering"), \
        lines[0]
    assert f"kept: the report in {folder} (written before the store failed" in lines[0], lines[0]
    assert (folder / "report.md").is_file()
