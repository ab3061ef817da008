"""Held-out round 17, H03 (/work/r17-report.md): ``bench train --group-size 100000 --prompts-per-step 2`` passed the
step-size check (it counted the token ids: 77 MB) and grew to 22 GB before the kernel's OOM killer ended it (rc 137,
nothing said, the run left RUNNING). The check now counts what one completion of the rollout batch holds (the model's
KV cache over prompt + completion, its vocabulary's logits, per-token statistics: ``bench.inputs.sequence_bytes``),
read from the model's config.json, and refuses such a step in one line before any work."""

from __future__ import annotations

import json

import pytest

from bench import inputs
from bench.config import TrainConfig
from bench.model import model_shape

GiB = 2**30


def test_the_estimate_counts_the_models_kv_cache_and_logits(tmp_path):
    tiny = model_shape("builtin:tiny-arith")
    each, what = inputs.sequence_bytes(tiny, 48)
    assert each > 100 * 8 * 48 and "KV cache of 4 layers" in what, (each, what)  # not the token ids alone
    assert inputs.sequence_bytes(tiny, 96)[0] > each  # longer completions: a longer cache
    # a bigger model (read from its own config.json) holds more per completion; bfloat16 halves its cache
    big = {**tiny, "num_hidden_layers": 24, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936}
    (tmp_path / "config.json").write_text(json.dumps(big))
    shape = model_shape(str(tmp_path))
    assert inputs.sequence_bytes(shape, 48)[0] > 3 * each
    assert inputs.sequence_bytes(shape, 48, "bfloat16")[0] < inputs.sequence_bytes(shape, 48)[0]
    # tensors on a GPU (or in vLLM's bounded cache): only the host part counts against this machine's memory
    assert inputs.sequence_bytes(shape, 48, tensors=False)[0] < each
    assert inputs.sequence_bytes(None, 48) == (8 * 48, "the token ids alone")  # a hub id: the lower bound


def test_a_group_size_of_100000_is_refused_and_the_usual_sizes_are_not(monkeypatch):
    monkeypatch.setattr(inputs, "memory_bytes", lambda: 24 * GiB)  # the QA machine's memory
    cfg = TrainConfig(steps=1, group_size=100000, prompts_per_step=2, eval_problems=4, device="cpu")
    with pytest.raises(ValueError) as e:
        cfg.validate()
    line = str(e.value)
    assert line.startswith("config field `group_size`=100000") and "more than this machine's 24 GiB" in line, line
    assert "give a smaller --group-size" in line and "KV cache" in line, line
    # the defaults, the tests' and the README's sizes, a 4 GiB machine's usual runs: not refused
    monkeypatch.setattr(inputs, "memory_bytes", lambda: 4 * GiB)
    for sizes in ({}, {"group_size": 256, "prompts_per_step": 2}, {"group_size": 16, "prompts_per_step": 64},
                  {"max_new_tokens": 200}):
        TrainConfig(device="cpu", **sizes).validate()


def test_bench_train_refuses_it_in_one_line_before_any_work(tmp_path, bench_here, monkeypatch):
    import bench.engines.entry as engines

    monkeypatch.setattr(inputs, "memory_bytes", lambda: 24 * GiB)

    def trained(*a, **k):  # (the old check let it through: fail here, not after 22 GB)
        raise AssertionError("the step was not refused: training started")

    monkeypatch.setattr(engines, "train", trained)
    rc, _, err = bench_here(["train", "--steps", "1", "--group-size", "100000", "--prompts-per-step", "2",
                             "--eval-problems", "4", "--run-name", "x", "--device", "cpu"], tmp_path)
    lines = [ln for ln in err.strip().splitlines() if " INFO " not in ln]
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert "config field `group_size`=100000" in lines[0] and "--group-size" in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == [], sorted(p.name for p in tmp_path.iterdir())  # nothing made
