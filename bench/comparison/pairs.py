"""One pair of a comparison, wherever an executor runs it (in this process, a pool process, a Ray task): claim it,
decide under the claim whether it is reused, resumed or trained, train it with the comparison's training function.
And the comparison's step-0 evaluation, shared by its pairs.

Each pair is claimed with a lock file (store.py ``pair_lock``) before anything is decided about it; under the claim
the store is asked again whether the pair already FINISHED (then it is reused: another process trained it meanwhile)
or has a checkpoint (resumed), else it is trained. Exceptions other than an interrupt become a failed result naming the
pair, and the other pairs go on.

The step-0 (before training) evaluation is the same for every objective: the same starting policy on the same
problems. It is computed once per comparison (:func:`initial_evals`) and logged into every run at step 0.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace

from bench import faults
from bench.comparison.plan import Pair, deleted_run, pair_config, reusable, run_dir
from bench.comparison.store import lock_file, pair_lock
from bench.config import TrainConfig
from bench.data import derive_seed, eval_problems
from bench.engines import RunStopped, TrainingDiverged, TrainResult
from bench.evaluate import eval_metrics, held_out_result
from bench.model import load_policy
from bench.plugins import plugin_failure
from bench.rollout import make_sampler
from bench.runs import resume
from bench.runs.run import experiment_dir, folder_held, has_checkpoint, remove_run_folder, seed_and_threads
from bench.runs.tracking import answering, store_client
from bench.workers import Notify
from evaluators.metrics import summarize
from reports import metric_keys as K
from reports.record import member_tag

TrainFn = Callable[..., TrainResult]  # train_fn(cfg, *, on_eval, on_step, step0_eval): bench.engines.entry.train


@dataclass(frozen=True)
class PairContext:
    """What every pair of one comparison shares (pickled to the worker that runs a pair)."""

    cfg: TrainConfig               # the comparison's base config (pair_config derives the run's)
    cid: str
    parent_id: str
    experiment_id: str
    force: bool
    train_fn: TrainFn
    on_eval: Callable[[Pair, int, dict[str, float]], None] | None = None


@dataclass
class PairJob:
    index: int                     # position in the comparison's list of pairs to run
    pair: Pair
    ctx: PairContext
    step0: dict[str, float] | None = None   # the shared step-0 evaluation of its seed, when computed


@dataclass
class PairResult:
    index: int
    outcome: str                   # finished | stopped early | reused (...) | failed: ... | interrupted | not started
    action: str = ""               # what was done under the claim: reuse | resume | train
    run_id: str | None = None
    error: str = ""                # traceback of a failure


# ------------------------------------------------------------------ step 0, once per comparison
def initial_evals(cfg: TrainConfig, seeds: list[int]) -> dict[int, dict[str, float]]:
    """The step-0 held-out metrics of each seed's run, computed from ONE evaluation when it is greedy.

    Greedy decoding of the starting policy does not depend on the seed or the objective; only the bootstrap interval
    of the accuracy is seeded (per run), so it is recomputed per seed from the same per-problem results. A sampled
    evaluation (``eval_temperature`` > 0) draws per seed: evaluated once per seed."""
    seed_and_threads(cfg)
    model, tok = load_policy(cfg.model, cfg.device, cfg.dtype, cfg.revision)
    sampler = make_sampler(cfg.backend, model, tok)
    task, problems = eval_problems(cfg.eval_task or cfg.task, limit=cfg.eval_problems, data=cfg.eval_data,
                                   difficulty=cfg.difficulty)
    out: dict[int, dict[str, float]] = {}
    if cfg.eval_temperature > 0:
        for s in seeds:
            out[s] = eval_metrics(held_out_result(replace(cfg, seed=s), sampler, tok, task, problems))
        return out
    res = held_out_result(replace(cfg, seed=seeds[0]), sampler, tok, task, problems)
    greedy = [bool(r["greedy_correct"]) for r in res.rows]
    for s in seeds:
        seed = derive_seed(s, "eval")
        out[s] = eval_metrics(replace(res, seed=seed, metrics=summarize(greedy, None, None, 0, seed=seed)))
    return out


# ------------------------------------------------------------------ one pair, under its claim
def inputs_changed(cfg: TrainConfig, p: Pair) -> str | None:
    """The line of a pair whose inputs (data files, model, task versions: ``TrainConfig.comparison_hash``) are no
    longer those the comparison was planned with (its run name ends with that hash), else None. Held-out round 17,
    H29: a data folder rewritten while `bench run` trained its first pair: the second trained on the new data under
    the old data's comparison id, a mixed comparison, silently."""
    if p.run_name.endswith("-" + cfg.comparison_hash()[:6]):
        return None
    sources = ", ".join(dict.fromkeys(str(d) for d in (cfg.data, cfg.eval_data) if d)) or "its model or task files"
    return (f"its inputs changed since the comparison started ({sources}): it would train on other inputs than the "
            "pairs before it; put them back and rerun the same command, or rerun it as it is for a new comparison "
            "of the new inputs")


def run_pair(notify: Notify, job: PairJob) -> PairResult:
    """Claim the pair, decide reuse / resume / train under the claim, train. Exceptions other than an interrupt
    become a failed result naming the pair (the caller goes on with the other pairs)."""
    p, ctx = job.pair, job.ctx
    cfg = ctx.cfg
    what = f"{p.variant} seed {p.seed}"
    lock = lock_file(cfg.output_dir, cfg.experiment, p.run_name)
    try:
        with answering(cfg.tracking_uri), \
                pair_lock(lock, what, on_wait=lambda msg: notify("msg", job.index, msg)) as free:
            # (the pair's own requests bounded as its run's are: a lost server is its one line within the bound)
            client = store_client(cfg.tracking_uri)
            if (changed := inputs_changed(cfg, p)) is not None:
                return PairResult(job.index, f"failed: {changed}", "train")
            if not ctx.force or not free:
                record, stale, gone_final = reusable(client, ctx.experiment_id, cfg, p)
                if stale is not None:
                    return PairResult(job.index, f"failed: {stale}", "train")  # (`bench run`'s plan refuses it first)
                done = record.info.run_id if record is not None else None
                if done is not None and gone_final is not None:
                    if record.data.tags.get(member_tag(ctx.cid)) == "1":  # (its comparison counts the new run)
                        client.set_tag(done, member_tag(ctx.cid), "0")
                    notify("msg", job.index, f"{what}: its final model {gone_final} is gone (moved or deleted): "
                           "trained again, as a new run")
                    done = None
                if done is not None:
                    client.set_tag(done, member_tag(ctx.cid), "1")
                    how = "reused" if free else "reused (trained by another process)"
                    return PairResult(job.index, how, "reuse", done)
            gone = None if ctx.force else deleted_run(client, cfg, run_dir(cfg, p))
            if gone is not None:  # deleted in the store (to redo it): the pair is absent, trained again
                with folder_held(run_dir(cfg, p)):  # (no training starts in it while it goes; one running: refused)
                    kept = remove_run_folder(run_dir(cfg, p), experiment_dir(cfg.output_dir, cfg.experiment))
                notify("msg", job.index, f"{what}: its MLflow run {gone} was deleted in the store; trained again (its "
                       f"folder's checkpoints removed{', a file of yours kept' if kept else ''})")
            action = "resume" if has_checkpoint(run_dir(cfg, p)) else "train"
            notify("start", job.index, action)
            p = replace(p, action=action)
            pcfg = pair_config(cfg, p, ctx.cid, ctx.parent_id)

            def on_eval(step: int, metrics: dict[str, float]) -> None:
                notify("eval", job.index, step, metrics.get(K.EVAL_ACCURACY, float("nan")))
                if ctx.on_eval is not None:
                    ctx.on_eval(p, step, metrics)

            def on_step(step: int, metrics: dict[str, float]) -> None:
                notify("step", job.index, step, metrics.get(K.REWARD_MEAN, float("nan")))

            res = ctx.train_fn(pcfg, on_eval=on_eval, on_step=on_step,
                               step0_eval=job.step0 if action == "train" else None)
            client.set_tag(res.run_id, member_tag(ctx.cid), "1")  # a resumed run may predate this id
            return PairResult(job.index, "stopped early" if res.stopped_early else "finished", action, res.run_id)
    except TrainingDiverged as e:
        return PairResult(job.index, f"failed: {e}", "train", error=traceback.format_exc())
    except Exception as e:  # noqa: BLE001  (reported with the pair named; the other pairs go on)
        # a fault of the store or the file system, or an exception a plugin's code raised: its line
        said = faults.describe(e, store=cfg.tracking_uri) or plugin_failure(e)
        # bad input, a fault of the store / file system, a run a fault stopped: its one line; anything else is a bug,
        # whose traceback is shown
        known = said is not None or isinstance(e, (ValueError, OSError, RunStopped, faults.RaisedInWork))
        if said is None and isinstance(e, ValueError) and str(e).startswith("--resume: "):
            said = f"resuming it: {_resume_refused(cfg, p, ctx.cid, e)}"  # (bench run resumes a pair itself: no flag)
        elif said is None:
            said = str(e) if isinstance(e, (RunStopped, faults.RaisedInWork)) else f"{type(e).__name__}: {e}"
        if said.startswith("no space left on device") and "rerun" not in said:  # (round 15, H07: its run RUNNING)
            said += (", then rerun the same command: it resumes the pair from its last checkpoint (and ends its run "
                     "if left RUNNING)")
        return PairResult(job.index, f"failed: {' '.join(str(said).split())}", "train",
                          error="" if known else traceback.format_exc())


def _resume_refused(cfg: TrainConfig, p: Pair, cid: str, e: ValueError) -> str:
    """The resume check's line in `bench run`'s words (held-out round 16, H21: it told of dropping --resume and giving
    another --run-name, flags `bench run` has not; a folder written since the check before the comparison)."""
    said, diff = str(e)[len("--resume: "):], []
    if " holds a run of another configuration: " in said:
        try:
            found = resume.saved(run_dir(cfg, p))
            diff = resume.differences(pair_config(cfg, p, cid, None), *found) if found is not None else []
        except (ValueError, OSError):  # (changed again since: its line as it was)
            return said
    return resume.pair_mismatch(cfg, run_dir(cfg, p), found[0], diff) if diff else said


def step0_task(notify: Notify, step0_fn: Callable[[TrainConfig, list[int]], dict[int, dict[str, float]]],
               cfg: TrainConfig, seeds: list[int]) -> dict[int, dict[str, float]]:
    """The comparison's step-0 evaluation as an executor task; when it fails, each run evaluates its own step 0."""
    try:
        return step0_fn(cfg, seeds)
    except Exception as e:  # noqa: BLE001  (each run then evaluates its own step 0)
        notify("msg", -1, f"the shared step-0 evaluation failed ({type(e).__name__}: {e}); each run evaluates its "
                          "own step 0")
        return {}

