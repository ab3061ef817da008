"""Read one comparison (its training runs and their metric series) from MLflow, and nothing else.

A comparison is the set of training runs (``pobench.kind=train``) that carry ``pobench.comparison=<id>`` or the
membership tag ``pobench.in.<id>=1`` (set by ``bench run`` on runs it reuses from an earlier comparison of the same
conditions). All its runs must share ``pobench.config_hash``; anything else is an error, never a mixed table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from reports import metric_keys as K
from reports.record import (  # noqa: F401  (DEFAULT_TRACKING_URI, member_tag: re-exported)
    COMPARISON,
    CONFIG_HASH,
    DEFAULT_TRACKING_URI,
    KIND,
    MEMBER_PREFIX,
    OBJECTIVE,
    OBJECTIVES,
    SEED,
    SEEDS,
    VARIANT,
    member_tag,
    open_client,
)
from reports.record import tracking_uri as resolve_tracking_uri

# series every report reads (others are ignored)
SERIES_KEYS = (
    K.EVAL_ACCURACY, K.EVAL_ACCURACY_SAMPLED,
    K.REWARD_MEAN, K.ROLLOUT_ACCURACY, K.REFILL_COMPLETIONS, K.ENTROPY_MEAN, K.ZERO_ADV_FRAC, K.LENGTH_MEAN,
    K.GEN_TOKENS,
    K.GRAD_NORM, K.KL_REF, K.ABS_LOG_RATIO,
    "objective/clip_frac_low", "objective/clip_frac_high", "objective/masked_frac", "objective/detached_frac",
    "objective/selected_frac",
    K.ELAPSED_S, K.CPU_S, K.LOAD_AVG_1M,
)


@dataclass
class RunData:
    run_id: str
    name: str
    variant: str            # the label the report groups by: the objective's name, or name + override label
    objective: str          # the registered objective's name
    seed: int
    status: str
    config_hash: str
    start_time: int
    tags: dict[str, str]
    params: dict[str, str]
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


@dataclass
class Comparison:
    experiment: str
    experiment_id: str
    comparison_id: str
    tracking_uri: str
    runs: list[RunData]                  # FINISHED runs, one per (objective, seed)
    not_finished: list[RunData]          # member runs that did not finish (reported as missing)
    missing: list[tuple[str, int]] = field(default_factory=list)
    """(objective, seed) pairs the comparison run records (``bench run``'s objectives × seeds) that have no run in the
    store at all: deleted, or never trained (reported, never silently left out)."""
    other_config: list[RunData] = field(default_factory=list)
    """Runs tagged into the comparison under another configuration than its run records (`bench train --comparison`
    before held-out round 10): left out of the tables, each named in the report's notes."""
    odd: list[str] = field(default_factory=list)
    """Notes on runs whose record does not add up (held-out round 11, H11): a run whose tags contradict its recorded
    config (left out), two runs claiming one (objective, seed) (which one is used); said in the report, never
    silently picked."""

    @property
    def objectives(self) -> list[str]:
        seen: list[str] = []
        for r in self.runs:
            if r.variant not in seen:
                seen.append(r.variant)
        return seen

    @property
    def config_hash(self) -> str:
        return self.runs[0].config_hash


def _client(uri: str):
    return open_client(uri)  # a fresh local store is created under a lock (reports/record.py)


def get_experiment(client, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ValueError(f"no MLflow experiment named {experiment!r} at {client.tracking_uri}; "
                         f"existing: {', '.join(names) or 'none'}")
    return exp


def _search(client, exp_id: str, flt: str) -> list:
    out, token = [], None
    while True:
        page = client.search_runs([exp_id], filter_string=flt, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def list_comparisons(client, exp_id: str) -> dict[str, int]:
    """Comparison ids of the experiment's training runs -> latest start time (ms) among their runs."""
    found: dict[str, int] = {}
    for r in _search(client, exp_id, "tags.`pobench.kind` = 'train'"):
        ids = {r.data.tags.get(COMPARISON)} | {
            k[len(MEMBER_PREFIX):] for k, v in r.data.tags.items() if k.startswith(MEMBER_PREFIX) and v == "1"}
        for cid in ids - {None, ""}:
            found[cid] = max(found.get(cid, 0), r.info.start_time or 0)
    return found


def _to_rundata(r) -> RunData:
    tags = dict(r.data.tags)
    name = tags.get("mlflow.runName", r.info.run_name or r.info.run_id)
    objective = tags.get(OBJECTIVE)
    if not objective:
        raise ValueError(f"run {name} ({r.info.run_id}) has no pobench.objective tag")
    try:
        seed = int(tags[SEED])
    except (KeyError, ValueError):
        raise ValueError(f"run {name} ({r.info.run_id}) has no integer pobench.seed tag") from None
    if not tags.get(CONFIG_HASH):
        raise ValueError(f"run {name} ({r.info.run_id}) has no pobench.config_hash tag: cannot check that the "
                         f"comparison's conditions are identical")
    return RunData(run_id=r.info.run_id, name=name, variant=tags.get(VARIANT) or objective, objective=objective,
                   seed=seed, status=r.info.status, config_hash=tags[CONFIG_HASH],
                   start_time=r.info.start_time or 0, tags=tags, params=dict(r.data.params))


def load_series(client, run_id: str, keys: Iterable[str] = SERIES_KEYS) -> dict[str, list[tuple[int, float]]]:
    out = {}
    for key in keys:
        hist = client.get_metric_history(run_id, key)
        if hist:
            by_step: dict[int, tuple[int, float]] = {}
            for m in hist:  # a step logged twice (a resumed run) keeps its latest value
                if m.step not in by_step or m.timestamp >= by_step[m.step][0]:
                    by_step[m.step] = (m.timestamp, m.value)
            out[key] = sorted((s, v) for s, (_, v) in by_step.items())
    return out


def load_comparison(experiment: str, comparison: str | None = None, tracking_uri: str | None = None, *,
                    objectives: Iterable[str] | None = None, seeds: Iterable[int] | None = None,
                    client=None, extra_keys: Iterable[str] = (), with_series: bool = True) -> Comparison:
    """Load a comparison's finished runs with their series (``SERIES_KEYS`` and ``extra_keys``; none when not
    ``with_series``).

    ``comparison=None`` picks the experiment's only comparison, or the most recent one (the others are named in the
    message printed by the CLI). ``objectives``/``seeds`` restrict the runs (``bench run`` reports what it ran).
    """
    uri = resolve_tracking_uri(tracking_uri)
    client = client or _client(uri)
    exp = get_experiment(client, experiment)
    comps = list_comparisons(client, exp.experiment_id)
    if not comps:
        raise ValueError(f"experiment {experiment!r} has no training runs of a comparison (runs tagged "
                         f"pobench.kind=train and pobench.comparison); run `bench run` first")
    if comparison is None:
        comparison = max(comps, key=comps.get)
    elif comparison not in comps:
        raise ValueError(f"no comparison {comparison!r} in experiment {experiment!r}; existing: "
                         f"{', '.join(sorted(comps))}")
    runs = {r.info.run_id: r for r in _search(
        client, exp.experiment_id, f"tags.`pobench.kind` = 'train' and tags.`pobench.comparison` = '{comparison}'")}
    for r in _search(client, exp.experiment_id,
                     f"tags.`pobench.kind` = 'train' and tags.`{member_tag(comparison)}` = '1'"):
        runs[r.info.run_id] = r
    members = [_to_rundata(r) for r in runs.values() if r.data.tags.get(member_tag(comparison)) != "0"]
    if objectives is not None:
        wanted = set(objectives)
        members = [m for m in members if m.variant in wanted or m.objective in wanted]
    if seeds is not None:
        wanted_s = {int(s) for s in seeds}
        members = [m for m in members if m.seed in wanted_s]

    hashes: dict[str, list[str]] = {}
    for m in members:
        hashes.setdefault(m.config_hash, []).append(m.name)
    recorded = _comparison_tags(client, exp.experiment_id, comparison)
    other_config = []
    if len(hashes) > 1 and recorded.get(CONFIG_HASH) in hashes:  # runs tagged in by `bench train --comparison`
        other_config = [m for m in members if m.config_hash != recorded[CONFIG_HASH]]  # (left out, said: H06)
        members = [m for m in members if m.config_hash == recorded[CONFIG_HASH]]
        hashes = {recorded[CONFIG_HASH]: hashes[recorded[CONFIG_HASH]]}
    if len(hashes) > 1:
        detail = "; ".join(f"{h}: {', '.join(sorted(n))}" for h, n in sorted(hashes.items()))
        raise ValueError(f"comparison {comparison!r} mixes runs with different configs (pobench.config_hash), so "
                         f"its objectives were not compared under the same conditions: {detail}")

    odd: list[str] = []
    claimed = set()  # the pairs runs with edited tags trained (their params): said as such, not as "missing"
    for m in [m for m in members if _contradiction(m)]:
        odd.append(f"Run {m.name} ({m.run_id}) {_contradiction(m)}: its tags were changed after it was trained, so "
                   f"it is left out; set its tags back to what it trained to count it.")
        seed = m.params.get("seed", "")
        claimed.add((m.tags.get(VARIANT) or m.params.get("algo") or m.objective,
                     int(seed) if seed.lstrip("-").isdigit() else m.seed))
        members.remove(m)
    finished = [m for m in members if m.status == "FINISHED"]
    not_finished = [m for m in members if m.status != "FINISHED"]
    by_key: dict[tuple[str, int], RunData] = {}
    for m in sorted(finished, key=lambda m: m.start_time):  # a pair trained twice keeps its latest run, said
        if (m.variant, m.seed) in by_key:
            old = by_key[(m.variant, m.seed)]
            odd.append(f"Runs {old.name} ({old.run_id}) and {m.name} ({m.run_id}) both claim {m.variant} seed "
                       f"{m.seed} in this comparison: the later one, {m.run_id}, is used; to use the other, set the "
                       f"tag {member_tag(comparison)}=0 on this one.")
        by_key[(m.variant, m.seed)] = m
    done = sorted(by_key.values(), key=lambda m: (m.variant, m.seed))
    not_finished = [m for m in not_finished if (m.variant, m.seed) not in by_key]
    if not done:
        raise ValueError(f"comparison {comparison!r} in experiment {experiment!r} has no finished training run "
                         f"({len(not_finished)} unfinished)")
    present = {(m.variant, m.seed) for m in members}
    missing = [p for p in _recorded_pairs(recorded) if p not in present and p not in claimed
               and (objectives is None or p[0] in wanted) and (seeds is None or p[1] in wanted_s)]
    keys = [*SERIES_KEYS, *[k for k in extra_keys if k not in SERIES_KEYS]]
    for m in done if with_series else []:
        m.series = load_series(client, m.run_id, keys)
    # objective order: as first started (the order `bench run` was given), then seeds ascending
    first = {}
    for m in sorted(done, key=lambda m: m.start_time):
        first.setdefault(m.variant, len(first))
    done.sort(key=lambda m: (first[m.variant], m.seed))
    return Comparison(experiment=experiment, experiment_id=exp.experiment_id, comparison_id=comparison,
                      tracking_uri=uri, runs=done, not_finished=not_finished, missing=missing,
                      other_config=other_config, odd=odd)


def _contradiction(m: RunData) -> str:
    """How a run's objective / seed tags contradict the config it recorded (params ``algo``, ``seed``); "" when they
    agree or it recorded none."""
    algo, seed = m.params.get("algo"), m.params.get("seed")
    if (algo is None or algo == m.objective) and (seed is None or seed == str(m.seed)):
        return ""
    return (f"is tagged {OBJECTIVE}={m.objective}, {SEED}={m.seed} but its recorded config (params) trained "
            f"{algo or m.objective} seed {seed if seed is not None else m.seed}")


def _comparison_tags(client, exp_id: str, comparison: str) -> dict[str, str]:
    """The tags of the comparison's own run (`bench run`'s); none without that run."""
    found = _search(client, exp_id, f"tags.`{KIND}` = 'comparison' and tags.`{COMPARISON}` = '{comparison}'")
    return dict(found[0].data.tags) if found else {}


def _recorded_pairs(tags: dict[str, str]) -> list[tuple[str, int]]:
    """The (objective, seed) pairs the comparison's own run records (its ``tags``), in its order; none without it."""
    objectives = [o for o in tags.get(OBJECTIVES, "").split(",") if o]
    seeds = [int(s) for s in tags.get(SEEDS, "").split(",") if s.strip().lstrip("-").isdigit()]
    return [(o, s) for o in objectives for s in seeds]
