"""Checkpoints of a training run: model, optimizer and scheduler state, step, MLflow run id, wall-clock, the RNG
state, the metrics not yet sent to MLflow and the objective's state (``objective_state``: a controller's, empty for a
pure objective); for an objective with a critic (PPO) also ``critic.pt``, the critic's weights and optimizer state.

Writing: every file goes into a temporary folder (``ckpt-N.tmp``, pobench's marker written into it first: a leftover
of it is known to be pobench's), is flushed to disk, and its size and SHA-256 are recorded in ``state.json`` (written
last); then the folder is renamed to ``ckpt-N``. A failure on the way (disk
full, a file-size limit, an interrupt) removes the temporary folder, so no half-written checkpoint is ever left, and
a full disk is one line naming the folder (:class:`CheckpointError`). The final weights are swapped in the same way
(:func:`save_final`): ``<run>/final`` is complete or absent.

Loading (:func:`load`) runs no code from disk: tensors through ``torch.load(weights_only=True)`` (a pickle that would
run code is refused), everything else is JSON. Each file is checked against its recorded size and digest first. A
checkpoint that cannot be resumed (missing, truncated or altered file, unreadable ``state.json``) is named in one
line and the resume falls back to the newest older checkpoint that can; when none can, one line says which folder to
delete. (Checkpoints of earlier versions have no digests: they load unverified, still through the safe loader.)

Retention (``TrainConfig.keep_checkpoints`` = N): the newest N checkpoints stay, older ones are deleted once a newer
one is complete (pobench's own: a user's link named like a checkpoint is neither counted nor touched); the newest
:data:`OPTIM_KEPT` of them keep their optimizer state (``optim.pt``, twice the model's
size with AdamW), so with N >= 2 a corrupt newest checkpoint still leaves one to resume from; older kept ones hold
the weights only."""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.fault_causes import full_errno
from bench.runs.folders import CHECKPOINTS, LISTING, MARKER, carry_over, own_temp, remove_written
from reports.paths import is_owned, make_owned

PREFIX = "ckpt-"
FINAL_TMP = ".final.tmp"  # the final weights are written here, then renamed to ``final``
FORMAT = 2            # state.json records "files": {name: [size, sha256]} (format 1 had none)
OPTIM_KEPT = 2        # newest checkpoints that keep their optimizer state
CRITIC = "critic.pt"  # an objective's critic (PPO's value function): weights and optimizer state


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or resumed: one line naming the folder or file and the cause."""


class _Foreign(CheckpointError):
    """A checkpoint that is sound but not this engine's: no fallback to an older one."""


class DiskFull(CheckpointError):
    """A checkpoint or the final weights could not be written: the disk is full or a file-size limit was reached.
    Nothing half-written was left."""


class FolderLost(CheckpointError):
    """The run folder was deleted, or its marker removed, while the run trained: no checkpoint goes into it."""


def _check_folder(run_dir: Path) -> None:
    """FolderLost (one line) unless ``run_dir`` is still the run folder pobench marked (``bench.runs.folders``): a
    checkpoint is never written into a folder pobench no longer owns (it recreated the folder, unmarked, and a rerun
    then met checkpoints in a folder it may not write into)."""
    if not (run_dir.is_dir() and not run_dir.is_symlink() and is_owned(run_dir)):
        if not os.path.lexists(run_dir):  # (held-out round 16, H17: "move what is left of it away", nothing left)
            raise FolderLost(f"the run folder {run_dir} was deleted while the run trained: nothing more is written; "
                             "rerun the command to train the run again from step 0")
        raise FolderLost(f"the run folder {run_dir} lost its {MARKER} marker (or was replaced) while the run "
                         "trained: no checkpoint is written into a folder pobench no longer owns; move it away, "
                         "then rerun the command (the run trains again from step 0)")


class NoneResumable(CheckpointError):
    """No checkpoint of a run can be resumed (each one named)."""


def step_of(folder: str | Path) -> int:
    """The step a checkpoint folder holds: ``ckpt-0000004`` -> 4."""
    return int(Path(folder).name[len(PREFIX):])


def latest(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder of a run (renamed into place, with its state.json), or None."""
    done = _complete(Path(run_dir))
    return done[-1] if done else None


def _complete(run_dir: Path) -> list[Path]:
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.glob(f"{PREFIX}*") if (p / "state.json").exists() and not p.name.endswith(".tmp"))


# ------------------------------------------------------------------ writing
class _HashingWriter:
    """A binary file that hashes what is written and keeps the OSError of a failed write (torch's writer turns it
    into an unreadable ``unexpected pos`` RuntimeError)."""

    def __init__(self, fh) -> None:
        self.fh, self.sha, self.size, self.error = fh, hashlib.sha256(), 0, None

    def write(self, data) -> int:
        try:
            n = self.fh.write(data)
        except OSError as e:
            self.error = e
            raise
        self.sha.update(data)
        self.size += len(data)
        return n

    def flush(self) -> None:
        self.fh.flush()


def _save_tensors(obj: Any, path: Path) -> list:
    """``torch.save`` into ``path``, flushed to disk; returns ``[size, sha256]``."""
    with open(path, "wb") as fh:
        w = _HashingWriter(fh)
        try:
            torch.save(obj, w)
            fh.flush()
            os.fsync(fh.fileno())
        except Exception:
            if w.error is not None:
                raise w.error from None
            raise
    return [w.size, w.sha.hexdigest()]


def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_full(e: BaseException) -> bool:
    """``e`` says the disk is full or a file-size limit was reached."""
    return full_errno(e) is not None


def _full(e: BaseException, what: Path) -> DiskFull:
    """One line for a write of ``what`` that failed on a full disk or a file-size limit."""
    code = full_errno(e)
    why = os.strerror(code) + (": the file-size limit, ulimit -f" if code == errno.EFBIG else "")
    return DiskFull(f"no space left on device while writing {what} ({why}); nothing half-written was left: "
                    "free space (or raise the file-size limit), then resume")


def _commit(run_dir: Path, step: int, state: dict[str, Any], fill: Callable[[Path], dict[str, list]] = lambda t: {},
            keep: int = 1) -> tuple[Path, list[Path]]:
    """Write checkpoint ``step`` atomically (``fill`` writes its files into a temporary folder and returns their
    ``[size, sha256]``, then ``state.json``, then the folder is renamed), drop all but the newest ``keep``. Only now
    that the new one is complete: a kill at any point leaves one to resume from. Returns the new folder and the kept
    ones, oldest first."""
    final = run_dir / f"{PREFIX}{step:07d}"
    tmp = run_dir / f"{PREFIX}{step:07d}.tmp"
    _check_folder(run_dir)
    clear_leftover(tmp)
    try:
        make_owned(tmp, "checkpoint")  # its marker first: a leftover of it is known to be pobench's (clear_leftover)
        files = fill(tmp)
        _write_text(tmp / "state.json", json.dumps({**state, "step": step, "format": FORMAT, "files": files}))
        _fsync_dir(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # never a half-written checkpoint
        if is_full(e):
            raise _full(e, final) from None
        raise
    carry_over(final, tmp)  # (the same step written again: a user's file in it moves to the new one)
    if final.is_symlink():  # a user's link at this step's name (to a checkpoint moved away): replaced, as `final`'s
        print(f"bench: warning: {final} was a link pobench did not write (to {os.readlink(final)}): replaced by the "
              "run's checkpoint of that step; what it pointed to is untouched", file=sys.stderr)
        final.unlink()
    tmp.rename(final)
    _fsync_dir(run_dir)
    done = [d for d in _complete(run_dir) if not d.is_symlink()]  # (a user's link named as a checkpoint: neither
    for old in done[:-keep]:                                      # counted nor touched: held-out round 16, H06)
        engine_dir = _engine_dir(old, run_dir)
        if engine_dir is not None:  # a state-only checkpoint's engine folder goes with it
            shutil.rmtree(engine_dir, ignore_errors=True)
        remove_written(old)  # its files; a user's file put in it stays (bench/runs/folders.py)
    return final, done[-keep:]


def _engine_dir(ckpt: Path, run_dir: Path) -> Path | None:
    """The engine folder a state-only checkpoint names, when it lies inside the run folder (a state.json naming
    anything else never makes pobench delete it)."""
    try:
        named = json.loads((ckpt / "state.json").read_text()).get("trl_checkpoint")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(named, str) or not named:
        return None
    path, root = Path(named).resolve(), run_dir.resolve()
    return path if root in path.parents else None


def clear_leftover(tmp: Path) -> None:
    """Remove the temporary folder an interrupted write left at ``tmp`` (pobench's own: it writes folders there; a
    checkpoint's only when it holds pobench's marker or only pobench's files: ``bench.runs.folders.own_temp``).
    Anything else at that name is not pobench's and stays: FileExistsError naming it (one line at the command line);
    a folder that cannot be removed: the OSError naming the file."""
    ours = own_temp(tmp) if fnmatch.fnmatchcase(tmp.name, CHECKPOINTS) else tmp.is_dir() and not tmp.is_symlink()
    if ours:
        shutil.rmtree(tmp)
    elif tmp.is_dir() and not tmp.is_symlink():
        raise FileExistsError(errno.EEXIST, "a folder pobench did not write (files of yours) where it writes its "
                              "temporary checkpoint folder: move it away, then resume", str(tmp))
    elif tmp.exists() or tmp.is_symlink():
        raise FileExistsError(errno.EEXIST, "a file where pobench writes its temporary folder", str(tmp))


def save(run_dir: str | Path, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         scheduler: Any, state: dict[str, Any], keep: int = 1, critic: Any = None) -> Path:
    """Checkpoint ``step``; ``critic`` (an objective's value function, bench/engines/native/critic.py): its weights and
    optimizer state go into ``critic.pt`` (a checkpoint of a run without one holds no such file)."""
    def fill(tmp: Path) -> dict[str, list]:
        files = {"model.pt": _save_tensors(_weights(model), tmp / "model.pt"),  # with LoRA: the adapter only
                 "optim.pt": _save_tensors({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                            "torch_rng": torch.get_rng_state()}, tmp / "optim.pt")}
        if critic is not None:
            files[CRITIC] = _save_tensors(critic.state_dict(), tmp / CRITIC)
        return files

    final, kept = _commit(Path(run_dir), step, state, fill, keep)
    for old in kept[:-OPTIM_KEPT]:  # the newest OPTIM_KEPT keep the optimizer state a resume reads (the critic's
        (old / "optim.pt").unlink(missing_ok=True)  # too: an older checkpoint cannot be resumed)
        (old / CRITIC).unlink(missing_ok=True)
    return final


def save_state(run_dir: str | Path, step: int, state: dict[str, Any], keep: int = 1) -> Path:
    """A checkpoint that holds only ``state.json``, for an engine that writes weights and optimizer state itself (the
    TRL engine: ``state["trl_checkpoint"]`` names its folder, dropped with the checkpoint; the size and digest of
    each of its files are recorded). Same naming, atomicity and retention as ``save``, so ``latest`` (and with it
    `bench run`'s resume decision) sees it as any other."""
    engine = state.get("trl_checkpoint")

    def fill(tmp: Path) -> dict[str, list]:
        if not engine or not Path(engine).is_dir():
            return {}
        root = Path(engine)
        return {str(p.relative_to(root)): [p.stat().st_size, _digest(p)] for p in sorted(root.rglob("*"))
                if p.is_file()}

    return _commit(Path(run_dir), step, state, fill, keep=keep)[0]


def save_final(run_dir: str | Path, write: Callable[[Path], None]) -> Path:
    """The final weights: ``write(folder)`` fills a temporary folder beside ``<run>/final``, which is then swapped in,
    so ``final`` is complete or absent (a failure, a full disk included, leaves no half-written one and keeps an
    older one). Returns ``<run>/final``."""
    run_dir = Path(run_dir)
    dest, tmp, old = run_dir / "final", run_dir / FINAL_TMP, run_dir / ".final.old"
    _check_folder(run_dir)
    clear_leftover(tmp)
    if old.is_dir() and not old.is_symlink():  # the old final a killed swap left: its files (a user's stay)
        remove_written(old)
    clear_leftover(old)
    try:
        tmp.mkdir(parents=True)
        write(tmp)
        written = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if not p.is_dir())
        (tmp / LISTING).write_text(json.dumps(written))  # what `--force` may delete in it (bench/runs/folders.py)
        for p in tmp.rglob("*"):
            if p.is_file():
                with open(p, "rb") as fh:
                    os.fsync(fh.fileno())
        _fsync_dir(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_full(e):
            raise _full(e, dest) from None
        raise
    if dest.exists() or dest.is_symlink():
        dest.rename(old)
    tmp.rename(dest)
    _fsync_dir(run_dir)
    if old.is_symlink():  # a final the user moved away and linked back: the link goes, what it points to stays
        old.unlink()
    else:
        carry_over(old, dest)  # a user's file in the old final moves to the new one; pobench's go
    return dest


# ------------------------------------------------------------------ reading
def _digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _read_state(ckpt: Path) -> dict[str, Any]:
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{ckpt}/state.json cannot be read ({type(e).__name__}: truncated or damaged)") from None
    if not isinstance(state, dict) or not {"run_id", "step", "pending", "elapsed"} <= set(state):
        raise CheckpointError(f"{ckpt}/state.json is not a pobench checkpoint state (fields missing)")
    return state


def _verify(path: Path, recorded: Any) -> None:
    """``path`` has the size and SHA-256 recorded when it was written (nothing to check when none was)."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    if not isinstance(recorded, list) or len(recorded) != 2:
        return
    size = path.stat().st_size
    if size != recorded[0]:
        raise CheckpointError(f"{path} has {size} bytes, {recorded[0]} were written (truncated or replaced)")
    if _digest(path) != recorded[1]:
        raise CheckpointError(f"{path} differs from what was written (SHA-256 mismatch: damaged or replaced)")


def _torch_load(path: Path, device: Any) -> Any:
    """Tensors and plain data only: a pickle that would construct other objects (run code) is refused."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path} was refused: it holds Python objects other than tensors and plain data, which "
                              "pobench never writes (a pickle that could run code); it was not loaded") from None
    except Exception as e:  # noqa: BLE001  (truncated zip, zeroed file, ...: named, never a torch traceback)
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise CheckpointError(f"{path} cannot be read ({type(e).__name__}: {first})") from None


def _read(ckpt: Path, device: Any, critic: bool = False) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """A checkpoint's state, weights and optimizer state (with ``critic``, the critic's under ``extra["critic"]``),
    each verified; CheckpointError naming what is wrong."""
    state = _read_state(ckpt)
    if state.get("engine") not in (None, "native"):
        raise _Foreign(f"{ckpt} is a checkpoint of the {state['engine']} engine: the native loop cannot resume it")
    files = state.get("files") or {}
    for name in ("model.pt", "optim.pt"):
        if name == "optim.pt" and not (ckpt / name).exists():
            raise CheckpointError(f"{ckpt} holds no optimizer state (only the newest {OPTIM_KEPT} checkpoints keep it)")
        _verify(ckpt / name, files.get(name))
    weights = _torch_load(ckpt / "model.pt", device)
    extra = _torch_load(ckpt / "optim.pt", "cpu")  # (the optimizer moves its state to its parameters' device)
    if not isinstance(extra, dict) or not {"optimizer", "scheduler", "torch_rng"} <= set(extra):
        raise CheckpointError(f"{ckpt}/optim.pt is not a pobench optimizer state (entries missing)")
    if critic:
        if not (ckpt / CRITIC).exists():
            raise CheckpointError(f"{ckpt} holds no critic ({CRITIC}): it is not a checkpoint of this objective")
        _verify(ckpt / CRITIC, files.get(CRITIC))
        extra["critic"] = _torch_load(ckpt / CRITIC, device)
        if not isinstance(extra["critic"], dict) or not {"model", "optimizer"} <= set(extra["critic"]):
            raise CheckpointError(f"{ckpt}/{CRITIC} is not a pobench critic state (entries missing)")
    return state, weights, extra


def _candidates(path: Path) -> list[Path]:
    """``path`` and then the older complete checkpoints of its run, newest first."""
    older = [p for p in reversed(_complete(path.parent)) if p.name < path.name]
    return [path, *older]


def _fell_back(skipped: list[str], chosen: Path, step: int) -> None:
    for why in skipped:
        print(f"bench: warning: checkpoint skipped: {why}", file=sys.stderr)
    print(f"bench: warning: resuming from {chosen} (step {step}); the steps after it are trained again (a report "
          "keeps the newest value of a step logged twice)", file=sys.stderr)


def _none_resumable(path: Path, skipped: list[str]) -> NoneResumable:
    return NoneResumable(f"no checkpoint of {path.parent} can be resumed ({'; '.join(skipped)}); delete "
                           f"{path.parent} to train this run from the start, or pass another --run-name")


def load(path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
         critic: Any = None) -> dict[str, Any]:
    """Resume from checkpoint ``path`` (normally :func:`latest`), else from the newest older one of the same run that
    can be resumed (each one skipped is named on stderr); returns its state. CheckpointError when none can."""
    path = Path(path)
    device = next(model.parameters()).device
    skipped: list[str] = []
    for ckpt in _candidates(path):
        try:
            state, weights, extra = _read(ckpt, device, critic=critic is not None)
        except _Foreign:
            raise
        except CheckpointError as e:
            skipped.append(str(e))
            continue
        try:
            if hasattr(model, "peft_config"):
                from peft import set_peft_model_state_dict

                set_peft_model_state_dict(model, weights)
            else:
                model.load_state_dict(weights)
            optimizer.load_state_dict(extra["optimizer"])
            scheduler.load_state_dict(extra["scheduler"])
            torch.set_rng_state(extra["torch_rng"])
            if critic is not None:
                critic.load_state_dict(extra["critic"])
        except (RuntimeError, KeyError, ValueError) as e:  # another model or optimizer than this config's
            raise CheckpointError(f"{ckpt} does not fit this run's model / optimizer "
                                  f"({str(e).strip().splitlines()[0][:200]}); was the config changed?") from None
        if skipped:
            _fell_back(skipped, ckpt, state["step"])
        return state
    raise _none_resumable(path, skipped)


def load_state(path: str | Path, engine: str = "trl") -> dict[str, Any]:
    """The state of a state-only checkpoint of ``engine`` (the TRL engine's) to resume from: ``path`` or the newest
    older one whose state.json and engine folder (each file's recorded size and digest) are intact; CheckpointError
    when none is."""
    path = Path(path)
    skipped: list[str] = []
    for ckpt in _candidates(path):
        try:
            state = _read_state(ckpt)
            if state.get("engine", "native") != engine:
                raise _Foreign(f"{ckpt} is a checkpoint of the {state.get('engine', 'native')} engine: --engine "
                               f"{engine} cannot resume it")
            engine_dir = state.get("trl_checkpoint")
            if not isinstance(engine_dir, str) or not Path(engine_dir).is_dir():
                raise CheckpointError(f"{ckpt} names the engine folder {engine_dir!r}, which does not exist")
            for name, recorded in (state.get("files") or {}).items():
                _verify(Path(engine_dir) / name, recorded)
        except _Foreign:
            raise
        except CheckpointError as e:
            skipped.append(str(e))
            continue
        if skipped:
            _fell_back(skipped, ckpt, state["step"])
        return state
    raise _none_resumable(path, skipped)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of the model: every weight, or only the adapter of a peft (LoRA) model."""
    if hasattr(model, "peft_config"):
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(model)
    return model.state_dict()
