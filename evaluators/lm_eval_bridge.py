"""Bridge to lm-evaluation-harness: run lm-eval on the same rows, prompts and answer extraction as `bench eval`.

`write_tasks` writes, for each benchmark, the evaluated problems as a JSONL file (with the exact prompt text we give
the model) and an lm-eval task YAML that reads it (``dataset_path: json`` with ``data_files``), decodes greedily,
filters each response through our `extract_answer` (a ``custom`` filter) and scores it with our verifier
(``process_results``), both from a ``utils.py`` next to the YAML. `run_lm_eval` runs lm-eval's ``simple_evaluate``
with its own Hugging Face model class (``HFLM(pretrained=<folder>)``); `compare_with_ours` lines up its per-row answers
with ours. For the same model, greedy decoding and the same prompts the two accuracies must agree.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TASK_PREFIX = "pobench_"

_UTILS = '''"""lm-eval hooks written by pobench (evaluators/lm_eval_bridge.py): our prompts, extraction, verifier."""
import sys

if {root!r} not in sys.path:
    sys.path.insert(0, {root!r})

from evaluators.verify import answers_match, extract_answer  # noqa: E402


def doc_to_text(doc):
    return doc["prompt"]


def extract(resps, docs):  # greedy: one response per doc; keep the first, as lm-eval's take_first does
    return [extract_answer(rs[0], doc["kind"]) or "" for rs, doc in zip(resps, docs)]


def process_results(doc, results):
    pred = results[0]
    return {{"acc": float(bool(pred) and answers_match(pred, doc["answer"], doc["kind"]))}}
'''


def task_name(benchmark: str) -> str:
    return TASK_PREFIX + benchmark


def write_tasks(entries: list[tuple[Any, list, list[str]]], out_dir: str | Path, max_new_tokens: int) -> list[str]:
    """Write ``<task>.jsonl`` + ``<task>.yaml`` per (benchmark, problems, prompts) and one ``utils.py``.

    Returns the task names (``pobench_<benchmark>``) to pass to lm-eval with ``include_path=out_dir``.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[1])
    (out / "utils.py").write_text(_UTILS.format(root=root))
    names = []
    for benchmark, problems, prompts in entries:
        name = task_name(benchmark.name)
        data = out / f"{name}.jsonl"
        with open(data, "w") as f:
            for p, prompt in zip(problems, prompts):
                f.write(json.dumps({"id": p.id, "prompt": prompt, "answer": p.answer,
                                    "kind": benchmark.answer_kind}) + "\n")
        config = {
            "task": name,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test",
            "output_type": "generate_until",
            "doc_to_text": "!function utils.doc_to_text",
            "doc_to_target": "answer",
            "target_delimiter": "",
            "fewshot_delimiter": "",
            "num_fewshot": 0,
            "generation_kwargs": {"until": [], "do_sample": False, "temperature": 0.0,
                                  "max_gen_toks": int(max_new_tokens)},
            "filter_list": [{"name": "pobench", "filter": [{"function": "custom",
                                                            "filter_fn": "!function utils.extract"}]}],
            "process_results": "!function utils.process_results",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
            "metadata": {"version": float(benchmark.version) if _is_float(benchmark.version) else 1.0,
                         "pobench_version": str(benchmark.version)},
        }
        text = yaml.safe_dump(config, sort_keys=False, width=1000)
        # lm-eval's `!function` tag must stay an unquoted YAML tag
        text = text.replace("'!function utils.doc_to_text'", "!function utils.doc_to_text")
        text = text.replace("'!function utils.extract'", "!function utils.extract")
        text = text.replace("'!function utils.process_results'", "!function utils.process_results")
        (out / f"{name}.yaml").write_text(text)
        names.append(name)
    return names


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


@dataclass
class LmEvalResult:
    """lm-eval's accuracy per benchmark and its per-row responses (in our row order)."""

    scores: dict[str, float]
    rows: dict[str, list[dict[str, Any]]]
    version: str
    task_dir: str
    raw: dict[str, Any] = field(default_factory=dict)


def run_lm_eval(path: str, benchmarks: list[tuple[Any, list]], out_dir: str | Path, *, max_new_tokens: int,
                prompt: Callable[[Any, str], str], device: str = "cpu", dtype: str = "float32",
                batch_size: int = 1) -> LmEvalResult:
    """Run lm-eval (its HF model class, greedy) on `benchmarks` = [(benchmark, problems)] with our prompts.

    ``path``: the model folder; ``prompt(tokenizer, question)``: the prompt text `bench eval` gives the model;
    ``device``: a torch device name (``cpu``, ``cuda``, ``cuda:0``). The caller (bench/cli/eval.py) resolves all
    three, so evaluators never import bench."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    context = _context_length(AutoConfig.from_pretrained(path), tokenizer)
    entries = [(b, ps, [prompt(tokenizer, p.question) for p in ps]) for b, ps in benchmarks]
    out = Path(out_dir)
    names = write_tasks(entries, out, max_new_tokens)
    manager = TaskManager(include_path=str(out.resolve()))
    lm = HFLM(pretrained=path, dtype=dtype, device=device, batch_size=batch_size)
    # lm-eval bounds a completion with generate(max_length=prompt + max_gen_toks); a `max_new_tokens` in the model
    # folder's generation_config.json would take precedence over it, so it is cleared: the task's limit applies.
    lm.model.generation_config.max_new_tokens = None
    results = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, log_samples=True,
                                      bootstrap_iters=0, apply_chat_template=False)
    scores, rows = {}, {}
    for b, _, _ in entries:
        name = task_name(b.name)
        task_scores = results["results"][name]
        scores[b.name] = float(next(v for k, v in task_scores.items() if k.startswith("acc,")))
        samples = sorted(results["samples"][name], key=lambda s: s["doc_id"])
        rows[b.name] = [{"id": s["doc"]["id"], "prompt": s["arguments"][0][0] if s.get("arguments") else None,
                         "completion": s["resps"][0][0], "answer": _first(s["filtered_resps"]) or None,
                         "correct": bool(s["acc"]),
                         # lm-eval cuts such a prompt on the left to fit max_new_tokens in the context; we do not
                         "truncated": len(tokenizer(s["doc"]["prompt"])["input_ids"]) + max_new_tokens > context}
                        for s in samples]
    (out / "lm_eval_results.json").write_text(json.dumps({"scores": scores, "rows": rows}, indent=2))
    return LmEvalResult(scores=scores, rows=rows, version=getattr(lm_eval, "__version__", "unknown"),
                         task_dir=str(out), raw={k: results.get(k) for k in ("results", "configs", "versions")})


def _context_length(config, tokenizer) -> int:
    """The context length lm-eval's HF model assumes (its `max_length` rule): config, else tokenizer, else 2048."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(config, attr, None):
            return int(getattr(config, attr))
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if limit and limit < 10**9 else 2048


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


def compare_with_ours(harness: LmEvalResult, ours) -> dict[str, Any]:
    """Row-by-row comparison of lm-eval's greedy answers with ours (`bench.evaluate.EvalResult` with greedy rows)."""
    theirs = harness.rows[ours.benchmark]
    if len(theirs) != len(ours.rows):
        raise ValueError(f"{ours.benchmark}: lm-eval scored {len(theirs)} rows, we scored {len(ours.rows)}")
    disagreements = []
    for mine, other in zip(ours.rows, theirs):
        if mine["id"] != other["id"]:
            raise ValueError(f"{ours.benchmark}: row order differs ({mine['id']} vs {other['id']})")
        if (mine.get("greedy_answer"), bool(mine.get("greedy_correct"))) != (other["answer"], other["correct"]):
            disagreements.append({"id": mine["id"], "truncated_by_lm_eval": bool(other.get("truncated")),
                                  "ours": mine.get("greedy_completion"),
                                  "lm_eval": other["completion"], "our_answer": mine.get("greedy_answer"),
                                  "lm_eval_answer": other["answer"]})
    ours_acc = ours.metrics["greedy_acc"].value if "greedy_acc" in ours.metrics else None
    truncated = [o["id"] for o in theirs if o.get("truncated")]
    return {"lm_eval_acc": harness.scores[ours.benchmark], "our_greedy_acc": ours_acc, "truncated": truncated,
            "same_prompts": sum(m["prompt"] == o["prompt"] for m, o in zip(ours.rows, theirs)),
            "same_completions": sum(m.get("greedy_completion") == o["completion"]
                                    for m, o in zip(ours.rows, theirs)),
            "rows": len(theirs), "disagreements": disagreements, "lm_eval_version": harness.version}
