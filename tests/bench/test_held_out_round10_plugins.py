"""Held-out round 10's plugin cases (H01, H07, H10, H11) and two commands at once on one folder (H12, H14):

- a plugin objective whose setting comes from a file it reads at import, a file it runs by path, or an environment
  variable is another comparison when that value changes (the old run was reused, and a resume trained on);
- a plugin that fails to load only in a pool worker is one line naming it in each pair's line;
- a plugin's os._exit in its loss fails the run in one line (it ended the command with 0, the run left RUNNING);
- a warm start into a folder another one writes now is refused; two `bench eval --comparison` store each evaluation
  once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench import plugins
from bench.config import TrainConfig

from .test_plugins import _registries_as_they_were  # noqa: F401  (autouse: the registries as they were)

TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--eval-every", "0",
        "--samples-every", "0", "--checkpoint-every", "1", "--no-progress"]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def _new_process(plugin: Path) -> None:
    """Forget ``plugin`` as a new command's process has never loaded it: its module and its objectives."""
    from algorithms import registry

    loaded = plugins._LOADED.pop(str(plugin.resolve()), None)
    if loaded is not None:
        sys.modules.pop(loaded.module, None)
        for name in [n for n, s in registry._REGISTRY.items() if s.module == loaded.module]:
            registry.unregister(name)


def _hash(plugin: Path) -> str:
    _new_process(plugin)
    return TrainConfig(plugins=[str(plugin)]).comparison_hash()


# ------------------------------------------------------------------ H01, H07: a plugin's settings from elsewhere
PLUGINS = {
    # H01: a JSON file it reads at import
    "json": ("import json, pathlib\nfrom algorithms import register\n"
             "kl = json.loads((pathlib.Path(__file__).parent / 'kl.json').read_text())['kl_coef']\n"
             "register('grpo-cfg', base='grpo', description='kl from kl.json', kl_coef=kl)\n", "kl.json",
             '{"kl_coef": 0.0}', '{"kl_coef": 0.05}'),
    # H07: a file it runs by path (the value reaches no objective: a reward function's, say)
    "runpy": ("import runpy, pathlib\nns = runpy.run_path(str(pathlib.Path(__file__).parent / 'settings.py'))\n"
              "SCALE = ns['SCALE']\n", "settings.py", "SCALE = 1.0\n", "SCALE = 2.0\n"),
    "exec": ("import pathlib\nexec(open(pathlib.Path(__file__).parent / 'settings.py').read())\n", "settings.py",
             "SCALE = 1.0\n", "SCALE = 2.0\n"),
    "spec_from_file_location": (
        "import importlib.util, pathlib\n"
        "spec = importlib.util.spec_from_file_location('mysettings', pathlib.Path(__file__).parent / 'settings.py')\n"
        "mod = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(mod)\n", "settings.py", "SCALE = 1.0\n",
        "SCALE = 2.0\n"),
}


@pytest.mark.parametrize("kind", list(PLUGINS))
def test_a_file_a_plugin_reads_or_runs_at_import_is_part_of_its_identity(tmp_path, kind):
    """H01 / H07: the comparison id stayed the same when the file a plugin read its setting from (or ran by path)
    changed, so `bench run` reused the old run under the new value. The content of each file its own code opens while
    imported is now in its digest (bench/plugin_guard.py ``FileReads``): another value, another comparison; the same
    content, the same one; the run's pobench.plugins tag names the file."""
    source, name, before, after = PLUGINS[kind]
    plugin = tmp_path / "plug.py"
    plugin.write_text(source)
    (tmp_path / name).write_text(before)
    first = _hash(plugin)
    assert plugins.plugins_tag([str(plugin)]).endswith(f"+{name}")
    (tmp_path / name).write_text(after)
    assert _hash(plugin) != first
    (tmp_path / name).write_text(before)
    assert _hash(plugin) == first


def test_an_objective_setting_from_an_environment_variable_is_part_of_the_identity(tmp_path, monkeypatch):
    """H01 (p03): ``kl_coef=float(os.environ.get("MY_KL", "0"))`` kept the comparison id when MY_KL changed. The
    resolved settings of each objective a plugin registers are now in its identity, wherever a value came from."""
    plugin = tmp_path / "envplug.py"
    plugin.write_text("import os\nfrom algorithms import register\nregister('grpo-env', base='grpo', "
                      "description='kl from MY_KL', kl_coef=float(os.environ.get('MY_KL', '0')))\n")
    monkeypatch.delenv("MY_KL", raising=False)
    first = _hash(plugin)
    monkeypatch.setenv("MY_KL", "0.05")
    assert _hash(plugin) != first
    monkeypatch.setenv("MY_KL", "0")
    assert _hash(plugin) == first


def test_resume_after_the_plugin_s_data_file_changed_is_refused(tmp_path, bench_here):
    """H01 (p02t): `bench train --plugin cfgplug.py` trained, kl.json changed, then `--steps 2 --resume` trained the
    extra step with the new kl_coef while the run recorded the old one, exit 0. Now the new value is another folder
    key, and the resume is refused in one line naming the plugin's changed sources, exit 2, nothing trained."""
    source, name, before, after = PLUGINS["json"]
    plugin = tmp_path / "cfgplug.py"
    plugin.write_text(source)
    (tmp_path / name).write_text(before)
    train = ["train", "--algo", "grpo-cfg", "--plugin", "cfgplug.py", *TINY]
    rc, _, err = bench_here(train, tmp_path)
    assert rc == 0, err[-3000:]
    (tmp_path / name).write_text(after)
    _new_process(plugin)
    rc, _, err = bench_here([*train, "--steps", "2", "--resume"], tmp_path)
    assert rc == 2, err[-3000:]
    line = _one_line(err)
    assert "plugin sources (cfgplug.py@" in line and "with another configuration" in line, line


# ------------------------------------------------------------------ H10: a plugin that fails in a worker only
def test_a_plugin_failing_to_load_in_a_pool_worker_only_is_named_in_each_pair_s_line(tmp_path, bench_here):
    """H10: a plugin that loads in the command's process but raises in a pool worker (here: it is not the main
    process; a working folder or an environment variable of the parent's only alike) gave Python's "Exception in
    initializer:" with two chained tracebacks, and each pair said "worker process ended (BrokenProcessPool: ...)",
    never naming the plugin. Now each pair's line names the plugin, its file and its error, no traceback, exit 1
    (real pool processes: the plugin is loaded in each)."""
    (tmp_path / "workerfail.py").write_text(
        "import multiprocessing\nfrom algorithms import register\n"
        "if multiprocessing.current_process().name != 'MainProcess':\n"
        "    raise RuntimeError('cannot load in a worker (no GPU here)')\n"
        "register('grpo-w', base='grpo', description='fails in workers')\n")
    rc, out, err = bench_here(["run", "--algos", "grpo-w", "--no-controls", "--seeds", "0,1", "--workers", "2",
                               *TINY[:-5], "--eval-every", "1", "--plugin", "workerfail.py", "--no-progress"],
                              tmp_path)
    assert rc == 1, (out + err)[-3000:]
    assert "Traceback" not in out + err and "initializer" not in out + err, (out + err)[-3000:]
    why = f"plugin {tmp_path / 'workerfail.py'} failed to load in a worker process: RuntimeError: cannot load in a " \
          "worker (no GPU here)"
    for seed in (0, 1):  # (each pair's line names the plugin; its error is said once: held-out round 15, H09)
        assert f"seed {seed}: failed: plugin {tmp_path / 'workerfail.py'} failed to load in a worker process" in out, \
            out[-3000:]
    assert (out + err).count(why) == 1, (out + err)[-3000:]


# ------------------------------------------------------------------ H11: os._exit in a plugin's loss
def test_os_exit_in_a_plugin_objective_s_loss_fails_the_run_in_one_line(tmp_path):
    """H11: a plugin objective calling os._exit(0) in its loss ended `bench train` with exit 0, nothing said, its run
    left RUNNING. A process cannot catch os._exit; pobench replaces it, for a loaded plugin's code, by a raise handled
    as its sys.exit is: one line naming the plugin's line, a failure's exit code, the run FAILED (a real process:
    the exit is the subject)."""
    from tests.bench.test_held_out_round9 import _bench
    from tests.bench.test_signals import statuses
    from tests.conftest import fresh_store

    uri = fresh_store(tmp_path)
    (tmp_path / "osexit.py").write_text(
        "import os\nfrom algorithms import register\nfrom algorithms.policy_gradient import PolicyGradient\n\n\n"
        "class OsExitPG(PolicyGradient):\n    def policy_term(self, batch, ratio, adv, is_w):\n"
        "        os._exit(0)\n\n\n"
        "register('osexit', OsExitPG, description='calls os._exit(0) in its loss')\n")
    done = _bench(["train", "--algo", "osexit", "--plugin", "osexit.py", *TINY], tmp_path)
    # (the exit code of a plugin's sys.exit, whatever it is: held-out round 10 H13 is about which)
    assert done.returncode in (1, 2), (done.stdout + done.stderr)[-3000:]
    line = _one_line(done.stderr)
    assert f"os._exit(0) was called inside the work at {tmp_path / 'osexit.py'}:8 (in policy_term)" in line, line
    assert statuses(uri, "pobench") == ["FAILED"]


# ------------------------------------------------------------------ H12, H14: two commands at once on one folder
def test_a_warmstart_into_a_folder_another_warmstart_writes_now_is_refused(tmp_path, bench_here):
    """H12: two `bench warmstart` of different recipes into one `--out` at once both ended 0, the model of one silently
    replaced by the other's (the one-after-the-other refusal was raced past). The folder is now held from the look
    at what it holds until the model is saved: a warm start into it while another holds it is refused in one line,
    exit 2, nothing written there (the other command's hold taken here, as it takes it: no race in the test)."""
    from filelock import FileLock

    other = FileLock(str(tmp_path / ".locks" / "m2.warmstart.lock"), thread_local=False)
    (tmp_path / ".locks").mkdir()
    other.acquire(timeout=0)
    (tmp_path / ".locks" / "m2.warmstart.lock.pid").write_text(f"{os.getpid()}\n")  # (as its holder writes it)
    try:
        rc, _, err = bench_here(["warmstart", "--steps", "3", "--eval", "0", "--out", "m2", "--no-progress"],
                                tmp_path)
    finally:
        other.release()
    assert rc == 2, err[-3000:]
    assert f"another bench warmstart (process {os.getpid()}) is writing there now" in _one_line(err), err
    assert not (tmp_path / "m2").exists()


def test_two_comparison_evals_at_once_store_each_evaluation_once(tmp_path, bench_here):
    """H14: two `bench eval --comparison` at once both planned "0 stored, N to evaluate", both evaluated everything,
    and each model's evaluation was stored twice. Each (run, benchmark, settings) evaluation is now claimed with a lock
    (as `bench run` claims its pairs), and asked for again once claimed. Here without a race: the second command's
    plan is made first, the first command then evaluates and stores, and the second one goes on: it reuses the
    stored evaluation instead of storing a duplicate."""
    from mlflow import MlflowClient

    from bench.comparison.evals import EvalSettings, evaluate_missing, plan_evaluations

    run = ["run", "--algos", "grpo", "--seeds", "0", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
           "--eval-problems", "4", "--eval-every", "1", "--max-new-tokens", "8", "--samples-every", "0",
           "--workers", "1", "--no-progress", "--no-report", "--no-controls"]
    rc, _, err = bench_here(run, tmp_path)
    assert rc == 0, err[-3000:]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp_id = client.get_experiment_by_name("pobench").experiment_id
    (train,) = client.search_runs([exp_id], "tags.`pobench.kind` = 'train'")
    cid = train.data.tags["pobench.comparison"]
    settings = EvalSettings(limit=4, max_new_tokens=8, device="cpu", dtype="float32")
    second = plan_evaluations("pobench", cid, ["arith"], settings, uri, client)  # planned before the first stores
    assert second.missing == 1
    rc, _, err = bench_here(["eval", "--comparison", cid, "--benchmarks", "arith", "--limit", "4",
                             "--max-new-tokens", "8", "--temperature", "0"], tmp_path)
    assert rc == 0 and "0 stored, 1 to evaluate" in err, err[-3000:]
    (first,) = client.search_runs([exp_id], "tags.`pobench.kind` = 'eval'")
    assert plan_evaluations("pobench", cid, ["arith"], settings, uri, client).reused == 1  # (the command's settings)
    assert list(evaluate_missing(second, settings, "pobench", uri, tmp_path / "e2")) == [first.info.run_id]
    assert len(client.search_runs([exp_id], "tags.`pobench.kind` = 'eval'")) == 1


# ------------------------------------------------------------------ round 13, H37: a plugin edited as the pool starts
def test_a_plugin_edited_while_the_pool_starts_fails_each_pair_in_one_line(tmp_path, bench_here):
    """Held-out round 13 (H37): a plugin file edited after `bench run` identified it and before its pool workers
    imported it: the workers trained the edited code (kl_coef 0.5) under the comparison id of the first (0.0), exit 0,
    nothing said. Now a worker whose plugins are not those the command identified trains nothing: each pair's line
    names the change, exit 1 (here the plugin edits its own file half a second after the command imported it)."""
    (tmp_path / "pv.py").write_text(
        "import multiprocessing, threading\nfrom algorithms import register\n"
        "KL = 0.0\n"
        "register('grpo-v', base='grpo', kl_coef=KL, description='edited while the pool starts')\n"
        "def _edit():\n"
        "    text = open(__file__).read().replace('KL = 0.0', 'KL = 0.5')\n"
        "    open(__file__, 'w').write(text)\n"
        "if multiprocessing.current_process().name == 'MainProcess':\n"
        "    threading.Timer(0.5, _edit).start()\n")
    rc, out, err = bench_here(["run", "--algos", "grpo-v", "--no-controls", "--seeds", "0,1", "--workers", "2",
                               *TINY[:-5], "--plugin", "pv.py", "--no-progress", "--no-report"], tmp_path)
    assert "KL = 0.5" in (tmp_path / "pv.py").read_text()
    assert rc == 1, (out + err)[-3000:]
    assert "Traceback" not in out + err, (out + err)[-3000:]
    for seed in (0, 1):
        assert f"seed {seed}: failed: the plugins changed on disk while the command started its worker processes" \
            in out, out[-3000:]
