"""Which figures a report draws, and why one is not drawn.

:func:`draw_all` returns, per figure key, either a :class:`reports.figures.Drawn` or the sentence saying why it is
left out (a quantity no run logged, one that never varies, no convergence target). ``FIGURES`` is the one table of
them, in the order of report.md (:class:`Figure`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reports import checks, cost_figures, figures
from reports import metric_keys as K
from reports.curves import KEY_TOKENS, cpu_at, elapsed_at, tokens_at
from reports.derived import KEY_ACC, KEY_CPU, KEY_LOAD


@dataclass(frozen=True)
class Figure:
    """One figure of a report, in report.md's order: its key, the alt text of its image, and for a figure of one
    metric against the step its file name, metric, y label and title (the others are drawn by their own functions:
    accuracy against time and tokens, the fractions, the convergence bars, the compute fit). An accuracy's label
    gets its unit (figures.axis_label)."""

    key: str
    alt: str
    file: str = ""
    metric: str = ""
    ylabel: str = ""
    title: str = ""


#: the one table of a report's figures, in report.md's order
FIGURES = (
    Figure("accuracy_vs_step", "held-out accuracy vs step", "accuracy_vs_step", KEY_ACC, "greedy held-out accuracy",
           "Held-out accuracy vs step"),
    Figure("accuracy_vs_time", "accuracy vs wall-clock time"),
    Figure("accuracy_vs_cpu", "accuracy vs CPU seconds"),
    Figure("accuracy_vs_tokens", "accuracy vs generated tokens"),
    Figure("train_accuracy", "training verifier accuracy vs step", "train_accuracy_vs_step", K.ROLLOUT_ACCURACY,
           "verifier accuracy of rollouts", "Training accuracy vs step (verifier, first round)"),
    Figure("reward", "shaped reward vs step", "reward_vs_step", K.REWARD_MEAN, "mean shaped reward",
           "Training reward vs step (as shaped by each objective)"),
    Figure("refill", "refill-round completions vs step", "refill_vs_step", K.REFILL_COMPLETIONS, "completions",
           "Refill-round completions per step (dynamic sampling)"),
    Figure("entropy", "entropy vs step", "entropy_vs_step", K.ENTROPY_MEAN, "mean token entropy (nats)",
           "Rollout entropy vs step"),
    Figure("length", "response length vs step", "length_vs_step", K.LENGTH_MEAN, "mean completion length (tokens)",
           "Response length vs step (first round)"),
    Figure("kl", "KL to the reference vs step", "kl_vs_step", K.KL_REF, "KL to the reference (k3, per token)",
           "KL to the reference policy vs step"),
    Figure("grad_norm", "gradient norm vs step", "grad_norm_vs_step", K.GRAD_NORM, "gradient norm (before clipping)",
           "Gradient norm vs step"),
    Figure("fractions", "clip and masked fractions"),
    Figure("ttc", "time to convergence"),
    Figure("compute_fit", "accuracy vs sampled tokens with the sigmoid fit"),
)
#: the figures of one metric against the step
STEP_FIGURES = tuple(f for f in FIGURES if f.metric)
BY_KEY = {f.key: f for f in FIGURES}


def metric_file(key: str) -> str:
    """The file name of an extra ``--metrics`` figure: ``metric_`` + the key with ``/`` as ``__``."""
    from reports.paths import safe_component

    return safe_component("metric_" + key.replace("/", "__"), "--metrics")


def plotted_keys(extra: tuple[str, ...] = ()) -> list[str]:
    """Every metric a report plots (the curves export holds these)."""
    keys = [f.metric for f in STEP_FIGURES] + [k for k, _ in figures.FRACTION_KEYS]
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

    for f in STEP_FIGURES:
        why = reason(f.metric) if f.key != "accuracy_vs_step" else None
        out[f.key] = why or figures.series_figure(cmp.runs, f.metric, f.ylabel, f.title, out_dir, f.file, order,
                                                  opts)
        if crowded and not why:
            out[f"{f.key}:panels"] = figures.panels_figure(cmp.runs, f.metric, f.ylabel, f.title, out_dir,
                                                           f"{f.file}_panels", order, baseline, opts)
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
