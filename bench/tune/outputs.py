"""The outputs of a study, written at the end of every worker's run and by `bench tune --show`.

In ``--out`` (default ``.pobench/tune/<study>/``, also logged to the study's MLflow parent run by
``bench.tune.runs.log_outputs``): ``best.yaml`` (``{algo, objective_overrides}``, accepted by ``bench run --params``),
``summary.csv`` / ``summary.md`` (one row per trial), ``importance.csv`` / ``importance.md`` (fANOVA parameter
importances as numbers, or why there are none), ``history.png``, ``importance.png``, ``contour.png`` (Optuna's
matplotlib plots; a plot that cannot be drawn yet, e.g. importances with fewer than two complete trials, is listed in
``summary.md`` with the reason), and ``confirm.md`` / ``confirm.csv`` once the study has a confirm result
(``bench.tune.confirm``). See docs/TUNING.md.

Each call writes every output whole (a temporary file renamed over it: a link the user put there is replaced, not
written through) and removes the outputs of an earlier call into the same folder that this one does not write (a
``best.yaml``, plot or confirm table of another study, or of the same study before its trials failed): a folder
never shows outputs of two different states of a study side by side.
"""

from __future__ import annotations

import csv
import io
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState
from rich.console import Console
from rich.table import Table

from bench.tune.confirm import write_confirm
from bench.tune.storage import DEFAULT_DIR, default_storage_url, open_storage, redact
from reports.edits import record_written
from reports.paths import replace_file, under

#: every file ``write_outputs`` may write into a study's output folder (the confirm tables included)
OUTPUT_NAMES = ("best.yaml", "summary.csv", "summary.md", "importance.csv", "importance.md", "history.png",
                "importance.png", "contour.png", "confirm.md", "confirm.csv")

# what fANOVA importance can and cannot say: importance.md and docs/TUNING.md
IMPORTANCE_MEANING = (
    "fANOVA fits a random forest to the complete trials' values as a function of their parameters and splits the "
    "variance of its prediction over the searched ranges: `variance fraction` is the share of that variance a "
    "parameter explains alone (its main effect; the rest of 1 is interactions), `importance` the same numbers scaled "
    "to sum to 1 (what importance.png shows). It says how much each parameter's variation explains the variation of "
    "the score among the trials sampled; it does not say whether the best setting beats the default (the confirm "
    "step, `--confirm-seeds`, measures that on fresh seeds), and with few trials or noisy trial values (few seeds) "
    "the forest may credit noise to a parameter.")


def study_dir(root: str | Path, study: str) -> Path:
    """A study's output folder under ``root`` (``.pobench/tune``), the name made safe."""
    return under(root, study, "--study")


def show(study_name: str | None, storage_url: str | None = None, out: Path | None = None) -> Path:
    """`bench tune --show`: print the leaderboard of an existing study and write its outputs (to ``out``, default
    ``.pobench/tune/<study>``); ValueError listing the studies of the storage when ``study_name`` is not one."""
    url = storage_url or default_storage_url()
    db = url[len("sqlite:///"):] if url.startswith("sqlite:///") else None
    if db is not None and not Path(db).exists():  # (only reading: no storage is created where there was none)
        raise ValueError(f"--show: no Optuna storage at {db}: nothing to show; give --storage of the study's storage")
    storage = open_storage(url)
    names = optuna.study.get_all_study_names(storage)
    if not study_name or study_name not in names:
        raise ValueError(f"--show needs --study NAME of an existing study; studies in {redact(url)}: "
                         f"{', '.join(names) or '(none)'}")
    study = optuna.load_study(study_name=study_name, storage=storage)
    print_leaderboard(study)
    out = out or study_dir(DEFAULT_DIR, study_name)
    write_outputs(study, out)
    return out


def leaderboard(study: Any) -> list[dict[str, Any]]:
    """One row per trial: finished trials best first, then the others by number."""
    sign = -1.0 if study.direction.name == "MAXIMIZE" else 1.0
    rows = []
    for t in study.get_trials(deepcopy=False):
        dur = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start \
            else None
        last = max(t.intermediate_values) if t.intermediate_values else None
        rows.append({"trial": t.number, "state": t.state.name, "value": t.value,
                     "last_report": None if last is None else t.intermediate_values[last],
                     "duration_s": None if dur is None else round(dur, 1),
                     "retry_of": t.system_attrs.get("failed_trial"),
                     "mlflow_run": t.user_attrs.get("mlflow_run_id"), **{f"p.{k}": v for k, v in t.params.items()}})
    complete = sorted((r for r in rows if r["state"] == TrialState.COMPLETE.name), key=lambda r: sign * r["value"])
    return complete + [r for r in rows if r["state"] != TrialState.COMPLETE.name]


def print_leaderboard(study: Any) -> None:
    rows = leaderboard(study)
    params = sorted({k for r in rows for k in r if k.startswith("p.")})
    metric = study.user_attrs.get("metric", "")
    table = Table(title=f"study {study.study_name} ({study.direction.name.lower()} {metric})")
    for col in ["trial", "state", "value", "last_report", "duration_s", *[p[2:] for p in params]]:
        table.add_column(col, justify="right" if col not in ("state",) else "left")
    for r in rows:
        table.add_row(*[_fmt(r.get(c)) for c in ["trial", "state", "value", "last_report", "duration_s", *params]])
    Console(width=max(120, 70 + 16 * len(params))).print(table)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def best_params_yaml(study: Any) -> str:
    """``{algo, objective_overrides}`` of the best trial, the format `bench run --params` reads."""
    best = study.best_trial  # ValueError when no trial completed
    algo = study.user_attrs.get("algo")
    if not algo:
        raise ValueError(f"study {study.study_name!r} was not created by `bench tune` (no algo attribute)")
    head = (f"# best trial {best.number} of study {study.study_name}: {study.user_attrs.get('metric', 'value')} = "
            f"{best.value:.6g} (seeds [{study.user_attrs.get('seeds', '?')}], {study.user_attrs.get('steps', '?')} "
            f"training steps)\n# use: bench run --algos {algo} --params best.yaml\n")
    return head + yaml.safe_dump({"algo": algo, "objective_overrides": dict(best.params)}, sort_keys=False)


def write_outputs(study: Any, out: Path) -> dict[str, Path]:
    """best.yaml, summary.csv, summary.md and the PNG plots; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    notes: list[str] = []
    rows = leaderboard(study)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=cols)
    w.writeheader()
    w.writerows(rows)
    paths["summary.csv"] = replace_file(out / "summary.csv", text.getvalue())
    imp = importances(study)
    paths.update(write_importance(study, imp, out))
    try:
        paths["best.yaml"] = replace_file(out / "best.yaml", best_params_yaml(study))
    except ValueError as e:
        notes.append(f"best.yaml not written: {e}")
    from optuna.visualization import matplotlib as ovm  # (matplotlib: only when a study's outputs are drawn)

    top = _top_params(study, imp)
    plots = {"history.png": lambda: ovm.plot_optimization_history(study),
             "importance.png": lambda: ovm.plot_param_importances(study, evaluator=_evaluator()),
             "contour.png": lambda: ovm.plot_contour(study, params=top)}
    for name, make in plots.items():
        if name == "contour.png" and len(top) < 2:
            notes.append("contour.png not drawn: it needs two searched parameters and two complete trials")
            continue
        if name == "importance.png" and imp.reason:  # (Optuna would draw equal bars, or one bar of 1)
            notes.append(f"importance.png not drawn: {imp.reason}")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = make()
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
            fig.set_size_inches(max(fig.get_size_inches()[0], 7), max(fig.get_size_inches()[1], 5))
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
            plt.close(fig)
            paths[name] = replace_file(out / name, png.getvalue())
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            notes.append(f"{name} not drawn: {e}")
        plt.close("all")
    md = [f"# Study `{study.study_name}`", "",
          f"objective `{study.user_attrs.get('algo', '?')}`, metric `{study.user_attrs.get('metric', '?')}` "
          f"({study.direction.name.lower()}); seeds [{study.user_attrs.get('seeds', '?')}]; "
          f"{study.user_attrs.get('steps', '?')} training steps per run", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    md += ["", *[f"- {n}" for n in notes]]
    paths["summary.md"] = replace_file(out / "summary.md", "\n".join(md) + "\n")
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    paths.update(write_confirm(study, out))
    drop_earlier_outputs(out, set(paths))
    record_written(out, paths.values())  # (a later edit of one is told, not replaced: reports.edits, H14)
    return paths


def drop_earlier_outputs(out: Path, written: set[str]) -> None:
    """Remove the outputs (``OUTPUT_NAMES``) an earlier call left in ``out`` that this one did not write: a stale
    best.yaml beside a summary that no longer has a best trial would be read as this study's. (The folder is
    pobench's: ``--out`` is checked, the default is under ``.pobench/``.) A link is removed, never followed."""
    for name in set(OUTPUT_NAMES) - written:
        path = out / name
        if path.is_symlink() or path.is_file():
            path.unlink()


@dataclass(frozen=True)
class Importance:
    """The fANOVA parameter importances of a study's complete trials (``_evaluator``, as importance.png): each
    parameter's share of the variance of the trial values as the forest models them (``variance``: main effects;
    ``normalized``: the same scaled to sum to 1, Optuna's ``get_param_importances``), highest first; ``reason`` says
    why there are none."""

    n_complete: int
    normalized: dict[str, float] = field(default_factory=dict)
    variance: dict[str, float] = field(default_factory=dict)
    reason: str = ""


def importances(study: Any) -> Importance:
    """fANOVA importances of the complete trials, or the reason they cannot be computed (fewer than two complete
    trials, one parameter, every value equal)."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    n = len(complete)
    names = sorted({k for t in complete for k in t.params})
    if n < 2:
        return Importance(n, reason=f"{n} complete trial{'' if n == 1 else 's'}: importances need at least two")
    if len(names) < 2:
        return Importance(n, reason=f"one parameter searched ({', '.join(names) or 'none'}): its importance is 1 by "
                                    "construction, which says nothing about how much it matters")
    if len({t.value for t in complete}) == 1:
        return Importance(n, reason=f"all {n} complete trials have the same value ({complete[0].value:.6g}): there "
                                    "is no variation for a parameter to explain")
    from optuna.importance import get_param_importances

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (normalize=False is marked experimental)
            raw = get_param_importances(study, evaluator=_evaluator(), normalize=False)
    except (ValueError, RuntimeError, ZeroDivisionError) as e:
        return Importance(n, reason=f"fANOVA failed: {e}")
    raw = {k: float(v) for k, v in raw.items()}
    total = sum(raw.values())
    if total <= 0:
        return Importance(n, reason="fANOVA credits none of the variation to any parameter alone")
    ranked = sorted(raw, key=lambda k: -raw[k])
    # (Optuna's normalize=True divides by the same sum: the numbers importance.png shows)
    return Importance(n, {k: raw[k] / total for k in ranked}, {k: raw[k] for k in ranked})


def few_trials(n_params: int) -> int:
    """Below this many complete trials importance.md says its numbers are noise: 5 per searched parameter, at
    least 10 (a rule of thumb for a random forest on so few points, not a test)."""
    return max(10, 5 * n_params)


def write_importance(study: Any, imp: Importance, out: Path) -> dict[str, Path]:
    """``importance.csv`` (one row per parameter; only the header when there are none) and ``importance.md`` (the
    table, the trials it rests on and what it means, or why there is none)."""
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow(["parameter", "importance", "variance_fraction", "n_complete"])
    w.writerows([k, repr(v), repr(imp.variance[k]), imp.n_complete] for k, v in imp.normalized.items())
    replace_file(out / "importance.csv", text.getvalue())
    n_all = len(study.get_trials(deepcopy=False))
    md = [f"# Parameter importance (fANOVA): study `{study.study_name}`", "",
          f"Metric `{study.user_attrs.get('metric', '?')}` ({study.direction.name.lower()}); rests on "
          f"{imp.n_complete} complete trial{'' if imp.n_complete == 1 else 's'} of {n_all}.", ""]
    if imp.reason:
        md += [f"Not computed: {imp.reason}.", ""]
    else:
        if imp.n_complete < few_trials(len(imp.normalized)):
            md += [f"**Few trials:** {imp.n_complete} complete trials for {len(imp.normalized)} parameters (fewer "
                   f"than {few_trials(len(imp.normalized))}): fANOVA's forest is fitted to a handful of points and "
                   "these shares can change completely with the next trial; read them as noise. Pruned trials do "
                   "not count: `--pruner none` and more trials make them informative.", ""]
        md += ["| parameter | importance | variance fraction |", "|---|---|---|"]
        md += [f"| {k} | {v:.3f} | {imp.variance[k]:.3f} |" for k, v in imp.normalized.items()]
        md += [f"| (interactions) | | {max(0.0, 1 - sum(imp.variance.values())):.3f} |", ""]
    md += [IMPORTANCE_MEANING, ""]
    replace_file(out / "importance.md", "\n".join(md))
    return {"importance.csv": out / "importance.csv", "importance.md": out / "importance.md"}


def _evaluator() -> Any:
    """fANOVA with a fixed seed: the importance plot and the contour's choice of parameters agree. (Imported here:
    optuna.importance loads scikit-learn and SciPy, half a second of every `bench` process's start.)"""
    from optuna.importance import FanovaImportanceEvaluator

    return FanovaImportanceEvaluator(seed=0)


def _top_params(study: Any, imp: Importance) -> list[str]:
    """The two most important parameters (fANOVA) for a readable contour; [] when a contour cannot be drawn."""
    names = sorted({k for t in study.get_trials(deepcopy=False) for k in t.params})
    if len(names) < 2 or imp.n_complete < 2:
        return []
    return list(dict.fromkeys(list(imp.normalized) + names))[:2]
