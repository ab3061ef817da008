"""Checkpoint retention: the newest N checkpoints stay, only the newest keeps its optimizer state, the final weights
stay apart; the newest is always complete enough to resume from."""

from __future__ import annotations

import pytest
import torch

from bench.engines.native import checkpoint


def _save_steps(run_dir, steps, keep):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    for step in steps:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        checkpoint.save(run_dir, step, model=model, optimizer=opt, scheduler=sched,
                        state={"run_id": "r", "elapsed": 0.0, "pending": []}, keep=keep)
    return model, opt, sched


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keeps_the_newest_n_and_only_the_newest_optimizer_state(tmp_path, keep):
    model, opt, sched = _save_steps(tmp_path, range(1, 6), keep)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == [f"ckpt-{s:07d}" for s in range(6 - keep, 6)]
    with_optim = [p.name for p in sorted(tmp_path.iterdir()) if (p / "optim.pt").exists()]
    assert with_optim == ["ckpt-0000005"]
    assert all((p / "model.pt").exists() and (p / "state.json").exists() for p in tmp_path.iterdir())
    last = checkpoint.latest(tmp_path)
    assert last.name == "ckpt-0000005"
    fresh = torch.nn.Linear(4, 3)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    state = checkpoint.load(last, model=fresh, optimizer=fresh_opt,
                            scheduler=torch.optim.lr_scheduler.LambdaLR(fresh_opt, lambda i: 1.0))
    assert state["step"] == 5 and torch.equal(fresh.weight, model.weight)
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_keep_checkpoints_must_be_positive():
    from bench.config import TrainConfig

    with pytest.raises(ValueError, match="`keep_checkpoints`"):
        TrainConfig(keep_checkpoints=0).validate()


def test_a_training_run_leaves_one_checkpoint_and_the_final_weights(tmp_path):
    from bench.config import TrainConfig
    from bench.engines import train

    cfg = TrainConfig(steps=3, prompts_per_step=2, group_size=2, max_new_tokens=8, eval_every=0, eval_problems=4,
                      samples_every=0, checkpoint_every=1, track_ref_kl=False, output_dir=str(tmp_path / "runs"),
                      tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", run_name="r")
    res = train(cfg)
    assert sorted(p.name for p in res.output_dir.iterdir()) == ["ckpt-0000003", "config.yaml", "final", "inputs.json"]
    assert (res.output_dir / "ckpt-0000003" / "optim.pt").exists()
    assert (res.output_dir / "final" / "model.safetensors").exists()


def test_state_only_checkpoints_rotate_with_the_engine_folder_they_name(tmp_path):
    """The TRL engine's checkpoints: pobench's state.json names TRL's folder; dropping an old checkpoint drops that
    folder too, and only after the new one is complete (TRL's own rotation is off)."""
    from bench.engines.native import checkpoint

    trl = [tmp_path / "trl" / f"checkpoint-{n}" for n in (2, 4)]
    for d in trl:
        d.mkdir(parents=True)
    checkpoint.save_state(tmp_path / "run", 1, {"trl_checkpoint": str(trl[0])}, keep=1)
    assert trl[0].exists() and checkpoint.latest(tmp_path / "run").name.endswith("0000001")
    checkpoint.save_state(tmp_path / "run", 2, {"trl_checkpoint": str(trl[1])}, keep=1)
    assert not trl[0].exists() and trl[1].exists()
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["ckpt-0000002"]
