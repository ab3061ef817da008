"""Figures of a comparison, drawn for print: PNG, PDF (Type 42 fonts) and SVG of each.

Every series of a report gets its style by its position in the comparison's objective order (the same in every
figure of one report): a colour from a colour-blind-safe palette (Okabe-Ito, then Paul Tol's muted colours), a marker
and a line style, so no two series of a figure share a colour (up to :data:`PALETTE`'s 13) and a grayscale print
still separates them by marker and dash. The line is the seed mean; the band is a 95% Student-t confidence interval
of that mean over seeds (``band="ci"``, the default) or the min-max over seeds (``band="minmax"``), none with one
seed, cut where it passes the values the metric can take (``reports.metric_keys.domain``: no band below 0 for a
KL or a count, none above 100% for an accuracy), and the legend then says so ("band cut at 0"). Accuracies are shown
in the tables' unit (``FigureOptions.units``: percent unless ``--fractions``). A legend that would cover data moves
outside the axes. Every drawing function returns a :class:`Drawn`: the files and the plotted numbers (``series``),
which the curves export reproduces (reports/curves.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
from matplotlib.ticker import EngFormatter, MaxNLocator

from reports.metric_keys import domain
from reports.tables import Units


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
#: the formats written when none is asked for: $POBENCH_FIGURE_FORMATS (e.g. ``png``: a report in a third of the
#: time, PNG only), else all of FORMATS
FORMATS_ENV = "POBENCH_FIGURE_FORMATS"


def figure_formats(spec: str | Sequence[str] | None = None) -> tuple[str, ...]:
    """The figure formats of ``spec`` (``"png,pdf"`` or a sequence; None: ``$POBENCH_FIGURE_FORMATS``, else all):
    a subset of FORMATS that holds ``png`` (report.md shows the PNG), in FORMATS' order; ValueError naming the
    choices otherwise."""
    import os

    where = "--formats"
    if spec is None:
        spec, where = os.environ.get(FORMATS_ENV) or ",".join(FORMATS), FORMATS_ENV
    names = [x.strip().lower() for x in (spec.split(",") if isinstance(spec, str) else spec) if x.strip()]
    unknown = [n for n in names if n not in FORMATS]
    if unknown or "png" not in names:
        raise ValueError(f"{where}={','.join(names) or repr(spec)}: give formats among {', '.join(FORMATS)}, with png "
                         "(the report shows the PNG), e.g. png or png,pdf,svg")
    return tuple(f for f in FORMATS if f in names)

Series = Sequence[tuple[int, float]]


def style(i: int) -> dict:
    """Colour, marker and line style of the series at position ``i``."""
    return {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)],
            "linestyle": LINESTYLES[i % len(LINESTYLES)]}


@dataclass
class FigureOptions:
    titles: bool = True          # False: no title in the figure (the paper's caption says it)
    band: str = "ci"             # "ci": 95% t interval of the seed mean; "minmax": min-max over seeds
    units: Units = field(default_factory=Units)  # accuracies in percent (the tables' unit), or fractions
    formats: tuple[str, ...] = field(default_factory=figure_formats)  # --formats: the files of each figure

    def __post_init__(self) -> None:
        self.formats = figure_formats(self.formats)
        if self.band not in BANDS:
            raise ValueError(f"band {self.band!r}: expected one of {', '.join(BANDS)}")


@dataclass
class Drawn:
    """A drawn figure: its files; per series label, the plotted x, mean, band low / high and seed count; and what its
    legend says of bands cut at the metric's bounds ("" when none was)."""

    paths: list[Path]
    series: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    note: str = ""


class Band(NamedTuple):
    """A series' seed mean and band per step (values as shown: accuracies in the report's unit)."""

    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: np.ndarray            # seeds that logged each step
    cut: tuple[float, ...]   # the bounds of the metric the band was cut at (as shown); () when it stayed inside


def bounds(key: str | None, units: Units | None = None) -> tuple[float | None, float | None]:
    """The values metric ``key`` can take, as shown (``reports.metric_keys.domain``: an accuracy's [0, 1] is [0, 100]
    in percent, the default units); (None, None) for no key."""
    if key is None:
        return None, None
    units = units or Units()
    d, f = domain(key), units.factor(key)
    return (None if d.low is None else d.low * f), (None if d.high is None else d.high * f)


def seed_band(series_per_seed: Sequence[Series], band: str = "ci", key: str | None = None,
              units: Units | None = None) -> Band:
    """Align seeds by step: the :class:`Band` over the seeds that logged each step, values multiplied by
    ``units.factor(key)`` (accuracies in percent by default). ``band``: "ci" = mean ± t(0.975, n-1)·s/√n, "minmax" =
    min and max over seeds; low = high = mean where one seed logged the step.

    A t band can pass the values the metric can take (``bounds(key)``: the band of two seeds at accuracies 0 and 0.25
    reaches −1.5; a KL near 0 gets a band below 0). It is cut there, and ``cut`` says where: the mean can only lie
    within those values, so the cut interval is still a 95% confidence interval of it (it keeps every mean the t
    interval keeps that is possible at all). The figure says so in its legend (:func:`cut_note`). The mean is never
    moved; a min-max band never passes the values logged."""
    from scipy import stats

    units = units or Units()
    f = 1.0 if key is None else units.factor(key)
    by_step: dict[int, list[float]] = {}
    for ser in series_per_seed:
        for s, v in ser:
            if v is not None and np.isfinite(v):
                by_step.setdefault(int(s), []).append(float(v) * f)
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
    floor, ceiling = bounds(key, units)
    lo_a, hi_a, cut = np.array(lo), np.array(hi), []
    if floor is not None and np.any(lo_a < floor - 1e-12):
        cut.append(floor)
    if ceiling is not None and np.any(hi_a > ceiling + 1e-12):
        cut.append(ceiling)
    lo_a = lo_a if floor is None else np.maximum(lo_a, floor)
    hi_a = hi_a if ceiling is None else np.minimum(hi_a, ceiling)
    return Band(np.array(steps), np.array(mean), lo_a, hi_a, np.array(count), tuple(cut))


def cut_note(cut: Sequence[float], key: str, units: Units | None = None) -> str:
    """The legend's words for a band cut at the metric's bounds (:func:`seed_band`): "band cut at 0", "band cut at
    0% and 100%"; "" when nothing was cut."""
    if not cut:
        return ""
    units = units or Units()
    sign = "%" if units.percent and domain(key).accuracy else ""
    return "band cut at " + " and ".join(f"{v:g}{sign}" for v in sorted(set(cut)))


def _line(ax, x, mean, lo, hi, i: int, label: str, n: int, crowded: bool = False) -> bool:
    """One series with its band; ``crowded`` (more than CROWDED series in the axes): no band, since ten stacked bands
    bury the lines (each objective's band is in the figure's panels version, :func:`panels_figure`). Returns whether
    a band was drawn."""
    st = style(i)
    every = max(1, len(x) // 8)  # about 8 markers per line, offset per series so markers of two lines do not stack
    ax.plot(x, mean, label=label, markevery=(i % every, every), markeredgewidth=0.6, **st)
    if n > 1 and np.any(hi > lo) and not crowded:
        ax.fill_between(x, lo, hi, color=st["color"], alpha=0.15, linewidth=0)
        return True
    return False


def _covers_data(fig, ax, leg) -> bool:
    """Whether the legend's box holds a point of a plotted line (lines densified between their vertices)."""
    ax.get_xlim(), ax.get_ylim()  # (the axes' limits brought up to date with the plotted data, as a draw would)
    box = leg.get_window_extent(fig.canvas.get_renderer())  # (where "best" puts it: found without a draw)
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


def legend(fig, ax, title: str = "") -> None:
    """Inside the axes where it covers no data and there are few series, else outside on the right; ``title`` above
    its entries (what a band cut at the metric's bounds is, :func:`cut_note`)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    kw = {"frameon": False, "title": title or None, "title_fontsize": RC["legend.fontsize"]}
    if len(handles) <= LEGEND_INSIDE_MAX:
        leg = ax.legend(loc="best", **kw)
        if not _covers_data(fig, ax, leg):
            return
        leg.remove()
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw)


def save(fig, out_dir: Path, name: str, formats: Sequence[str] = FORMATS) -> list[Path]:
    paths = []
    for ext in formats:
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


def _record(drawn: Drawn, label: str, b: Band, ok=slice(None), x=None) -> None:
    """Keep the plotted numbers of one series (``ok``: the steps drawn; ``x``: its x values when not the steps)."""
    x = b.steps[ok] if x is None else x
    drawn.series[label] = {"x": [float(v) for v in x], "mean": [float(v) for v in b.mean[ok]],
                           "low": [float(v) for v in b.low[ok]], "high": [float(v) for v in b.high[ok]],
                           "n": [int(v) for v in b.n[ok]]}


def finish(fig, ax, title: str, opts: FigureOptions, note: str) -> None:
    if opts.titles:
        ax.set_title(title)
    legend(fig, ax, note)


def axis_label(text: str, key: str, units: Units) -> str:
    """An axis label with the unit of an accuracy: "greedy held-out accuracy (%)"; other metrics' labels as given."""
    return f"{text} ({units.unit})" if domain(key).accuracy else text


def series_figure(runs, key: str, ylabel: str, title: str, out_dir: Path, name: str, order: Sequence[str],
                  opts: FigureOptions | None = None) -> Drawn:
    """``key`` against the training step: one line per objective (seed mean) with its band."""
    opts = opts or FigureOptions()
    drawn, cut = Drawn([]), []
    with styled(figsize=SIZE) as (fig, ax):
        for obj, rs in _by_objective(runs).items():
            sers = [r.series.get(key, []) for r in rs if r.series.get(key)]
            if not sers:
                continue
            b = seed_band(sers, opts.band, key, opts.units)
            if _line(ax, b.steps, b.mean, b.low, b.high, order.index(obj), f"{obj} (n={len(sers)})", len(sers),
                     len(order) > CROWDED):
                cut += b.cut
            _record(drawn, obj, b)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(axis_label(ylabel, key, opts.units))
        drawn.note = cut_note(cut, key, opts.units)
        finish(fig, ax, title, opts, drawn.note)
        drawn.paths = save(fig, out_dir, name, opts.formats)
    return drawn


def panels_figure(runs, key: str, ylabel: str, title: str, out_dir: Path, name: str, order: Sequence[str],
                  reference: str | None, opts: FigureOptions | None = None, columns: int = 5) -> Drawn:
    """Small multiples of ``key`` against the step: one panel per objective (its seed mean and band, in its style)
    with the ``reference`` objective's seed mean in grey in every other panel; shared axes."""
    opts = opts or FigureOptions()
    groups = _by_objective(runs)
    objs = [o for o in order if any(r.series.get(key) for r in groups.get(o, []))]
    drawn, cut = Drawn([]), []
    ref = None
    if reference in objs:
        ref = seed_band([r.series[key] for r in groups[reference] if r.series.get(key)], opts.band, key, opts.units)
    rows = -(-len(objs) // columns)
    size = (1.6 * columns, 1.35 * rows + 0.3)
    with styled(rows, columns, figsize=size, sharex=True, sharey=True, squeeze=False) as (fig, axes):
        for ax, obj in zip(axes.flat, objs):
            sers = [r.series[key] for r in groups[obj] if r.series.get(key)]
            b = seed_band(sers, opts.band, key, opts.units)
            if ref is not None and obj != reference:
                ax.plot(ref.steps, ref.mean, color="#999999", linewidth=0.9, label=reference)
            if _line(ax, b.steps, b.mean, b.low, b.high, order.index(obj), obj, len(sers)):
                cut += b.cut
            _record(drawn, obj, b)
            ax.set_title(obj, fontsize=6.5, pad=2)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
        for ax in list(axes.flat)[len(objs):]:
            ax.set_visible(False)
        fig.supxlabel("training step", fontsize=8)
        fig.supylabel(axis_label(ylabel, key, opts.units), fontsize=8)
        if opts.titles:
            fig.suptitle(f"{title}" + (f" (grey: {reference})" if ref is not None else ""), fontsize=9)
        fig.tight_layout()
        drawn.note = cut_note(cut, key, opts.units)
        if drawn.note:  # (no legend here: the note goes under the panels, on the right)
            fig.text(0.99, 0.0, drawn.note, ha="right", va="bottom", fontsize=RC["legend.fontsize"])
        drawn.paths = save(fig, out_dir, name, opts.formats)
    return drawn


def versus_figure(runs, key: str, x_of: Callable[[object, int], float | None], xlabel: str, ylabel: str,
                  title: str, out_dir: Path, name: str, order: Sequence[str],
                  opts: FigureOptions | None = None) -> Drawn:
    """``key`` against another per-step quantity ``x_of(run, step)`` (wall-clock seconds, generated tokens): the
    seed mean of ``key`` at each logged step, placed at the seed mean of x there (steps where a seed has no x are
    left out)."""
    opts = opts or FigureOptions()
    drawn, cut = Drawn([]), []
    with styled(figsize=SIZE) as (fig, ax):
        for obj, rs in _by_objective(runs).items():
            rs = [r for r in rs if r.series.get(key)]
            if not rs:
                continue
            b = seed_band([r.series[key] for r in rs], opts.band, key, opts.units)
            xs = []
            for s in b.steps:
                v = [x_of(r, int(s)) for r in rs if any(st == s for st, _ in r.series[key])]
                xs.append(np.mean(v) if v and all(x is not None for x in v) else np.nan)
            xs = np.array(xs, dtype=float)
            ok = np.isfinite(xs)
            if not ok.any():
                continue
            if _line(ax, xs[ok], b.mean[ok], b.low[ok], b.high[ok], order.index(obj), f"{obj} (n={len(rs)})",
                     len(rs), len(order) > CROWDED):
                cut += b.cut
            _record(drawn, obj, b, ok, xs[ok])
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 20k tokens, 1.5k seconds
        ax.set_ylabel(axis_label(ylabel, key, opts.units))
        drawn.note = cut_note(cut, key, opts.units)
        finish(fig, ax, title, opts, drawn.note)
        drawn.paths = save(fig, out_dir, name, opts.formats)
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
    drawn, cut = Drawn([]), []
    with styled(1, len(panels), figsize=(SIZE[0] * 0.8 * len(panels), SIZE[1]), squeeze=False) as (fig, axes):
        handles: dict[str, object] = {}
        for ax, (key, title) in zip(axes[0], panels):
            for obj, rs in _by_objective(runs).items():
                sers = [r.series.get(key, []) for r in rs if r.series.get(key)]
                if sers:
                    b = seed_band(sers, opts.band, key, opts.units)
                    if _line(ax, b.steps, b.mean, b.low, b.high, order.index(obj), f"{obj} (n={len(sers)})",
                             len(sers), len(order) > CROWDED):
                        cut += b.cut
                    _record(drawn, f"{key}:{obj}", b)
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
        drawn.note = cut_note(cut, panels[0][0], opts.units)  # (every panel a fraction: the same bounds)
        fig.legend(list(handles.values()), list(handles), frameon=False, loc="upper left",
                   bbox_to_anchor=(1.0, 0.95), title=drawn.note or None, title_fontsize=RC["legend.fontsize"])
        drawn.paths = save(fig, out_dir, name, opts.formats)
    return drawn


def fmt_num(x: float) -> str:
    """A figure's number: 0.0007, 0.069, 12.3, 456, 15.3k, 2.4M."""
    if abs(x) >= 1e4:
        return EngFormatter(places=1, sep="")(x).replace(".0", "")
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}".replace(".0", "") if abs(x) >= 1 else f"{x:.2g}"
