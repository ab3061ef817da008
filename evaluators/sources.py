"""Reading benchmark rows from where they live: a local JSONL / JSON / parquet file or folder, or the Hugging Face hub.

Rows come back as plain dicts together with where each came from (``file:line``), so that mapping errors can name the
exact row. Malformed rows raise `BadRowError` naming the file and line, unless ``skip_bad_rows`` is set, in which case
they are counted and listed in the returned `SourceRows.skipped`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from evaluators.hints import NOT_REGULAR, missing_file, not_regular

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


class BadRowError(ValueError):
    """A row that cannot be read or mapped; the message names the file and line (or row index)."""


@dataclass
class SourceRows:
    """Rows of one split and where each one came from."""

    rows: list[dict]
    where: list[str]
    """``path:line`` (JSONL), ``path[index]`` (JSON / parquet) or ``hub-id[index]`` for each row."""
    source: str
    """What was read: a path or a hub id (with its config and split)."""
    skipped: list[str] = field(default_factory=list)
    """``where: why`` of each row skipped because of ``skip_bad_rows``."""
    kept: list[str] = field(default_factory=list)
    """``where`` of each problem a benchmark's ``load_rows`` made of these rows, in its order."""


def _read_bytes(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:  # permission denied, a FIFO's end gone, an I/O error: the file named, one line
        raise BadRowError(f"{path}: cannot be read ({e.strerror or e})") from None


def _decode(path: Path, data: bytes) -> str:
    """The text of a whole data file (UTF-8, a byte-order mark dropped), or BadRowError naming its first line that
    is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise BadRowError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the file as UTF-8"
                          ) from None


def _row(raw: bytes) -> dict:
    """One JSONL line as a row; ValueError saying why it is none (not UTF-8, not JSON, not an object)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte 0x{raw[e.start]:02x}); save the file as UTF-8") from None
    row = json.loads(line)
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    return row


def read_jsonl(path: Path, skip_bad_rows: bool = False) -> SourceRows:
    rows, where, skipped = [], [], []
    data = _read_bytes(path)
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (common on Windows) is dropped
        data = data[3:]
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = _row(raw)
        except ValueError as e:
            msg = f"{path}:{lineno}: malformed JSONL row ({e})"
            if not skip_bad_rows:
                raise BadRowError(msg + "; fix the line or pass --skip-bad-rows to skip such rows") from None
            skipped.append(msg)
            continue
        rows.append(row)
        where.append(f"{path}:{lineno}")
    return SourceRows(rows, where, str(path), skipped)


def read_json(path: Path, skip_bad_rows: bool = False) -> SourceRows:
    data = _read_bytes(path)
    try:
        text = _decode(path, data)
    except BadRowError:
        if b"\n{" in data.strip():  # JSON lines saved as .json: the bad line is a row (--skip-bad-rows)
            return read_jsonl(path, skip_bad_rows)
        raise
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if "\n{" in text.strip():  # JSON lines saved as .json
            return read_jsonl(path, skip_bad_rows)
        raise BadRowError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
    if isinstance(data, dict):
        lists = [k for k, v in data.items() if isinstance(v, list)]
        if len(lists) == 1:  # {"data": [...]} / {"test": [...]}
            data = data[lists[0]]
        elif all(isinstance(v, dict) for v in data.values()) and data:  # {id: row}
            data = [{"id": k, **v} for k, v in data.items()]
        else:
            data = [data]  # one problem per file (the original MATH layout)
    if not isinstance(data, list):
        raise BadRowError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    rows, where, skipped = [], [], []
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            msg = f"{path}[{i}]: expected a JSON object, got {type(row).__name__}"
            if not skip_bad_rows:
                raise BadRowError(msg)
            skipped.append(msg)
            continue
        rows.append(row)
        where.append(f"{path}[{i}]")
    return SourceRows(rows, where, str(path), skipped)


def read_parquet(path: Path) -> SourceRows:
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except Exception as e:  # not parquet, truncated, unreadable: pyarrow's error in one line, the file named
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise BadRowError(f"{path}: cannot be read as parquet ({type(e).__name__}: {first})") from None
    rows = [{k: _plain(v) for k, v in r.items()} for r in frame.to_dict(orient="records")]
    return SourceRows(rows, [f"{path}[{i}]" for i in range(len(rows))], str(path))


def _plain(value):
    """numpy arrays / scalars from parquet -> Python lists / scalars."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def read_file(path: Path, skip_bad_rows: bool = False) -> SourceRows:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return read_jsonl(path, skip_bad_rows)
    if suffix == ".json":
        return read_json(path, skip_bad_rows)
    if suffix == ".parquet":
        return read_parquet(path)
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use one of {', '.join(DATA_SUFFIXES)}")


def _concat(parts: list[SourceRows], source: str) -> SourceRows:
    out = SourceRows([], [], source)
    for part in parts:
        out.rows += part.rows
        out.where += part.where
        out.skipped += part.skipped
    return out


def read_folder(folder: Path, split: str, skip_bad_rows: bool = False) -> SourceRows:
    """A split inside a folder: ``<split>.jsonl|json|parquet``, ``<split>-*.parquet`` (also under ``data/``), a
    ``<split>/`` folder of files (e.g. the original MATH layout, one JSON file per problem), or the folder's only
    data file."""
    for base in (folder, folder / "data"):
        for suffix in DATA_SUFFIXES:
            if not_regular(base / f"{split}{suffix}"):  # (a FIFO: "no data for split ...; found: <it>", round 15 H17)
                raise ValueError(f"{base / f'{split}{suffix}'}: {NOT_REGULAR}; write the rows to a JSONL / JSON / "
                                 "parquet file in its place")
            if (base / f"{split}{suffix}").is_file():
                return read_file(base / f"{split}{suffix}", skip_bad_rows)
        shards = sorted(base.glob(f"{split}-*.parquet")) + sorted(base.glob(f"{split}-*.jsonl"))
        if shards:
            return _concat([read_file(p, skip_bad_rows) for p in shards], str(base / f"{split}-*"))
    if (folder / split).is_dir():
        files = sorted((p for p in (folder / split).rglob("*") if p.suffix.lower() in DATA_SUFFIXES),
                       key=lambda p: [int(t) if t.isdigit() else t for t in p.with_suffix("").parts])
        if files:
            return _concat([read_file(p, skip_bad_rows) for p in files], str(folder / split))
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in DATA_SUFFIXES]
    if len(files) == 1:
        return read_file(files[0], skip_bad_rows)
    listing = ", ".join(sorted(p.name for p in folder.iterdir())) or "(empty)"
    raise FileNotFoundError(f"{folder}: no data for split {split!r}: expected {split}.jsonl, {split}.json, "
                            f"{split}.parquet, {split}-*.parquet or a {split}/ folder; found: {listing}")


def read_hub(hub_id: str, config: str | None, split: str) -> SourceRows:
    """A split of a Hugging Face hub dataset (needs network access or a warm `datasets` cache)."""
    try:
        import datasets

        ds = datasets.load_dataset(hub_id, config, split=split)
    except Exception as e:  # offline, unknown id, gated, ...: one clear message with the way out
        raise ValueError(f"could not load {hub_id}{f' ({config})' if config else ''} split {split!r} from the "
                         f"Hugging Face hub: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}. "
                         f"Without network access, pass a local JSONL / JSON / parquet file or folder with "
                         f"--data PATH (see docs/EVALUATORS.md)") from None
    rows = [dict(r) for r in ds]
    name = f"{hub_id}{f':{config}' if config else ''}[{split}]"
    return SourceRows(rows, [f"{name}[{i}]" for i in range(len(rows))], name)


def looks_like_hub_id(data: str) -> bool:
    return not os.path.exists(data) and data.count("/") == 1 and not data.startswith((".", "/", "~")) \
        and not data.lower().endswith(DATA_SUFFIXES)


def read_source(data: str | os.PathLike, split: str, skip_bad_rows: bool = False,
                hub_config: str | None = None, hub_split: str | None = None) -> SourceRows:
    """Rows of `split` from a local file, a local folder, or a hub id (``owner/name``)."""
    text = str(data)
    path = Path(text).expanduser()
    if path.is_file():
        return read_file(path, skip_bad_rows)
    if path.is_dir():
        return read_folder(path, split, skip_bad_rows)
    if not_regular(path):  # (a FIFO, <(...): "no such file or folder" named a path that exists)
        raise ValueError(f"--data {text}: {NOT_REGULAR}; write the rows to a JSONL / JSON / parquet file and give "
                         "its path")
    if os.path.lexists(path):  # (a symbolic link that loops or points to nothing: listed, no hub id)
        raise FileNotFoundError(f"--data {text}: {missing_file(path)}")
    if looks_like_hub_id(text):
        return read_hub(text, hub_config, hub_split or split)
    raise FileNotFoundError(f"--data {text}: {missing_file(path, 'file or folder')} (and not a hub id of the form "
                            "owner/name)")
