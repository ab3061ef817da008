"""Figures of a comparison (PNG + PDF): seed mean per objective with a shaded min-max band over seeds.

Each objective keeps the same colour in every figure and every report (a fixed palette by objective name).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from reports import metric_keys as K
from reports.derived import value_at  # noqa: E402

# colour-blind-safe colours (Okabe-Ito first, then tab10), fixed per registered objective name
_PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000",
            "#8c564b", "#7f7f7f", "#bcbd22", "#17becf", "#9467bd", "#e377c2", "#2ca02c", "#d62728"]
_FIXED = {"grpo": 0, "dapo": 1, "tepo": 2, "gspo": 3, "dr_grpo": 4, "entropy_reg": 5, "clip_cov": 8, "kl_cov": 9,
          "forking_tokens": 7, "tepo-no-mask": 10, "tepo-mask-all": 11, "tepo-mask-adv": 12,
          "tepo-mask-entropy": 13, "tepo-token-ratio": 14, "tepo-seq-mean": 15, "tepo-likelihood-credit": 6}


def colour(objective: str) -> str:
    """The objective's colour: fixed for registered names, a stable hash of the name otherwise."""
    base = objective.split("+")[0]
    if objective in _FIXED:
        return _PALETTE[_FIXED[objective]]
    idx = int(hashlib.md5(objective.encode()).hexdigest(), 16) % len(_PALETTE)
    if base in _FIXED and objective != base:  # a tuned variant: same hue family is not guaranteed; stable though
        idx = (_FIXED[base] + 1 + idx) % len(_PALETTE)
    return _PALETTE[idx]


STYLE = {
    "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 7, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.3, "grid.linewidth": 0.5, "lines.linewidth": 1.4, "savefig.bbox": "tight",
    "font.family": "DejaVu Sans",
}
SIZE = (4.0, 2.8)  # inches: one column of a two-column paper, at a readable size


def seed_band(series_per_seed: Sequence[Sequence[tuple[int, float]]]):
    """Align seeds by step: (steps, mean, low, high, count) over the seeds that logged each step."""
    by_step: dict[int, list[float]] = {}
    for ser in series_per_seed:
        for s, v in ser:
            if np.isfinite(v):
                by_step.setdefault(int(s), []).append(float(v))
    steps = sorted(by_step)
    vals = [by_step[s] for s in steps]
    return (np.array(steps), np.array([np.mean(v) for v in vals]), np.array([min(v) for v in vals]),
            np.array([max(v) for v in vals]), np.array([len(v) for v in vals]))


def _line(ax, x, mean, lo, hi, objective: str, n: int) -> None:
    c = colour(objective)
    ax.plot(x, mean, color=c, label=f"{objective} (n={n})", marker="o" if len(x) <= 12 else None, markersize=2.5)
    if n > 1:
        ax.fill_between(x, lo, hi, color=c, alpha=0.18, linewidth=0)


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    paths = []
    for ext in ("png", "pdf"):
        p = out_dir / f"{name}.{ext}"
        fig.savefig(p, dpi=200 if ext == "png" else None)
        paths.append(p)
    plt.close(fig)
    return paths


def _by_objective(runs) -> dict[str, list]:
    groups: dict[str, list] = {}
    for r in runs:
        groups.setdefault(r.variant, []).append(r)
    return groups


def series_figure(runs, key: str, ylabel: str, title: str, out_dir: Path, name: str) -> list[Path]:
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=SIZE)
        for obj, rs in _by_objective(runs).items():
            sers = [r.series.get(key, []) for r in rs if r.series.get(key)]
            if not sers:
                continue
            steps, mean, lo, hi, _ = seed_band(sers)
            _line(ax, steps, mean, lo, hi, obj, len(sers))
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(frameon=False)
        return _save(fig, out_dir, name)


def accuracy_time_figure(runs, out_dir: Path, name: str = "accuracy_vs_time") -> list[Path]:
    """Held-out accuracy against wall-clock seconds (``time/elapsed_s`` at each evaluation step, mean over seeds)."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=SIZE)
        for obj, rs in _by_objective(runs).items():
            sers = [r.series.get(K.EVAL_ACCURACY, []) for r in rs if r.series.get(K.EVAL_ACCURACY)]
            if not sers:
                continue
            steps, mean, lo, hi, _ = seed_band(sers)
            secs = []
            for s in steps:
                ts = [0.0 if s == 0 else value_at(r.series.get(K.ELAPSED_S, []), int(s)) for r in rs]
                ts = [t for t in ts if t is not None]
                secs.append(np.mean(ts) if ts else np.nan)
            secs = np.array(secs)
            ok = np.isfinite(secs)
            _line(ax, secs[ok], mean[ok], lo[ok], hi[ok], obj, len(sers))
        ax.set_xlabel("wall-clock seconds (training, evaluation excluded)")
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.set_title("Held-out accuracy vs wall-clock time")
        ax.legend(frameon=False)
        return _save(fig, out_dir, name)


FRACTION_KEYS = [("objective/clip_frac_low", "clipped (low side)"), ("objective/clip_frac_high", "clipped (high side)"),
                 ("objective/masked_frac", "KL-masked tokens (TEPO)"),
                 ("objective/detached_frac", "detached tokens (clip_cov)"),
                 ("objective/selected_frac", "selected tokens (kl_cov, forking)")]


def fraction_panels(runs) -> list[tuple[str, str]]:
    """The fraction panels worth drawing: quantities that vary (an all-zero panel says nothing)."""
    from reports.checks import varies

    return [(k, t) for k, t in FRACTION_KEYS if varies(runs, k)]


def fractions_figure(runs, out_dir: Path, name: str = "clip_masked_fractions") -> list[Path]:
    panels = fraction_panels(runs)
    if not panels:
        return []
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(panels), figsize=(SIZE[0] * 0.8 * len(panels), SIZE[1]), squeeze=False)
        for ax, (key, title) in zip(axes[0], panels):
            for obj, rs in _by_objective(runs).items():
                sers = [r.series.get(key, []) for r in rs if r.series.get(key)]
                if sers:
                    steps, mean, lo, hi, _ = seed_band(sers)
                    _line(ax, steps, mean, lo, hi, obj, len(sers))
            ax.set_title(title)
            ax.set_xlabel("training step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylim(bottom=0)
            ax.set_ylabel("fraction of tokens")
            ax.legend(frameon=False)
        fig.tight_layout()
        return _save(fig, out_dir, name)


def ttc_figure(conv_rows: list[dict], target: float, out_dir: Path, name: str = "time_to_convergence") -> list[Path]:
    """Bars of mean time to convergence (steps and seconds) with 95% CI; objectives where a seed never reached the
    target get no bar, only the words "not reached (k/n)"."""
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(SIZE[0] * 1.6, SIZE[1]))
        for ax, (unit, label) in zip(axes, (("steps", "training steps"), ("seconds", "wall-clock seconds"))):
            xs = np.arange(len(conv_rows))
            top = max([r[f"{unit}_mean"] + (r[f"{unit}_ci"] or 0) for r in conv_rows
                       if r[f"{unit}_mean"] is not None] or [1.0])
            top = top if top > 0 else 1.0
            for x, r in zip(xs, conv_rows):
                m, h = r[f"{unit}_mean"], r[f"{unit}_ci"]
                if m is not None:
                    ax.bar(x, m, color=colour(r["objective"]), width=0.6,
                           yerr=h if h is not None else None, capsize=3, error_kw={"linewidth": 0.8})
                    ax.text(x, m + (h or 0) + 0.02 * top, fmt_num(m), ha="center", va="bottom", fontsize=6.5)
                else:
                    ax.text(x, 0.05 * top, f"not reached\n({r['n'] - r['reached']}/{r['n']} seeds)", ha="center",
                            va="bottom", fontsize=6.5, color=colour(r["objective"]))
            ax.set_xticks(xs, [r["objective"] for r in conv_rows], rotation=20 if len(conv_rows) > 3 else 0)
            ax.set_xlim(-0.6, len(conv_rows) - 0.4)
            ax.set_ylim(0, top * 1.2)
            ax.set_ylabel(label)
            ax.grid(axis="x", visible=False)
        fig.suptitle(f"Time to reach held-out accuracy {target:.3f} (smoothed); mean ± 95% CI over seeds", fontsize=9)
        fig.tight_layout()
        return _save(fig, out_dir, name)


def fmt_num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"
