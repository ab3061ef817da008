"""Checkpoints: retention (the newest N stay, the newest two keep their optimizer state), atomic writes (a full disk
leaves nothing half-written, in one line), verification on load (a corrupt newest checkpoint is named and the resume
falls back to an older one), and no code run from a checkpoint (a planted pickle is refused)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bench.runs import checkpoint
from bench.runs.checkpoint import CheckpointError
from bench.runs.folders import claim_run_folder
from tests.conftest import fresh_store

STATE = {"run_id": "r", "elapsed": 0.0, "pending": []}


def _fresh():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)


def _save_steps(run_dir, steps, keep):
    """Checkpoints of ``steps``; returns the model, optimizer, scheduler and the weights at each step."""
    model, opt, sched = _fresh()
    claim_run_folder(run_dir)  # (as lifecycle.run_folder makes it: a checkpoint goes only into a marked folder)
    at = {}
    for step in steps:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        checkpoint.save(run_dir, step, model=model, optimizer=opt, scheduler=sched, state=dict(STATE), keep=keep)
        at[step] = model.weight.detach().clone()
    return model, opt, sched, at


def _load(path):
    fresh, opt, sched = _fresh()
    return fresh, opt, checkpoint.load(path, model=fresh, optimizer=opt, scheduler=sched)


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keeps_the_newest_n_and_the_optimizer_state_of_the_newest_two(tmp_path, keep):
    model, opt, sched, _ = _save_steps(tmp_path, range(1, 6), keep)
    kept = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".pobench-owned", *kept]
    assert kept == [f"ckpt-{s:07d}" for s in range(6 - keep, 6)]
    with_optim = [p.name for p in sorted(tmp_path.glob("ckpt-*")) if (p / "optim.pt").exists()]
    assert with_optim == [f"ckpt-{s:07d}" for s in range(max(6 - keep, 4), 6)]
    assert all((p / "model.pt").exists() and (p / "state.json").exists() for p in tmp_path.glob("ckpt-*"))
    last = checkpoint.latest(tmp_path)
    assert last.name == "ckpt-0000005"
    fresh, fresh_opt, state = _load(last)
    assert state["step"] == 5 and torch.equal(fresh.weight, model.weight)
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_state_json_records_size_and_digest_of_each_file(tmp_path):
    _save_steps(tmp_path, [1], keep=1)
    ckpt = tmp_path / "ckpt-0000001"
    files = json.loads((ckpt / "state.json").read_text())["files"]
    for name in ("model.pt", "optim.pt"):
        data = (ckpt / name).read_bytes()
        assert files[name] == [len(data), hashlib.sha256(data).hexdigest()]


def test_keep_checkpoints_must_be_positive():
    from bench.config import TrainConfig

    with pytest.raises(ValueError, match="`keep_checkpoints`"):
        TrainConfig(keep_checkpoints=0).validate()


@pytest.mark.slow
def test_a_training_run_leaves_one_checkpoint_and_the_final_weights(tmp_path):
    from bench.config import TrainConfig
    from bench.engines.entry import train

    cfg = TrainConfig(steps=3, prompts_per_step=2, group_size=2, max_new_tokens=8, eval_every=0, eval_problems=4,
                      samples_every=0, checkpoint_every=1, track_ref_kl=False, output_dir=str(tmp_path / "runs"),
                      tracking_uri=fresh_store(tmp_path), run_name="r")
    res = train(cfg)
    assert sorted(p.name for p in res.output_dir.iterdir()) == [".pobench-files", ".pobench-owned", "ckpt-0000003",
                                                                "config.yaml", "final", "inputs.json", "run.json"]
    assert sorted(json.loads((res.output_dir / ".pobench-files").read_text())) == ["config.yaml", "inputs.json"]
    assert json.loads((res.output_dir / "run.json").read_text())["run_id"] == res.run_id
    assert (res.output_dir / "ckpt-0000003" / "optim.pt").exists()
    assert (res.output_dir / "final" / "model.safetensors").exists()


# ------------------------------------------------------------------ corrupt checkpoints
def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: max(1, p.stat().st_size // 3)])


def _zero(p: Path) -> None:
    p.write_bytes(b"\0" * p.stat().st_size)


DAMAGE = [("model.pt", _truncate), ("model.pt", _zero), ("optim.pt", _truncate), ("optim.pt", _zero),
          ("state.json", _truncate)]


@pytest.mark.parametrize("name, damage", DAMAGE, ids=[f"{n}-{d.__name__[1:]}" for n, d in DAMAGE])
def test_corrupt_newest_checkpoint_is_named_and_the_resume_falls_back(tmp_path, capsys, name, damage):
    _, _, _, at = _save_steps(tmp_path, range(1, 4), keep=2)
    damage(tmp_path / "ckpt-0000003" / name)
    fresh, _, state = _load(checkpoint.latest(tmp_path))
    assert state["step"] == 2 and torch.equal(fresh.weight, at[2])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and f"ckpt-0000003/{name}" in err[0] and "resuming from" in err[1] and "0000002" in err[1]


def test_a_flipped_byte_that_still_loads_is_caught_by_the_digest(tmp_path, capsys):
    """Same size, still a valid file: only the recorded digest tells (the weights would load silently wrong)."""
    _, _, _, at = _save_steps(tmp_path, range(1, 4), keep=2)
    path = tmp_path / "ckpt-0000003" / "model.pt"
    data = bytearray(path.read_bytes())
    weights = torch.load(path, weights_only=True)["weight"]
    raw = weights.numpy().tobytes()
    i = bytes(data).index(raw) + len(raw) - 1  # the last byte of the weight matrix
    data[i] ^= 0x40
    path.write_bytes(bytes(data))
    assert not torch.equal(torch.load(path, weights_only=True)["weight"], weights)  # it loads, and differs
    fresh, _, state = _load(checkpoint.latest(tmp_path))
    assert state["step"] == 2 and torch.equal(fresh.weight, at[2])
    assert "ckpt-0000003/model.pt differs from what was written" in capsys.readouterr().err


@pytest.mark.parametrize("name, damage", DAMAGE, ids=[f"{n}-{d.__name__[1:]}" for n, d in DAMAGE])
def test_no_resumable_checkpoint_says_which_folder_to_delete(tmp_path, name, damage):
    _save_steps(tmp_path, range(1, 3), keep=1)
    damage(tmp_path / "ckpt-0000002" / name)
    with pytest.raises(CheckpointError) as e:
        _load(checkpoint.latest(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and f"ckpt-0000002/{name}" in msg and f"delete {tmp_path}" in msg


def test_an_older_checkpoint_without_optimizer_state_is_no_fallback(tmp_path):
    _save_steps(tmp_path, range(1, 5), keep=3)  # ckpt-2 keeps weights only
    _zero(tmp_path / "ckpt-0000004" / "model.pt")
    _zero(tmp_path / "ckpt-0000003" / "optim.pt")
    with pytest.raises(CheckpointError, match="ckpt-0000002 holds no optimizer state"):
        _load(checkpoint.latest(tmp_path))


def test_checkpoint_of_an_earlier_version_loads_unverified_and_is_named_when_broken(tmp_path):
    """Format 1 (no digests): still loaded, through the safe loader; a zeroed file is one line naming it."""
    model, opt, sched = _fresh()
    old = tmp_path / "ckpt-0000001"
    old.mkdir()
    torch.save(model.state_dict(), old / "model.pt")
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "torch_rng": torch.get_rng_state()},
               old / "optim.pt")
    (old / "state.json").write_text(json.dumps({**STATE, "step": 1}))
    fresh, _, state = _load(old)
    assert state["step"] == 1 and torch.equal(fresh.weight, model.weight)
    _zero(old / "model.pt")
    with pytest.raises(CheckpointError, match=r"ckpt-0000001/model.pt cannot be read"):
        _load(old)


# ------------------------------------------------------------------ no code from a checkpoint
class Payload:
    """A pickle whose loading would run a shell command (writes the file ``path``)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return os.system, (f"touch '{self.path}'",)


def plant(ckpt: Path, marker: Path, record: bool = True) -> None:
    """Replace ``optim.pt`` by the payload; ``record``: also its size and digest in state.json, as an attacker able
    to write the folder would."""
    torch.save({"optimizer": Payload(marker)}, ckpt / "optim.pt")
    if record:
        state = json.loads((ckpt / "state.json").read_text())
        data = (ckpt / "optim.pt").read_bytes()
        state["files"]["optim.pt"] = [len(data), hashlib.sha256(data).hexdigest()]
        (ckpt / "state.json").write_text(json.dumps(state))


@pytest.mark.parametrize("record", [True, False], ids=["digest-updated", "digest-stale"])
def test_planted_pickle_is_refused_and_never_runs(tmp_path, record):
    _save_steps(tmp_path / "run", [1], keep=1)
    marker = tmp_path / "PWNED"
    plant(tmp_path / "run" / "ckpt-0000001", marker, record)
    with pytest.raises(CheckpointError) as e:
        _load(checkpoint.latest(tmp_path / "run"))
    assert "ckpt-0000001/optim.pt" in str(e.value) and "\n" not in str(e.value)
    assert re.search("was refused" if record else "w(as|ere) written", str(e.value))
    assert not marker.exists()


@pytest.mark.slow
def test_bench_train_resume_refuses_a_planted_pickle_in_one_line(tmp_path, bench_here):
    """The issue's reproduction: a payload in optim.pt of a real run, `bench train --resume` as a user runs it."""
    from bench.config import TrainConfig
    from bench.engines.entry import train
    from bench.runs import resume

    flags = dict(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=8, eval_every=0, samples_every=0,
                 checkpoint_every=1, output_dir=str(tmp_path / "runs"), tracking_uri=fresh_store(tmp_path),
                 run_name="r")
    cfg = resume.train_folder(TrainConfig(**flags))  # the folder `bench train` uses: runs/<experiment>/r
    train(cfg)
    marker = tmp_path / "PWNED"
    plant(cfg.run_dir() / "ckpt-0000002", marker)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    rc, _, stderr = bench_here(["train", *args, "--resume"], tmp_path)
    assert rc == 2, stderr[-3000:]
    err = stderr.strip().splitlines()
    assert len(err) == 1 and "optim.pt was refused" in err[0] and "Traceback" not in stderr, stderr
    assert not marker.exists()


@pytest.mark.slow
def test_bench_train_resume_falls_back_from_a_corrupt_newest_checkpoint(tmp_path, bench_here):
    from mlflow import MlflowClient

    from bench.config import TrainConfig
    from bench.engines.entry import train
    from bench.runs import resume

    flags = dict(steps=3, prompts_per_step=2, group_size=2, max_new_tokens=8, eval_every=0, samples_every=0,
                 checkpoint_every=1, keep_checkpoints=2, output_dir=str(tmp_path / "runs"),
                 tracking_uri=fresh_store(tmp_path), run_name="r")
    cfg = resume.train_folder(TrainConfig(**flags))  # the folder `bench train` uses: runs/<experiment>/r
    res = train(cfg)
    _zero(cfg.run_dir() / "ckpt-0000003" / "model.pt")
    args = [f"--{k.replace('_', '-')}={v}" for k, v in {**flags, "steps": 4}.items()]
    rc, _, err = bench_here(["train", *args, "--resume"], tmp_path)
    assert rc == 0, err[-3000:]
    assert "ckpt-0000003/model.pt" in err and "resuming from" in err
    client = MlflowClient(flags["tracking_uri"])
    assert client.get_run(res.run_id).info.status == "FINISHED"
    steps = {m.step for m in client.get_metric_history(res.run_id, "rollout/reward_mean")}
    assert steps == {1, 2, 3, 4}


# ------------------------------------------------------------------ atomic writes, full disk
FULL_DISK = textwrap.dedent("""
    import resource, sys, torch
    from bench.runs import checkpoint
    from bench.runs.folders import claim_run_folder
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    model(torch.randn(2, 256)).sum().backward()
    opt.step()
    run = claim_run_folder(sys.argv[1])
    state = {"run_id": "r", "elapsed": 0.0, "pending": []}
    checkpoint.save(run, 1, model=model, optimizer=opt, scheduler=sched, state=state)  # fits
    checkpoint.save_final(run, lambda d: (d / "w.bin").write_bytes(b"1" * 1000))
    resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))  # optim.pt (~530 kB) does not fit
    for what in ("checkpoint", "final"):
        try:
            if what == "checkpoint":
                checkpoint.save(run, 2, model=model, optimizer=opt, scheduler=sched, state=state)
            else:
                checkpoint.save_final(run, lambda d: (d / "w.bin").write_bytes(b"2" * 500_000))
        except checkpoint.CheckpointError as e:
            print(e)
""")


def test_full_disk_is_one_line_and_leaves_nothing_half_written(tmp_path):
    """A file-size limit (``ulimit -f``) stands in for a full disk: the same ENOSPC-class error on write."""
    run = claim_run_folder(tmp_path / "run")
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    assert "no space left on device while writing" in lines[0] and "ckpt-0000002" in lines[0]
    assert "no space left on device while writing" in lines[1] and str(run / "final") in lines[1]
    assert sorted(p.name for p in run.iterdir()) == [".pobench-owned", "ckpt-0000001", "final"]  # no .tmp, old kept
    assert (run / "final" / "w.bin").read_bytes() == b"1" * 1000
    state = json.loads((run / "ckpt-0000001" / "state.json").read_text())
    assert state["step"] == 1 and set(state["files"]) == {"model.pt", "optim.pt"}


# ------------------------------------------------------------------ the TRL engine's state-only checkpoints
def _trl_checkpoint(run: Path, n: int) -> Path:
    d = run / "trl" / f"checkpoint-{n}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(os.urandom(64))
    (d / "optimizer.pt").write_bytes(os.urandom(64))
    return d


def test_state_only_checkpoints_rotate_with_the_engine_folder_they_name(tmp_path):
    """The TRL engine's checkpoints: pobench's state.json names TRL's folder; dropping an old checkpoint drops that
    folder too, and only after the new one is complete (TRL's own rotation is off)."""
    run = claim_run_folder(tmp_path / "run")
    trl = [_trl_checkpoint(run, n) for n in (2, 4)]
    checkpoint.save_state(run, 1, {**STATE, "trl_checkpoint": str(trl[0]), "engine": "trl"}, keep=1)
    assert trl[0].exists() and checkpoint.latest(run).name.endswith("0000001")
    checkpoint.save_state(run, 2, {**STATE, "trl_checkpoint": str(trl[1]), "engine": "trl"}, keep=1)
    assert not trl[0].exists() and trl[1].exists()
    assert sorted(p.name for p in run.iterdir()) == [".pobench-owned", "ckpt-0000002", "trl"]
    assert checkpoint.load_state(checkpoint.latest(run))["trl_checkpoint"] == str(trl[1])


def test_a_state_json_naming_a_folder_outside_the_run_never_deletes_it(tmp_path):
    outside = tmp_path / "home"
    outside.mkdir()
    (outside / "important.txt").write_text("notes")
    run = claim_run_folder(tmp_path / "run")
    checkpoint.save_state(run, 1, {**STATE, "trl_checkpoint": str(outside), "engine": "trl"}, keep=1)
    checkpoint.save_state(run, 2, {**STATE, "trl_checkpoint": str(_trl_checkpoint(run, 2)), "engine": "trl"}, keep=1)
    assert (outside / "important.txt").read_text() == "notes"


def test_state_only_checkpoint_with_a_damaged_engine_file_falls_back(tmp_path, capsys):
    run = claim_run_folder(tmp_path / "run")
    for step, n in ((1, 2), (2, 4)):
        checkpoint.save_state(run, step, {**STATE, "trl_checkpoint": str(_trl_checkpoint(run, n)), "engine": "trl"},
                              keep=2)
    _truncate(run / "trl" / "checkpoint-4" / "optimizer.pt")
    assert checkpoint.load_state(checkpoint.latest(run))["step"] == 1
    assert "checkpoint-4/optimizer.pt has" in capsys.readouterr().err
    _zero(run / "ckpt-0000001" / "state.json")
    with pytest.raises(CheckpointError, match=f"delete {run}"):
        checkpoint.load_state(checkpoint.latest(run))


def test_engines_refuse_each_others_checkpoints_without_fallback(tmp_path):
    run = claim_run_folder(tmp_path / "run")
    _save_steps(run, [1], keep=2)
    checkpoint.save_state(run, 2, {**STATE, "trl_checkpoint": str(_trl_checkpoint(run, 2)), "engine": "trl"}, keep=2)
    with pytest.raises(CheckpointError, match="checkpoint of the trl engine"):
        _load(checkpoint.latest(run))
    with pytest.raises(CheckpointError, match="--engine trl cannot resume it"):
        checkpoint.load_state(run / "ckpt-0000001")


def test_an_unresumable_folder_being_trained_by_another_process_keeps_its_run(tmp_path):
    """No checkpoint of a folder can be resumed: its RUNNING run is ended FAILED (its process is gone), but not while
    another process holds the folder (it trains there now: its run is live)."""
    from mlflow import MlflowClient

    from bench.config import TrainConfig
    from bench.runs.lifecycle import end_unresumable
    from bench.runs.locks import folder_held
    from bench.runs.tracking import write_run_record
    from reports.record import get_or_create_experiment

    cfg = TrainConfig(steps=1, output_dir=str(tmp_path / "runs"), tracking_uri=fresh_store(tmp_path), run_name="r",
                      experiment="busy")
    run_dir = cfg.run_dir()
    run_dir.mkdir(parents=True)
    client = MlflowClient(cfg.tracking_uri)
    run_id = client.create_run(get_or_create_experiment(client, cfg.tracking_uri, "busy")).info.run_id
    write_run_record(run_dir, {"run_id": run_id, "tracking_uri": cfg.tracking_uri})
    with folder_held(run_dir):  # (another training's lock, taken here)
        said = end_unresumable(cfg, run_dir, CheckpointError("damaged"))
    assert said == f"; its MLflow run {run_id} is left as it is: another process is training in {run_dir} now"
    assert client.get_run(run_id).info.status == "RUNNING"
    assert end_unresumable(cfg, run_dir, CheckpointError("damaged")) == f"; its MLflow run {run_id} was ended FAILED"
    assert client.get_run(run_id).info.status == "FAILED"
