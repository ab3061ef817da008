"""Which figures a report draws, and why one is not drawn.

:func:`draw_all` returns, per figure key, either a :class:`reports.figures.Drawn` or the sentence saying why it is
left out (a quantity no run logged, one that never varies, no convergence target). ``FIGURES`` lists them in the
order of report.md: key, file name, metric, y label, title, alt text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from reports import checks, cost_figures, figures
from reports import metric_keys as K
from reports.curves import KEY_TOKENS, cpu_at, elapsed_at, tokens_at
from reports.derived import KEY_ACC, KEY_CPU, KEY_LOAD

# (key, file name, metric, y label, title); accuracy against time and tokens, the fractions and the convergence bars
# are drawn by their own functions; an accuracy's label gets its unit (figures.axis_label)
STEP_FIGURES = [
    ("accuracy_vs_step", "accuracy_vs_step", KEY_ACC, "greedy held-out accuracy", "Held-out accuracy vs step"),
    ("train_accuracy", "train_accuracy_vs_step", K.ROLLOUT_ACCURACY, "verifier accuracy of rollouts",
     "Training accuracy vs step (verifier, first round)"),
    ("reward", "reward_vs_step", K.REWARD_MEAN, "mean shaped reward",
     "Training reward vs step (as shaped by each objective)"),
    ("refill", "refill_vs_step", K.REFILL_COMPLETIONS, "completions",
     "Refill-round completions per step (dynamic sampling)"),
    ("entropy", "entropy_vs_step", K.ENTROPY_MEAN, "mean token entropy (nats)", "Rollout entropy vs step"),
    ("length", "length_vs_step", K.LENGTH_MEAN, "mean completion length (tokens)",
     "Response length vs step (first round)"),
    ("kl", "kl_vs_step", K.KL_REF, "KL to the reference (k3, per token)", "KL to the reference policy vs step"),
    ("grad_norm", "grad_norm_vs_step", K.GRAD_NORM, "gradient norm (before clipping)", "Gradient norm vs step"),
]
ALT = {"accuracy_vs_step": "held-out accuracy vs step", "accuracy_vs_time": "accuracy vs wall-clock time",
       "accuracy_vs_cpu": "accuracy vs CPU seconds", "accuracy_vs_tokens": "accuracy vs generated tokens",
       "train_accuracy": "training verifier accuracy vs step",
       "reward": "shaped reward vs step", "refill": "refill-round completions vs step", "entropy": "entropy vs step",
       "length": "response length vs step", "kl": "KL to the reference vs step", "grad_norm": "gradient norm vs step",
       "fractions": "clip and masked fractions", "ttc": "time to convergence",
       "compute_fit": "accuracy vs sampled tokens with the sigmoid fit"}
ORDER = ["accuracy_vs_step", "accuracy_vs_time", "accuracy_vs_cpu", "accuracy_vs_tokens", "train_accuracy", "reward",
         "refill", "entropy", "length", "kl", "grad_norm", "fractions", "ttc", "compute_fit"]


def metric_file(key: str) -> str:
    """The file name of an extra ``--metrics`` figure: ``metric_`` + the key with ``/`` as ``__``."""
    from reports.paths import safe_component

    return safe_component("metric_" + key.replace("/", "__"), "--metrics")


def plotted_keys(extra: tuple[str, ...] = ()) -> list[str]:
    """Every metric a report plots (the curves export holds these)."""
    keys = [k for _, _, k, _, _ in STEP_FIGURES] + [k for k, _ in figures.FRACTION_KEYS]
    return [*keys, K.ELAPSED_S, KEY_CPU, KEY_TOKENS, *[k for k in extra if k not in keys]]


def load_label(runs) -> str:
    """The machine's load the runs trained under (mean ``sys/load_avg_1m`` of each, their range), for a wall-clock
    axis: "load 1.9" or "load 1.2-3.4"; "load not logged"."""
    loads = [float(np.mean(v)) for r in runs if (v := [x for _, x in r.series.get(KEY_LOAD, [])])]
    if not loads:
        return "load not logged"
    lo, hi = min(loads), max(loads)
    return f"load {lo:.1f}" if hi - lo < 0.05 else f"load {lo:.1f}-{hi:.1f}"


def draw_all(cmp, conv, target: float | None, target_why: str, interval: str, out_dir: Path,
             opts: figures.FigureOptions, extra: tuple[str, ...] = (), baseline: str | None = None,
             fits: dict | None = None) -> dict[str, figures.Drawn | str]:
    """Every figure of the report (key -> drawn figure, or why not); with more than ``figures.CROWDED`` objectives,
    each figure against the step also gets a panels version (``<key>:panels``) with each objective's band."""
    order = cmp.objectives
    out: dict[str, figures.Drawn | str] = {}
    crowded = len(order) > figures.CROWDED

    def reason(key: str) -> str | None:
        return None if checks.varies(cmp.runs, key) else checks.constant_reason(cmp.runs, key)

    for fig_key, name, key, ylabel, title in STEP_FIGURES:
        why = reason(key) if fig_key != "accuracy_vs_step" else None
        out[fig_key] = why or figures.series_figure(cmp.runs, key, ylabel, title, out_dir, name, order, opts)
        if crowded and not why:
            out[f"{fig_key}:panels"] = figures.panels_figure(cmp.runs, key, ylabel, title, out_dir,
                                                             f"{name}_panels", order, baseline, opts)
    if not any(r.series.get(K.ELAPSED_S) for r in cmp.runs):
        out["accuracy_vs_time"] = f"no run logged `{K.ELAPSED_S}`"
    else:
        out["accuracy_vs_time"] = figures.versus_figure(
            cmp.runs, KEY_ACC, elapsed_at, f"training wall-clock seconds (evaluation excluded; {load_label(cmp.runs)})",
            "greedy held-out accuracy", "Held-out accuracy vs wall-clock time (depends on the machine's load)",
            out_dir, "accuracy_vs_time", order, opts)
    lacking_cpu = [r.name for r in cmp.runs if not r.series.get(KEY_CPU)]
    if lacking_cpu:
        out["accuracy_vs_cpu"] = (f"{len(lacking_cpu)} run(s) did not log `{KEY_CPU}` "
                                  f"({', '.join(lacking_cpu[:3])}{', ...' if len(lacking_cpu) > 3 else ''})")
    else:
        out["accuracy_vs_cpu"] = figures.versus_figure(
            cmp.runs, KEY_ACC, cpu_at, "CPU seconds of the training process (evaluation excluded)",
            "greedy held-out accuracy", "Held-out accuracy vs CPU time", out_dir, "accuracy_vs_cpu", order, opts)
    lacking = [r.name for r in cmp.runs if tokens_at(r, max((s for s, _ in r.series.get(KEY_ACC, [])), default=0))
               is None]
    if lacking:
        out["accuracy_vs_tokens"] = (f"{len(lacking)} run(s) did not log `{KEY_TOKENS}` at every step "
                                     f"({', '.join(lacking[:3])}{', ...' if len(lacking) > 3 else ''})")
    else:
        out["accuracy_vs_tokens"] = figures.versus_figure(
            cmp.runs, KEY_ACC, tokens_at, "completion tokens sampled (cumulative)", "greedy held-out accuracy",
            "Held-out accuracy vs generated tokens", out_dir, "accuracy_vs_tokens", order, opts)
    out["fractions"] = (figures.fractions_figure(cmp.runs, out_dir, order, opts)
                        or "no clip / mask / selection fraction varies in any run")
    if target is None:
        out["ttc"] = f"no convergence target ({target_why})"
    elif not any(r["steps"] is not None and r["steps"].value is not None for r in conv):
        out["ttc"] = (f"no objective reached the convergence target {100 * target:.1f}% at every seed (a mean is given "
                      "only then; the convergence table has the per-seed counts)")
    else:
        out["ttc"] = cost_figures.ttc_figure(conv, target, interval, out_dir, order, opts)
    if fits is not None:
        if any(f.curve is not None for f in fits.values()):
            out["compute_fit"] = cost_figures.compute_fit_figure(fits, out_dir, order, opts)
        else:
            out["compute_fit"] = "no objective could be fitted (" + "; ".join(
                f"{o}: {f.why}" for o, f in fits.items()) + ")"
    for key in extra:
        out[f"metric:{key}"] = reason(key) or figures.series_figure(cmp.runs, key, key, f"{key} vs step", out_dir,
                                                                    metric_file(key), order, opts)
    return out
