"""Held-out round 16 (issue 29): two stale results silently reused: a comparison's pair trained while its plugin
imported a helper by a computed name, the helper edited since (H09); a benchmark evaluation of a data file whose
reference answers were rewritten since (H10). Neither is reused now."""

from __future__ import annotations

import json
import re

from tests.bench.test_held_out_round12 import _comparison_with_a_final_model
from tests.conftest import fresh_store


# ------------------------------------------------------------------ H10: a rewritten benchmark file
def test_a_rewritten_benchmark_file_is_evaluated_again_and_the_report_takes_the_new_result(tmp_path, bench_here):
    """H10: `bench eval --comparison ID --benchmarks gsm8k --data gsm8k=d.jsonl --limit 4`, then every reference
    answer of d.jsonl rewritten (`#### 0` -> `#### 90`), the same command: `1 stored, 0 to evaluate`, the results
    against the old answers reused. Now the eval key covers the problems by content: the rewritten file is evaluated
    again (a new key; the old evaluation stays in the store), the same file once more is reused, and the report's
    benchmark table takes the newest."""
    from mlflow import MlflowClient

    from reports.evals import chosen, load_evals
    from reports.load import load_comparison

    uri = fresh_store(tmp_path)
    rid = _comparison_with_a_final_model(tmp_path, uri)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i}+{i}?", "answer": f"{i}+{i}={2 * i}\n#### 0"}) + "\n"
                            for i in range(4)))
    args = ["eval", "--comparison", "c1", "--benchmarks", "gsm8k", "--data", "gsm8k=d.jsonl", "--limit", "4",
            "--tracking-uri", uri, "--temperature", "0", "--max-new-tokens", "2"]
    rc, _, err = bench_here(args, tmp_path)
    assert rc == 0 and "1 runs x 1 benchmarks; 0 stored, 1 to evaluate" in err, err[-3000:]

    data.write_text(data.read_text().replace("#### 0", "#### 90"))
    rc, _, err = bench_here(args, tmp_path)
    assert rc == 0 and "1 runs x 1 benchmarks; 0 stored, 1 to evaluate" in err, err[-3000:]
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.get_run(rid).info.experiment_id
    evals = client.search_runs([exp_id], "tags.`pobench.kind` = 'eval'", order_by=["attributes.start_time ASC"])
    assert len(evals) == 2 and len({e.data.tags["pobench.eval_key"] for e in evals}) == 2  # (the old one kept)

    rc, _, err = bench_here(args, tmp_path)  # the same file again: reused
    assert rc == 0 and "1 stored, 0 to evaluate" in err, err[-3000:]
    cmp = load_comparison("pobench", "c1", uri, client=client, with_series=False)
    assert chosen(load_evals(client, cmp))["gsm8k"][rid].run_id == evals[-1].info.run_id


# ------------------------------------------------------------------ H09: a helper imported at call time, edited
DYN_PLUGIN = '''
import importlib, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from algorithms import register, register_advantage


def kp(rewards):
    h = importlib.import_module("dyn" + "helper16")
    return h.scale * (rewards - rewards.mean(dim=1, keepdim=True))


register_advantage("adv-dyn16", kp, description="scaled by a helper imported at call time")
register("grpo-dyn16", base="grpo", description="grpo with that estimator", advantage_estimator="adv-dyn16")
'''


def test_a_helper_a_plugin_imports_while_training_edited_since_is_not_reused_silently(tmp_path, bench_here):
    """H09: a plugin whose advantage estimator imports its helper at call time by a computed name
    (`importlib.import_module("dyn" + "helper")`); `bench run --plugin ../pl/p_dyn.py --algos grpo-dyn ...`, then the
    helper edited (`scale = 1.0` -> `-5.0`), the same command: `grpo-dyn seed 0: reused`, the result of the old helper
    under the same comparison id. Now each run records the modules of the user's its plugin's code imported while it
    trained (tag `pobench.run_imports`), and a changed one refuses the reuse in one line before any work, exit 2,
    naming the module and what to do; --force trains it again, with the edited helper, which is then reused."""
    import sys

    from mlflow import MlflowClient

    from algorithms import unregister, unregister_advantage

    pl, work = tmp_path / "pl", tmp_path / "w"
    pl.mkdir()
    work.mkdir()
    (pl / "p_dyn16.py").write_text(DYN_PLUGIN)
    helper = pl / "dynhelper16.py"
    helper.write_text("scale = 1.0\n")
    cmd = ["run", "--plugin", "../pl/p_dyn16.py", "--algos", "grpo-dyn16", "--seeds", "0", "--no-controls",
           "--workers", "1", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "2",
           "--max-new-tokens", "4", "--samples-every", "0", "--no-progress", "--no-report"]
    try:
        rc, out, err = bench_here(cmd, work)
        assert rc == 0, err[-3000:]
        client = MlflowClient(f"sqlite:///{work}/mlflow.db")
        exp_id = client.get_experiment_by_name("pobench").experiment_id
        (first,) = client.search_runs([exp_id], "tags.`pobench.kind` = 'train'")
        assert str(helper) in first.data.tags.get("pobench.run_imports", ""), first.data.tags

        sys.modules.pop("dynhelper16", None)  # (a new command's process imports the edited helper)
        helper.write_text("scale = -5.0\n")
        rc, out, err = bench_here(cmd, work)
        lines = [ln for ln in err.splitlines() if ln.strip() and "warning: plugin" not in ln]
        assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
        assert lines[0].startswith(f"bench run: error: grpo-dyn16 seed 0: its finished run {first.info.run_id} "
                                   f"trained while plugin code imported dynhelper16.py ({helper}), which has changed "
                                   "since: "), err
        assert "top level" in lines[0] and "--force" in lines[0], lines[0]
        assert len(client.search_runs([exp_id], "tags.`pobench.kind` = 'train'")) == 1  # nothing trained

        rc, out, err = bench_here([*cmd, "--force"], work)
        assert rc == 0, err[-3000:]
        rc, out, err = bench_here(cmd, work)  # trained with the edited helper: reused now
        assert rc == 0 and re.search(r"grpo-dyn16 +seed 0: reused", out), (out + err)[-3000:]
    finally:
        unregister("grpo-dyn16")
        unregister_advantage("adv-dyn16")
        sys.modules.pop("dynhelper16", None)


def test_the_record_of_imported_modules_spans_tags_and_names_a_gone_module(tmp_path):
    """H09's record past MLflow's tag length (8000 characters) is split over several tags and read back whole; a
    recorded module whose file is gone is named as gone, one unchanged is not named."""
    from bench import plugin_imports

    kept = tmp_path / "kept.py"
    kept.write_text("x = 1\n")
    found = {str(tmp_path / f"m{i:03d}" / "gone.py"): f"{i:016x}" for i in range(200)}
    found[str(kept)] = plugin_imports._digest(kept)
    tags = plugin_imports.tags(found)
    assert len(tags) > 1 and all(len(v) <= 8000 for v in tags.values())
    assert plugin_imports.recorded(tags) == found
    changed = plugin_imports.changed(tags)
    assert len(changed) == 200 and all(c.endswith(", which is gone since") for c in changed)
    assert not any("kept.py" in c for c in changed)
