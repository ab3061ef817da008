"""`--engine trl` (bench/engines/trl/): loss / gradient parity with the native loop for every registered objective,
refusals, and end-to-end runs (a 2-process torchrun run, a `bench run` comparison whose report matches a native one).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import launch

pytest.importorskip("trl")

from algorithms import PolicyBatch, get_objective, list_objectives  # noqa: E402
from bench.config import TrainConfig  # noqa: E402
from bench.engines import trl as engine  # noqa: E402
from tests.conftest import fresh_store

REPO = Path(__file__).resolve().parents[2]
TOL = dict(atol=1e-5, rtol=1e-5)


def _cfg(**kw) -> TrainConfig:
    base = dict(engine="trl", device="cpu", prompts_per_step=2, group_size=3, minibatches=1, micro_batch_size=6,
                max_new_tokens=7, steps=1, checkpoint_every=0)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from datasets import Dataset

    from bench.model import load_policy

    torch.manual_seed(0)
    model, tok = load_policy("builtin:tiny-arith", "cpu")
    cfg = _cfg()
    args = engine.grpo_config(cfg, tmp_path_factory.mktemp("trl"), 1)
    tr = engine._trainer_class()(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                 args=args, train_dataset=Dataset.from_list([{"prompt": "1+1=", "pobench_problem": 0}]),
                                 processing_class=tok, objective=get_objective("grpo"), pobench_cfg=cfg)
    return tr


def _rollout(tok, vocab: int):
    """Fixed prompts (different lengths: left padding) and completions (different lengths: right padding)."""
    g = torch.Generator().manual_seed(1)
    p_len, c_len = [3, 5, 4, 3, 5, 4], [7, 2, 5, 6, 1, 4]
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in p_len]
    completions = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in c_len]
    return prompts, completions, g


def _grads(model) -> list[torch.Tensor]:
    out = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def _both(tr, name: str, objective=None, advantages_to_trl=None):
    """(loss, grads) of the native loop (bench.rollout.scoring.score + the objective on a PolicyBatch) and of the TRL
    engine's ``_compute_loss`` on the same rollout batch."""
    from bench.data import derive_seed
    from bench.engines.native.step import pad
    from bench.rollout.scoring import score

    model, tok = tr.model, tr.processing_class
    objective = objective or get_objective(name)
    tr.objective = objective
    prompts, completions, g = _rollout(tok, model.config.vocab_size)
    B = len(completions)
    model.zero_grad(set_to_none=True)
    lp, ent, mask = score(model, prompts, completions, 1.0, grad=True)
    T = lp.shape[1]
    noise = lambda s: torch.randn(B, T, generator=g) * s * mask  # noqa: E731
    old = lp.detach() + noise(0.3)
    ref = lp.detach() + noise(0.2)
    sampler = old + noise(0.1)
    old_ent = (ent.detach() + noise(0.2)).abs()
    ref_ent = (ent.detach() + noise(0.2)).abs()
    adv = torch.randn(B, generator=g)
    truncated = torch.tensor([True, False, False, True, False, False])
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, max_length=7, ref_logprobs=ref,
                        entropy=ent if objective.needs_entropy_grad else ent.detach(), old_entropy=old_ent,
                        ref_entropy=ref_ent, sampler_logprobs=sampler, truncated=truncated)
    gen = torch.Generator().manual_seed(derive_seed(tr.pobench_cfg.seed, "objective", tr.state.global_step, tr._step))
    ours, _ = objective.loss(batch, generator=gen)
    ours.backward()
    g_ours = _grads(model)

    pad_id = tok.pad_token_id
    lp_w = max(len(p) for p in prompts)
    prompt_ids = torch.tensor([[pad_id] * (lp_w - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (lp_w - len(p)) + [1] * len(p) for p in prompts])
    completion_ids = torch.tensor([c + [pad_id] * (T - len(c)) for c in completions])
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": mask.long(), "num_items_in_batch": mask.sum(),
              "advantages": adv if advantages_to_trl is None else advantages_to_trl(adv),
              "old_per_token_logps": old, "ref_per_token_logps": ref, "sampling_per_token_logps": sampler,
              "pobench_old_entropy": old_ent, "pobench_ref_entropy": ref_ent, "pobench_truncated": truncated}
    assert pad([torch.ones(len(c)) for c in completions], T).equal(mask)
    theirs = tr._compute_loss(model, inputs)
    theirs.backward()
    return (ours.detach(), g_ours), (theirs.detach(), _grads(model))


def _supported(name: str) -> str | None:
    """None when the engine trains `name`, else the refusal message."""
    try:
        engine.check_supported(_cfg(algo=name))
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("name", list_objectives())
def test_loss_and_gradients_equal_the_native_loop(trainer, name):
    refusal = _supported(name)
    if refusal is not None:  # refused objectives: the error names the field, and the rest of their loss is checked
        assert "--engine trl does not support objective" in refusal
        assert ("`dynamic_sampling`" in refusal or "needs greedy_rewards" in refusal or "critic" in refusal
                or "needs reward_components" in refusal
                or "per-token advantages need" in refusal or "couples the completions of a group" in refusal), refusal
        if "dynamic_sampling" not in refusal:
            return
        objective = get_objective(name, dynamic_sampling=False)
    else:
        objective = get_objective(name)
    (l_ours, g_ours), (l_trl, g_trl) = _both(trainer, name, objective)
    torch.testing.assert_close(l_trl, l_ours, **TOL)
    assert any(g.abs().sum() > 0 for g in g_ours)
    for a, b in zip(g_trl, g_ours):
        torch.testing.assert_close(a, b, **TOL)


def test_parity_check_catches_a_wrong_aggregation_or_advantage(trainer):
    """The comparison above is sensitive: the wrong aggregation, or the advantages negated, break it."""
    (l_ours, _), _ = _both(trainer, "grpo")
    (_, _), (l_wrong, _) = _both(trainer, "grpo", get_objective("grpo", aggregation="token-mean"))
    assert (l_wrong - l_ours).abs() > 1e-4
    (l_ours, g_ours), (l_neg, g_neg) = _both(trainer, "grpo", advantages_to_trl=lambda a: -a)
    assert (l_neg - l_ours).abs() > 1e-4
    assert max(float((a - b).abs().max()) for a, b in zip(g_ours, g_neg)) > 1e-4


def test_unsupported_settings_are_refused_by_name():
    engine.check_supported(_cfg(resume=True))  # (resumed from pobench's checkpoint of TRL's: test below)
    for field, value in [("control", "random-reward"), ("lora_rank", 4), ("backend", "vllm"),
                         ("scoring_chunk_mb", 0.0), ("length_grouped_micro_batches", False)]:
        with pytest.raises(ValueError, match=f"`{field}`"):
            engine.check_supported(_cfg(**{field: value}))
    with pytest.raises(ValueError, match="dynamic_sampling"):
        engine.check_supported(_cfg(algo="dapo"))
    engine.check_supported(_cfg(algo="dapo", objective_overrides={"dynamic_sampling": False}))
    with pytest.raises(ValueError, match="greedy_rewards"):
        engine.check_supported(_cfg(algo="remax"))
    for key in ("beta", "loss_type", "use_liger_kernel", "learning_rate"):
        with pytest.raises(ValueError, match=key):
            engine.check_supported(_cfg(engine_args={key: 1}))
    engine.check_supported(_cfg(engine_args={"use_vllm": False}))
    with pytest.raises(ValueError, match="engine_args"):
        TrainConfig(engine_args={"use_vllm": True}).validate()
    with pytest.raises(ValueError, match="engine"):
        TrainConfig(engine="verl2").validate()


def test_liger_is_refused(tmp_path):
    cfg = _cfg()
    args = engine.grpo_config(cfg, tmp_path, 1)
    args.use_liger_kernel = True
    with pytest.raises(ValueError, match="use_liger_kernel"):
        engine._trainer_class()(model=None, reward_funcs=None, args=args, objective=None, pobench_cfg=cfg)


def test_the_engine_is_part_of_the_hash():
    """(The hash of runs from before engines existed is gone: the inputs' digests, bench/runs/identity.py, changed every
    hash once; issue 20.)"""
    cfg = TrainConfig()
    assert cfg.comparison_hash() != dataclasses.replace(cfg, engine="trl").comparison_hash()


def test_batch_layout():
    assert engine.layout(_cfg(prompts_per_step=16, group_size=8, minibatches=4, micro_batch_size=64), 1) == {
        "per_device": 32, "grad_accum": 1, "steps_per_generation": 4, "updates_per_step": 4}
    assert engine.layout(_cfg(prompts_per_step=16, group_size=8, minibatches=4, micro_batch_size=8), 2) == {
        "per_device": 8, "grad_accum": 2, "steps_per_generation": 8, "updates_per_step": 4}
    with pytest.raises(ValueError, match="minibatches"):
        engine.layout(_cfg(prompts_per_step=3, group_size=3, minibatches=2), 1)


# ------------------------------------------------------------------------------------------- end to end
def _env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def _no_launcher_env(monkeypatch) -> None:
    """No torchrun variable (as ``_env`` gives a child) for a command run in this process (``bench_here``, which
    leaves out the MLFLOW_* ones)."""
    for k in [k for k in os.environ if k.startswith(("RANK", "WORLD_SIZE", "LOCAL_"))]:
        monkeypatch.delenv(k)


@pytest.mark.slow
def test_torchrun_two_processes_write_one_mlflow_run(tmp_path):
    """`torchrun --nproc_per_node 2 -m bench.engines.trl`: gloo data-parallel on CPU, one MLflow run (rank 0); the
    config's plugins (an example task, the example objectives) are loaded in both processes (the task is only known
    through its plugin; a rank without it fails)."""
    import yaml
    from mlflow.tracking import MlflowClient

    uri = fresh_store(tmp_path)
    plugins = [str(REPO / "examples" / "plugins" / f) for f in ("objectives.py", "mod7_task.py")]
    cfg = dict(algo="tepo", steps=2, prompts_per_step=2, group_size=4, minibatches=2, micro_batch_size=2,
               max_new_tokens=12, eval_every=2, eval_problems=8, eval_temperature=0.0, device="cpu",
               output_dir=str(tmp_path / "runs"), tracking_uri=uri, experiment="trl-ddp", checkpoint_every=0,
               samples_every=0, plugins=plugins, task="mod7")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "bench.engines.trl", "--config", str(tmp_path / "run.yaml")]
    res = launch.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("trl-ddp")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["pobench.engine"] == "trl" and run.data.tags["pobench.objective"] == "tepo"
    assert run.data.tags["pobench.kind"] == "train"
    for key in ("objective/masked_frac", "objective/policy_loss", "train/loss", "train/kl_ref", "train/grad_norm",
                "rollout/accuracy", "rollout/reward_mean", "rollout/entropy_mean", "rollout/gen_tokens",
                "time/elapsed_s", "time/cpu_s", "sys/load_avg_1m", "perf/total_num_tokens", "perf/throughput"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert steps == [1, 2], (key, steps)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] == [0, 2]
    tokens = client.get_metric_history(run.info.run_id, "perf/total_num_tokens")
    n = cfg["prompts_per_step"] * cfg["group_size"]  # both processes' completions, each with its prompt (>= 1 token)
    assert all(2 * n <= m.value <= n * (100 + cfg["max_new_tokens"]) for m in tokens), tokens
    assert run.data.tags["pobench.engine_distributed"] == "MULTI_CPU"
    assert run.data.tags["pobench.engine_processes"] == "2"
    assert run.data.tags["pobench.task"] == "mod7"
    assert {"objectives.py", "mod7_task.py"} <= {p.split("@")[0] for p in run.data.tags["pobench.plugins"].split(",")}


def _report_columns(out: Path) -> dict[str, list[str]]:
    cols = {}
    for f in sorted(out.rglob("*.csv")):
        with f.open() as fh:
            cols[f.name] = next(csv.reader(fh), [])
    lines = (out / "report.md").read_text().splitlines()
    tables = [lines[i - 1] for i, ln in enumerate(lines) if i and ln.replace(" ", "").startswith("|---")]
    headings = [re.sub(r"`[^`]*`", "`id`", ln) for ln in lines if ln.startswith("#")]
    cols["report.md headings"] = headings
    cols["report.md table headers"] = tables
    return cols


@pytest.mark.slow
def test_bench_run_trl_report_has_the_native_tables(tmp_path, monkeypatch, bench_here):
    """`bench run --engine trl --algos grpo,tepo --seeds 0` writes a report with the native report's tables (in this
    process: what is compared is the report, not the process around it)."""
    _no_launcher_env(monkeypatch)
    outs = {}
    for eng in ("native", "trl"):
        d = tmp_path / eng
        d.mkdir()
        cmd = ["run", "--engine", eng, "--algos", "grpo,tepo", "--seeds", "0",
               "--steps", "2", "--prompts-per-step", "2", "--group-size", "4", "--minibatches", "2",
               "--max-new-tokens", "12", "--eval-every", "1", "--eval-problems", "8", "--workers", "1",
               "--tracking-uri", fresh_store(d), "--output-dir", str(d / "runs"),
               "--out-root", str(d / "reports"), "--no-progress", "--device", "cpu"]
        rc, _, err = bench_here(cmd, d)
        assert rc == 0, err[-4000:]
        reports = list((d / "reports").rglob("report.md"))
        assert len(reports) == 1
        outs[eng] = _report_columns(reports[0].parent)
    assert outs["trl"] == outs["native"]


@pytest.mark.slow
def test_trl_run_resumes_after_sigkill_like_a_native_one(tmp_path, monkeypatch, bench_here):
    """SIGKILL a TRL-engine `bench train` as soon as its step-2 checkpoint exists (6 steps); `--resume` continues the
    same MLflow run from TRL's checkpoint: no missing and no duplicated step, the numbers of an uninterrupted run."""
    import signal
    import time

    from mlflow.tracking import MlflowClient

    uri = fresh_store(tmp_path)
    common = ["--engine", "trl", "--algo", "tepo", "--steps", "6", "--prompts-per-step", "2", "--group-size", "4",
              "--minibatches", "2", "--max-new-tokens", "12", "--eval-every", "2", "--eval-problems", "8",
              "--checkpoint-every", "2", "--samples-every", "0", "--device", "cpu", "--tracking-uri", uri]
    killed = [*common, "--experiment", "killed", "--run-name", "killed", "--output-dir", str(tmp_path / "runs")]
    log = open(tmp_path / "killed.log", "wb")  # (a pipe nobody reads could fill and stall the run)
    proc = launch.Popen([sys.executable, "-m", "bench.cli", "train", *killed], cwd=tmp_path, env=_env(tmp_path),
                        stdout=log, stderr=subprocess.STDOUT)
    ckpt = tmp_path / "runs" / "killed" / "killed" / "ckpt-0000002" / "state.json"  # <experiment>/<run>
    deadline = time.time() + 600
    while not ckpt.exists():
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.time() < deadline, "no checkpoint after 600 s"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # in step 3 (steps 3-6 and two evaluations are still to come)
    proc.wait()
    log.close()
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert run.info.status == "RUNNING"
    _no_launcher_env(monkeypatch)
    rc, out, err = bench_here(["train", *killed, "--resume"], tmp_path)  # (the resume, in this process)
    assert rc == 0, out[-3000:] + err[-3000:]
    (again,) = client.search_runs([run.info.experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    rc, out, err = bench_here(["train", *common, "--experiment", "ref", "--run-name", "ref", "--output-dir",
                               str(tmp_path / "ref")], tmp_path)  # the uninterrupted reference
    assert rc == 0, err[-3000:]
    (ref_run,) = client.search_runs([client.get_experiment_by_name("ref").experiment_id])

    def history(run_id, key):
        return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]

    for key in ("rollout/reward_mean", "train/grad_norm", "objective/policy_loss"):
        h = history(run.info.run_id, key)
        assert [s for s, _ in h] == [1, 2, 3, 4, 5, 6], key
        assert [v for _, v in h] == pytest.approx([v for _, v in history(ref_run.info.run_id, key)], rel=1e-5), key
    assert [s for s, _ in history(run.info.run_id, "eval/accuracy")] == [0, 2, 4, 6]
    cpu = history(run.info.run_id, "time/cpu_s")  # continued from the checkpoint across the kill, not from 0
    assert [s for s, _ in cpu] == [1, 2, 3, 4, 5, 6] and all(a < b for (_, a), (_, b) in zip(cpu, cpu[1:])), cpu
    assert history(run.info.run_id, "eval/accuracy") == history(ref_run.info.run_id, "eval/accuracy")
