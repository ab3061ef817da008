"""pobench's worker loss and trainer on verl 0.9.1 (bench/engines/verl/worker_loss.py, trainer.py), CPU only.

A tiny causal LM (embedding -> GRU -> logits) stands for the actor, the old policy and the reference; its outputs are
laid out as verl's engine returns them (nested over prompt + response, position t holding log p(token t+1), computed
with verl's own ``logprobs_from_logits`` / ``entropy_from_logits``), the per-sample fields as verl's agent loop and
TransferQueue hold them (``list_of_dict_to_tensordict``), and the micro-batches are cut by verl's
``prepare_micro_batches``. The expected values are pobench's objectives on a ``PolicyBatch`` computed from the same
models, independently of verl. Tests of the trainer need TransferQueue (verl's V1 trainer); they use an in-memory
stand-in for its key-value store and for the worker groups.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (tox -e verl)")

from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from algorithms import PolicyBatch, get_objective  # noqa: E402
from bench.engines import verl as engine  # noqa: E402
from bench.engines.verl.worker_loss import OLD_ENTROPY, REF_ENTROPY, worker_loss_fn  # noqa: E402
from tests.verl.test_verl_engine import compose, train_config  # noqa: E402

pytestmark = pytest.mark.verl
ROOT = Path(__file__).resolve().parents[2]
V = 13
PROMPT_LENS = [2, 1, 3, 2, 1, 3, 1, 2]
RESPONSE_LENS = [7, 3, 5, 7, 1, 6, 4, 2]
B, T = len(RESPONSE_LENS), max(RESPONSE_LENS)
TOL = {"rtol": 1e-6, "atol": 1e-9}
WORKER = [p.objective for p in engine.objective_table() if p.mode == "worker-loss"]
# every worker-loss objective at its registered defaults, and one that needs the worker loss only through an override
CASES = [(n, {}) for n in WORKER] + [("grpo", {"kl_is_correction": True})]


class TinyLM(torch.nn.Module):
    """Causal toy LM: a position's logits depend on the whole prefix, so a misaligned position shows."""

    def __init__(self, seed: int):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.emb, self.rnn, self.out = torch.nn.Embedding(V, 8), torch.nn.GRU(8, 8), torch.nn.Linear(8, V)
        self.double()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (L,) -> (L, V)
        h, _ = self.rnn(self.emb(ids)[:, None])
        return self.out(h[:, 0])


_g = torch.Generator().manual_seed(7)
SEQS = [(torch.randint(V, (p,), generator=_g), torch.randint(V, (r,), generator=_g))
        for p, r in zip(PROMPT_LENS, RESPONSE_LENS)]
ADV = torch.randn(B, generator=_g, dtype=torch.float64)
MASK = (torch.arange(T)[None, :] < torch.tensor(RESPONSE_LENS)[:, None]).double()


def engine_output(model, rows, *, entropy: bool = True, temperature: float = 1.0) -> dict[str, torch.Tensor]:
    """What verl's FSDP engine returns for ``rows`` (remove-padding path): per-token log-probs of the next token
    (the packed ids rolled by one) and entropies, nested over prompt + response."""
    ids = torch.cat([torch.cat(SEQS[i]) for i in rows])
    logits = torch.cat([model(torch.cat(SEQS[i])) for i in rows]) / temperature  # sequences attend only to themselves
    offsets = torch.tensor([0] + [len(torch.cat(SEQS[i])) for i in rows]).cumsum(0)
    out = {"log_probs": torch.nested.nested_tensor_from_jagged(
        logprobs_from_logits(logits, torch.roll(ids, shifts=-1)), offsets)}
    if entropy:
        out["entropy"] = torch.nested.nested_tensor_from_jagged(entropy_from_logits(logits), offsets)
    return out


def expected(model, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs and entropies of the response tokens, straight from the model's logits (no verl)."""
    lp, h = [], []
    for prompt, response in SEQS:
        logits = model(torch.cat([prompt, response]))[len(prompt) - 1:len(prompt) + len(response) - 1] / temperature
        dist = torch.distributions.Categorical(logits=logits)
        lp.append(torch.nn.functional.pad(dist.log_prob(response), (0, T - len(response))))
        h.append(torch.nn.functional.pad(dist.entropy(), (0, T - len(response))))
    return torch.stack(lp), torch.stack(h)


MODEL, OLD, REF = TinyLM(0), TinyLM(1), TinyLM(2)  # π_θ, π_old (the actor before the update), π_ref
with torch.no_grad():
    (OLD_LP, OLD_H), (REF_LP, REF_H) = expected(OLD), expected(REF)


def objective_loss(name: str, overrides: dict, *, with_metrics: bool = False):
    lp, h = expected(MODEL)
    objective = get_objective(name, **overrides)
    batch = PolicyBatch(logprobs=lp, old_logprobs=OLD_LP, advantages=ADV, mask=MASK, max_length=T,
                        ref_logprobs=REF_LP, entropy=h if objective.needs_entropy_grad else h.detach(),
                        old_entropy=OLD_H, ref_entropy=REF_H)
    loss, metrics = objective.loss(batch)
    return (loss, metrics) if with_metrics else loss


def sample_fields(i: int) -> dict[str, torch.Tensor]:
    """One sample as verl's agent loop puts it into TransferQueue (1-D per sample), before any forward."""
    prompt, response = SEQS[i]
    r = len(response)
    return {"prompts": prompt, "responses": response, "input_ids": torch.cat([prompt, response]),
            "attention_mask": torch.ones(len(prompt) + r, dtype=torch.long),
            "position_ids": torch.arange(len(prompt) + r), "response_mask": torch.ones(r, dtype=torch.long),
            "loss_mask": torch.ones(r, dtype=torch.long), "rollout_log_probs": OLD_LP[i, :r] + 0.01,
            "row": torch.tensor([i])}


def actor_step_fields(i: int) -> dict[str, torch.Tensor]:
    """... and what the trainer's old / reference / advantage passes add before the actor update."""
    r = RESPONSE_LENS[i]
    return {**sample_fields(i), "old_log_probs": OLD_LP[i, :r], "ref_log_prob": REF_LP[i, :r],
            "advantages": ADV[i].expand(r).clone(), OLD_ENTROPY: OLD_H[i, :r], REF_ENTROPY: REF_H[i, :r]}


def run_update(loss_fn, data: TensorDict, micro_batch_size: int, model=MODEL, pg_losses: list | None = None):
    """The actor update of one mini-batch as verl's engine runs it: global token count, micro-batches, the loss
    function on each with the model's output (summed here instead of backpropagated one by one). ``pg_losses``
    collects the micro-batches' actor/pg_loss metric."""
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(MASK.sum()), global_batch_size=len(data),
                         use_dynamic_bsz=False, micro_batch_size_per_gpu=micro_batch_size, calculate_entropy=True)
    micro_batches, _ = prepare_micro_batches(data)
    assert len(micro_batches) == len(data) // micro_batch_size
    total = torch.zeros((), dtype=torch.float64)
    for micro in micro_batches:
        loss, metrics = loss_fn(model_output=engine_output(model, micro["row"].flatten().tolist()), data=micro,
                                dp_group=None)
        assert metrics["actor/pg_loss"].aggregation.value == "sum"
        if pg_losses is not None:
            pg_losses += metrics["actor/pg_loss"].values
        total = total + loss
    return total


def plan_actor_config(p: engine.VerlMapping) -> ActorConfig:
    fields = {k.rpartition(".")[2]: v for k, v in p.native.items() if k.startswith("actor_rollout_ref.actor.")}
    fields["policy_loss"] = {"loss_mode": p.loss_mode}
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **fields)


def assert_same_loss_and_grads(ours: torch.Tensor, want: torch.Tensor, model=MODEL):
    params = list(model.parameters())
    torch.testing.assert_close(ours.detach(), want.detach(), **TOL)
    for g_ours, g_want in zip(torch.autograd.grad(ours, params), torch.autograd.grad(want, params)):
        torch.testing.assert_close(g_ours, g_want, **TOL)


# --- the worker loss through verl's micro-batch machinery
@pytest.mark.parametrize("name,overrides", CASES, ids=[n + ("-r-kl" if o else "") for n, o in CASES])
def test_worker_loss_equals_objective(name, overrides, monkeypatch):
    """The replaced actor loss over verl's micro-batches (two, one for objectives that select tokens per micro-batch)
    sums to our objective on the whole batch: loss and gradients of the model's parameters."""
    monkeypatch.setenv(engine.OVERRIDES_ENV, json.dumps({name: overrides}))
    p = engine.mapping(name, overrides)
    assert p.mode == "worker-loss" and p.runs
    data = tu.list_of_dict_to_tensordict([actor_step_fields(i) for i in range(B)])
    micro_batch_size = B // 2 if get_objective(name, **overrides).split_invariant else B
    pg_losses = []
    ours = run_update(worker_loss_fn(plan_actor_config(p)), data, micro_batch_size, pg_losses=pg_losses)
    want, metrics = objective_loss(name, overrides, with_metrics=True)
    assert_same_loss_and_grads(ours, want)
    # verl's actor/pg_loss (summed over micro-batches): the objective's policy term on the whole batch
    assert sum(pg_losses) == pytest.approx(float(metrics["objective/policy_loss"]), rel=1e-9, abs=1e-12)


def test_tepo_mask_uses_both_entropies():
    """TEPO's mask reads H_θ and H_ref: on these models it keeps some tokens and drops others (so a swapped or
    misaligned entropy changes the loss)."""
    lp, h = expected(MODEL)
    keep = (ADV[:, None] > 0) & (h < REF_H) & (MASK > 0)
    assert 0 < int(keep.sum()) < int(MASK.sum())
    assert not torch.allclose(REF_H * MASK, OLD_H * MASK)


def test_verl_ppo_loss_refuses_a_worker_loss_objective():
    """Without pobench's trainer, verl's own ppo_loss calls the registered stub: it raises, naming the fix."""
    p = engine.mapping("tepo")
    data = tu.list_of_dict_to_tensordict([actor_step_fields(i) for i in range(B)])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(MASK.sum()), global_batch_size=B)
    with pytest.raises(ValueError, match="worker loss.*trainer.v1.trainer_mode=pobench_sync"):
        ppo_loss(plan_actor_config(p), engine_output(MODEL, list(range(B))), data)
    with pytest.raises(ValueError, match="runs on verl as 'registered'"):
        worker_loss_fn(plan_actor_config(engine.mapping("grpo")))(model_output=engine_output(MODEL, list(range(B))),
                                                               data=data)
    assert core_algos.get_policy_loss_fn("pobench_grpo") is not None


def test_worker_loss_names_a_missing_field():
    p = engine.mapping("tepo")
    data = tu.list_of_dict_to_tensordict([{k: v for k, v in actor_step_fields(i).items() if k != REF_ENTROPY}
                                          for i in range(B)])
    with pytest.raises(ValueError, match="ref_entropy.*pobench's trainer"):
        run_update(worker_loss_fn(plan_actor_config(p)), data, B)


# --- the generated config
@pytest.mark.parametrize("algo", ["tepo", "forking_tokens", "tepo-seq-mean"])
def test_worker_loss_config_validates_with_verl(algo, tmp_path):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    cfg = train_config(algo, output_dir=str(tmp_path))
    generated = engine.make_verl_config(cfg, engine.VerlOptions(n_gpus_per_node=8))
    config = compose(engine.hydra_overrides(generated))
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=False)
    OmegaConf.resolve(config)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)  # what pobench's trainer binds the loss to
    objective = get_objective(algo)
    assert actor.policy_loss.loss_mode == f"pobench_{algo}"
    assert (actor.loss_agg_mode, actor.entropy_coeff, actor.kl_loss_coef) == (objective.config.aggregation, 0.0, 0.0)
    assert need_reference_policy(config) == actor.use_kl_loss == objective.needs_reference
    assert actor.calculate_entropy == (algo != "forking_tokens")
    assert config.trainer.use_v1 and config.trainer.v1.trainer_mode == engine.TRAINER_MODE
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env["VERL_USE_EXTERNAL_MODULES"] == engine.TRAINER_MODULE


# --- pobench's trainer (verl's V1 trainer; needs TransferQueue)
class FakeStore:
    """In-memory stand-in for TransferQueue's key-value interface (kv_batch_get / kv_batch_put)."""

    def __init__(self):
        self.rows: dict[str, dict[str, torch.Tensor]] = {}

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        fields = select_fields or sorted(self.rows[keys[0]])
        return tu.list_of_dict_to_tensordict([{f: self.rows[k][f] for f in fields} for k in keys])

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        from transfer_queue import KVBatchMeta

        for name, value in fields.items():
            for key, v in zip(keys, value.unbind(0)):
                self.rows.setdefault(key, {})[name] = v
        return KVBatchMeta(keys=list(keys), tags=[{} for _ in keys], partition_id=partition_id,
                           fields=sorted(self.rows[keys[0]]))

    def padded(self, name: str) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(self.rows[str(i)][name], (0, T - RESPONSE_LENS[i]))
                            for i in range(B)])


class FakeWorkers:
    """A worker group's forward as TransferQueue sees it: the engine's outputs written back under their names."""

    def __init__(self, store: FakeStore, model):
        self.store, self.model, self.calls, self.loss_fns = store, model, [], []

    def compute_log_prob(self, batch):
        info = dict(batch.extra_info)
        self.calls.append(info)
        rows = self.store.kv_batch_get(batch.keys, batch.partition_id, ["row"])["row"].flatten().tolist()
        with torch.no_grad():
            out = engine_output(self.model, rows, entropy=info["calculate_entropy"], temperature=info["temperature"])
        self.store.kv_batch_put(batch.keys, batch.partition_id, TensorDict(out, batch_size=len(rows)))
        return batch

    compute_ref_log_prob = compute_log_prob

    def set_loss_fn(self, loss_fn):
        self.loss_fns.append(loss_fn)


@pytest.fixture
def trainer_setup(monkeypatch, tmp_path):
    tq = pytest.importorskip("transfer_queue", reason="verl's V1 trainer needs TransferQueue (tox -e verl installs it)")
    from omegaconf import OmegaConf

    from bench.engines.verl.trainer import PobenchTrainer

    store = FakeStore()
    monkeypatch.setattr(tq, "kv_batch_get", store.kv_batch_get)
    monkeypatch.setattr(tq, "kv_batch_put", store.kv_batch_put)
    config = compose(engine.hydra_overrides(engine.make_verl_config(train_config("tepo", output_dir=str(tmp_path)))))
    OmegaConf.resolve(config)
    trainer = object.__new__(PobenchTrainer)  # no Ray: only the attributes the overridden steps read
    trainer.config, trainer.ref_in_actor = config, False
    trainer.actor_rollout_wg, trainer.ref_policy_wg = FakeWorkers(store, OLD), FakeWorkers(store, REF)
    keys = [str(i) for i in range(B)]
    batch = store.kv_batch_put(keys, "train", tu.list_of_dict_to_tensordict([sample_fields(i) for i in range(B)]))
    batch.extra_info = {"temperature": config.actor_rollout_ref.rollout.temperature}
    return trainer, store, batch


def test_trainer_writes_old_and_reference_entropies(trainer_setup):
    """The old pass keeps H_old (verl computes it, then the reference pass overwrites its field); the reference pass
    asks for entropies and writes H_ref: both equal the entropies of the models' own logits at the response tokens."""
    trainer, store, batch = trainer_setup
    metrics = {}
    batch = trainer._compute_old_log_prob(batch, metrics)
    batch = trainer._compute_ref_log_prob(batch, metrics)
    assert [c["calculate_entropy"] for c in trainer.actor_rollout_wg.calls + trainer.ref_policy_wg.calls] == [True] * 2
    assert {"old_log_probs", OLD_ENTROPY, "ref_log_prob", REF_ENTROPY} <= set(batch.fields)
    torch.testing.assert_close(store.padded(REF_ENTROPY), REF_H, **TOL)
    torch.testing.assert_close(store.padded("ref_log_prob"), REF_LP, **TOL)
    torch.testing.assert_close(store.padded(OLD_ENTROPY), OLD_H, **TOL)
    torch.testing.assert_close(store.padded("old_log_probs"), OLD_LP, **TOL)
    torch.testing.assert_close(store.padded("entropy"), OLD_H, **TOL)  # verl's field, as verl left it
    assert "actor/entropy" in metrics


def test_trainer_installs_the_worker_loss_that_runs_the_objective(trainer_setup, monkeypatch):
    """End to end on CPU: _setup hands every actor worker pobench's loss (pickled as Ray sends it), the old and
    reference passes fill the batch, and the actor update over verl's micro-batches equals TEPO on the whole batch."""
    import ray.cloudpickle
    from verl.trainer.ppo.v1 import PPOTrainerSync

    trainer, store, batch = trainer_setup
    monkeypatch.setattr(PPOTrainerSync, "_setup", lambda self: None)  # the Ray worker groups
    monkeypatch.delenv(engine.OVERRIDES_ENV, raising=False)
    trainer._setup()
    (loss_fn,) = trainer.actor_rollout_wg.loss_fns
    loss_fn = ray.cloudpickle.loads(ray.cloudpickle.dumps(loss_fn))
    batch = trainer._compute_ref_log_prob(trainer._compute_old_log_prob(batch, {}), {})
    store.kv_batch_put(batch.keys, "train", TensorDict({"advantages": torch.nested.as_nested_tensor(
        [ADV[i].expand(r).clone() for i, r in enumerate(RESPONSE_LENS)], layout=torch.jagged)}, batch_size=B))
    data = store.kv_batch_get(batch.keys, "train")  # every field, as the actor worker gets them
    assert_same_loss_and_grads(run_update(loss_fn, data, B // 2), objective_loss("tepo", {}))


def test_trainer_is_registered_when_verl_is_imported():
    """$VERL_USE_EXTERNAL_MODULES (set by the generated config in every Ray worker) registers pobench's trainer
    while verl is imported, as in verl's task runner before it looks the trainer up."""
    pytest.importorskip("transfer_queue", reason="verl's V1 trainer needs TransferQueue (tox -e verl installs it)")
    code = ("import verl.trainer.main_ppo; from verl.trainer.ppo.v1 import get_trainer_cls; "
            f"print(get_trainer_cls({engine.TRAINER_MODE!r}).__name__)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]]),
           "VERL_USE_EXTERNAL_MODULES": engine.TRAINER_MODULE}
    out = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "PobenchTrainer"
