"""verl engine: pobench objectives as verl policy losses, a comparison run's verl config, and its launch on Ray.

Three parts, each usable alone:

1. **Objectives** (``register_all``, run on import when verl is installed): every pobench objective is registered
   with verl's policy-loss registry (``verl.trainer.ppo.core_algos.register_policy_loss``) as ``pobench_<name>``.
   verl calls a registered loss as ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
   rollout_is_weights) -> (loss, metrics)`` (selected by ``actor_rollout_ref.actor.policy_loss.loss_mode``), and
   adds the KL to the reference and the entropy bonus itself, outside that function (``verl/workers/utils/losses.py``
   ``ppo_loss``). So an objective's β·KL (every token, unmasked) and α·H terms run as verl's own ``use_kl_loss`` /
   ``entropy_coeff`` and its registered loss is the objective with those two terms at 0; the advantage estimator,
   DAPO's dynamic sampling and overlong shaping run as verl's ``algorithm.adv_estimator``,
   ``algorithm.filter_groups`` and the ``dapo`` reward manager. ``mapping(name)`` says how one objective runs;
   ``objective_table()`` lists all. This module is importable as verl's ``actor_rollout_ref.model.external_lib``
   (verl imports it in every worker); registration is idempotent.

   **Worker loss** (``mapping(name).mode == "worker-loss"``): an objective whose loss needs more than verl hands a
   policy loss (current / old / reference entropies, π_ref log-probs under a mask, r·KL: TEPO and its masked
   ablations, forking tokens) runs as ``worker_loss.pobench_worker_loss``, which replaces verl's ``ppo_loss`` in the
   actor workers (same signature: ``(config, model_output, data, dp_group) -> (loss, metrics)``) and computes the
   whole objective, KL and entropy terms included, on a ``PolicyBatch`` built from verl's micro-batch. It is
   installed by pobench's verl trainer (``trainer.PobenchTrainer``, a subclass of verl's synchronous V1 trainer
   registered as ``trainer.v1.trainer_mode=pobench_sync``): ``set_loss_fn`` on the actor worker group after setup,
   the old pass's entropy kept as ``old_entropy``, and the reference pass run with ``calculate_entropy`` to write
   ``ref_entropy``. verl looks the trainer up in its task runner's process, so the generated config sets
   ``$VERL_USE_EXTERNAL_MODULES=bench.engines.verl.trainer`` (imported by ``import verl`` in every Ray worker). The
   registered ``pobench_<name>`` of such an objective is a stub that raises, naming that setup. The trainer needs
   verl's V1 dependencies (TransferQueue); what still cannot run (pobench's batch options, estimators without a verl
   counterpart) is "unsupported", refused with the reason by ``make_verl_config``.

2. **Config** (``make_verl_config``): the Hydra overrides of verl's ``ppo_trainer`` config for one run (objective,
   seed) of a pobench ``TrainConfig``; ``hydra_overrides`` flattens them into ``key=value`` arguments of
   ``python -m verl.trainer.main_ppo``. ``write_data`` converts a task's problems into verl's parquet layout, and
   ``compute_score`` is the reward function verl calls (pobench's own verifier).

3. **Launch** (module ``launch``; needs GPUs and a Ray cluster): creates the MLflow run with pobench's tags, runs
   verl with ``MLFLOW_RUN_ID`` set so verl's MLflow logger writes into it, then copies verl's metrics under pobench's
   names (``METRIC_MAP``) so ``bench report`` can read the run. ``run.VerlEngine`` is the training engine of
   ``--engine verl``. Neither is imported here: this package is verl's ``external_lib``, imported in every verl
   worker, whose environment has no MLflow.

Entry point: ``python -m bench.engines.verl --algo NAME --seed N [--config run.yaml] --print-config|--launch``.
verl is imported lazily: without it, ``mapping``, ``objective_table`` and ``make_verl_config`` still work
(``trainer.py`` alone imports verl's V1 trainer at import).
"""

from __future__ import annotations

from bench.engines.verl.config import (
    VerlOptions,
    _chat_template,  # noqa: F401  (tests check the template)
    compute_score,
    hydra_overrides,
    main_ppo_command,
    make_verl_config,
    problem_rows,
    run_name,
    write_data,
)
from bench.engines.verl.losses import (
    ADV_ESTIMATORS,
    EXTERNAL_LIB,
    KL_TYPES,
    OVERRIDES_ENV,
    PREFIX,
    ROLLOUT_ENGINES,
    TOKEN_ADV_ESTIMATORS,
    TRAINER_MODE,
    TRAINER_MODULE,
    WORKER_FIELDS,
    VerlMapping,
    make_policy_loss,
    mapping,
    objective_table,
    register_all,
    table_markdown,
)
from bench.engines.verl.worker_loss import pobench_worker_loss, worker_loss_fn
from bench.plugins import load_plugins, plugins_from_env

__all__ = ["ADV_ESTIMATORS", "EXTERNAL_LIB", "KL_TYPES", "OVERRIDES_ENV", "PREFIX", "ROLLOUT_ENGINES",
           "TOKEN_ADV_ESTIMATORS", "TRAINER_MODE", "TRAINER_MODULE", "WORKER_FIELDS", "VerlOptions", "VerlMapping",
           "compute_score", "hydra_overrides", "main_ppo_command", "make_policy_loss", "make_verl_config",
           "mapping", "objective_table", "pobench_worker_loss", "problem_rows", "register_all", "run_name",
           "table_markdown", "worker_loss_fn", "write_data"]

# in a verl worker: the run's plugins ($POBENCH_PLUGINS, set by make_verl_config) before the objectives are registered
# with verl and before the worker loss looks its objective up
load_plugins(plugins_from_env())
try:  # registration on import (verl's external_lib); without verl the config part still works
    import verl.trainer.ppo.core_algos  # noqa: F401
except ImportError:
    pass
else:
    register_all()
