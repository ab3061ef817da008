"""Figures of a comparison, drawn for print: PNG, PDF (Type 42 fonts) and SVG of each.

Every series of a report gets its style by its position in the comparison's objective order (the same in every
figure of one report): a colour from a colour-blind-safe palette (Okabe-Ito, then Paul Tol's muted colours), a marker
and a line style, so no two series of a figure share a colour (up to :data:`PALETTE`'s 13) and a grayscale print
still separates them by marker and dash. The line is the seed mean; the band is a 95% Student-t confidence interval
of that mean over seeds (``band="ci"``, the default) or the min-max over seeds (``band="minmax"``), none with one
seed. A legend that would cover data moves outside the axes. Every drawing function returns a :class:`Drawn`: the
files and the plotted numbers (``series``), which the curves export reproduces (reports/curves.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.ticker import EngFormatter, LogLocator, MaxNLocator, NullFormatter


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported at the first figure: it takes a third of a second, which every
    `bench` process (a training worker too) would pay at its start, since the CLI imports the report modules."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def styled(*args, **kwargs) -> Iterator[tuple]:
    """``pyplot.subplots(*args, **kwargs)`` drawn under the report's style (``RC``): ``(figure, axes)``."""
    plt = pyplot()
    with plt.rc_context(RC):
        yield plt.subplots(*args, **kwargs)


# Okabe & Ito (2008) without its yellow (too pale on white), then Paul Tol's "muted" scheme (paultol.eu)
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#882255", "#999933", "#332288", "#44AA99", "#AA4499", "#DDCC77"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "8"]
LINESTYLES = ["-", "--", ":", "-."]          # 13 markers x 4 dashes: every (marker, dash) pair unique up to 52
BANDS = ("ci", "minmax")
LEGEND_INSIDE_MAX = 5                        # more series than this: legend outside the axes
CROWDED = 5                                  # more series than this: bands only in the panels version of a figure

RC = {
    "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 7, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.3, "grid.linewidth": 0.5, "lines.linewidth": 1.3, "lines.markersize": 4,
    "savefig.bbox": "tight", "font.family": "DejaVu Sans",
    "pdf.fonttype": 42, "ps.fonttype": 42,   # TrueType (Type 42) fonts: venues reject Type 3
    "svg.fonttype": "path",
}
SIZE = (4.0, 2.8)  # inches: one column of a two-column paper, at a readable size
FORMATS = ("png", "pdf", "svg")

Series = Sequence[tuple[int, float]]


def style(i: int) -> dict:
    """Colour, marker and line style of the series at position ``i``."""
    return {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)],
            "linestyle": LINESTYLES[i % len(LINESTYLES)]}


@dataclass
class FigureOptions:
    titles: bool = True          # False: no title in the figure (the paper's caption says it)
    band: str = "ci"             # "ci": 95% t interval of the seed mean; "minmax": min-max over seeds

    def __post_init__(self) -> None:
        if self.band not in BANDS:
            raise ValueError(f"band {self.band!r}: expected one of {', '.join(BANDS)}")


@dataclass
class Drawn:
    """A drawn figure: its files and, per series label, the plotted x, mean, band low / high and seed count."""

    paths: list[Path]
    series: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def value_range(key: str | None) -> tuple[float | None, float | None]:
    """The values ``key`` can take: [0, 1] for accuracies, fractions and rates, [0, inf) for entropies, lengths, token
    counts, norms and times, else unbounded. A t band of two seeds can reach past them (an accuracy band below 0):
    ``seed_band`` clips the band there, the mean is never clipped."""
    if key is None:
        return None, None
    name = key.rsplit("/", 1)[-1]
    if (name in ("accuracy", "accuracy_sampled", "greedy_acc", "pass_at_1") or name.endswith(("_frac", "_rate"))
            or name.startswith(("pass_at_", "maj_at_")) or key == "rollout/accuracy"):
        return 0.0, 1.0
    if key.startswith(("rollout/entropy", "rollout/length", "time/")) or name in ("gen_tokens", "grad_norm"):
        return 0.0, None
    return None, None


def seed_band(series_per_seed: Sequence[Series], band: str = "ci", key: str | None = None):
    """Align seeds by step: (steps, mean, low, high, count) over the seeds that logged each step. ``band``: "ci" =
    mean ± t(0.975, n-1)·s/√n, "minmax" = min and max over seeds; low = high = mean where one seed logged the step.
    The band is clipped to ``value_range(key)`` (an accuracy's t band of 2 seeds often reaches below 0)."""
    from scipy import stats

    by_step: dict[int, list[float]] = {}
    for ser in series_per_seed:
        for s, v in ser:
            if v is not None and np.isfinite(v):
                by_step.setdefault(int(s), []).append(float(v))
    steps = sorted(by_step)
    mean, lo, hi, count = [], [], [], []
    for s in steps:
        v = np.array(by_step[s])
        m = float(v.mean())
        if len(v) < 2:
            low = high = m
        elif band == "minmax":
            low, high = float(v.min()), float(v.max())
        else:
            h = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
            low, high = m - h, m + h
        mean.append(m)
        lo.append(low)
        hi.append(high)
        count.append(len(v))
    floor, ceiling = value_range(key)
    lo_a = np.array(lo) if floor is None else np.maximum(np.array(lo), floor)
    hi_a = np.array(hi) if ceiling is None else np.minimum(np.array(hi), ceiling)
    return np.array(steps), np.array(mean), lo_a, hi_a, np.array(count)


def _line(ax, x, mean, lo, hi, i: int, label: str, n: int, crowded: bool = False) -> None:
    """One series with its band; ``crowded`` (more than CROWDED series in the axes): no band, since ten stacked bands
    bury the lines (each objective's band is in the figure's panels version, :func:`panels_figure`)."""
    st = style(i)
    every = max(1, len(x) // 8)  # about 8 markers per line, offset per series so markers of two lines do not stack
    ax.plot(x, mean, label=label, markevery=(i % every, every), markeredgewidth=0.6, **st)
    if n > 1 and np.any(hi > lo) and not crowded:
        ax.fill_between(x, lo, hi, color=st["color"], alpha=0.15, linewidth=0)


def _covers_data(fig, ax, leg) -> bool:
    """Whether the legend's box holds a point of a plotted line (lines densified between their vertices)."""
    fig.canvas.draw()
    box = leg.get_window_extent()
    for line in ax.get_lines():
        xy = np.asarray(line.get_xydata(), dtype=float)
        xy = xy[np.isfinite(xy).all(axis=1)]
        if len(xy) == 0:
            continue
        if len(xy) > 1:
            t = np.linspace(0, 1, 12)[:, None, None]
            xy = (xy[:-1][None] * (1 - t) + xy[1:][None] * t).reshape(-1, 2)
        pts = ax.transData.transform(xy)
        inside = (pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1) & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)
        if inside.any():
            return True
    return False


def legend(fig, ax) -> None:
    """Inside the axes where it covers no data and there are few series, else outside on the right."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if len(handles) <= LEGEND_INSIDE_MAX:
        leg = ax.legend(frameon=False, loc="best")
        if not _covers_data(fig, ax, leg):
            return
        leg.remove()
    ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def save(fig, out_dir: Path, name: str) -> list[Path]:
    paths = []
    for ext in FORMATS:
        p = out_dir / f"{name}.{ext}"
        fig.savefig(p, dpi=200 if ext == "png" else None, metadata={"Date": None} if ext == "pdf" else None)
        paths.append(p)
    pyplot().close(fig)
    return paths


def _by_objective(runs) -> dict[str, list]:
    groups: dict[str, list] = {}
    for r in runs:
        groups.setdefault(r.variant, []).append(r)
    return groups


def _record(drawn: Drawn, label: str, x, mean, lo, hi, count) -> None:
    drawn.series[label] = {"x": [float(v) for v in x], "mean": [float(v) for v in mean],
                           "low": [float(v) for v in lo], "high": [float(v) for v in hi],
                           "n": [int(v) for v in count]}


def _finish(fig, ax, title: str, opts: FigureOptions) -> None:
    if opts.titles:
        ax.set_title(title)
    legend(fig, ax)


def series_figure(runs, key: str, ylabel: str, title: str, out_dir: Path, name: str, order: Sequence[str],
                  opts: FigureOptions | None = None) -> Drawn:
    """``key`` against the training step: one line per objective (seed mean) with its band."""
    opts = opts or FigureOptions()
    drawn = Drawn([])
    with styled(figsize=SIZE) as (fig, ax):
        for obj, rs in _by_objective(runs).items():
            sers = [r.series.get(key, []) for r in rs if r.series.get(key)]
            if not sers:
                continue
            steps, mean, lo, hi, count = seed_band(sers, opts.band, key)
            _line(ax, steps, mean, lo, hi, order.index(obj), f"{obj} (n={len(sers)})", len(sers),
                  len(order) > CROWDED)
            _record(drawn, obj, steps, mean, lo, hi, count)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        _finish(fig, ax, title, opts)
        drawn.paths = save(fig, out_dir, name)
    return drawn


def panels_figure(runs, key: str, ylabel: str, title: str, out_dir: Path, name: str, order: Sequence[str],
                  reference: str | None, opts: FigureOptions | None = None, columns: int = 5) -> Drawn:
    """Small multiples of ``key`` against the step: one panel per objective (its seed mean and band, in its style)
    with the ``reference`` objective's seed mean in grey in every other panel; shared axes."""
    opts = opts or FigureOptions()
    groups = _by_objective(runs)
    objs = [o for o in order if any(r.series.get(key) for r in groups.get(o, []))]
    drawn = Drawn([])
    ref = None
    if reference in objs:
        ref = seed_band([r.series[key] for r in groups[reference] if r.series.get(key)], opts.band, key)
    rows = -(-len(objs) // columns)
    size = (1.6 * columns, 1.35 * rows + 0.3)
    with styled(rows, columns, figsize=size, sharex=True, sharey=True, squeeze=False) as (fig, axes):
        for ax, obj in zip(axes.flat, objs):
            sers = [r.series[key] for r in groups[obj] if r.series.get(key)]
            steps, mean, lo, hi, count = seed_band(sers, opts.band, key)
            if ref is not None and obj != reference:
                ax.plot(ref[0], ref[1], color="#999999", linewidth=0.9, label=reference)
            _line(ax, steps, mean, lo, hi, order.index(obj), obj, len(sers))
            _record(drawn, obj, steps, mean, lo, hi, count)
            ax.set_title(obj, fontsize=6.5, pad=2)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
        for ax in list(axes.flat)[len(objs):]:
            ax.set_visible(False)
        fig.supxlabel("training step", fontsize=8)
        fig.supylabel(ylabel, fontsize=8)
        if opts.titles:
            fig.suptitle(f"{title}" + (f" (grey: {reference})" if ref is not None else ""), fontsize=9)
        fig.tight_layout()
        drawn.paths = save(fig, out_dir, name)
    return drawn


def versus_figure(runs, key: str, x_of: Callable[[object, int], float | None], xlabel: str, ylabel: str,
                  title: str, out_dir: Path, name: str, order: Sequence[str],
                  opts: FigureOptions | None = None) -> Drawn:
    """``key`` against another per-step quantity ``x_of(run, step)`` (wall-clock seconds, generated tokens): the
    seed mean of ``key`` at each logged step, placed at the seed mean of x there (steps where a seed has no x are
    left out)."""
    opts = opts or FigureOptions()
    drawn = Drawn([])
    with styled(figsize=SIZE) as (fig, ax):
        for obj, rs in _by_objective(runs).items():
            rs = [r for r in rs if r.series.get(key)]
            if not rs:
                continue
            steps, mean, lo, hi, count = seed_band([r.series[key] for r in rs], opts.band, key)
            xs = []
            for s in steps:
                v = [x_of(r, int(s)) for r in rs if any(st == s for st, _ in r.series[key])]
                xs.append(np.mean(v) if v and all(x is not None for x in v) else np.nan)
            xs = np.array(xs, dtype=float)
            ok = np.isfinite(xs)
            if not ok.any():
                continue
            _line(ax, xs[ok], mean[ok], lo[ok], hi[ok], order.index(obj), f"{obj} (n={len(rs)})", len(rs),
                  len(order) > CROWDED)
            _record(drawn, obj, xs[ok], mean[ok], lo[ok], hi[ok], count[ok])
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 20k tokens, 1.5k seconds
        ax.set_ylabel(ylabel)
        _finish(fig, ax, title, opts)
        drawn.paths = save(fig, out_dir, name)
    return drawn


FRACTION_KEYS = [("objective/clip_frac_low", "clipped (low side)"), ("objective/clip_frac_high", "clipped (high side)"),
                 ("objective/masked_frac", "KL-masked tokens (TEPO)"),
                 ("objective/detached_frac", "detached tokens (clip_cov)"),
                 ("objective/selected_frac", "selected tokens (kl_cov, forking)")]


def fraction_panels(runs) -> list[tuple[str, str]]:
    """The fraction panels worth drawing: quantities that vary (an all-zero panel says nothing)."""
    from reports.checks import varies

    return [(k, t) for k, t in FRACTION_KEYS if varies(runs, k)]


def fractions_figure(runs, out_dir: Path, order: Sequence[str], opts: FigureOptions | None = None,
                     name: str = "clip_masked_fractions") -> Drawn | None:
    """One panel per varying fraction, one legend for all panels (outside, on the right)."""
    opts = opts or FigureOptions()
    panels = fraction_panels(runs)
    if not panels:
        return None
    drawn = Drawn([])
    with styled(1, len(panels), figsize=(SIZE[0] * 0.8 * len(panels), SIZE[1]), squeeze=False) as (fig, axes):
        handles: dict[str, object] = {}
        for ax, (key, title) in zip(axes[0], panels):
            for obj, rs in _by_objective(runs).items():
                sers = [r.series.get(key, []) for r in rs if r.series.get(key)]
                if sers:
                    steps, mean, lo, hi, count = seed_band(sers, opts.band, key)
                    _line(ax, steps, mean, lo, hi, order.index(obj), f"{obj} (n={len(sers)})", len(sers),
                          len(order) > CROWDED)
                    _record(drawn, f"{key}:{obj}", steps, mean, lo, hi, count)
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
            if opts.titles:
                ax.set_title(title)
            else:
                ax.set_ylabel(title)
            ax.set_xlabel("training step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylim(bottom=0)
        axes[0][0].set_ylabel("fraction of tokens" if opts.titles else f"fraction: {panels[0][1]}")
        fig.tight_layout()
        fig.legend(list(handles.values()), list(handles), frameon=False, loc="upper left",
                   bbox_to_anchor=(1.0, 0.95))
        drawn.paths = save(fig, out_dir, name)
    return drawn


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
            for x, r in zip(xs, conv_rows):
                e = r[unit]
                i = order.index(r["objective"])
                st = style(i)
                if e is None or e.value is None:
                    text = (f"not reached\n({r['n'] - r['reached']}/{r['n']} seeds)" if e is None
                            else "not logged" if e.why.startswith("not logged") else "n/a")
                    ax.text(x, 0.04, text, ha="center", va="bottom", fontsize=6.5, color=st["color"],
                            rotation=90 if len(conv_rows) > 6 else 0, transform=ax.get_xaxis_transform())
                    continue
                lo, hi = (e.low, e.high) if e.has_interval else (e.value, e.value)
                seeds = [v for v in r[f"{unit}_per_seed"] if v is not None and v > 0]
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
            ax.set_xlim(-0.6, len(conv_rows) - 0.4)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_num(v)))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylabel(f"{label} (log scale)")
            ax.grid(axis="x", visible=False)
        if opts.titles:
            fig.suptitle(f"Time to reach {100 * target:.1f}% held-out accuracy (smoothed; {interval})\ngeometric mean "
                         f"over seeds with its 95% t interval on the log scale; open markers: seeds", fontsize=9)
        fig.tight_layout()
        drawn.paths = save(fig, out_dir, name)
    return drawn


def compute_fit_figure(fits: dict, out_dir: Path, order: Sequence[str], opts: FigureOptions | None = None,
                       name: str = "compute_fit") -> Drawn:
    """Held-out accuracy against the completion tokens sampled (log x): every seed's evaluations after step 0 as
    points and the objective's fitted sigmoid (``reports.fit``) as a line, in the objective's style; its ceiling A as
    a dotted line (up to ``CROWDED`` objectives). An objective without a fit shows its points only, the legend says
    why."""
    opts = opts or FigureOptions()
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
            r = np.array([p[1] for p in f.points])
            ax.scatter(c, r, s=10, marker=st["marker"], facecolors="none", edgecolors=st["color"], linewidths=0.7,
                       alpha=0.8)
            drawn.series[f"points:{obj}"] = {"x": c.tolist(), "mean": r.tolist(), "low": r.tolist(),
                                             "high": r.tolist(), "n": [f.seeds] * len(c)}
            label = f"{obj}: no fit" if f.curve is None else f"{obj}: A={f.curve.a:.2f}, B={f.curve.b:.2f}"
            ax.plot([], [], color=st["color"], marker=st["marker"], markerfacecolor="none", label=label,
                    linestyle="none" if f.curve is None else st["linestyle"])  # (the legend's key: points and line)
            if f.curve is None:
                continue
            y = f.curve(grid)
            ax.plot(grid, y, color=st["color"], linestyle=st["linestyle"])  # (no markers: the points are the data)
            if len(fits) <= CROWDED:
                ax.axhline(f.curve.a, color=st["color"], linestyle=":", linewidth=0.7, alpha=0.8)
            drawn.series[f"fit:{obj}"] = {"x": grid.tolist(), "mean": y.tolist(), "low": y.tolist(),
                                          "high": y.tolist(), "n": [f.seeds] * len(grid)}
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("completion tokens sampled (cumulative, log scale)")
        ax.set_ylabel("held-out accuracy (greedy)")
        _finish(fig, ax, "Accuracy vs sampled tokens: sigmoid fit per objective (ScaleRL); dotted: ceiling A", opts)
        drawn.paths = save(fig, out_dir, name)
    return drawn


def fmt_num(x: float) -> str:
    """A figure's number: 0.0007, 0.069, 12.3, 456, 15.3k, 2.4M."""
    if abs(x) >= 1e4:
        return EngFormatter(places=1, sep="")(x).replace(".0", "")
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}".replace(".0", "") if abs(x) >= 1 else f"{x:.2g}"
