"""Human-readable descriptions of registered objectives, generated from the registry (CLI and docs share them)."""

from __future__ import annotations

import dataclasses

from .registry import default_config, get_objective, get_spec, list_objectives


def field_rows(name: str) -> list[dict]:
    """One row per config field of a registered objective: name, default, doc, source, search range (without the
    fields of an advantage estimator it does not select: GDPO's weights)."""
    spec = get_spec(name)
    cfg = default_config(name)
    parent = default_config(spec.base) if spec.base else None
    rows = []
    for f in dataclasses.fields(cfg):
        if f.metadata.get("estimator") not in (None, cfg.advantage_estimator):  # another estimator's field
            continue
        value = getattr(cfg, f.name)
        if parent is not None and getattr(parent, f.name) != value:
            source = f"ablation of {spec.base}"
        elif f.name in spec.defaults and spec.base is None:
            source = spec.paper
        else:
            source = f.metadata.get("paper") or ""
        rows.append({"field": f.name, "default": value, "doc": f.metadata.get("doc", ""), "source": source,
                     "search": f.metadata.get("search")})
    return rows


def zero_advantage_text(name: str) -> str:
    """Whether the update skips the forward / backward of this objective's sequences with Â = 0, and why not."""
    terms = get_objective(name).zero_advantage_terms()
    if not terms:
        return "skipped in the update (no term gives them gradient; they still count in every normaliser)"
    return "forwarded: " + "; ".join(terms)


def details_text(name: str) -> str:
    spec = get_spec(name)
    lines = [f"{name}: {spec.description}", f"  paper: {spec.paper}"]
    if spec.base:
        lines.append(f"  ablation of: {spec.base}")
    lines.append(f"  objective class: {spec.objective_class.__name__} (config {spec.config_class.__name__})")
    lines.append(f"  zero-advantage sequences: {zero_advantage_text(name)}")
    lines.append("  fields:")
    width = max(len(r["field"]) for r in field_rows(name))
    for r in field_rows(name):
        search = ""
        if r["search"]:
            lo, hi, log = r["search"]
            search = f"  [search {lo}..{hi}{' log' if log else ''}]"
        src = f" ({r['source']})" if r["source"] else ""
        lines.append(f"    {r['field']:<{width}} = {r['default']!r:<22} {r['doc']}{src}{search}")
    return "\n".join(lines)


def defaults_markdown() -> str:
    """The defaults table of docs/objectives.md (a test checks the doc holds exactly this)."""
    out = []
    for name in list_objectives():
        spec = get_spec(name)
        out.append(f"### `{name}`\n\n{spec.description} Source: {spec.paper}."
                   + (f" Ablation of `{spec.base}`." if spec.base else "")
                   + f" Zero-advantage sequences: {zero_advantage_text(name)}.\n")
        out.append("| field | default | meaning | source | search range |")
        out.append("|---|---|---|---|---|")
        for r in field_rows(name):
            search = ""
            if r["search"]:
                lo, hi, log = r["search"]
                search = f"{lo} .. {hi}" + (" (log)" if log else "")
            out.append(f"| `{r['field']}` | `{r['default']!r}` | {r['doc']} | {r['source']} | {search} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
