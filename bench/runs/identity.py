"""A run's identity by content: digests of every input that can change its result, which ``TrainConfig.comparison_hash``
includes, so a rewritten data file, changed weights or another hub revision is a new comparison (retrained, never
reused).

- a data file: SHA-256 of its bytes; a data folder: of its data files' relative paths and digests; a hub dataset id:
  the id (its revision is not resolved);
- a default source (no ``--data``): the ``$POBENCH_DATA_DIR/<task>`` folder when there is one, else the task's hub id;
  a generated task (``arith``): its name and version (its settings are config fields);
- a local model folder (and the built-in one): its top-level config, tokenizer and weight files; a hub model id: the
  commit its revision (``--revision``, default ``main``) resolves to, from the local Hugging Face cache, else the hub;
- the prompt template: the template string is a config field, and ``auto`` / ``chat`` read the chat template from the
  tokenizer files, which the model digest covers;
- the task's name and version (``Task.version`` changes with its answer rules).

File digests are cached by (absolute path, size, mtime, inode, ctime) in this process and in
``$POBENCH_CACHE_DIR/digests.json`` (default ``~/.cache/pobench``), so a large file or model is read once.
``datasets`` and ``log_datasets``: the runs'
``mlflow.log_input`` records; ``written_by_note``: what ``bench run`` says of a reused run written by another
pobench version or commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from evaluators import get_task
from evaluators.benchmarks import DATA_DIR_ENV
from evaluators.sources import DATA_SUFFIXES, looks_like_hub_id
from reports.record import GIT_COMMIT, VERSION

CACHE_ENV = "POBENCH_CACHE_DIR"
# the files of a model folder that make the model: config, tokenizer (with its chat template), weights
MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin", ".pt", ".pth", ".model", ".txt", ".tiktoken", ".jinja")
_SHA_RE = re.compile(r"[0-9a-f]{40}")
_memo: dict[tuple, str] = {}


def _cache_file() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "pobench")
    return Path(root).expanduser() / "digests.json"


def _read_cache() -> dict[str, str]:
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, digest: str) -> None:
    """Add one entry (best effort: a read-only home only costs hashing again)."""
    path = _cache_file()
    try:
        data = _read_cache()
        data[key] = digest
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, cached by (absolute path, size, mtime, inode, ctime in ns). The inode and ctime
    matter: a file rewritten with the same size and its mtime restored (``touch -r``, ``cp -p``, ``rsync -t``,
    ``tar x``, a coarse-timestamp file system) keeps size and mtime, but its ctime changes with every write and
    ``utime`` (nothing but the kernel sets it), and a replacing copy is a new inode (held-out round 8)."""
    p = Path(path).expanduser().resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
    if key in _memo:
        return _memo[key]
    text_key = json.dumps(key)
    digest = _read_cache().get(text_key)
    if digest is None:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        _write_cache(text_key, digest)
    _memo[key] = digest
    return digest


def _files_digest(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f"{f.relative_to(root).as_posix()}\0{file_digest(f)}\n".encode())
    return h.hexdigest()


def data_digest(source: str | Path) -> str:
    """The digest of a data source: a file's bytes, a folder's data files, or ``hub:<id>``."""
    path = Path(source).expanduser()
    if path.is_file():
        return file_digest(path)
    if path.is_dir():
        files = [f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in DATA_SUFFIXES]
        return _files_digest(path, files)
    return f"hub:{source}"


def model_digest(model: str, revision: str | None = None) -> str:
    """The digest of a model: its folder's config, tokenizer and weight files, or ``hub:<id>@<commit>``."""
    from bench.model import resolve_model_path  # (bench.model imports torch)

    path = Path(resolve_model_path(model)).expanduser()
    if path.is_dir():
        files = [f for f in path.iterdir() if f.is_file() and f.suffix.lower() in MODEL_FILE_SUFFIXES]
        return _files_digest(path, files)
    return f"hub:{model}@{hub_revision(model, revision) or 'unresolved'}"


def offline() -> bool:
    """True when the Hugging Face hub must not be asked (``HF_HUB_OFFLINE``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cached_revision(repo_id: str, revision: str | None = None, kind: str = "model") -> str | None:
    """The commit ``revision`` (default ``main``) of a hub repo resolves to in the local Hugging Face cache, or None."""
    if revision and _SHA_RE.fullmatch(revision):
        return revision
    from huggingface_hub import constants

    ref = Path(constants.HF_HUB_CACHE) / f"{kind}s--{repo_id.replace('/', '--')}" / "refs" / (revision or "main")
    try:
        sha = ref.read_text().strip()
    except OSError:
        return None
    return sha if _SHA_RE.fullmatch(sha) else None


@lru_cache(maxsize=64)
def hub_revision(repo_id: str, revision: str | None = None) -> str | None:
    """The commit of a hub model's ``revision``: from the local cache, else asked of the hub (not when offline)."""
    sha = cached_revision(repo_id, revision)
    if sha is not None or offline():
        return sha
    try:
        from huggingface_hub import HfApi

        return HfApi().model_info(repo_id, revision=revision, timeout=10).sha
    except Exception:  # no network, unknown id: the run's model load says why
        return None


def task_source(task_name: str, data: str | None, difficulty: int = 2) -> str | None:
    """Where a task's rows come from: ``data``, else ``$POBENCH_DATA_DIR/<task>``, else the task's own ``data_dir``
    (a plugin's files), else its hub id; None for a generated task."""
    task = get_task(task_name, difficulty=difficulty)
    if task.generated:
        return None
    if data is not None:
        return str(data)
    root = os.environ.get(DATA_DIR_ENV)
    if root and (Path(root) / task.name).is_dir():
        return str(Path(root) / task.name)
    if getattr(task, "data_dir", None):
        return str(task.data_dir)
    return getattr(task, "hub_id", None) or task.name


def input_digests(cfg) -> dict[str, str]:
    """Every input of ``cfg`` that can change its result -> its digest (module doc)."""
    out = {"model": model_digest(cfg.model, getattr(cfg, "revision", None))}
    for key, task_name, data in (("train", cfg.task, cfg.data), ("eval", cfg.eval_task or cfg.task, cfg.eval_data)):
        task = get_task(task_name, difficulty=cfg.difficulty)
        out[f"{key}_task"] = f"{task.name}@{task.version}"
        source = task_source(task_name, data, cfg.difficulty)
        if source is not None:
            out[f"{key}_data"] = data_digest(source)
    return out


# ------------------------------------------------------------------ the record
def datasets(cfg) -> list[dict[str, Any]]:
    """The datasets a run reads (training, held-out): name, digest, source, rows; generated tasks have no rows."""
    out = []
    for context, task_name, data, split in (("training", cfg.task, cfg.data, "train"),
                                            ("evaluation", cfg.eval_task or cfg.task, cfg.eval_data, "test")):
        source = task_source(task_name, data, cfg.difficulty)
        if source is None:
            continue
        digest = data_digest(source)
        rows = row_count(task_name, source, split, cfg.difficulty, cfg.skip_bad_rows, digest)
        out.append({"name": f"{task_name}-{split}", "digest": digest[:12] if len(digest) == 64 else digest,
                    "source": source, "rows": rows, "context": context})
    return out


@lru_cache(maxsize=32)
def row_count(task_name: str, source: str, split: str, difficulty: int, skip_bad_rows: bool, digest: str) -> int:
    """The problems a task reads from ``source`` (``digest`` keys the cache: a rewritten file is counted again)."""
    return len(get_task(task_name, difficulty=difficulty).load(split=split, data=source, skip_bad_rows=skip_bad_rows))


def log_datasets(client, run_id: str, cfg) -> None:
    """``mlflow.log_input`` of every dataset of the run (context tag: training / evaluation)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = []
    for d in datasets(cfg):
        source_type = "hub" if looks_like_hub_id(d["source"]) else "local"
        inputs.append(DatasetInput(
            Dataset(d["name"], d["digest"], source_type, json.dumps({"uri": d["source"]}),
                    profile=json.dumps({"num_rows": d["rows"]})),
            tags=[InputTag("mlflow.data.context", d["context"])]))
    if inputs:  # (two pairs logging one new dataset at once: the slower insert fails, and is made again)
        from reports.record import retry_locked

        retry_locked(client.log_inputs, run_id, datasets=inputs)


def written_by_note(tags: dict[str, str], now: dict[str, str]) -> str:
    """`` (written by pobench V at commit C)`` when a reused run's version or commit differs from ``now``, else ''."""
    then = {k: tags.get(k, "unknown") for k in (VERSION, GIT_COMMIT)}
    if all(then[k] == now.get(k, "unknown") for k in then):
        return ""
    return (f" (written by pobench {then[VERSION]} at commit {then[GIT_COMMIT][:10]}; this is "
            f"{now.get(VERSION, 'unknown')} at {now.get(GIT_COMMIT, 'unknown')[:10]})")
