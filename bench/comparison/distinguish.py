"""The distinguishability probe (``algorithms.probe``) under a training configuration: used by ``bench run`` (a
warning before training, ``probe.json`` on the comparison's MLflow run) and ``bench list --compare``."""

from __future__ import annotations

import sys
from typing import Any

from algorithms.probe import ProbeResult, Regime, probe
from bench.comparison.plan import variant_label
from bench.config import TrainConfig


def regime_of(cfg: TrainConfig, log_ratio_per_update: float | None = None) -> Regime:
    """The probe regime of the loop's most off-policy micro-batch under ``cfg`` (``Regime.from_loop``: the drift
    per update is assumed proportional to the learning rate unless a measured value is given)."""
    return Regime.from_loop(update_epochs=cfg.update_epochs, minibatches=cfg.minibatches, lr=cfg.lr,
                            prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                            micro_batch_size=cfg.micro_batch_size, max_new_tokens=cfg.max_new_tokens,
                            log_ratio_per_update=log_ratio_per_update)


def probe_config(cfg: TrainConfig, algos: list[str], params: dict[str, dict[str, Any]] | None = None
                 ) -> ProbeResult:
    """Probe the objectives of a comparison (with their overrides, labelled as ``bench run`` labels them)."""
    params = params or {}
    entries = [(variant_label(a, params.get(a, {})), a, dict(params.get(a, {}))) for a in algos]
    return probe(entries, regime_of(cfg))


def warn_before_run(cfg: TrainConfig, algos: list[str], params: dict[str, dict[str, Any]] | None = None, *,
                    client=None, run_id: str | None = None, stream=None) -> ProbeResult | None:
    """Print a warning naming coinciding objectives and inert terms (nothing when there are none); log the probe
    as ``probe.json`` on MLflow run ``run_id`` when given. A probe that fails (e.g. a plugin objective that needs
    tensors the probe does not build) is reported in one line and does not stop the run. ``stream``: default the
    ``sys.stderr`` of the moment of the call (not of the import: a replaced stderr may be closed since)."""
    stream = stream or sys.stderr
    try:
        result = probe_config(cfg, algos, params)
    except Exception as e:  # the probe is advice: never block training on it
        print(f"WARNING: the distinguishability probe failed ({type(e).__name__}: {e}); training anyway", file=stream)
        return None
    lines = result.warnings()
    if lines:
        print(f"WARNING: under this configuration ({result.regime.describe()}) the distinguishability probe finds:",
              file=stream)
        for line in lines:
            print(f"  - {line}", file=stream)
        print("  (`bench list --compare` prints the full table; see docs/objectives.md, \"Training regime and the "
              "distinguishability probe\")", file=stream)
    if client is not None and run_id is not None:
        client.log_text(run_id, result.to_json(), "probe.json")
    return result
