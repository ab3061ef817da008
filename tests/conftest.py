"""Shared test settings (one torch thread per process) and fixtures: a real MLflow tracking server on loopback
(no mock stands in for it)."""

from __future__ import annotations

import os

# The tiny model's matrices are small: one intra-op thread per process is faster than two on a 2-core machine, and
# keeps subprocess-based tests (servers, workers) from oversubscribing the cores. Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Reports draw their figures as PNG only (a third of the CPU of PNG + PDF + SVG, which `bench report --formats` also
# offers users): the PDF and SVG files, their fonts and report.md's links to them are tested where they are the
# subject (tests/reports/test_figures.py, test_report.py), with this unset.
os.environ.setdefault("POBENCH_FIGURE_FORMATS", "png")

import contextlib  # noqa: E402
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.net import free_port


def pytest_configure(config):
    """Under pytest-xdist (`pytest -n 2`), tests marked ``xdist_group`` run on one worker (``--dist loadgroup``):
    the Ray tests share that worker's one local Ray instance (``ray_local``) instead of starting one each.

    And Ctrl-C raises KeyboardInterrupt in this process, as in a terminal or a notebook: a suite started in the
    background by a non-interactive shell (`.ci/run &`, nohup) inherits an ignored SIGINT, where pobench rightly
    takes a KeyboardInterrupt for one raised by code, not a stop (``bench.runs.stop.raised_by_code``); the tests that
    stand for a user's Ctrl-C by raising it (an ``on_eval`` hook) model an interactive process."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if any(a == "--dist" or a.startswith("--dist=") for a in config.invocation_params.args):
        return  # (a scheduling the user chose)
    if getattr(config.option, "dist", "no") == "load":  # the controller: its scheduler
        config.option.dist = "loadgroup"
    if hasattr(config, "workerinput"):  # a worker: the group in each test's id, which that scheduler reads
        config.option.loadgroup = True


def pytest_runtest_logreport(report):
    """A failure is named on standard error as it happens (the controller's, under xdist): a suite that hangs or is
    killed later (a CI limit) still says which tests failed, where its summary is never printed."""
    if report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        crash = getattr(report.longrepr, "reprcrash", None)
        why = f"{crash.path}:{crash.lineno}: {crash.message}" if crash else str(report.longrepr)[-300:]
        print(f"\nFAILED {report.nodeid} ({report.when}): {why[:500]}", file=sys.__stderr__, flush=True)


def pytest_unconfigure(config):
    """The zygotes of tests/launch.py end with the session (not at the interpreter's exit, which an xdist worker may
    not reach before its controller ends it: a zygote orphaned then is counted in nobody's CPU)."""
    import threading

    from tests import launch

    launch.close_all()
    left = [t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()
            and not t.daemon]
    if left:  # (the interpreter waits for them at its exit: an xdist worker that never ends hangs the suite)
        print(f"\n{os.environ.get('PYTEST_XDIST_WORKER', 'pytest')}: threads still running at the end: "
              f"{', '.join(left)}", file=sys.__stderr__, flush=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """``POBENCH_CPU_LOG=<file>`` (or ``POBENCH_TEST_CPU``): append each test's CPU seconds (this process's and its
    reaped children's: the commands and pool processes it started) as ``seconds<TAB>test id`` lines, to find where
    the suite's CPU goes (the suite's budget is in CPU seconds: 700 for `pytest -n 2`). A session fixture's setup
    and teardown count in the test that ran them (the first and the last of its worker)."""
    out = os.environ.get("POBENCH_CPU_LOG") or os.environ.get("POBENCH_TEST_CPU")
    if not out:
        yield
        return
    import resource

    from tests import launch

    def cpu() -> float:  # (the processes forked by tests/launch.py's zygote: as they end, not when it is reaped)
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + launch.CHILD_CPU[0]

    t0 = cpu()
    yield
    with open(out, "a") as fh:
        fh.write(f"{cpu() - t0:.2f}\t{item.nodeid}\n")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORE_FILES = ("mlflow.db", "mlruns", "mlartifacts")  # what MLflow writes into the folder a process runs in


@pytest.fixture(autouse=True)
def no_store_left_in_the_repository():
    """A test fails when an MLflow store or runs' files appear in the repository while it runs (a test that logged to
    the working folder's store, or into an experiment whose files MLflow put in ``./mlruns`` there): each test's
    records belong in its own folder. (Under `pytest -n 2` the test running beside it on the other worker may be the
    one; what was there before the test is left alone: a developer's own `bench run` in the repository.)"""
    before = {n for n in STORE_FILES if os.path.exists(os.path.join(REPO, n))}
    yield
    new = [n for n in STORE_FILES if n not in before and os.path.exists(os.path.join(REPO, n))]
    assert not new, f"{', '.join(new)} appeared in the repository ({REPO}) during this test"


ON_RAY = pytest.mark.xdist_group("ray")  # the tests that use ``ray_local``


class _LocalRay:
    """The local Ray instance the tests of this process share: started by the first test that needs it, stopped as soon
    as the next test of this process does not (an idle Ray instance's daemons cost about 3 CPU-seconds a minute: kept
    for the rest of a 25-minute session it was ~80 CPU-seconds of the suite's budget for nothing). The Ray tests are one
    ``xdist_group``, so they run one after another and share one start."""

    def __init__(self) -> None:
        self.ray = None
        self.sigterm = None

    def start(self):
        if self.ray is None:
            from bench.workers import init_ray

            # (Ray's driver sets a SIGTERM handler raising SystemExit; left after its shutdown, a process a later test
            # forks and terminates at once raised it before multiprocessing's bootstrap, and ran pytest on: CI saw it)
            self.sigterm = signal.getsignal(signal.SIGTERM)
            ray = init_ray(None, workers=2)
            assert ray.cluster_resources().get("CPU") == 2
            self.ray = ray
        return self.ray

    def stop(self) -> None:
        if self.ray is not None:
            ray, self.ray = self.ray, None
            ray.shutdown()
            if self.sigterm is not None:
                signal.signal(signal.SIGTERM, self.sigterm)


_LOCAL_RAY = _LocalRay()


@pytest.fixture
def ray_local():
    """A local Ray instance with 2 CPUs, started by pobench's own function and shared by the tests of this process
    that need one, one after another (each Ray start is seconds of CPU): ``_LocalRay``. The executors and `bench
    tune` use a connection that exists (as in a notebook); a fresh `bench run` process starting its own instance is
    tested in tests/bench/test_executor_ray.py."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'pobench[ray]')")
    return _LOCAL_RAY.start()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop the shared local Ray instance once the next test of this process does not use it (``_LocalRay``)."""
    if nextitem is None or "ray_local" not in getattr(nextitem, "fixturenames", ()):
        _LOCAL_RAY.stop()


def pytest_sessionfinish(session, exitstatus):
    _LOCAL_RAY.stop()


@pytest.fixture(autouse=True)
def no_tracking_uri_left_set():
    """A test that sets MLflow's process-global tracking URI (``mlflow.set_tracking_uri``, which also sets
    $MLFLOW_TRACKING_URI for child processes) must put it back: otherwise every later test of the worker, and the
    commands they start, write to that store instead of their own folder's."""
    try:
        from mlflow.tracking._tracking_service import utils
    except ImportError:  # (the tox environments of the optional engines install no MLflow)
        yield
        return
    before = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    yield
    after = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    assert after == before, f"the test left MLflow's tracking URI set: {after} (was {before})"


@pytest.fixture(autouse=True)
def no_signal_handler_left_set():
    """A test that changes this process's SIGINT handler (a command's ``entry``, a pool worker's setup, a plugin's
    import run here) must put it back: pobench reads it to tell a stop from a KeyboardInterrupt a plugin raised
    (``bench.runs.stop.raised_by_code``), so a handler left set changes what later tests of the worker see. It is put
    back, and the test fails naming it. (SIGTERM is not checked: ``ray.init`` installs Ray's own in the driver.)"""
    import signal

    before = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    yield
    changed = {s.name: signal.getsignal(s) for s, h in before.items() if signal.getsignal(s) != h}
    for s, h in before.items():
        if h is not None:
            signal.signal(s, h)
    assert not changed, f"this test left signal handlers set: {changed}"


@pytest.fixture(autouse=True)
def no_stop_state_left():
    """What a test that ran a command's code in this process left in ``bench.runs.stop`` (the stop signal it got, an
    interrupt held, the hook that sends a dropped interrupt again, ``sys.unraisablehook``) is reset after it: left,
    a later test's dropped KeyboardInterrupt would make this worker send itself that signal again."""
    hook = sys.unraisablehook
    yield
    sys.unraisablehook = hook
    stop = sys.modules.get("bench.runs.stop")
    if stop is not None:
        stop._RECEIVED["signal"] = None
        stop._HELD.update(depth=0, pending=False)
        stop._LOST.update(signal=None, hook=None)


def fresh_store(folder, name: str = "mlflow.db") -> str:
    """The URI of a new, empty local MLflow store ``folder/name`` (unless that file exists), made as pobench makes one
    (``reports.record.create_store``: MLflow's migrations for a process's first store, one to three seconds; a copy of
    that empty store for its later ones). Tests of the creation itself start from no file."""
    from pathlib import Path

    from reports.record import create_store

    db = Path(folder) / name
    db.parent.mkdir(parents=True, exist_ok=True)
    if not db.exists():
        create_store(db)
    return f"sqlite:///{db}"


def copy_project(src, dst):
    """Copy the project folder ``src`` (its store, runs, files) to ``dst``, as a copy the user made and pobench took
    for its own: the store's experiments and runs point at the copy's files (MLflow keeps them as absolute paths; a
    copy left pointing at ``src`` is refused before any work: held-out round 17, H21). Returns ``dst``."""
    import sqlite3
    from pathlib import Path

    shutil.copytree(src, dst)
    old, new = str(Path(src).resolve()), str(Path(dst).resolve())
    con = sqlite3.connect(Path(dst) / "mlflow.db")
    with con:
        con.execute("update experiments set artifact_location = replace(artifact_location, ?, ?)", (old, new))
        con.execute("update runs set artifact_uri = replace(artifact_uri, ?, ?)", (old, new))
    con.close()
    return dst


@contextlib.contextmanager
def forkserver_context(*preload: str):
    """A multiprocessing context whose processes fork from a forkserver of their own that imported ``preload`` once
    (for tests that start several processes at once: three spawned processes each import pobench again, seconds of
    CPU each; forked ones are separate processes all the same). The forkserver is stopped at the end, so this
    process's next pool (bench/executors.py) starts one with its own preload."""
    import multiprocessing
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    try:
        yield ctx
    finally:
        with contextlib.suppress(Exception):  # (CPython's: every version with a forkserver has it)
            forkserver._forkserver._stop()


@pytest.fixture
def bench_here(monkeypatch, capsys):
    """``bench_here(argv, cwd, **env) -> (exit code, stdout, stderr)``: `bench ARGV` run in this process, in folder
    ``cwd``, with ``env`` added, no ``MLFLOW_*`` variable and no tracking URI set in this process (as a child started
    by the tests gets). For a command whose own process is not what is tested (a resume after a stopped or failed
    run: its exit code, its lines and what it records are): this process has the imports already, a new one takes
    seconds of CPU to start."""
    from mlflow.tracking._tracking_service import utils

    from bench.cli.main import main

    def run(argv: list[str], cwd, **env: str) -> tuple[int, str, str]:
        for k in [k for k in os.environ if k.startswith("MLFLOW_")]:
            monkeypatch.delenv(k)
        monkeypatch.setattr(utils, "_tracking_uri", None)  # (no URI set by mlflow.set_tracking_uri before)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        rc = main(list(argv))
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


class MlflowServer:
    """A real `mlflow server` (SQLite backend, local artifact root, tracking only: no job-runner process) on a free
    loopback port, in a process group of its own, so it can be killed (its workers with it), hung, and started again
    on the same port and store. ``served_artifacts``: the runs' files are uploaded to the server, which keeps them in
    ``root/served`` (``--artifacts-destination``: a server's storage, whose faults its clients meet as HTTP errors)."""

    def __init__(self, root, served_artifacts: bool = False) -> None:
        self.root, self.port, self.proc = root, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"
        self.artifacts = ["--artifacts-destination", str(root / "served")] if served_artifacts else \
            ["--default-artifact-root", str(root / "artifacts")]

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        with open(self.root / "server.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", "1", "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db", *self.artifacts],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}: "
                                   f"{(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"mlflow server not healthy in 300 s: "
                                   f"{(self.root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.3)

    def kill(self) -> None:
        """SIGKILL to the server and its workers: connections are refused from now on."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def hang(self) -> None:
        """SIGSTOP to the server and its workers: connections are accepted (by the kernel) and never answered."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def go_on(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """URI of a real `mlflow server` (``MlflowServer``) for the session."""
    if shutil.which("mlflow") is None:
        pytest.skip("the `mlflow` command is not on PATH")
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    try:
        server.start()
        yield server.uri
    finally:
        server.stop()


@pytest.fixture(scope="module")
def postgres():
    """A real PostgreSQL server on loopback (tests/pg.py) for the tests of a module; skipped, with the reason, where
    its binaries are missing."""
    from tests import pg

    reason = pg.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with pg.PostgresServer() as server:
        yield server
