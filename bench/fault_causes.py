"""What an error's chain of causes says, for the one line of a fault (``bench.faults.describe`` and the commands
that word their own): an HTTP error status a server answered, a cloud storage client's refusal, an Optuna storage
found damaged or refusing writes; and the first line worth quoting of a database's error. No pobench imports: the
low end of ``bench.faults``, which re-exports these names."""

from __future__ import annotations

import errno
import os


def chain(error: BaseException | None):
    """``error``, its cause or context, theirs, ...: each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def damaged(text: str) -> bool:
    """Whether a database error's text says the file is not a sound SQLite database (damaged, truncated, another
    kind of file): rerunning once it "answers again" does not help; restoring or moving it away does."""
    return any(t in text for t in ("database disk image is malformed", "file is not a database"))


#: the statuses a proxy answers for a server behind it that does not answer (502 Bad Gateway, 503 Service
#: Unavailable, 504 Gateway Timeout): no answer from MLflow, tried again until the bound as a refused connection is
NO_ANSWER_STATUSES = (502, 503, 504)


def answered_status(error: BaseException) -> int | None:
    """The HTTP error status the server answered ``error``'s request with (in its chain: MLflow's client raises
    urllib3's "too many <status> error responses", its retries used up at the first with none left, or a requests
    HTTPError), unless it is one of :data:`NO_ANSWER_STATUSES`; None for any other error. Held-out round 9: a server's
    500 on an upload (its artifacts' disk full) was taken for no answer: "did not answer within 5 s", a traceback,
    and the run left RUNNING."""
    import re

    import requests
    import urllib3

    for e in chain(error):
        status = None
        if isinstance(e, urllib3.exceptions.ResponseError) and (m := re.search(r"too many (\d+) error", str(e))):
            status = int(m.group(1))
        elif isinstance(e, requests.exceptions.HTTPError) and e.response is not None:
            status = e.response.status_code
        if status is not None and status not in NO_ANSWER_STATUSES:
            return status
    return None


#: the packages whose exceptions say that a remote place for a run's files (S3, Google Cloud Storage, Azure Blob
#: Storage: an experiment's artifact location) refused a file: no credentials, access denied, no such bucket
CLOUD_CLIENTS = ("botocore", "boto3", "s3transfer", "google", "azure")


def cloud_refusal(error: BaseException) -> str | None:
    """``Type: first line`` of the error a cloud storage client raised in ``error``'s chain (:data:`CLOUD_CLIENTS`);
    None when there is none. Held-out round 9's leftover: outside a training run (the comparison run's files, the
    report, `bench tune`'s outputs, `bench eval`'s results) such a refusal was botocore's traceback."""
    for e in chain(error):
        if type(e).__module__.split(".")[0] in CLOUD_CLIENTS:
            return f"{type(e).__name__}: {first_line(str(e))}" if str(e).strip() else type(e).__name__
    return None


#: what a damaged Optuna storage is told (a new study in another storage needs another name: its trials' run folders
#: keep this study's, ``bench.tune.study.check_new_study``)
STORAGE_DAMAGED_ADVICE = ("the trials it held are lost with it unless it is restored: restore it from a backup, then "
                          "rerun the same command to resume the study; or move it away and start a new study: the "
                          "same command with another --study (this study's runs keep their names)")


def storage_damage(error: BaseException) -> str | None:
    """SQLite's words when ``error`` (an Optuna storage's) says its file is damaged (:func:`damaged`: malformed,
    not a database), else None: waiting for it to "answer again" does not help (held-out round 14, H14)."""
    for e in chain(error):
        if damaged(str(e)):
            return first_line(str(e), "malformed", "not a database")
    return None


def storage_refusal(error: BaseException) -> str | None:
    """What an Optuna storage that answers but refuses every write says, and what to do (the end of a line after the
    storage's name): read-only, or its disk full; None for another failure (unreachable: "once it answers again").
    Issue 29 (C10): a read-only storage was told to wait until it "answers again"."""
    said = " ".join(str(c) for c in chain(error))
    if "readonly database" in said or "read-only database" in said:
        return "is read-only (attempt to write a readonly database): make the file and its folder writable"
    if "database or disk is full" in said:
        return "is on a full disk (database or disk is full): free space"
    return None


def first_line(text: str, *about: str) -> str:
    """The first line of ``text`` (the first that holds one of ``about``, when one does: SQLAlchemy may put its note
    "(raised as a result of Query-invoked autoflush ...)" before the database's own error)."""
    lines = text.strip().splitlines() or [""]
    return next((ln for ln in lines if any(a in ln for a in about)), lines[0])[:300]


#: the errnos of a full disk, a full quota, the file-size limit (``ulimit -f``)
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def full_errno(e: BaseException) -> int | None:
    """The errno of a full disk / quota / file-size limit that ``e`` reports (an OSError, or the text of a library's
    own exception type: safetensors' SafetensorError "I/O error: No space left on device (os error 28)",
    tokenizers'), else None."""
    if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
        return e.errno
    text = str(e)
    for code in FULL_ERRNOS:
        if os.strerror(code) in text or f"os error {code})" in text or text.endswith(f"os error {code}"):
            return code
    return None
