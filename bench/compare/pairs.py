"""Running the pairs of `bench run`: one after another in this process, or in a local process pool.

Pool: ``spawn`` processes (no fork of a process holding torch / MLflow state), one torch thread each, SIGINT
ignored in the workers: Ctrl-C reaches the parent, which stops handing out pairs and sends SIGTERM to the busy
workers; the training loop turns that into its interrupt path (checkpoint the last finished step, run KILLED), so
rerunning the command resumes exactly there. A pair whose worker raises is reported with the pair named; the other
pairs go on. Results are identical to running the pairs one after another: every random draw of a run is a pure
function of its config and seed, and every run uses one intra-op thread either way.

Each pair is claimed with a lock file (``bench.compare.store.pair_lock``) before anything is decided about it; under the
claim the store is asked again whether the pair already FINISHED (then it is reused: another process trained it
meanwhile) or has a checkpoint (resumed), else it is trained.

The step-0 (before training) evaluation is the same for every objective: the same starting policy on the same
problems. It is computed once per comparison (:func:`initial_evals`) and logged into every run at step 0.
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from bench.config import TrainConfig

Notify = Callable[..., None]  # notify(kind, pair index, *payload): "start" | "step" | "eval" | "msg"


@dataclass
class PairJob:
    index: int                     # position in the harness's list of pairs to run
    cfg: TrainConfig               # the comparison's base config (pair_config derives the run's)
    pair: Any                      # bench.compare.plan.Pair
    cid: str
    parent_id: str
    experiment_id: str
    force: bool


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

    from bench.data import eval_problems
    from bench.engines.native.loop import derive_seed, eval_metrics, held_out_result, seed_and_threads
    from bench.model import load_policy
    from bench.rollout import make_engine
    from evaluators.metrics import summarize

    seed_and_threads(cfg)
    model, tok = load_policy(cfg.model, cfg.device, cfg.dtype)
    engine = make_engine(cfg.backend, model, tok)
    bench_, problems = eval_problems(cfg.eval_task or cfg.task, limit=cfg.eval_problems, data=cfg.eval_data,
                                     difficulty=cfg.difficulty)
    out: dict[int, dict[str, float]] = {}
    if cfg.eval_temperature > 0:
        for s in seeds:
            out[s] = eval_metrics(held_out_result(replace(cfg, seed=s), engine, tok, bench_, problems))
        return out
    res = held_out_result(replace(cfg, seed=seeds[0]), engine, tok, bench_, problems)
    greedy = [bool(r["greedy_correct"]) for r in res.rows]
    for s in seeds:
        seed = derive_seed(s, "eval")
        out[s] = eval_metrics(replace(res, seed=seed, metrics=summarize(greedy, None, None, 0, seed=seed)))
    return out


# ------------------------------------------------------------------ one pair, under its claim
def run_pair(job: PairJob, notify: Notify, on_eval=None, step0: dict[str, float] | None = None) -> PairResult:
    """Claim the pair, decide reuse / resume / train under the claim, train. Exceptions other than an interrupt
    become a failed result naming the pair (the caller goes on with the other pairs)."""
    from bench.compare.plan import finished_run, pair_config, run_dir
    from bench.compare.store import locks_dir, pair_lock
    from bench.engines.native import checkpoint
    from bench.engines.native.loop import TrainingDiverged, train
    from reports.record import member_tag, open_client

    p, cfg = job.pair, job.cfg
    what = f"{p.variant} seed {p.seed}"
    lock = locks_dir(cfg.output_dir, cfg.experiment) / f"{p.run_name}.lock"
    try:
        with pair_lock(lock, what, on_wait=lambda msg: notify("msg", job.index, msg)) as free:
            client = open_client(cfg.tracking_uri)
            if not job.force or not free:
                done = finished_run(client, job.experiment_id, cfg, p)
                if done is not None:
                    client.set_tag(done, member_tag(job.cid), "1")
                    how = "reused" if free else "reused (trained by another process)"
                    return PairResult(job.index, how, "reuse", done)
            action = "resume" if checkpoint.latest(run_dir(cfg, p)) is not None else "train"
            notify("start", job.index, action)
            p = replace(p, action=action)
            pcfg = pair_config(cfg, p, job.cid, job.parent_id)

            def cb(step: int, metrics: dict[str, float]) -> None:
                notify("eval", job.index, step, metrics.get("eval/accuracy", float("nan")))
                if on_eval is not None:
                    on_eval(p, step, metrics)

            def on_step(step: int, metrics: dict[str, float]) -> None:
                notify("step", job.index, step, metrics.get("rollout/reward_mean", float("nan")))

            res = train(pcfg, on_eval=cb, on_step=on_step, step0_eval=step0 if action == "train" else None)
            client.set_tag(res.run_id, member_tag(job.cid), "1")  # a resumed run may predate this id
            return PairResult(job.index, "stopped early" if res.stopped_early else "finished", action, res.run_id)
    except TrainingDiverged as e:
        return PairResult(job.index, f"failed: {e}", "train", error=traceback.format_exc())
    except Exception as e:  # noqa: BLE001  (reported with the pair named; the other pairs go on)
        return PairResult(job.index, f"failed: {type(e).__name__}: {e}", "train", error=traceback.format_exc())


# ------------------------------------------------------------------ the pool's worker side
_WORKER: dict[str, Any] = {"queue": None, "stop": None, "busy": False}


def _on_sigterm(*_: Any) -> None:
    if _WORKER["busy"]:  # the parent stops a busy worker: the training loop's interrupt path
        raise KeyboardInterrupt
    # an idle worker ignores it: the pool's shutdown ends it cleanly


def _worker_init(queue, stop) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C goes to the parent, which decides
    signal.signal(signal.SIGTERM, _on_sigterm)
    import torch

    torch.set_num_threads(1)
    _WORKER["queue"], _WORKER["stop"] = queue, stop


def _notify(*event: Any) -> None:
    _WORKER["queue"].put(event)


def _pool_pair(job: PairJob, on_eval, step0) -> PairResult:
    if _WORKER["stop"].is_set():
        return PairResult(job.index, "not started")
    _WORKER["busy"] = True
    try:
        return run_pair(job, _notify, on_eval, step0)
    except KeyboardInterrupt:
        return PairResult(job.index, "interrupted")
    finally:
        _WORKER["busy"] = False


def _pool_step0(cfg: TrainConfig, seeds: list[int]) -> dict[int, dict[str, float]]:
    _WORKER["busy"] = True
    try:
        return initial_evals(cfg, seeds)
    except KeyboardInterrupt:  # stopped by the parent: nothing to keep
        return {}
    finally:
        _WORKER["busy"] = False


# ------------------------------------------------------------------ the parent side
def execute(jobs: list[PairJob], *, workers: int, notify: Notify, on_eval=None, step0_cfg: TrainConfig | None = None,
            step0_seeds: list[int] = (), on_result: Callable[[PairResult], None] | None = None) -> list[PairResult]:
    """Run ``jobs`` (after the shared step-0 evaluation when ``step0_cfg``) on ``workers`` processes (1 = in this
    process). ``on_result`` is called in this process as each pair ends. A KeyboardInterrupt stops everything
    cleanly and is re-raised once the busy pairs have checkpointed."""
    if workers <= 1:
        step0 = _safe_step0(step0_cfg, step0_seeds, notify) if step0_cfg is not None else {}
        results = []
        for job in jobs:
            r = run_pair(job, notify, on_eval, step0.get(job.pair.seed))
            results.append(r)
            if on_result is not None:
                on_result(r)
        return results
    return _execute_pool(jobs, workers, notify, on_eval, step0_cfg, list(step0_seeds), on_result)


def _safe_step0(cfg, seeds, notify) -> dict[int, dict[str, float]]:
    try:
        return initial_evals(cfg, seeds)
    except Exception as e:  # noqa: BLE001  (each run then evaluates its own step 0)
        notify("msg", -1, f"the shared step-0 evaluation failed ({type(e).__name__}: {e}); each run evaluates its "
                          "own step 0")
        return {}


def _execute_pool(jobs, workers, notify, on_eval, step0_cfg, step0_seeds, on_result) -> list[PairResult]:
    import concurrent.futures as cf
    import multiprocessing as mp
    import queue as queue_mod

    from bench.engines.native.loop import _sigterm_as_interrupt

    ctx = mp.get_context("spawn")
    events, stop = ctx.Queue(), ctx.Event()
    results: dict[int, PairResult] = {}
    restore = _sigterm_as_interrupt()  # `kill <parent>` stops the workers as cleanly as Ctrl-C
    ex = cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(events, stop))

    def drain() -> None:
        while True:
            try:
                notify(*events.get_nowait())
            except queue_mod.Empty:
                return

    def wait_all(futs) -> None:
        pending = set(futs)
        while pending:
            done, pending = cf.wait(pending, timeout=0.2)
            drain()
            for f in done:
                job = futs[f]
                if job is None:
                    continue
                try:
                    r = f.result()
                except Exception as e:  # noqa: BLE001  (the worker process died: BrokenProcessPool, ...)
                    r = PairResult(job.index, f"failed: worker process ended ({type(e).__name__}: {e})",
                                   error=traceback.format_exc())
                results[job.index] = r
                if on_result is not None:
                    on_result(r)
        drain()

    try:
        step0: dict[int, dict[str, float]] = {}
        if step0_cfg is not None:
            f0 = ex.submit(_pool_step0, step0_cfg, step0_seeds)
            wait_all({f0: None})
            try:
                step0 = f0.result()
            except Exception as e:  # noqa: BLE001
                notify("msg", -1, f"the shared step-0 evaluation failed ({type(e).__name__}: {e}); each run "
                                  "evaluates its own step 0")
        futs = {}
        for job in jobs:
            try:
                futs[ex.submit(_pool_pair, job, on_eval, step0.get(job.pair.seed))] = job
            except cf.BrokenExecutor as e:  # a worker died before its pair started: report it, go on
                failed = cf.Future()
                failed.set_exception(e)
                futs[failed] = job
        wait_all(futs)
    except KeyboardInterrupt:
        stop.set()  # queued pairs return "not started"
        for proc in list((getattr(ex, "_processes", None) or {}).values()):
            if proc.is_alive():
                try:
                    os.kill(proc.pid, signal.SIGTERM)  # busy ones checkpoint and end KILLED; idle ones ignore it
                except ProcessLookupError:
                    pass
        ex.shutdown(wait=True, cancel_futures=True)
        drain()
        raise
    finally:
        ex.shutdown(wait=True)
        restore()
    if any(r.outcome == "interrupted" for r in results.values()):
        raise KeyboardInterrupt  # an on_eval callback interrupted a pair in a worker
    return [results[j.index] for j in jobs if j.index in results]
