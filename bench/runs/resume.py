"""Safe resume: a checkpointed run continues only under the configuration it was started with.

``check`` compares the new configuration with the one the run saved (``<run>/config.yaml``, and ``<run>/inputs.json``:
the digests of its data and model, bench/runs/identity.py, and of its plugins' sources, bench/plugins.py) and refuses
every difference in one line naming each field; a larger ``steps`` (with a constant learning-rate schedule, which
does not depend on it) is the one change allowed, and ``record_extension`` records it on the run (tag
``pobench.steps_extended``, the updated ``config.yaml``).

``train_folder``: the folder of a `bench train` run, ``<output_dir>/<experiment>/<algo>-s<seed>-<key>``, where
``key`` hashes everything that must not change on resume, so two configurations never share a folder (as `bench run`'s
``<output_dir>/<experiment>/<variant>-s<seed>-<hash>``); ``preflight`` refuses, before any work, a ``--resume`` whose
folder holds no checkpoint, naming what differs from the run of the same objective and seed that does have one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from bench.runs import checkpoint, identity
from bench.runs.folders import INPUTS_FILE, RUN_CONFIG, check_config_unedited, experiment_dir, write_recorded
from bench.runs.tracking import read_run_record
from reports.paths import replace_file
from reports.record import STEPS_EXTENDED

# fields a resume may change: they locate the run or change no number of it
FREE = ("resume", "threads", "keep_checkpoints", "tags", "comparison", "output_dir", "run_name")


def saved(run_dir: Path) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(config, input digests) a run saved when it started; None for a folder without them."""
    path = Path(run_dir) / RUN_CONFIG
    if not path.is_file():
        return None
    cfg = _read(path, yaml.safe_load, yaml.YAMLError, "YAML")
    inputs_path = Path(run_dir) / INPUTS_FILE
    inputs = _read(inputs_path, json.loads, ValueError, "JSON") if inputs_path.is_file() else {}
    return cfg, inputs


def _read(path: Path, load, error: type[Exception], what: str) -> dict[str, Any]:
    """A mapping a run saved (``config.yaml``, ``inputs.json``); a damaged or empty file is one ValueError line naming
    it and what to do (held-out round 10, H08: a YAML traceback, a 40-field "None -> ..." line, a JSON error naming
    no file)."""
    fix = (f"restore it (a copy of config.yaml is among the artifacts of the run's MLflow run), or move {path.parent} "
           "away to train a new run")
    try:
        text = path.read_text()
        data = load(text)
    except (error, UnicodeDecodeError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else (f" at line {e.lineno}" if hasattr(e, "lineno")
                                                                       else "")
        raise ValueError(f"--resume: {path} is damaged (invalid {what}{where}): {fix}") from None
    if not isinstance(data, dict):
        why = "empty" if not text.strip() else f"not a mapping of fields ({type(data).__name__})"
        raise ValueError(f"--resume: {path} is damaged ({why}): {fix}")
    return data


PLUGIN_SOURCES = "plugin_sources"  # the key of inputs.json holding the plugins' identity


def plugin_sources(cfg) -> dict[str, str]:
    """``{"plugin_sources": "<file>@<digest>,..."}`` of the plugins ``cfg`` names (what the comparison hash takes of
    them: bench/plugins.py ``identity``), or nothing without plugins."""
    from bench.plugins import identity as plugins_identity  # (bench.plugins imports the registries)

    return {PLUGIN_SOURCES: ",".join(plugins_identity(cfg.plugins))} if cfg.plugins else {}


def current_inputs(cfg) -> dict[str, str]:
    """What ``inputs.json`` records of ``cfg``: its inputs' digests and its plugins' source digests."""
    return {**identity.input_digests(cfg), **plugin_sources(cfg)}


def differences(cfg, then: dict[str, Any], inputs: dict[str, str]) -> list[str]:
    """``field (saved -> new)`` for every field ``cfg`` changes against a run's saved config and inputs."""
    now = cfg.to_dict()
    out = []
    for key in sorted(set(then) | set(now)):
        if key in FREE or then.get(key) == now.get(key):
            continue
        if key == "steps" and then.get(key, 0) < now[key] and now.get("lr_schedule") == "constant":
            continue  # the one change allowed: more steps under a schedule that does not depend on them
        out.append(f"{key} ({then.get(key)!r} -> {now.get(key)!r})")
    current = current_inputs(cfg)
    for key in sorted(set(inputs) | set(current)):
        if key == PLUGIN_SOURCES:  # (a run recorded before pobench kept its plugins' digests: its tag names them)
            if key in inputs and inputs[key] != current.get(key):
                out.append(f"plugin sources ({inputs[key]} -> {current.get(key) or 'none'}: a plugin's source, a "
                           "module of yours it imports, a file it reads at import or its objectives' settings changed "
                           "since the run started; restore it to resume)")
        elif inputs and inputs.get(key) != current.get(key):
            out.append(f"inputs.{key} (the content of the run's {key.replace('_', ' ')} changed)")
    return out


def check(cfg, run_dir: Path) -> None:
    """Refuse to resume the run in ``run_dir`` with a configuration other than its own (ValueError, one line)."""
    found = saved(run_dir)
    if found is None:
        return
    diff = differences(cfg, *found)
    if not diff and found[0].get("steps") != cfg.steps:  # (record_extension rewrites config.yaml: an edit refused)
        check_config_unedited(run_dir)
    if diff:
        then_steps = found[0].get("steps")
        raise ValueError(f"--resume: {run_dir} holds a run of another configuration: {'; '.join(diff)}. Resume it "
                         f"with its own settings (only a larger --steps than {then_steps}, with a constant "
                         "--lr-schedule, may change), or train the new configuration as a new run: drop --resume "
                         "(and give another --run-name when you gave one)")


def pair_mismatch(cfg, run_dir: Path, then: dict[str, Any], diff: list[str], more: int = 0) -> str:
    """What a `bench run` pair whose folder holds a run of other settings says (held-out round 16, H21: the
    comparison made in another MLflow store was told to drop --resume and give another --run-name, flags `bench run`
    does not have): the ways `bench run` has to go on. ``more``: how many more pair folders are alike."""
    held = f"{run_dir} and {more} more pair folder(s) hold these pairs' runs" if more else \
        f"{run_dir} holds this pair's run"
    others = ("give another --output-dir for this command's runs, or pass --force to train the pairs again here "
              "(their checkpoints replaced)")
    store, them = then.get("tracking_uri"), "them" if more else "it"
    if store != cfg.tracking_uri and len(diff) == 1:
        return (f"{held} of another MLflow store ({store}; this command's is {cfg.tracking_uri}): rerun with "
                f"--tracking-uri {store} to resume {them} there, or {others}")
    own = "their" if more else "its"
    return f"{held} with other settings: {'; '.join(diff)}: rerun with {own} own settings to resume {them}, or {others}"


def record_inputs(run_dir: Path, cfg) -> Path:
    """Save the digests of ``cfg``'s inputs next to its config (what ``check`` compares on resume)."""
    path = Path(run_dir) / INPUTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(current_inputs(cfg), indent=1, sort_keys=True)
    return write_recorded(path, lambda p: replace_file(p, text))  # (no link followed; its digest recorded)


def record_extension(logger, cfg, run_dir: Path) -> None:
    """A resume with a larger ``steps``: tag ``pobench.steps_extended`` (``"40,60"``: every length the run was given)
    and rewrite ``config.yaml`` (file and artifact) with the new length."""
    found = saved(run_dir)
    if found is None or found[0].get("steps") == cfg.steps:
        return
    run = logger.client.get_run(logger.run_id)
    history = run.data.tags.get(STEPS_EXTENDED) or str(found[0].get("steps"))
    logger.set_tags({STEPS_EXTENDED: f"{history},{cfg.steps}"})
    write_recorded(Path(run_dir) / RUN_CONFIG, cfg.save)
    logger.log_artifact(Path(run_dir) / RUN_CONFIG)


# ------------------------------------------------------------------ bench train's folders
def key(cfg) -> str:
    """Six hex digits of everything a resume must not change (``differences``): the config but ``FREE``, ``steps``,
    ``algo`` and ``seed`` (in the folder name), the input digests and the plugins' source digests (an edited plugin
    trains in a new folder; a run without plugins keeps the key it had before they were covered)."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in (*FREE, "steps", "algo", "seed")}
    d["inputs"] = identity.input_digests(cfg)
    d.update(plugin_sources(cfg))
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:6]


def train_folder(cfg):
    """``cfg`` with `bench train`'s folder: ``output_dir/<experiment>``, run name ``<algo>-s<seed>-<key>`` unless
    ``--run-name`` gives one."""
    return dataclasses.replace(cfg, output_dir=str(experiment_dir(cfg.output_dir, cfg.experiment)),
                               run_name=cfg.run_name or f"{cfg.algo}-s{cfg.seed}-{key(cfg)}")


def check_resume(cfg, root: str | Path) -> None:
    """Before any work: ``check`` the run ``cfg`` resumes; a ``--resume`` with no checkpoint in its folder is refused,
    naming what differs from the newest checkpointed run of the same objective and seed under ``root`` (the
    ``--output-dir``: every experiment), unless the folder names its MLflow run (``run.json``: a run stopped before
    its first checkpoint, resumed from step 0 in that run)."""
    if not cfg.resume:
        return
    run_dir = cfg.run_dir()
    if checkpoint.latest(run_dir) is not None or read_run_record(run_dir) is not None:
        check(cfg, run_dir)
        return
    others = [d for d in Path(root).glob(f"*/{cfg.algo}-s{cfg.seed}-*") if checkpoint.latest(d) is not None]
    if not others:
        raise ValueError(f"--resume: no checkpoint in {run_dir} (nor of {cfg.algo} seed {cfg.seed} under {root}); "
                         "drop --resume to start the run")
    newest = max(others, key=lambda d: checkpoint.latest(d).stat().st_mtime)
    found = saved(newest)
    diff = differences(cfg, *found) if found else []
    what = "; ".join(diff) or "its folder"
    raise ValueError(f"--resume: no checkpoint of this configuration in {run_dir}; {newest} holds a checkpoint of "
                     f"{cfg.algo} seed {cfg.seed} with another configuration: {what}. Resume that run with its own "
                     "settings, or drop --resume to start this one")
