"""Checkpoints of a training run: model, optimizer and scheduler state, step, MLflow run id, wall-clock, the RNG
state and the metrics not yet sent to MLflow. Written atomically (temporary folder, then rename)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

PREFIX = "ckpt-"
KEEP = 2


def latest(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    done = sorted(p for p in run_dir.glob(f"{PREFIX}*") if (p / "state.json").exists() and not p.name.endswith(".tmp"))
    return done[-1] if done else None


def save(run_dir: str | Path, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         scheduler: Any, state: dict[str, Any]) -> Path:
    run_dir = Path(run_dir)
    final = run_dir / f"{PREFIX}{step:07d}"
    tmp = run_dir / f"{PREFIX}{step:07d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(_weights(model), tmp / "model.pt")  # with LoRA: the adapter only
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state()}, tmp / "optim.pt")
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(p for p in run_dir.glob(f"{PREFIX}*") if not p.name.endswith(".tmp"))[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
         ) -> dict[str, Any]:
    path = Path(path)
    device = next(model.parameters()).device
    weights = torch.load(path / "model.pt", map_location=device)
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, weights)
    else:
        model.load_state_dict(weights)
    extra = torch.load(path / "optim.pt", map_location=device, weights_only=False)
    optimizer.load_state_dict(extra["optimizer"])
    scheduler.load_state_dict(extra["scheduler"])
    torch.set_rng_state(extra["torch_rng"])
    return json.loads((path / "state.json").read_text())


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of the model: every weight, or only the adapter of a peft (LoRA) model."""
    if hasattr(model, "peft_config"):
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(model)
    return model.state_dict()
