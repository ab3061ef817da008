"""Which objective a comparison's report measures the others against: `--ablation X` makes X the baseline."""

from __future__ import annotations

import pytest

from bench.cli.run import run_baseline


def test_ablation_root_is_the_baseline():
    tepo = ["tepo", "tepo-no-mask", "tepo-mask-all"]
    assert run_baseline(None, ["tepo"], tepo) == "tepo"
    assert run_baseline(None, ["tepo"], ["grpo", *tepo]) == "tepo"      # `--algos grpo --ablation tepo`
    assert run_baseline("grpo", ["tepo"], ["grpo", *tepo]) == "grpo"    # --baseline wins
    assert run_baseline(None, None, ["grpo", "dapo"]) is None            # the report's rule: grpo when run,
    assert run_baseline(None, None, ["dapo", "tepo"]) is None            # else the first objective
    with pytest.raises(ValueError, match="--baseline 'grpo' is not among the objectives run"):
        run_baseline("grpo", None, ["dapo"])
