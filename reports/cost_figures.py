"""The figures of a comparison's cost: time to convergence in load-independent units and the compute-performance fit
(``reports.fit``), drawn with the styles and helpers of ``reports.figures`` (PNG, PDF, SVG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.ticker import EngFormatter, LogLocator, NullFormatter

from reports.figures import CROWDED, SIZE, Drawn, FigureOptions, axis_label, finish, fmt_num, save, style, styled
from reports.metric_keys import EVAL_ACCURACY

TTC_PANELS = (("steps", "training steps"), ("tokens", "completion tokens sampled"),
              ("cpu_s", "training CPU seconds"))


def ttc_figure(conv_rows: list[dict], target: float, interval: str, out_dir: Path, order: Sequence[str],
               opts: FigureOptions | None = None, name: str = "time_to_convergence") -> Drawn:
    """The time to convergence (interpolated between evaluations) in steps, sampled tokens and CPU seconds, one panel
    each on a log axis: the geometric mean over seeds (a marker in the objective's style) with its asymmetric 95%
    interval as whiskers (``reports.stats.positive_ci``: symmetric on the log axis, never below 0, never cut), and
    each seed's value as a small open marker beside it. An objective where a seed never reached the target shows
    "not reached (k/n)", one whose runs did not log the quantity "not logged". No wall-clock panel: it would show the
    machine's load (runs.csv has each run's, with the load)."""
    from matplotlib.ticker import FuncFormatter

    opts = opts or FigureOptions()
    drawn = Drawn([])
    with styled(1, len(TTC_PANELS), figsize=(SIZE[0] * 2.2, SIZE[1])) as (fig, axes):
        for ax, (unit, label) in zip(axes, TTC_PANELS):
            xs = np.arange(len(conv_rows))
            ax.set_yscale("log")
            shown: list[float] = []  # the panel's values (markers and whiskers' ends)
            for x, r in zip(xs, conv_rows):
                e = r[unit]
                i = order.index(r["objective"])
                st = style(i)
                if e is None or e.value is None:
                    text = (f"not\nreached\n({r['n'] - r['reached']}/{r['n']})" if e is None
                            else "not\nlogged" if e.why.startswith("not logged") else "n/a")
                    ax.text(x, 0.04, text, ha="center", va="bottom", fontsize=6.5, color=st["color"],
                            rotation=90 if len(conv_rows) > 8 else 0, transform=ax.get_xaxis_transform())
                    continue
                lo, hi = (e.low, e.high) if e.has_interval else (e.value, e.value)
                seeds = [v for v in r[f"{unit}_per_seed"] if v is not None and v > 0]
                shown += [*seeds, e.value, lo, hi]
                ax.plot([x + 0.18] * len(seeds), seeds, linestyle="none", marker=st["marker"], markersize=3,
                        markerfacecolor="none", markeredgecolor=st["color"], markeredgewidth=0.6)
                ax.errorbar(x, e.value, yerr=[[e.value - lo], [hi - e.value]] if e.has_interval else None,
                            color=st["color"], marker=st["marker"], markersize=5, capsize=3, elinewidth=0.9,
                            linestyle="none")
                ax.annotate(fmt_num(e.value), (x, e.value), xytext=(-5, 0), textcoords="offset points",
                            ha="right", va="center", fontsize=6.5)
                drawn.series[f"{unit}:{r['objective']}"] = {"x": [float(x)], "mean": [float(e.value)],
                                                            "low": [float(lo)], "high": [float(hi)], "n": [r["n"]]}
            ax.set_xticks(xs, [r["objective"] for r in conv_rows], rotation=35 if len(conv_rows) > 3 else 0,
                          ha="right" if len(conv_rows) > 3 else "center")
            ax.set_xlim(-0.95, len(conv_rows) - 0.4)  # (room for the first value label)
            _span_a_decade(ax, [v for v in shown if v > 0])
            # ticks at 1, 2, 5 x 10^k: a log axis spanning less than a decade still gets labelled ticks
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_num(v)))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylabel(f"{label} (log scale)")
            ax.grid(axis="x", visible=False)
        if opts.titles:
            target_text = f"{opts.units.acc(target)}{'%' if opts.units.percent else ''}"
            fig.suptitle(f"Time to reach {target_text} held-out accuracy (smoothed; {interval})\ngeometric mean "
                         f"over seeds with its 95% t interval on the log scale; open markers: seeds", fontsize=9)
        fig.tight_layout(rect=(0, 0, 1, 0.88) if opts.titles else None)
        drawn.paths = save(fig, out_dir, name, opts.formats)
    return drawn


def _span_a_decade(ax, values: list[float]) -> None:
    """A log axis showing ``values`` spans at least a decade around them. Held-out round 16 (H04): a seed's 3 steps
    and their geometric mean, 3.0000000000000018 (exp of the mean log), made matplotlib's limits 2e-15 apart: an
    empty panel, and two RuntimeWarnings of its layout (divide by zero) in every report of a 1-seed comparison."""
    if not values:
        return
    low, high = min(values), max(values)
    if high / low < 10:
        pad = (10 * low / high) ** 0.5
        ax.set_ylim(low / pad, high * pad)


def compute_fit_figure(fits: dict, out_dir: Path, order: Sequence[str], opts: FigureOptions | None = None,
                       name: str = "compute_fit") -> Drawn:
    """Held-out accuracy against the completion tokens sampled (log x): every seed's evaluations after step 0 as
    points and the objective's fitted sigmoid (``reports.fit``) as a line, in the objective's style; its ceiling A as
    a dotted line (up to ``CROWDED`` objectives). An objective without a fit shows its points only, the legend says
    why."""
    opts = opts or FigureOptions()
    scale = opts.units.factor(EVAL_ACCURACY)  # accuracies in the tables' unit
    drawn = Drawn([])
    with styled(figsize=(SIZE[0] * 1.25, SIZE[1] * 1.1)) as (fig, ax):
        lo = min((c for f in fits.values() for c, _ in f.points), default=1.0)
        hi = max((c for f in fits.values() for c, _ in f.points), default=10.0)
        grid = np.geomspace(lo, hi, 200)
        for obj, f in fits.items():
            if not f.points:
                continue
            i = order.index(obj)
            st = style(i)
            c = np.array([p[0] for p in f.points])
            r = np.array([p[1] for p in f.points]) * scale
            ax.scatter(c, r, s=10, marker=st["marker"], facecolors="none", edgecolors=st["color"], linewidths=0.7,
                       alpha=0.8)
            drawn.series[f"points:{obj}"] = {"x": c.tolist(), "mean": r.tolist(), "low": r.tolist(),
                                             "high": r.tolist(), "n": [f.seeds] * len(c)}
            label = f"{obj}: no fit" if f.curve is None else f"{obj}: A={opts.units.acc(f.curve.a)}, B={f.curve.b:.2f}"
            ax.plot([], [], color=st["color"], marker=st["marker"], markerfacecolor="none", label=label,
                    linestyle="none" if f.curve is None else st["linestyle"])  # (the legend's key: points and line)
            if f.curve is None:
                continue
            y = f.curve(grid) * scale
            ax.plot(grid, y, color=st["color"], linestyle=st["linestyle"])  # (no markers: the points are the data)
            if len(fits) <= CROWDED:
                ax.axhline(f.curve.a * scale, color=st["color"], linestyle=":", linewidth=0.7, alpha=0.8)
            drawn.series[f"fit:{obj}"] = {"x": grid.tolist(), "mean": y.tolist(), "low": y.tolist(),
                                          "high": y.tolist(), "n": [f.seeds] * len(grid)}
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("completion tokens sampled (cumulative, log scale)")
        ax.set_ylabel(axis_label("greedy held-out accuracy", EVAL_ACCURACY, opts.units))
        finish(fig, ax, "Accuracy vs sampled tokens: sigmoid fit per objective (ScaleRL); dotted: ceiling A", opts, "")
        drawn.paths = save(fig, out_dir, name, opts.formats)
    return drawn
