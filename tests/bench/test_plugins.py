"""Plugins (bench/plugins.py, docs/PLUGINS.md): an objective and a task of one's own, loaded by ``--plugin`` / the
config key ``plugins`` / the entry-point group, in the parent and in every process that trains: spawned workers, Ray
tasks, torchrun processes, verl workers. The example plugins of examples/plugins/ are the ones users copy, so the
tests load those. Real parts throughout: the command line, spawned processes, a local Ray instance, torchrun, MLflow
stores; the orchestration tests that need no model use tests/bench/fake_trainer.py's trainer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient

from algorithms import PolicyBatch, get_objective
from bench.cli import main
from bench.config import TrainConfig
from bench.plugin_identity import source_digest
from bench.plugins import load_plugins, objective_source
from tests import launch
from tests.conftest import ON_RAY, forkserver_context, fresh_store

from .test_parallel import model_dir, tiny  # noqa: F401  (fixtures)


@pytest.fixture(autouse=True)
def _registries_as_they_were():
    """Each test's plugins leave this process as it found it: the objective and task registries, the plugins loaded
    and their modules (under pytest-xdist another test file may run next in this process and list the built-ins)."""
    import sys

    from algorithms import advantages
    from algorithms import registry as objectives
    from bench import plugins
    from evaluators import benchmarks as tasks

    kept = [(d, dict(d)) for d in (objectives._REGISTRY, advantages._REGISTERED, tasks._BY_NAME, tasks._GENERATED,
                                   tasks._REGISTERED_BY, plugins._LOADED)]
    entry_points, modules, loaded = list(plugins._ENTRY_POINTS), set(sys.modules), set(plugins._LOADED)
    yield
    imported = {p.module for k, p in plugins._LOADED.items() if k not in loaded} - modules
    for d, before in kept:
        d.clear()
        d.update(before)
    plugins._ENTRY_POINTS[:] = entry_points
    for name in imported:  # (imported again by the next test that loads it: its objectives registered again)
        sys.modules.pop(name, None)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"
OBJECTIVES, TASK = str(EXAMPLES / "objectives.py"), str(EXAMPLES / "mod7_task.py")
HAVE_RAY = importlib.util.find_spec("ray") is not None
TINY_FLAGS = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--eval-every",
              "1", "--max-new-tokens", "8", "--samples-every", "0", "--checkpoint-every", "1", "--device", "cpu"]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return launch.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=_env(**env),
                      capture_output=True, text=True, timeout=600)


def _runs(uri: str, experiment: str) -> dict[str, object]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], "tags.`pobench.kind` = 'train'")
    return {r.data.tags["pobench.objective"]: r for r in runs}


# ------------------------------------------------------------------ loading, identity, errors (fast)
def test_the_comparison_hash_changes_with_the_plugin_source_not_its_path(tmp_path):
    for folder, text in (("a", "X = 1\n"), ("b", "X = 1\n"), ("c", "X = 2\n")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "noop_plugin.py").write_text(text)
    h = {f: TrainConfig(plugins=[str(tmp_path / f / "noop_plugin.py")]).comparison_hash() for f in "abc"}
    assert h["a"] == h["b"]                            # the same source in another folder: the same runs
    assert h["a"] != h["c"]                            # an edited plugin: other runs
    assert TrainConfig().comparison_hash() not in h.values()
    assert TrainConfig(plugins=[]).comparison_hash() == TrainConfig().comparison_hash()  # hashes of earlier runs


def test_a_plugin_s_identity_covers_the_local_modules_it_imports(tmp_path):
    """Issue 29: a plugin's identity was its own file's digest only, so a module it imports changing a setting (here
    the KL coefficient its objective registers with) reused the old runs under the new meaning. Its identity now
    covers the source of every module it imports from outside installed packages, at import time or later inside a
    function; the same source elsewhere keeps it, and a plugin without such imports keeps the digest it had (each
    hash in a fresh process, as a new command computes it: forked from a forkserver that imported pobench once, not
    the plugin, nor its modules)."""
    lib = tmp_path / "lib"
    (lib / "helpers").mkdir(parents=True)
    (lib / "settings.py").write_text("KL = 0.0\n")
    (lib / "helpers" / "__init__.py").write_text("")
    (lib / "helpers" / "deep.py").write_text("SCALE = 1.0\n")
    plugin = tmp_path / "plug.py"
    plugin.write_text("import json\nimport torch\nimport settings\nfrom algorithms import register\n"
                      "register('grpo-set', base='grpo', description='x', kl_coef=settings.KL)\n"
                      "def later():\n    from helpers.deep import SCALE\n    return SCALE\n")
    alone = tmp_path / "alone.py"
    alone.write_text("import json\nX = 1\n")
    from concurrent.futures import ProcessPoolExecutor

    def identity() -> list[str]:
        with ProcessPoolExecutor(1, mp_context=ctx) as fresh:  # (a new process each time)
            return fresh.submit(_identity_in_this_process, str(plugin), str(alone), str(lib)).result(timeout=300)

    with forkserver_context("bench.config", "bench.plugins", __name__) as ctx:
        first = identity()
        assert first[2] == f"alone.py@{source_digest(alone)}"  # no local import: the digest runs were stored under
        (lib / "settings.py").write_text("KL = 0.1\n")
        changed_setting = identity()
        (lib / "settings.py").write_text("KL = 0.0\n")
        (lib / "helpers" / "deep.py").write_text("SCALE = 2.0\n")
        changed_lazy = identity()
        (lib / "helpers" / "deep.py").write_text("SCALE = 1.0\n")
        again = identity()
    assert changed_setting[0] != first[0] and changed_lazy[0] != first[0]          # the comparison hash
    assert changed_setting[1] != first[1] and changed_lazy[1] != first[1]          # the run's pobench.plugins tag
    assert again == first                                                           # the same source: the same runs


def _identity_in_this_process(plugin: str, alone: str, lib: str) -> list[str]:
    """The comparison hash and ``pobench.plugins`` tag of ``plugin``, and the tag of ``alone``, computed in a process
    that never imported them, with ``lib`` on its import path (as $PYTHONPATH puts it)."""
    sys.path.insert(0, lib)
    from bench.config import TrainConfig
    from bench.plugins import plugins_tag

    return [TrainConfig(plugins=[plugin]).comparison_hash(), plugins_tag([plugin]), plugins_tag([alone])]


def test_a_plugin_importing_by_a_computed_name_is_warned_about(tmp_path, capsys):
    """What a plugin imports by a name computed at run time cannot be known from its source: `bench` says so in one
    line (the modules it imported while loading are covered all the same)."""
    (tmp_path / "dyn.py").write_text("import importlib\nNAME = 'json'\nmod = importlib.import_module(NAME)\n")
    assert main(["list", "--plugin", str(tmp_path / "dyn.py")]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(lines) == 1 and "computed at run time" in lines[0] and "dyn.py:3" in lines[0], err


def test_the_example_plugins_register_an_objective_and_a_task_with_its_own_verifier(capsys):
    load_plugins([OBJECTIVES, TASK])
    assert get_objective("grpo-nokl").config.kl_coef == 0.0 and get_objective("grpo").config.kl_coef > 0
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(4, 5, generator=g) * 0.1
    batch = PolicyBatch(logprobs=lp.clone().requires_grad_(), old_logprobs=lp.detach(),
                        advantages=torch.tensor([0.3, -2.0, 0.0, 5.0]), mask=torch.ones(4, 5), max_length=5)
    loss, _ = get_objective("sign-pg").loss(batch)
    # on-policy (ratio 1): the token-mean of −sign(Â) over the unmasked tokens
    assert loss.item() == pytest.approx(-(1 - 1 + 0 + 1) / 4, abs=1e-6)
    from evaluators import get_benchmark
    from evaluators.tasks import Problem

    mod7 = get_benchmark("mod7")
    problems = mod7.load(split="test", limit=3)
    assert len(problems) == 3 and problems[0].question.startswith("What is")
    p = Problem("x", "What is 10 mod 7?", "3")
    assert mod7.reward("so it is 10", p) == 1.0 and mod7.reward("it is 4", p) == 0.0   # congruent, not equal
    assert main(["list", "--plugin", OBJECTIVES, "--plugin", TASK]) == 0
    out = capsys.readouterr().out
    sign = next(line for line in out.splitlines() if line.startswith("sign-pg "))
    assert "[plugin objectives.py@" in sign and OBJECTIVES in sign
    assert "[plugin" not in next(line for line in out.splitlines() if line.startswith("grpo "))
    assert "task mod7: Remainders modulo 7" in out and "[plugin mod7_task.py@" in out
    assert objective_source("grpo") == "built-in"


def test_a_plugin_task_s_own_data_is_part_of_the_identity(tmp_path):
    """A task's ``data_dir`` (the plugin's JSONL files) is read when no --data is given, logged as the run's dataset
    and digested into the comparison hash: editing the plugin's data makes a new comparison. (In a fresh process:
    this process has mod7 registered from examples/ already.)"""
    import shutil

    copy = tmp_path / "plugin"
    shutil.copytree(EXAMPLES, copy)
    rows = sum(1 for line in (copy / "mod7" / "train.jsonl").read_text().splitlines() if line.strip())
    done = _python(f"""
        import json
        from bench.runs import identity
        from bench.config import TrainConfig
        from bench.plugins import load_plugins
        load_plugins([{str(copy / "mod7_task.py")!r}])
        cfg = TrainConfig(task="mod7", plugins=[{str(copy / "mod7_task.py")!r}])
        train, held_out = identity.datasets(cfg)
        before = cfg.comparison_hash()
        with open({str(copy / "mod7" / "train.jsonl")!r}, "a") as f:
            f.write(json.dumps({{"question": "What is 15 mod 7?", "answer": "1"}}) + "\\n")
        print(json.dumps([train["source"], train["rows"], identity.datasets(cfg)[0]["rows"],
                          before != cfg.comparison_hash()]))
    """, tmp_path, POBENCH_CACHE_DIR=str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [str(copy / "mod7"), rows, rows + 1, True]


def test_a_plugin_that_cannot_load_is_one_line_and_nothing_runs(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/m.db"
    (tmp_path / "broken.py").write_text("1 / 0\n")
    for plugin, said in (("nope.py", "plugin nope.py: no such file"),
                         (str(tmp_path / "broken.py"), "failed to load: ZeroDivisionError: division by zero"),
                         ("no_such_module_xyz", "plugin 'no_such_module_xyz': no module named 'no_such_module_xyz'")):
        assert main(["run", "--plugin", plugin, "--tracking-uri", uri, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("bench run: error: ") and said in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1
    assert main(["run", "--algos", "sign-pg-typo", "--tracking-uri", uri, "--no-progress"]) == 2
    assert not (tmp_path / "m.db").exists()


def test_a_plugin_that_calls_sys_exit_while_imported_is_one_line_not_a_silent_exit(tmp_path):
    """Issue 29: a plugin calling ``sys.exit(3)`` at import ended `bench` silently with 3, the code documented as
    "diverged": it is the plugin's failure to load, one line and exit 2 (a real process, as a user runs it)."""
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    done = launch.run([sys.executable, "-m", "bench.cli", "list", "--plugin", "exits.py"], cwd=tmp_path,
                      env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    (line,) = done.stderr.strip().splitlines()
    assert "plugin exits.py failed to load: it called sys.exit(3) while imported" in line, done.stderr


def test_a_notebook_objective_gets_one_line_and_an_imported_module_reaches_the_workers(tmp_path):
    """``register`` in ``__main__`` (here ``python -c``, as a notebook cell) cannot reach spawned workers: one line
    before any worker starts. Registered by an importable module the config does not name: the module is added to the
    config's plugins, and two spawned workers train it."""
    (tmp_path / "my_objectives.py").write_text(
        "from algorithms import register\n"
        "register('grpo-lowclip', base='grpo', description='GRPO with a small clip', clip_low=0.1, clip_high=0.1)\n")
    result = _python(f"""
        import sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(ROOT / 'tests' / 'bench')!r}]
        from algorithms import register
        from bench.comparison import ComparisonSpec, base_config, run_comparison
        from fake_trainer import fake_step0, fake_train
        register("grpo-nokl-nb", base="grpo", description="notebook", kl_coef=0.0)
        cfg = base_config(None, steps=2, eval_every=1, tracking_uri="sqlite:///{tmp_path}/m.db",
                          output_dir="{tmp_path}/runs", experiment="nb")
        spec = ComparisonSpec(cfg, ["grpo", "grpo-nokl-nb"], [0], workers=2, report=False, progress=False,
                              train_fn=fake_train, step0_fn=fake_step0)
        try:
            run_comparison(spec)
        except ValueError as e:
            print("ERROR", e)
        import my_objectives
        spec.algos = ["grpo", "grpo-lowclip"]
        res = run_comparison(spec)
        print("WORKERS", res.workers, [p.outcome for p in res.pairs])
    """, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    err = next(line for line in lines if line.startswith("ERROR"))
    assert "'grpo-nokl-nb' is registered in __main__" in err and "--workers 1" in err and "module" in err
    assert "WORKERS 2 ['finished', 'finished']" in lines, result.stdout + result.stderr[-3000:]
    run = _runs(f"sqlite:///{tmp_path}/m.db", "nb")["grpo-lowclip"]
    assert run.data.tags["pobench.plugins"].startswith("my_objectives.py@")
    assert "my_objectives" in run.data.params["plugins"]


def test_an_installed_plugin_is_loaded_from_its_entry_point(tmp_path):
    site = tmp_path / "site"
    (site / "pobench_demo-0.1.dist-info").mkdir(parents=True)
    (site / "pobench_demo-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: pobench-demo\n"
                                                                  "Version: 0.1\n")
    (site / "pobench_demo-0.1.dist-info" / "entry_points.txt").write_text("[pobench.plugins]\ndemo = demo_plugin\n")
    (site / "demo_plugin.py").write_text("from algorithms import register\n"
                                         "register('grpo-installed', base='grpo', description='installed', "
                                         "kl_coef=0.5)\n")
    result = launch.run([sys.executable, "-m", "bench.cli", "list"], cwd=tmp_path, capture_output=True, text=True,
                        env=_env(PYTHONPATH=f"{ROOT}{os.pathsep}{site}"), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("grpo-installed "))
    assert "[installed plugin demo_plugin.py@" in line


def test_verl_workers_load_the_plugins_before_the_objective_is_resolved(tmp_path):
    """make_verl_config hands the plugins to verl's workers ($POBENCH_PLUGINS in Ray's runtime env); importing
    pobench's verl package there (verl's external_lib) loads them, so the policy loss and the reward function of a
    plugin's objective and task resolve in a process that loaded nothing else."""
    from bench.engines.verl import make_verl_config
    from bench.plugins import PLUGINS_ENV

    load_plugins([OBJECTIVES, TASK])
    cfg = TrainConfig(algo="sign-pg", engine="verl", model="Qwen/Qwen2.5-Math-1.5B", task="mod7", steps=1,
                      prompts_per_step=4, minibatches=2, group_size=2, output_dir=str(tmp_path / "runs"),
                      plugins=[OBJECTIVES, TASK])
    env = make_verl_config(cfg)["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert json.loads(env[PLUGINS_ENV]) == [OBJECTIVES, TASK]
    result = _python("""
        import torch
        from bench.engines.verl import compute_score, make_policy_loss, mapping
        from algorithms import get_objective, PolicyBatch
        assert mapping("sign-pg").mode == "registered", mapping("sign-pg")
        g = torch.Generator().manual_seed(1)
        old = torch.randn(3, 4, generator=g) * 0.1
        lp = old + torch.randn(3, 4, generator=g) * 0.05
        adv = torch.tensor([1.0, -0.5, 2.0])
        mask = torch.ones(3, 4)
        loss, _ = make_policy_loss("sign-pg")(old, lp, adv[:, None].expand(3, 4), mask,
                                                   "seq-mean-token-mean")
        ref, _ = get_objective("sign-pg").loss(PolicyBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask,
                                                          max_length=4))
        print("LOSS", float(loss), float(ref))
        print("SCORE", compute_score("mod7", "it is 10", "3")["score"], compute_score("mod7", "it is 4", "3")["score"])
    """, tmp_path, **{PLUGINS_ENV: env[PLUGINS_ENV]})
    assert result.returncode == 0, result.stderr[-3000:]
    got = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    loss, ref = map(float, got["LOSS"].split())
    assert loss == pytest.approx(ref, rel=1e-6) and loss != 0.0
    assert got["SCORE"] == "1.0 0.0"    # the plugin's verifier (congruence), not the built-in one


# ------------------------------------------------------------------ real training (slow)
def _report_rows(folder: Path) -> list[str]:
    report = next(folder.rglob("report.md")).read_text()
    return [line.split("|")[1].strip() for line in report.splitlines() if line.startswith("| ")]


@pytest.mark.slow
def test_bench_run_trains_a_plugin_objective_and_task_in_two_spawned_workers(tmp_path, model_dir, capsys):  # noqa: F811
    uri = fresh_store(tmp_path, "m.db")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({"plugins": [OBJECTIVES], "model": model_dir}))
    flags = ["run", "--config", str(tmp_path / "cfg.yaml"), "--plugin", TASK, "--task", "mod7", "--algos",
             "grpo,sign-pg,grpo-median", "--seeds", "0", "--workers", "2", "--tracking-uri", uri, "--experiment",
             "plug", "--output-dir", str(tmp_path / "runs"), "--out-root", str(tmp_path / "reports"), "--no-progress",
             *TINY_FLAGS]
    assert main(flags) == 0, capsys.readouterr().err[-3000:]
    out = capsys.readouterr().out
    assert "on 2 worker(s)" in out and "sign-pg                  seed 0: finished" in out, out
    # grpo-median: the plugin's advantage estimator, known in the spawned workers (else its config would not validate)
    assert "grpo-median              seed 0: finished" in out, out
    assert {"grpo", "sign-pg", "grpo-median"} <= set(_report_rows(tmp_path / "reports"))
    runs = _runs(uri, "plug")
    for name in ("grpo", "sign-pg", "grpo-median"):
        tags = runs[name].data.tags
        assert tags["pobench.task"] == "mod7"
        assert [t.split("@")[0] for t in tags["pobench.plugins"].split(",")] == ["objectives.py", "mod7_task.py"]
    assert main(flags) == 0   # the same command again: both reused
    assert "sign-pg                  seed 0: reused" in capsys.readouterr().out


@pytest.mark.slow
@ON_RAY
def test_ray_tasks_train_a_plugin_objective_and_task(tmp_path, model_dir, ray_local):  # noqa: F811
    from bench.comparison import ComparisonSpec, run_comparison

    cfg = tiny(tmp_path, model_dir, "plug-ray", steps=1, plugins=[OBJECTIVES, TASK], task="mod7")
    res = run_comparison(ComparisonSpec(cfg, ["grpo", "sign-pg"], [0], executor="ray", progress=False,
                                        out_root=tmp_path / "reports"))
    assert (res.executor, [p.outcome for p in res.pairs]) == ("ray", ["finished", "finished"])
    assert {"grpo", "sign-pg"} <= set(_report_rows(tmp_path / "reports"))
    assert _runs(res.tracking_uri, "plug-ray")["sign-pg"].data.tags["pobench.task"] == "mod7"


@pytest.mark.slow
def test_bench_run_trains_plugin_objectives_with_trl(tmp_path, bench_here):
    """`bench run --engine trl` with a plugin's objective class and a plugin's advantage estimator, on a plugin's task
    (its pairs in this process: the plugins were loaded by the command). The plugins in both processes of a torchrun
    are test_engine_trl.py's test_torchrun_two_processes_write_one_mlflow_run."""
    pytest.importorskip("trl")
    uri = fresh_store(tmp_path, "m.db")
    rc, out, err = bench_here(["run", "--engine", "trl", "--algos", "sign-pg,grpo-median", "--seeds", "0",
                               "--workers", "1", "--experiment", "plug-trl", "--output-dir", str(tmp_path / "runs"),
                               "--out-root", str(tmp_path / "reports"), "--no-progress", "--plugin", OBJECTIVES,
                               "--plugin", TASK, "--task", "mod7", "--tracking-uri", uri, "--minibatches", "2",
                               "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "8",
                               "--eval-problems", "4", "--eval-every", "1", "--steps", "1", "--samples-every", "0",
                               "--device", "cpu"], tmp_path)
    assert rc == 0, out[-2000:] + err[-4000:]
    assert {"sign-pg", "grpo-median"} <= set(_report_rows(tmp_path / "reports"))  # (the plugin's estimator under TRL)
    runs = _runs(uri, "plug-trl")
    assert runs["grpo-median"].data.tags["pobench.engine"] == "trl"
    assert runs["sign-pg"].data.tags["pobench.task"] == "mod7"
    assert "objectives.py@" in runs["sign-pg"].data.tags["pobench.plugins"]


def test_resume_after_the_plugin_was_edited_is_refused_naming_its_digests(tmp_path, bench_here):
    """Held-out round 8 (F4): `bench train --plugin p.py --run-name r` killed after a checkpoint, `p.py` edited
    (kl_coef 0.0 -> 0.5), then `--resume`: accepted silently, the remaining steps trained with the new kl_coef while
    the run recorded the old value and the old plugin digest. Now the resume compares the plugins' source digests
    the run recorded (`inputs.json`) and refuses in one line naming the plugin's digests and what to do, exit 2,
    before any training (the resume in a fresh process: a plugin is imported once per process; the first run, which
    only makes the run to resume, in this one, whose registries the fixture puts back)."""
    import yaml

    plugin = tmp_path / "p.py"
    plugin.write_text('from algorithms import register\nregister("mine", base="grpo", description="a", kl_coef=0.0)\n')
    train = ["train", "--plugin", "p.py", "--algo", "mine", "--run-name", "r", "--no-progress", *TINY_FLAGS]
    fresh_store(tmp_path)  # (the default store of the working folder)
    rc, _, err = bench_here(train, tmp_path, POBENCH_CACHE_DIR=str(tmp_path / "cache"))
    assert rc == 0, err[-3000:]
    old = f"p.py@{source_digest(plugin)}"
    plugin.write_text(plugin.read_text().replace("kl_coef=0.0", "kl_coef=0.5"))  # as the user did
    new = f"p.py@{source_digest(plugin)}"
    run_dir = tmp_path / ".pobench" / "runs" / "pobench" / "r"
    before = sorted(p.name for p in run_dir.iterdir())

    done = launch.run([sys.executable, "-m", "bench.cli", *train, "--steps", "2", "--resume"], cwd=tmp_path,
                      env=_env(POBENCH_CACHE_DIR=str(tmp_path / "cache")), capture_output=True, text=True,
                      timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"plugin sources ({old}~" in lines[0] and f" -> {new}~" in lines[0], lines[0]  # (~: its settings)
    assert "another --run-name" in lines[0], lines[0]
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing trained: no checkpoint of step 2
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["steps"] == 1
