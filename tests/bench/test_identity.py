"""A run's identity by content (bench/runs/identity.py): rewritten data, changed model files or another hub revision
make a new comparison that is trained, never a stale reuse; the datasets are logged with mlflow.log_input; a run reused
from another pobench version or commit is named as such. Orchestration on the fake trainer
(tests/bench/fake_trainer.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient

from bench.comparison import ComparisonSpec, base_config, run_comparison
from bench.config import TrainConfig
from bench.model import BUILTIN_MODELS
from bench.runs import identity
from tests.conftest import fresh_store

from .fake_trainer import fake_step0, fake_train

GSM = [{"question": "Ann has 2 pens and gets 3 more. How many?", "answer": "2+3=5\n#### 5"},
       {"question": "Bob has 10 coins and spends 1. How many?", "answer": "10-1=9\n#### 9"},
       {"question": "Cy has 4 cats and 4 dogs. How many pets?", "answer": "4+4=8\n#### 8"}]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv(identity.CACHE_ENV, str(tmp_path / "cache"))



def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def gsm_cfg(tmp_path: Path, data: Path, **kw):
    return base_config(None, steps=2, eval_every=1, checkpoint_every=1, samples_every=0, task="gsm8k", data=str(data),
                       eval_data=str(data), experiment="ident", tracking_uri=fresh_store(tmp_path),
                       output_dir=str(tmp_path / "runs"), **kw)


def spec(cfg, **kw) -> ComparisonSpec:
    return ComparisonSpec(cfg, ["grpo"], [0], train_fn=fake_train, step0_fn=fake_step0, progress=False, report=False,
                          workers=1, **kw)


def test_rewritten_data_file_is_a_new_comparison_and_is_retrained(tmp_path):
    data = write(tmp_path / "train.jsonl", GSM)
    cfg = gsm_cfg(tmp_path, data)
    first = run_comparison(spec(cfg))
    assert first.pairs[0].outcome == "finished"
    same = run_comparison(spec(cfg))
    assert same.pairs[0].outcome == "reused" and same.comparison == first.comparison
    # every answer rewritten (still numbers: run_comparison checks, as `bench run` does, that the verifier reads them)
    write(data, [{**r, "answer": r["answer"].replace("#### ", "#### 1")} for r in GSM])
    again = run_comparison(spec(cfg))
    assert again.comparison != first.comparison
    assert again.pairs[0].outcome == "finished" and again.pairs[0].run_id != first.pairs[0].run_id


def test_datasets_and_digests_are_logged(tmp_path):
    data = write(tmp_path / "train.jsonl", GSM)
    cfg = gsm_cfg(tmp_path, data)
    res = run_comparison(spec(cfg))
    run = MlflowClient(cfg.tracking_uri).get_run(res.pairs[0].run_id)
    logged = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(logged) == {"gsm8k-train", "gsm8k-test"}
    train = logged["gsm8k-train"]
    assert train.dataset.digest == identity.file_digest(data)[:12]
    assert json.loads(train.dataset.profile) == {"num_rows": 3}
    assert json.loads(train.dataset.source) == {"uri": str(data)}
    assert {t.key: t.value for t in train.tags}["mlflow.data.context"] == "training"
    assert run.data.params["inputs.train_data"] == identity.file_digest(data)
    assert run.data.params["inputs.model"] == identity.model_digest("builtin:tiny-arith")


def test_a_rewrite_with_the_same_size_and_mtime_is_hashed_again(tmp_path):
    """Held-out round 8 (F9): a data file rewritten with the same size and its mtime restored (``touch -r``) was
    answered from the digest cache keyed by (path, size, mtime): the old comparison came back and its runs were
    reused. The key holds the inode and ctime too, which the rewrite and ``utime`` change."""
    data = write(tmp_path / "d.jsonl", GSM)
    before = identity.file_digest(data)
    identity._memo.clear()  # a new process, file unchanged: the on-disk cache answers (the file is not read)
    cache = json.loads((tmp_path / "cache" / "digests.json").read_text())
    assert list(cache.values()) == [before] and identity.file_digest(data) == before
    st = data.stat()
    text = data.read_text()
    data.write_text(text.replace("Ann", "Eve"))  # same size, same mtime restored, as the user did
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert data.stat().st_size == st.st_size and data.stat().st_mtime_ns == st.st_mtime_ns
    identity._memo.clear()  # a new process: the on-disk cache must not answer
    assert identity.file_digest(data) != before
    cfg = gsm_cfg(tmp_path, data)
    identity._memo.clear()
    h = cfg.comparison_hash()
    data.write_text(text)  # the original bytes again, mtime restored: back to the first digest
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    identity._memo.clear()
    assert identity.file_digest(data) == before and cfg.comparison_hash() != h


def test_model_folder_files_are_part_of_the_identity(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(BUILTIN_MODELS["builtin:tiny-arith"], folder)
    cfg = TrainConfig(model=str(folder))
    h = cfg.comparison_hash()
    weights = next(p for p in folder.iterdir() if p.suffix == ".safetensors")
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\1")
    assert cfg.comparison_hash() != h
    (folder / "tokenizer_config.json").write_text((folder / "tokenizer_config.json").read_text() + " ")
    assert identity.model_digest(str(folder)) != identity.model_digest("builtin:tiny-arith")


def test_hub_revision_resolved_from_the_cache_and_pinned(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    identity.hub_revision.cache_clear()
    assert identity.model_digest("org/model") == "hub:org/model@unresolved"
    refs = tmp_path / "hub" / "models--org--model" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("a" * 40)
    (refs / "v2").write_text("b" * 40)
    identity.hub_revision.cache_clear()
    assert identity.model_digest("org/model") == f"hub:org/model@{'a' * 40}"
    assert identity.model_digest("org/model", "v2") == f"hub:org/model@{'b' * 40}"
    assert identity.model_digest("org/model", "c" * 40) == f"hub:org/model@{'c' * 40}"
    assert (TrainConfig(model="org/model", revision="v2").comparison_hash()
            != TrainConfig(model="org/model").comparison_hash())


def test_reuse_under_another_pobench_commit_is_named(tmp_path):
    data = write(tmp_path / "train.jsonl", GSM)
    cfg = gsm_cfg(tmp_path, data)
    first = run_comparison(spec(cfg))
    MlflowClient(cfg.tracking_uri).set_tag(first.pairs[0].run_id, "pobench.git_commit", "0123456789abcdef")
    again = run_comparison(spec(cfg))
    assert again.pairs[0].outcome.startswith("reused (written by pobench ")
    assert "at commit 0123456789;" in again.pairs[0].outcome


def test_a_control_comparison_never_reuses_real_reward_runs(tmp_path):
    """`bench run --control random-reward` after the same comparison with real rewards: the control is part of the
    comparison's identity, so its runs are trained under the control, in their own folders."""
    data = write(tmp_path / "train.jsonl", GSM)
    real = run_comparison(spec(gsm_cfg(tmp_path, data)))
    control = run_comparison(spec(gsm_cfg(tmp_path, data, control="random-reward")))
    assert control.comparison != real.comparison
    (p,) = control.pairs
    assert p.outcome == "finished" and p.run_id != real.pairs[0].run_id and p.run_name != real.pairs[0].run_name
    tags = MlflowClient(control.tracking_uri).get_run(p.run_id).data.tags
    assert tags["pobench.control"] == "random-reward"
    assert run_comparison(spec(gsm_cfg(tmp_path, data, control="random-reward"))).pairs[0].outcome == "reused"
