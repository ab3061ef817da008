"""What pobench wrote into its output folders, and the files of it a user edited since (issue 29).

Every command that rewrites its own output folder (`bench report` and `bench compare`: the report folder swapped in
whole; `bench eval --out`, `bench tune --out` / its default ``.pobench/tune/<study>``: files replaced one by one)
records the SHA-256 of each file it wrote in the folder's listing (``reports.paths.LISTING``, a JSON object
``{relative path: digest}``; pobench alone writes it). Before any work, the next such command asks
:func:`check_unedited`: a file pobench wrote whose content is no longer what it wrote (the user edited it) is not
replaced: one line naming the edited files and what to do (move them away or copy the edits elsewhere, then run the
same command again), exit 2, nothing changed (held-out round 15, H14, H29: the edits were silently replaced). A file
the user deleted, or replaced by a symbolic link, is written again (nothing of theirs to lose: a link is replaced,
its target untouched); a file they added under another name is theirs and is
kept as before. A listing of an earlier pobench (a list, no digests) tells no edit: its files are replaced as before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from reports.paths import LISTING, UnsafePath, read_listing


class EditedOutputs(UnsafePath):
    """Files pobench wrote into an output folder were changed since (one line; exit 2, before any work)."""


def digest(path: str | Path) -> str | None:
    """The SHA-256 of the file at ``path`` (hex); None when it is no regular file or cannot be read."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return None
    h = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def recorded(folder: str | Path) -> dict[str, str | None]:
    """``{relative path: digest}`` of what pobench wrote into ``folder`` (``reports.paths.read_listing``); empty when
    there is no readable listing."""
    return read_listing(folder) or {}


def record_written(folder: str | Path, paths) -> dict[str, str | None]:
    """Add the files ``paths`` (under ``folder``) to its listing with their digests, as pobench wrote them; entries of
    files no longer there are dropped. Returns the listing written."""
    folder = Path(folder)
    listing = {rel: d for rel, d in recorded(folder).items() if (folder / rel).exists()}
    for p in paths:
        p = Path(p)
        rel = str(p.relative_to(folder)) if p.is_absolute() == folder.is_absolute() else p.name
        listing[rel] = digest(folder / rel)
    (folder / LISTING).write_text(json.dumps(listing, indent=0, sort_keys=True))
    return listing


def forget(folder: str | Path, rels) -> None:
    """Make the digests of ``rels`` (relative paths) in ``folder``'s listing unknown (None) before pobench writes them
    again: killed between its write and :func:`record_written`, its own new file is never taken for a user's edit."""
    folder = Path(folder)
    listing = recorded(folder)
    if any(listing.get(rel) is not None for rel in rels):
        listing.update({rel: None for rel in rels if rel in listing})
        (folder / LISTING).write_text(json.dumps(listing, indent=0, sort_keys=True))


def edited(folder: str | Path) -> list[str]:
    """The files pobench wrote into ``folder`` whose content changed since (relative paths, sorted); a file deleted,
    of unknown digest, or replaced by a symbolic link (the link is replaced, never written through: its target, the
    user's, stays as it is) is none."""
    folder = Path(folder)
    out = []
    for rel, was in sorted(recorded(folder).items()):
        path = folder / rel
        if was is None or path.is_symlink() or not path.exists():  # (a link: replaced, its target untouched)
            continue
        if digest(path) != was:
            out.append(rel)
    return out


def check_unedited(folder: str | Path, what: str, only=None) -> None:
    """EditedOutputs (one line naming ``what``, the folder and each edited file, and what to do) when files pobench
    wrote into ``folder`` were changed since: the command would replace them. Asked before any work by every command
    that rewrites its own output folder (``only``: the relative paths it would replace, when not all of them)."""
    changed = [rel for rel in edited(folder) if only is None or rel in only]
    if changed:
        them = "them" if len(changed) > 1 else "it"
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise EditedOutputs(f"{what} {folder}: {shown} changed since pobench wrote {them} (your edits): not replacing "
                            f"{them}; move {them} away (or copy your edits elsewhere), then run the same command again")
