"""Checkpoints of a training run: model, optimizer and scheduler state, step, MLflow run id, wall-clock, the RNG
state and the metrics not yet sent to MLflow. Written atomically (temporary folder, then rename).

Retention (``TrainConfig.keep_checkpoints`` = N): the newest N checkpoints stay, older ones are deleted once a newer one
is complete; of the kept ones only the newest keeps its optimizer state (``optim.pt``, twice the model's size with
AdamW), the only one a resume reads. The final weights are saved apart (``<run>/final``) by the training loop."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PREFIX = "ckpt-"


def latest(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    done = sorted(p for p in run_dir.glob(f"{PREFIX}*") if (p / "state.json").exists() and not p.name.endswith(".tmp"))
    return done[-1] if done else None


def _commit(run_dir: Path, step: int, state: dict[str, Any], fill: Callable[[Path], None] = lambda tmp: None,
            keep: int = 1) -> tuple[Path, list[Path]]:
    """Write checkpoint ``step`` atomically (``fill`` writes its files into a temporary folder, then ``state.json``,
    then the folder is renamed), drop all but the newest ``keep``. Only now that the new one is complete: a kill at
    any point leaves one to resume from. Returns the new folder and the kept ones, oldest first."""
    final = run_dir / f"{PREFIX}{step:07d}"
    tmp = run_dir / f"{PREFIX}{step:07d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    done = sorted(p for p in run_dir.glob(f"{PREFIX}*") if not p.name.endswith(".tmp"))
    for old in done[:-keep]:
        try:  # a state-only checkpoint's engine folder goes with it
            engine_dir = json.loads((old / "state.json").read_text()).get("trl_checkpoint")
        except (OSError, ValueError):
            engine_dir = None
        if engine_dir:
            shutil.rmtree(engine_dir, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return final, done[-keep:]


def save(run_dir: str | Path, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         scheduler: Any, state: dict[str, Any], keep: int = 1) -> Path:
    def fill(tmp: Path) -> None:
        torch.save(_weights(model), tmp / "model.pt")  # with LoRA: the adapter only
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "torch_rng": torch.get_rng_state()}, tmp / "optim.pt")

    final, kept = _commit(Path(run_dir), step, state, fill, keep)
    for old in kept[:-1]:  # only the newest keeps the optimizer state a resume reads
        (old / "optim.pt").unlink(missing_ok=True)
    return final


def save_state(run_dir: str | Path, step: int, state: dict[str, Any], keep: int = 1) -> Path:
    """A checkpoint that holds only ``state.json``, for an engine that writes weights and optimizer state itself (the
    TRL engine: ``state["trl_checkpoint"]`` names its folder, dropped with the checkpoint). Same naming, atomicity and
    retention as ``save``, so ``latest`` (and with it `bench run`'s resume decision) sees it as any other."""
    return _commit(Path(run_dir), step, state, keep=keep)[0]


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
