"""Named configurations: ``bench run --preset NAME`` and ``bench tune --preset NAME``.

A preset is a TrainConfig YAML shipped with the package (``bench/assets/presets/<name>.yaml``; the same file is
``configs/<name>.yaml`` in the repository) plus the objectives and seeds ``bench run`` uses with it when no flag names
them. Settings are layered: ``bench run``'s defaults < the preset < ``--config`` < flags, so a preset is a starting
point that any flag can change (a changed setting is a different comparison: its config hash differs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evaluators.hints import did_you_mean

PRESET_DIR = Path(__file__).resolve().parent / "assets" / "presets"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    algos: tuple[str, ...]          # bench run's objectives unless --algos / --ablation names them
    seeds: tuple[int, ...]          # bench run's seeds unless --seeds names them
    chosen_on: tuple[int, ...] = ()  # seeds its settings were chosen on (docs/TESTBED.md): never the reported ones

    @property
    def path(self) -> Path:
        return PRESET_DIR / f"{self.name}.yaml"


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("headroom",
           "the testbed with headroom (docs/TESTBED.md): the built-in model after 425 of its 500 warm-start steps "
           "(greedy held-out accuracy ~28%, token entropy ~0.28 nats), 40 steps of 4 mini-batch updates; chosen on "
           "seeds 0-4 with grpo and the positive controls only, reported on seeds 5-9",
           algos=("grpo", "dapo", "tepo"), seeds=(5, 6, 7, 8, 9), chosen_on=(0, 1, 2, 3, 4)),
)}


def get_preset(name: str) -> Preset:
    """The registered preset ``name``; an unknown name raises ValueError with the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}{did_you_mean(name, list(PRESETS))}; valid: {', '.join(PRESETS)}")
    return PRESETS[name]
