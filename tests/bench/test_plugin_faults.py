"""Plugins that misbehave, each as a user meets it (issue 29's held-out rounds 3 and 4; real files, a real SQLite
store, real processes): a plugin objective calling sys.exit, returning a wrong-shaped term or a non-scalar loss,
lacking policy_term, raising in __init__, or a plugin estimator raising (in `bench train` and in a `bench run` pool
worker): one line each, naming the plugin's line where it applies, no run left RUNNING."""

from __future__ import annotations

import sys

import pytest

from tests import launch
from tests.bench.test_held_out_faults import TINY, _lines
from tests.bench.test_signals import statuses
from tests.conftest import fresh_store

BAD_TERM_PLUGIN = '''
import sys

from algorithms import register, register_advantage
from algorithms.policy_gradient import ClippedPG, PolicyGradient, clipped_surrogate


class ExitPG(PolicyGradient):
    def policy_term(self, batch, ratio, adv, is_w):
        sys.exit(0)


class ShapePG(PolicyGradient):
    def policy_term(self, batch, ratio, adv, is_w):
        term, low, high = clipped_surrogate(ratio, adv, 0.2, 0.2)
        return term[:1, :1].repeat(1, 3), low, high, {{}}


class InitPG(PolicyGradient):
    def __init__(self, config, name=""):
        super().__init__(config, name)
        raise RuntimeError("boom in init")


class NonScalarPG(ClippedPG):
    def loss(self, batch, generator=None):
        loss, metrics = super().loss(batch, generator)
        return loss.expand(3), metrics


class NoTermPG(PolicyGradient):
    pass


class Boom(BaseException):
    pass


class BoomPG(PolicyGradient):
    def policy_term(self, batch, ratio, adv, is_w):
        raise Boom("x")


class BadKeyPG(ClippedPG):
    def loss(self, batch, generator=None):
        loss, metrics = super().loss(batch, generator)
        return loss, {{**metrics, "bad key!?*<>": loss.detach()}}


def exploding(rewards):
    raise RuntimeError("estimator exploded")


register("exit-pg-{n}", ExitPG, description="calls sys.exit(0) in its loss (a broken plugin)")
register("shape-pg-{n}", ShapePG, description="returns a policy term of the wrong shape (a broken plugin)")
register("init-pg-{n}", InitPG, description="raises in __init__ (a broken plugin)")
register("nonscalar-pg-{n}", NonScalarPG, description="returns a loss of shape (3,) (a broken plugin)")
register("noterm-pg-{n}", NoTermPG, description="has no policy_term (a broken plugin)")
register("boom-pg-{n}", BoomPG, description="raises its own BaseException subclass (a broken plugin)")
register("badkey-pg-{n}", BadKeyPG, description="returns a metric MLflow cannot name (a broken plugin)")
register_advantage("exploding-{n}", exploding, description="raises (a broken plugin)")
register("adv-pg-{n}", base="grpo", description="grpo with the raising estimator", advantage_estimator="exploding-{n}")
'''


BROKEN = {  # what each broken plugin objective's one line says
    "exit": "sys.exit(0) was called inside the work at ",
    "shape": "policy_term returned the policy term of",
    "init": "plugin broken.py raised RuntimeError: boom in init at ",
    "nonscalar": "loss returned a tensor of shape (3,), expected a scalar",
    "noterm": "NoTermPG does not implement policy_term",
    "boom": "plugin broken.py raised Boom: x at ",
    "badkey": "metric name 'bad key!?*<>' cannot be an MLflow key",
    "adv": "plugin broken.py raised RuntimeError: estimator exploded at ",
}


@pytest.mark.parametrize("kind, argv", [
    *[(kind, ["train", "--run-name", "r"]) for kind in BROKEN],
    pytest.param("exit", ["run", "--seeds", "0", "--no-controls", "--workers", "2", "--no-progress", "--no-report"],
                 marks=pytest.mark.slow)])
def test_a_plugin_objective_that_exits_or_returns_a_wrong_shape_is_one_line(tmp_path, bench_here, kind, argv):
    """Held-out round 3: an objective calling sys.exit(0) in its loss ended `bench train` / `bench run --workers 2`
    with exit 0, silently; one returning a wrong-shaped policy term ended in a traceback. Round 4: a plugin raising
    in its objective's __init__ or its estimator, a loss of shape (3,), a PolicyGradient without policy_term: a
    traceback each. Now one line each, naming the plugin's line where it applies."""
    from algorithms import unregister, unregister_advantage

    n = f"{kind}-{argv[0]}-{len(argv)}"
    fresh_store(tmp_path)
    (tmp_path / "broken.py").write_text(BAD_TERM_PLUGIN.format(n=n))
    flag = ["--algo"] if argv[0] == "train" else ["--algos"]
    try:
        rc, out, err = bench_here([argv[0], "--plugin", "broken.py", *flag, f"{kind}-pg-{n}", *argv[1:], *TINY],
                                  tmp_path)
    finally:
        for k in BROKEN:
            unregister(f"{k}-pg-{n}")
        unregister_advantage(f"exploding-{n}")
    text = out + err
    assert rc not in (0, None) and "Traceback" not in text and BROKEN[kind] in text, text[-3000:]
    if kind == "exit":
        assert "broken.py:10 (in policy_term)" in text, text[-3000:]
    lines = [ln for ln in _lines(err) if not ln.startswith("bench: warning")]
    assert len(lines) == 1, err[-3000:]  # (bench run: met by the distinguishability probe, before any pair)
    from mlflow import MlflowClient

    if MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_experiment_by_name("pobench") is not None:
        assert "RUNNING" not in statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench")


def test_sys_exit_inside_a_runs_training_fails_the_run_in_one_line(tmp_path):
    """The training of every run (bench.runs.lifecycle.recorded): a plugin's sys.exit(0) met there ends the run
    FAILED with the line as its cause (it ended KILLED, and the command exited 0), and the command gets that line."""
    from mlflow import MlflowClient

    from bench import faults
    from bench.runs.lifecycle import recorded
    from bench.runs.tracking import RunLogger

    uri = fresh_store(tmp_path)
    log = RunLogger(uri, "x")
    log.start("r", {"pobench.kind": "train"}, {"a": "1"})
    with pytest.raises(faults.ExitCalled, match=r"sys.exit\(0\) was called inside the work at .*test_plugin_faults"):
        with recorded(log):
            raise SystemExit(0)
    run = MlflowClient(uri).get_run(log.run_id)
    assert run.info.status == "FAILED" and "sys.exit(0)" in run.data.tags["pobench.failure"], run.info.status


@pytest.mark.slow
def test_a_plugin_estimator_raising_in_a_pool_worker_is_the_pairs_one_line(tmp_path, bench_here):
    """Held-out round 4: in `bench run --workers 2` the good pair finished and the bad one failed, but the worker's
    30-line traceback went to stderr. Now the pair's line names the plugin's line; no traceback."""
    from algorithms import unregister, unregister_advantage

    n = "pool"
    fresh_store(tmp_path)
    (tmp_path / "broken.py").write_text(BAD_TERM_PLUGIN.format(n=n))
    try:
        rc, out, err = bench_here(["run", "--plugin", "broken.py", "--algos", f"grpo,adv-pg-{n}", "--seeds", "0",
                                   "--no-controls", "--workers", "2", "--no-progress", "--no-report", *TINY], tmp_path)
    finally:
        for k in BROKEN:
            unregister(f"{k}-pg-{n}")
        unregister_advantage(f"exploding-{n}")
    assert rc == 1 and "Traceback" not in out + err, (out + err)[-3000:]
    failed = [ln for ln in err.splitlines() if f"adv-pg-{n} seed 0: failed: " in ln]
    assert len(failed) == 1 and "raised RuntimeError: estimator exploded at " in failed[0], err[-3000:]
    assert "broken.py:" in failed[0] and "(in exploding)" in failed[0], failed
    assert sorted(statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench", "train")) == ["FAILED", "FINISHED"]


REWARD_PLUGIN = '''
from evaluators import register_task
from evaluators.arith import ArithTask


class Raising(ArithTask):
    name = "raising-{n}"

    def reward(self, completion, problem):
        raise ValueError("the reward refused this completion")


class Stringy(ArithTask):
    name = "string-{n}"

    def reward(self, completion, problem):
        return "abc"


class NaNy(ArithTask):
    name = "nan-{n}"

    def reward(self, completion, problem):
        return float("nan")


for cls in (Raising, Stringy, NaNy):
    register_task(cls)
'''

BAD_REWARD = {  # the one line of each plugin task's bad reward
    "raising": "plugin rewards.py raised ValueError: the reward refused this completion at ",
    "string": "returned the reward 'abc' (str) for problem ",
    "nan": "returned the reward nan for problem ",
}


@pytest.mark.parametrize("kind", sorted(BAD_REWARD))
def test_a_plugin_tasks_reward_that_raises_or_is_not_a_number_is_one_line(tmp_path, bench_here, kind):
    """Held-out round 5: a plugin task's reward raising ValueError gave only its message (no plugin, no line); a
    string gave torch's "too many dimensions 'str'"; a NaN was reported as the loss diverging (exit 3). Now one line
    naming the plugin's line (exit 1: the plugin's code raised during the work), or the task, the problem and the
    value (exit 2)."""
    from evaluators import unregister_task

    n = "r5"
    fresh_store(tmp_path)
    (tmp_path / "rewards.py").write_text(REWARD_PLUGIN.format(n=n))
    try:
        rc, out, err = bench_here(["train", "--plugin", "rewards.py", "--task", f"{kind}-{n}", "--run-name", "r",
                                   *TINY], tmp_path)
    finally:
        for k in BAD_REWARD:
            unregister_task(f"{k}-{n}")
    text = out + err
    # (the plugin's own error met during the training: exit 1 whatever its class, held-out round 10, H13)
    assert rc == (1 if kind == "raising" else 2) and "Traceback" not in text and BAD_REWARD[kind] in text, text[-3000:]
    if kind == "raising":
        assert "rewards.py:10 (in reward)" in text, text[-3000:]
    else:
        assert f"task '{kind}-{n}'" in text, text[-3000:]
    assert len([ln for ln in _lines(err) if not ln.startswith("bench: warning")]) == 1, err[-3000:]
    assert "RUNNING" not in statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench")


def test_a_plugins_non_daemon_thread_does_not_keep_bench_alive(tmp_path):
    """Held-out round 6: a plugin starting a non-daemon thread at import made `bench list --plugin thr.py` print its
    output and then hang for ever, deaf to SIGINT and SIGTERM (only SIGKILL ended it). Now the thread gets a few
    seconds, then one line names it and the command exits with its own code."""
    import sys
    import time

    from tests.bench.test_signals import env

    (tmp_path / "thr.py").write_text(
        "import threading, time\n"
        "from algorithms import register\n"
        "threading.Thread(target=lambda: [time.sleep(1) for _ in iter(int, 1)], name='forever').start()\n"
        "register('thr-pg', base='grpo', description='grpo, with a thread that never ends')\n")
    t0 = time.monotonic()
    done = launch.run([sys.executable, "-m", "bench.cli", "list", "--plugin", "thr.py"], cwd=tmp_path,
                      capture_output=True, text=True, timeout=120, env=env())
    assert done.returncode == 0 and "thr-pg" in done.stdout, done.stderr[-3000:]
    assert time.monotonic() - t0 < 60
    assert "thread(s) forever (plugin thr.py) still running after the command ended" in done.stderr, done.stderr


def test_a_plugin_changing_the_working_folder_at_import_does_not_move_the_commands_paths(tmp_path, bench_here):
    """Issue 29 (round 6): a plugin calling os.chdir at import moved every relative path of the command (its run
    folder, its store, the plugin file), and the command reported them as deleted. pobench changes the folder back
    at once and says so in a warning; the run is trained where the user ran the command, nothing lands elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cd.py").write_text(f"import os\nos.chdir({str(elsewhere)!r})\nfrom algorithms import register\n"
                                    "register('cd-pg', base='grpo', description='grpo, from a plugin that moves')\n")
    from algorithms import unregister

    try:
        rc, _, err = bench_here(["train", "--plugin", "cd.py", "--algo", "cd-pg", "--run-name", "r", *TINY], tmp_path)
    finally:  # (this process's registry: the later tests of this worker must not see the plugin's objective)
        unregister("cd-pg")
    assert rc == 0, err[-3000:]
    assert f"plugin cd.py changed the working folder to {elsewhere} while imported" in err, err
    assert list(elsewhere.iterdir()) == []
    assert (tmp_path / "mlflow.db").is_file()
    assert statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench", "train") == ["FINISHED"]


def test_a_plugin_changing_torch_s_default_dtype_at_import_is_changed_back_and_named(tmp_path, bench_here):
    """Held-out round 8 (F10): a plugin calling `torch.set_default_dtype(torch.float64)` at import failed the run
    with a RuntimeError traceback deep in bench/engines/step_stats.py (`quantile() q tensor must be same dtype`),
    the plugin not named. As with os.chdir: pobench sets the default back right after the import and says so in a
    warning naming the plugin; the run trains to FINISHED."""
    import torch

    (tmp_path / "dtype.py").write_text("import torch\ntorch.set_default_dtype(torch.float64)\n"
                                       "from algorithms import register\n"
                                       "register('mine64', base='grpo', description='grpo, from a float64 plugin')\n")
    from algorithms import unregister

    try:
        rc, _, err = bench_here(["train", "--plugin", "dtype.py", "--algo", "mine64", "--run-name", "r", *TINY],
                                tmp_path)
        changed = torch.get_default_dtype()
    finally:  # (this process's registry and torch: the later tests of this worker must not see the plugin's)
        unregister("mine64")
        torch.set_default_dtype(torch.float32)
    assert rc == 0, err[-3000:]
    assert changed == torch.float32
    assert ("plugin dtype.py changed torch's default dtype to torch.float64 while imported; pobench changed it back"
            in err), err
    assert statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench", "train") == ["FINISHED"]


def test_a_plugin_turning_warnings_into_errors_at_import_is_put_back_and_named(tmp_path, bench_here):
    """Held-out round 9 (H14): a plugin calling `warnings.simplefilter("error")` at import made SQLAlchemy's
    deprecation warning inside MLflow's client an exception: `bench train` ended with its traceback, exit 1. As with
    os.chdir and the default dtype: the filters are put back right after the import, with a warning naming the
    plugin; a filter it adds for its own warnings (an ``ignore``, as libraries add) stays; the run trains to
    FINISHED."""
    import warnings

    (tmp_path / "warnerr.py").write_text(
        "import warnings\nwarnings.simplefilter('error')\n"
        "warnings.filterwarnings('ignore', message='mine only', category=UserWarning)\n"
        "from algorithms import register\nregister('warn-pg', base='grpo', description='grpo, warnings as errors')\n")
    from algorithms import unregister

    with warnings.catch_warnings():  # (this process's filters: the later tests must not see the plugin's)
        before = list(warnings.filters)
        try:
            rc, _, err = bench_here(["train", "--plugin", "warnerr.py", "--algo", "warn-pg", "--run-name", "r",
                                     *TINY], tmp_path)
        finally:
            unregister("warn-pg")
        after = list(warnings.filters)
    assert rc == 0, err[-3000:]
    assert ("plugin warnerr.py changed the process's warning filters (added 1 filter(s) turning warnings into errors"
            in err), err
    assert after[1:] == before and after[0][:3] == ("ignore", after[0][1], UserWarning), after[:3]
    assert statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench", "train") == ["FINISHED"]


def test_a_sigterm_after_a_plugin_ignoring_it_at_import_still_stops_the_command(tmp_path):
    """Held-out round 9 (H19): a plugin setting SIGTERM to SIG_IGN at import made a SIGTERM sent before the training
    silently ignored: the run trained to the end, exit 0 (under a scheduler: SIGKILL after its grace period, a run
    left RUNNING). pobench's own handlers are put back after the import, with a warning naming the plugin; a SIGTERM
    that comes after it (here sent by a second plugin as it is imported, in the same process: no race) stops the
    command with its one line and 143. Run as `python -m bench` (which now installs the handlers as `bench` does)."""
    import signal
    import sys

    from tests.bench.test_signals import env

    (tmp_path / "sigign.py").write_text("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                        "from algorithms import register\n"
                                        "register('sig-pg', base='grpo', description='grpo, deaf to SIGTERM')\n")
    (tmp_path / "term.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    done = launch.run([sys.executable, "-m", "bench", "train", "--plugin", "sigign.py", "--plugin", "term.py",
                           "--algo", "sig-pg", "--run-name", "r", *TINY], cwd=tmp_path, capture_output=True,
                      text=True, timeout=300, env=env())
    assert done.returncode == 143, done.stderr[-3000:]
    assert "bench train: stopped by SIGTERM; kept nothing" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "mlflow.db").exists(), done.stderr[-3000:]
    # the warning naming the plugin (printed once every plugin is loaded: here the second one stopped the command)
    from algorithms import unregister
    from bench.plugins import load_plugins

    handler = signal.getsignal(signal.SIGTERM)
    try:
        (plugin,) = load_plugins([str(tmp_path / "sigign.py")])
        after = signal.getsignal(signal.SIGTERM)
    finally:  # (this process's handler and registry: the later tests must not see the plugin's)
        signal.signal(signal.SIGTERM, handler)
        unregister("sig-pg")
    assert after == handler
    assert plugin.changed[0].startswith("the handler of SIGTERM to SIG_IGN while imported; pobench put its own back")


def test_a_plugin_importing_a_module_beside_it_says_its_folder_is_not_on_the_path(tmp_path):
    """Held-out round 13 (H14): a plugin file importing its sibling module (`import childhelper`), its folder not on
    PYTHONPATH: `failed to load: ModuleNotFoundError: No module named 'childhelper'`, nothing said of why (run as a
    script, Python would have put the folder first on its path). The line now says where the module is and what to
    do (a real command: the path is the process's)."""
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "childhelper.py").write_text("X = 1\n")
    (tmp_path / "plug" / "p_helper.py").write_text("import childhelper\n")
    p = launch.run([sys.executable, "-m", "bench.cli", "list", "--plugin", "plug/p_helper.py"], cwd=tmp_path,
                   capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]
    assert "No module named 'childhelper' ('childhelper' is beside the plugin in " \
           f"{tmp_path / 'plug'}, which is not on Python's path" in p.stderr, p.stderr
    assert "add that folder to PYTHONPATH" in p.stderr
